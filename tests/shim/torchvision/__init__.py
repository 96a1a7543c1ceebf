"""Stand-in for the parts of torchvision that Meta's sam2 imports; the project's only one.

torchvision is not installable next to this torch build, but Meta's code imports it
(transforms for SAM2Transforms, box ops for the mask generator; for Meta's sam3 in
tests/concepts: roi_align, masks_to_boxes, transforms.v2 and import-only names). This package implements
just those pieces with torchvision's semantics, independently of sam2serve's own code, so
Meta's code can run as the tests' oracle (tests/reference.py) and as the benchmark's
``reference`` row (sam2serve/bench/reference.py puts it on sys.path inside that worker
process only). It is put on sys.path only when the real torchvision is missing, and it is
never part of the sam2serve package: the benchmark finds it in a checkout of the
repository.
"""

__version__ = "0.0.0+sam2serve.shim"
