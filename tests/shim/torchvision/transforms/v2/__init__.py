"""torchvision.transforms.v2 stand-in: the four transforms of SAM 3's Sam3Processor.

Semantics follow torchvision v2 on image tensors: ToDtype(uint8, scale=True) keeps uint8 and
scales floats by 255 (round-to-nearest-even after clamping, as ``_to_dtype_tensor`` does);
Resize((h, w)) is bilinear with antialias=True, on uint8 with torch's native uint8 kernel only
on the CPU and only where torch's CPU capability is "AVX2" or "AVX512" or the machine is ARM
(torchvision 0.28's ``_do_native_uint8_resize_on_cpu``), elsewhere (CUDA, an x86 CPU without
AVX2) in float32, rounded and cast back to uint8 (``resize_image``); ToDtype(float32, scale=True)
multiplies uint8 by 1 / 255 (``to_dtype_image``); Normalize computes (x - mean) / std per
channel.
"""

import platform

import torch
from torch import Tensor

from torchvision.transforms.v2 import functional

__all__ = ["Compose", "Normalize", "Resize", "ToDtype", "functional"]


class Compose:
    def __init__(self, transforms) -> None:
        self.transforms = list(transforms)

    def __call__(self, x: Tensor) -> Tensor:
        for transform in self.transforms:
            x = transform(x)
        return x


class ToDtype:
    def __init__(self, dtype: torch.dtype, scale: bool = False) -> None:
        self.dtype, self.scale = dtype, scale

    def __call__(self, x: Tensor) -> Tensor:
        if x.dtype == self.dtype:
            return x
        if not self.scale:
            return x.to(self.dtype)
        if x.dtype == torch.uint8 and self.dtype.is_floating_point:
            return x.to(self.dtype).mul_(1.0 / 255)
        if x.dtype.is_floating_point and self.dtype == torch.uint8:
            return x.mul(255).clamp(0, 255).round().to(torch.uint8)
        raise NotImplementedError(f"shim ToDtype {x.dtype} -> {self.dtype}")


class Resize:
    def __init__(self, size, antialias: bool = True) -> None:
        self.size = [int(size), int(size)] if isinstance(size, int) else [int(s) for s in size]
        self.antialias = antialias

    def __call__(self, x: Tensor) -> Tensor:
        if list(x.shape[-2:]) == self.size:
            return x
        batched = x if x.dim() == 4 else x[None]
        native = x.device.type == "cpu" and (
            torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512")
            or platform.machine() in ("aarch64", "arm64")
        )
        cast = x.dtype == torch.uint8 and not native
        out = torch.nn.functional.interpolate(
            batched.float() if cast else batched,
            size=self.size,
            mode="bilinear",
            align_corners=False,
            antialias=self.antialias,
        )
        if cast:
            out = out.round_().to(torch.uint8)
        return out if x.dim() == 4 else out[0]


class Normalize:
    def __init__(self, mean, std) -> None:
        self.mean, self.std = list(mean), list(std)

    def __call__(self, x: Tensor) -> Tensor:
        mean = torch.tensor(self.mean, dtype=x.dtype).view(-1, 1, 1)
        std = torch.tensor(self.std, dtype=x.dtype).view(-1, 1, 1)
        return (x - mean) / std
