"""torchvision.transforms stand-in: ToTensor, Resize and Normalize for tensors.

Semantics follow torchvision's (v1) transforms on tensors: ToTensor scales uint8 to
[0, 1] floats in CHW; Resize calls `interpolate(..., align_corners=False,
antialias=True)` (rounding back for integer tensors) and returns the input untouched
when it already has the target size; Normalize computes `(x - mean) / std` per channel.
Resize and Normalize are scriptable modules because SAM2Transforms wraps them in
`torch.jit.script(nn.Sequential(...))`.
"""

from enum import Enum

import numpy as np
import torch
from PIL import Image
from torch import Tensor, nn

__all__ = ["InterpolationMode", "Normalize", "Resize", "ToTensor"]


class InterpolationMode(Enum):
    NEAREST = "nearest"
    BILINEAR = "bilinear"
    BICUBIC = "bicubic"


class ToTensor:
    """PIL image or HWC ndarray -> CHW tensor; uint8 becomes float in [0, 1]."""

    def __call__(self, pic) -> Tensor:
        array = np.asarray(pic) if isinstance(pic, Image.Image) else pic
        if array.ndim == 2:
            array = array[:, :, None]
        tensor = torch.from_numpy(array.transpose((2, 0, 1))).contiguous()
        if tensor.dtype == torch.uint8:
            return tensor.to(dtype=torch.get_default_dtype()).div(255)
        return tensor


def _output_size(h: int, w: int, size: list[int], max_size: int | None) -> list[int]:
    """torchvision's rule: [h, w] as given, or an int that sets the shorter side."""
    if len(size) == 2:
        return size
    short, long = (h, w) if h <= w else (w, h)
    new_short, new_long = size[0], int(size[0] * long / short)
    if max_size is not None and new_long > max_size:
        new_short, new_long = int(max_size * new_short / new_long), max_size
    return [new_short, new_long] if h <= w else [new_long, new_short]


class Resize(nn.Module):
    def __init__(
        self,
        size,
        interpolation: InterpolationMode = InterpolationMode.BILINEAR,
        max_size: int | None = None,
        antialias: bool | None = True,
    ) -> None:
        super().__init__()
        self.size: list[int] = [int(size)] if isinstance(size, int) else [int(s) for s in size]
        self.mode: str = interpolation.value
        self.max_size = max_size
        self.antialias: bool = bool(antialias) and interpolation != InterpolationMode.NEAREST

    def forward(self, img: Tensor) -> Tensor:
        h, w = img.shape[-2], img.shape[-1]
        out_size = _output_size(h, w, self.size, self.max_size)
        if out_size == [h, w]:
            return img
        batched = img.dim() == 4
        x = img if batched else img.unsqueeze(0)
        out_dtype = x.dtype
        if not x.is_floating_point():
            x = x.to(torch.float32)
        if self.mode == "nearest":
            x = nn.functional.interpolate(x, size=out_size, mode=self.mode)
        else:
            x = nn.functional.interpolate(
                x, size=out_size, mode=self.mode, align_corners=False, antialias=self.antialias
            )
        if out_dtype != x.dtype:
            x = torch.round(x)
            if out_dtype == torch.uint8:
                x = x.clamp(0, 255)
            x = x.to(out_dtype)
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
