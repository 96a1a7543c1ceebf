"""Test-only stand-in for the parts of torchvision Meta's sam2 imports.

torchvision is not installable next to this torch build, but Meta's reference code
imports it (transforms for SAM2Transforms, box ops for the mask generator). This shim
implements just those pieces with torchvision's semantics so the reference can run as an
oracle. It is put on sys.path only when the real torchvision is missing (see
tests/reference.py); it is never part of the sam2serve package.
"""

__version__ = "0.0.0+sam2serve.shim"
