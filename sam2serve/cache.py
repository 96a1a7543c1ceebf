"""Where sam2serve keeps what it fetches: one root, ``$SAM2SERVE_CACHE`` or
``~/.cache/sam2serve``, with a directory per kind (torch-free).

- ``checkpoints/``: Meta's checkpoint files under their own names (``load_model`` looks
  there and downloads there; cluster replicas copy checkpoint URIs there);
- ``artifacts/``: ``sam2serve export`` directories that cluster replicas copied from URIs;
- ``cluster.json``: what ``sam2serve cluster up`` started, for ``status`` and ``down``.

Read when asked, never at import time, so a test or a process that sets the variable
later is obeyed.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["CACHE_ENV", "DEFAULT_CACHE_ROOT", "cache_path", "cache_root"]

CACHE_ENV = "SAM2SERVE_CACHE"
DEFAULT_CACHE_ROOT = Path("~/.cache/sam2serve")


def cache_root() -> Path:
    """The root: ``$SAM2SERVE_CACHE`` if set (and not empty), else ``~/.cache/sam2serve``."""
    return Path(os.environ.get(CACHE_ENV) or DEFAULT_CACHE_ROOT).expanduser()


def cache_path(name: str) -> Path:
    """One entry of the root: ``checkpoints``, ``artifacts`` or ``cluster.json``."""
    return cache_root() / name
