"""``torchvision.transforms`` stand-in: ToTensor, Resize and Normalize, as Meta's
``SAM2Transforms`` uses them.

torchvision's (v1) semantics on tensors: ToTensor turns an HWC uint8 array into CHW floats
in [0, 1]; Resize to a fixed (h, w) is ``interpolate(..., "bilinear", align_corners=False,
antialias=True)``; Normalize is ``(x - mean) / std`` per channel. Resize and Normalize are
TorchScript-able modules because SAM2Transforms scripts them.
"""

from __future__ import annotations

import numpy as np
import torch
from PIL import Image
from torch import Tensor, nn

__all__ = ["Normalize", "Resize", "ToTensor"]


class ToTensor:
    """PIL image or HWC array -> CHW tensor; uint8 becomes float in [0, 1]."""

    def __call__(self, picture) -> Tensor:
        array = np.asarray(picture) if isinstance(picture, Image.Image) else picture
        if array.ndim == 2:
            array = array[:, :, None]
        tensor = torch.from_numpy(np.ascontiguousarray(array.transpose((2, 0, 1))))
        if tensor.dtype == torch.uint8:
            return tensor.to(dtype=torch.get_default_dtype()).div(255)
        return tensor


class Resize(nn.Module):
    """Resize float images to a fixed (height, width): bilinear with antialiasing."""

    def __init__(self, size, antialias: bool = True) -> None:
        super().__init__()
        sizes = [int(size), int(size)] if isinstance(size, int) else [int(s) for s in size]
        if len(sizes) != 2:
            raise ValueError(f"this stand-in resizes to a fixed (h, w) only, got {size!r}")
        self.size: list[int] = sizes
        self.antialias: bool = bool(antialias)

    def forward(self, image: Tensor) -> Tensor:
        if [image.shape[-2], image.shape[-1]] == self.size:
            return image
        batched = image.dim() == 4
        x = image if batched else image.unsqueeze(0)
        x = nn.functional.interpolate(
            x, size=self.size, mode="bilinear", align_corners=False, antialias=self.antialias
        )
        return x if batched else x.squeeze(0)


class Normalize(nn.Module):
    def __init__(self, mean: list[float], std: list[float], inplace: bool = False) -> None:
        super().__init__()
        self.mean: list[float] = [float(m) for m in mean]
        self.std: list[float] = [float(s) for s in std]

    def forward(self, tensor: Tensor) -> Tensor:
        mean = torch.tensor(self.mean, dtype=tensor.dtype, device=tensor.device)
        std = torch.tensor(self.std, dtype=tensor.dtype, device=tensor.device)
        return (tensor - mean.view(-1, 1, 1)) / std.view(-1, 1, 1)
