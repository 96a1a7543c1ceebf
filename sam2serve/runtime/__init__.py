"""How the model runs: threads (and, in time, modes, backends and the RuntimeSpec)."""
