"""torchvision.transforms.v2.functional stand-in: to_image only."""

import numpy as np
import torch
from PIL import Image


def to_image(inpt) -> torch.Tensor:
    """PIL image / HWC ndarray -> CHW tensor of the same dtype; tensors pass through."""
    if isinstance(inpt, torch.Tensor):
        return inpt
    array = np.asarray(inpt) if isinstance(inpt, Image.Image) else inpt
    if array.ndim == 2:
        array = array[:, :, None]
    return torch.from_numpy(np.ascontiguousarray(array.transpose((2, 0, 1))))
