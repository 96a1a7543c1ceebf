"""Access to Meta's reference `sam2` package, the oracle of the fidelity tests.

Meta's code imports torchvision, which cannot be installed next to our torch build.
`import_reference()` makes `import sam2...` work: when the real torchvision is not
importable it puts the test-only shim in tests/shim (ToTensor/Resize/Normalize and the
box ops, the latter backed by sam2serve.engine.nms) at the front of sys.path.
"""

from __future__ import annotations

import sys
from pathlib import Path

SHIM_DIR = Path(__file__).resolve().parent / "shim"


def _real_torchvision_importable() -> bool:
    try:
        import torchvision  # noqa: F401
    except (ImportError, OSError, RuntimeError, AttributeError):  # missing or broken build
        # A failed import can leave submodules behind; drop them so the shim is clean.
        for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
            del sys.modules[name]
        return False
    return True


def import_reference() -> None:
    """Make Meta's sam2 importable; call before importing anything from `sam2`."""
    if str(SHIM_DIR) in sys.path or _real_torchvision_importable():
        return
    sys.path.insert(0, str(SHIM_DIR))
