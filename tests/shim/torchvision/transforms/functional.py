"""torchvision.transforms.functional stand-in: only what SAM 3's image path calls."""

import numpy as np
import torch
from PIL import Image


def to_tensor(pic) -> torch.Tensor:
    array = np.asarray(pic) if isinstance(pic, Image.Image) else pic
    if array.ndim == 2:
        array = array[:, :, None]
    tensor = torch.from_numpy(np.ascontiguousarray(array.transpose((2, 0, 1))))
    return tensor.float().div(255) if tensor.dtype == torch.uint8 else tensor
