"""Meta's ``sam3`` 0.1.4 on its real stack, in a virtual environment of its own: PyPI's
torch 2.13.0 (its CUDA libraries installed, run on the CPU), torchvision 0.28.0, timm 1.0.x,
and sam3's own dependencies. The main environment cannot hold it: torchvision pins its
torch build, and transformers would then use torchvision's RoIAlign instead of ours.

The folder is ``$SAM2SERVE_META_SAM3_VENV`` (default ``~/.cache/sam2serve/meta-sam3-venv``),
created when missing (``python tests/concepts/meta_venv.py`` creates it ahead of a run).
``torch===2.13.0`` is PEP 440's exact match: the ``2.13.0+cpu`` build a machine may hold
in its local wheel folder is not what is asked for here.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

VENV = Path(
    os.environ.get(
        "SAM2SERVE_META_SAM3_VENV", Path.home() / ".cache" / "sam2serve" / "meta-sam3-venv"
    )
)
REQUIREMENTS = (
    "torch===2.13.0",
    "torchvision==0.28.0",
    "timm>=1.0.17,<1.1",
    "sam3==0.1.4",
    "psutil",  # sam3 imports it without declaring it
    "open-clip-torch==3.3.0",  # for its bpe_simple_vocab_16e6.txt.gz (sam3's wheel has none)
    "pillow",
)
READY = "sam2serve-meta-sam3-ready"  # written last: a half-made folder is made again
INSTALL_TIMEOUT_S = 3000


def venv_python() -> Path:
    """The environment's interpreter, creating the environment when it is not complete."""
    python = VENV / "bin" / "python"
    if not (VENV / READY).is_file():
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(VENV)], check=True)
        subprocess.run(
            [str(python), "-m", "pip", "install", "--quiet", *REQUIREMENTS],
            check=True,
            timeout=INSTALL_TIMEOUT_S,
        )
        (VENV / READY).write_text(" ".join(REQUIREMENTS) + "\n")
    return python


if __name__ == "__main__":
    start = time.monotonic()
    print(venv_python(), f"ready in {time.monotonic() - start:.0f} s")
