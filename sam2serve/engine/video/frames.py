"""Video frames -> the model's input, exactly as Meta's video predictor prepares them.

Meta's SAM2VideoPredictor resizes each frame with PIL (``Image.resize`` to 1024x1024, its
default filter) and normalises in float32 after a float64 division by 255; its image
predictor resizes with torch instead, so the two paths are not interchangeable and the
video path follows the video predictor. Frames are kept as the caller's uint8 arrays and
converted when their features are computed: a 1024x1024 float frame is 12 MB, a 480p
uint8 frame 0.9 MB.

On a GPU the uint8 frame crosses to the device once (from pinned memory, without
blocking) and is resized and normalised there: :func:`resize_like_pil` is Pillow's
bicubic resize (its fixed-point coefficients and 8-bit rounding, Resample.c) written with
torch, equal to Pillow's bytes (tested on the CPU over up- and downscales); no float copy
of a frame is ever made on the host. On the CPU, and for tall frames whose height shrinks
(Pillow 13 may resize those vertical pass first), Pillow resizes on the host and only its
uint8 result crosses; the numbers are the same either way.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import numpy as np
import torch
from PIL import Image

from sam2serve.engine.image import imagenet_stats, to_device


class FrameError(ValueError):
    """Frames that cannot be tracked; the message names the bad frame."""


def check_frames(frames: Sequence[np.ndarray]) -> tuple[int, int]:
    """(height, width) shared by all frames; uint8 (H, W, 3) arrays, at least one."""
    if len(frames) == 0:
        raise FrameError("a video needs at least one frame")
    size: tuple[int, int] | None = None
    for index, frame in enumerate(frames):
        if not isinstance(frame, np.ndarray) or frame.dtype != np.uint8:
            kind = getattr(frame, "dtype", type(frame).__name__)
            raise FrameError(f"frame {index} must be a uint8 numpy array, got {kind}")
        if frame.ndim != 3 or frame.shape[2] != 3 or 0 in frame.shape:
            raise FrameError(f"frame {index} must have shape (H, W, 3), got {frame.shape}")
        if size is None:
            size = frame.shape[:2]
        elif frame.shape[:2] != size:
            raise FrameError(
                f"frame {index} is {frame.shape[1]}x{frame.shape[0]}, "
                f"frame 0 is {size[1]}x{size[0]}: all frames must have one size"
            )
    assert size is not None
    return int(size[0]), int(size[1])


def preprocess_frame(
    frame: np.ndarray,
    image_size: int,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """uint8 (H, W, 3) -> normalised (3, image_size, image_size) on ``device``, in
    ``dtype`` (cast last, after normalising in float32 as Meta does)."""
    device = torch.device(device)
    height, width = frame.shape[:2]
    if device.type == "cpu" or not pillow_order_known(height, width):
        # Pillow on the host; only its uint8 result crosses to the device.
        resized = np.asarray(Image.fromarray(frame).resize((image_size, image_size)))
        pixels = to_device(resized, device).permute(2, 0, 1)
    else:
        pixels = resize_like_pil(to_device(frame, device).permute(2, 0, 1), image_size)
    return normalise(pixels).to(dtype)


def pillow_order_known(height: int, width: int) -> bool:
    """Whether Pillow resizes an ``height`` x ``width`` image to a square horizontal pass
    first, as :func:`resize_like_pil` does. Pillow 13 resizes some tall images whose
    height shrinks vertical pass first (each pass rounds to 8 bits, so the order shows in
    the bytes); an image no taller than wide is always horizontal first (measured over
    random sizes; the tests hold it to Pillow's bytes). Others are resized by Pillow."""
    return height <= width


def normalise(pixels: torch.Tensor) -> torch.Tensor:
    """uint8 (3, S, S) -> float32 (pixels / 255 - mean) / std, where the pixels are.

    float32(u / 255) in float64, as Meta computes it, is the correctly rounded quotient,
    as float32 division gives it: the same numbers. Mean and std are filled in on the
    device from Python floats (a tensor made from them would be a blocking upload)."""
    mean, std = imagenet_stats(pixels.device)
    return pixels.to(torch.float32).div_(255).sub_(mean).div_(std)


# Pillow's Resample.c: fixed-point coefficients with 22 fraction bits for 8-bit images.
_PRECISION_BITS = 32 - 8 - 2
_BICUBIC_A = -0.5
_BICUBIC_SUPPORT = 2.0


def _bicubic(x: np.ndarray) -> np.ndarray:
    """Pillow's bicubic_filter (a = -0.5), the same float64 operations in the same order."""
    a = _BICUBIC_A
    x = np.abs(x)
    near = ((a + 2.0) * x - (a + 3.0)) * x * x + 1
    far = (((x - 5) * x + 8) * x - 4) * a
    return np.where(x < 1.0, near, np.where(x < 2.0, far, 0.0))


@functools.lru_cache(maxsize=16)
def _coefficients(in_size: int, out_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Pillow's precompute_coeffs + normalize_coeffs_8bpc for one axis: (taps (out, k)
    int32 fixed-point weights, index (out, k) int64 input positions, clamped in range;
    taps past a pixel's window are 0)."""
    scale = in_size / out_size
    filterscale = max(scale, 1.0)
    support = _BICUBIC_SUPPORT * filterscale
    ksize = math.ceil(support) * 2 + 1
    center = (np.arange(out_size) + 0.5) * scale
    xmin = np.maximum((center - support + 0.5).astype(np.int64), 0)  # C's (int): truncation
    xmax = np.minimum((center + support + 0.5).astype(np.int64), in_size) - xmin
    taps = np.arange(ksize)
    inside = taps[None, :] < xmax[:, None]
    weights = _bicubic(
        (taps[None, :] + xmin[:, None] - center[:, None] + 0.5) * (1.0 / filterscale)
    )
    weights = np.where(inside, weights, 0.0)
    total = np.zeros(out_size)
    for k in range(ksize):  # Pillow sums the window left to right
        total = total + weights[:, k]
    weights = np.where(total[:, None] != 0.0, weights / np.where(total == 0, 1, total)[:, None], 0)
    one = 1 << _PRECISION_BITS
    fixed = np.where(weights < 0, np.trunc(-0.5 + weights * one), np.trunc(0.5 + weights * one))
    index = np.minimum(xmin[:, None] + taps[None, :], in_size - 1)
    return fixed.astype(np.int32), index


def _resample_last_axis(pixels: torch.Tensor, out_size: int) -> torch.Tensor:
    """Pillow's ImagingResampleHorizontal_8bpc over the last axis of uint8 ``pixels``."""
    device = pixels.device
    weights, positions = _device_coefficients(pixels.shape[-1], out_size, device)
    source = pixels.to(torch.int32)
    total = torch.full(
        (*pixels.shape[:-1], out_size), 1 << (_PRECISION_BITS - 1), dtype=torch.int32, device=device
    )
    for k in range(weights.shape[1]):  # integer sums: exact in any order, < 2**31 as in Pillow
        total += source[..., positions[:, k]] * weights[:, k]
    return (total >> _PRECISION_BITS).clamp_(0, 255).to(torch.uint8)


@functools.lru_cache(maxsize=16)
def _device_coefficients(
    in_size: int, out_size: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`_coefficients` on ``device``, uploaded once per size pair and device (a
    video's frames share one size: no copy per frame)."""
    fixed, index = _coefficients(in_size, out_size)
    return to_device(fixed, device), to_device(index, device)


def resize_like_pil(pixels: torch.Tensor, image_size: int) -> torch.Tensor:
    """uint8 (C, H, W) on any device -> uint8 (C, image_size, image_size), byte for byte
    ``PIL.Image.resize((image_size, image_size))`` (bicubic, no reducing gap) where
    :func:`pillow_order_known`: the horizontal pass, rounded to 8 bits, then the vertical
    one, each only if that side changes."""
    if pixels.dtype != torch.uint8 or pixels.ndim != 3:
        raise FrameError(f"expected uint8 (C, H, W) pixels, got {pixels.dtype} {pixels.shape}")
    if pixels.shape[2] != image_size:
        pixels = _resample_last_axis(pixels, image_size)
    if pixels.shape[1] != image_size:
        pixels = _resample_last_axis(pixels.transpose(1, 2), image_size).transpose(1, 2)
    return pixels.contiguous()
