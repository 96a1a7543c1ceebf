"""torchvision.datasets.vision stand-in: a base class for import only (sam3's training data)."""


class VisionDataset:
    def __init__(self, *args, **kwargs) -> None:
        raise RuntimeError("torchvision datasets are not available (test shim)")
