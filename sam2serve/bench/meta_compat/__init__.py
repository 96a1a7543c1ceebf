"""A minimal torchvision stand-in, so Meta's ``sam2`` package can run as the ``reference``
mode of the benchmark without torchvision (whose wheels are tied to exact torch builds).

This directory is put on ``sys.path`` only inside the benchmark's reference worker process
(see :mod:`sam2serve.bench.reference`), and only when the real torchvision is not
importable; nothing else in sam2serve ever imports ``torchvision``. It holds exactly what
Meta's image path uses: ``transforms.ToTensor / Resize / Normalize`` and
``ops.boxes.batched_nms / box_area``, with torchvision's semantics (the box geometry
is :mod:`sam2serve.engine.nms`'s).
"""
