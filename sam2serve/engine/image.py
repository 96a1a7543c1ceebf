"""Image decoding and model preprocessing.

`load_image` turns whatever a user hands us (a path, encoded bytes, a PIL image or an
array) into one canonical form, a uint8 RGB (H, W, 3) array with EXIF orientation applied,
or raises `ImageError` saying what was wrong. `preprocess` turns such arrays into the
model's input batch exactly as Meta's SAM2Transforms does (torchvision's ToTensor, Resize
and Normalize on a tensor), without depending on torchvision.
"""

from __future__ import annotations

import io
import os
import struct
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

import numpy as np
import torch
from PIL import Image, ImageOps

__all__ = [
    "DEFAULT_MAX_PIXELS",
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "ImageError",
    "ImageSource",
    "check_image_size",
    "load_image",
    "preprocess",
]

# Larger images are refused before decoding: 100 MP of RGB is 300 MB once decoded.
# Pillow keeps its own, separate guard (it refuses images over 2 * Image.MAX_IMAGE_PIXELS
# at open time); we read but never change that global.
DEFAULT_MAX_PIXELS = 100_000_000

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

ImageSource = str | os.PathLike[str] | bytes | bytearray | memoryview | Image.Image | np.ndarray

# What Pillow's decoders raise on a corrupt or truncated file (UnidentifiedImageError and
# most others are OSError; some plugins let struct, index and EOF errors through).
_PIL_ERRORS = (OSError, SyntaxError, ValueError, EOFError, IndexError, struct.error)
_ACCEPTED_SOURCES = "a file path, encoded image bytes, a PIL.Image or a numpy array"
_ACCEPTED_DTYPES = "uint8, uint16, bool, or float with values in [0, 1]"
_ACCEPTED_SHAPES = "(H, W), (H, W, 1), (H, W, 3) or (H, W, 4)"
_UINT16_TO_UINT8 = 255 / 65535


class ImageError(ValueError):
    """A user-supplied image that cannot be used; the message names the problem."""


def load_image(source: ImageSource, max_pixels: int | None = DEFAULT_MAX_PIXELS) -> np.ndarray:
    """Decode `source` into a uint8 RGB array of shape (H, W, 3).

    Paths and bytes are decoded with Pillow (JPEG, PNG, WebP, BMP, TIFF, ...), honouring
    the EXIF orientation tag. Grayscale, palette, alpha and 16-bit images are converted;
    alpha is dropped, not composited. `max_pixels` (None: no limit) is checked from the
    header, before any pixel is decoded, to refuse decompression bombs.

    An array that is already uint8 (H, W, 3) and C-contiguous is returned as is (shared).
    """
    if isinstance(source, np.ndarray):
        return _from_array(source, max_pixels, what="array")
    if isinstance(source, Image.Image):
        return _from_pil(source, max_pixels, what="PIL image")
    if isinstance(source, (str, os.PathLike)):
        return _from_path(Path(source), max_pixels)
    if isinstance(source, (bytes, bytearray, memoryview)):
        data = bytes(source)
        if not data:
            raise ImageError("image bytes are empty")
        return _decode(io.BytesIO(data), max_pixels, what="image data")
    raise ImageError(
        f"cannot load an image from {type(source).__name__}; expected {_ACCEPTED_SOURCES}"
    )


def _from_path(path: Path, max_pixels: int | None) -> np.ndarray:
    if not path.exists():
        raise ImageError(f"image file not found: {str(path)!r}")
    if not path.is_file():
        raise ImageError(f"image path is not a file: {str(path)!r}")
    try:
        with path.open("rb") as f:
            return _decode(f, max_pixels, what=f"image file {str(path)!r}")
    except OSError as exc:  # permission denied, I/O error while opening
        raise ImageError(f"cannot read image file {str(path)!r}: {exc}") from exc


def _decode(stream: IO[bytes], max_pixels: int | None, what: str) -> np.ndarray:
    try:
        image = Image.open(stream)  # lazy: reads the header only
    except Image.DecompressionBombError as exc:
        raise ImageError(f"{what} is too large to decode safely: {exc}") from exc
    except _PIL_ERRORS as exc:  # UnidentifiedImageError is an OSError
        raise ImageError(f"{what} is not a readable image: {exc}") from exc
    with image:
        check_image_size(image.size, max_pixels, what)  # before decoding any pixel
        try:
            image.load()
        except _PIL_ERRORS as exc:  # truncated or corrupt data
            raise ImageError(f"{what} could not be decoded (truncated or corrupt?): {exc}") from exc
        return _from_pil(image, max_pixels, what)


def check_image_size(size: tuple[int, int], max_pixels: int | None, what: str) -> None:
    """ImageError for an empty ``(width, height)`` or one over ``max_pixels`` (None: no
    limit), checked before any pixel is decoded."""
    width, height = size
    if width <= 0 or height <= 0:
        raise ImageError(f"{what} is empty ({width}x{height} pixels)")
    if max_pixels is not None and width * height > max_pixels:
        raise ImageError(
            f"{what} has {width}x{height} = {width * height} pixels, "
            f"more than the limit of {max_pixels}"
        )


def _from_pil(image: Image.Image, max_pixels: int | None, what: str) -> np.ndarray:
    check_image_size(image.size, max_pixels, what)
    try:
        oriented = ImageOps.exif_transpose(image)
        return _from_array(_pil_to_array(oriented), max_pixels, what)
    except ImageError:
        raise
    except _PIL_ERRORS as exc:
        raise ImageError(f"{what} could not be decoded: {exc}") from exc


def _pil_to_array(image: Image.Image) -> np.ndarray:
    """Pixels of a PIL image as an array that `_from_array` understands."""
    if image.mode in ("RGB", "L", "RGBA", "I;16", "F"):
        return np.asarray(image)
    if image.mode.startswith("I;16"):  # I;16B, I;16L, I;16N: numpy reads the byte order
        return np.asarray(image).astype(np.uint16)
    if image.mode == "I":
        return _int32_to_uint16(np.asarray(image))
    if image.mode == "1":
        return np.asarray(image.convert("L"))
    if image.mode in ("P", "PA", "LA", "La", "RGBa"):
        # Palette (possibly transparent) and grey+alpha go through RGBA; alpha is dropped.
        return np.asarray(image.convert("RGBA"))
    return np.asarray(image.convert("RGB"))  # CMYK, YCbCr, LAB, HSV, ...


def _int32_to_uint16(pixels: np.ndarray) -> np.ndarray:
    """Mode "I" holds 16-bit data from some decoders; other ranges are ambiguous."""
    if pixels.size and (pixels.min() < 0 or pixels.max() > 65535):
        raise ImageError(
            "32-bit integer image has values outside 0..65535 "
            f"(min {pixels.min()}, max {pixels.max()}); convert it to 8 or 16 bits first"
        )
    return pixels.astype(np.uint16)


def _from_array(pixels: np.ndarray, max_pixels: int | None, what: str) -> np.ndarray:
    if pixels.ndim not in (2, 3) or (pixels.ndim == 3 and pixels.shape[2] not in (1, 3, 4)):
        raise ImageError(f"{what} has shape {pixels.shape}; expected {_ACCEPTED_SHAPES}")
    height, width = pixels.shape[:2]
    check_image_size((width, height), max_pixels, what)
    rgb = _to_rgb_channels(pixels)
    return np.ascontiguousarray(_to_uint8(rgb, what))


def _to_rgb_channels(pixels: np.ndarray) -> np.ndarray:
    if pixels.ndim == 2:
        pixels = pixels[:, :, None]
    if pixels.shape[2] == 1:
        return np.repeat(pixels, 3, axis=2)
    if pixels.shape[2] == 4:
        return pixels[:, :, :3]  # alpha is dropped
    return pixels


def _to_uint8(pixels: np.ndarray, what: str) -> np.ndarray:
    if pixels.dtype == np.uint8:
        return pixels
    if pixels.dtype == np.bool_:
        return pixels.astype(np.uint8) * np.uint8(255)
    if pixels.dtype == np.uint16:
        # Scale the full 16-bit range onto 8 bits (65535 -> 255) rather than clipping.
        return np.rint(pixels * _UINT16_TO_UINT8).astype(np.uint8)
    if np.issubdtype(pixels.dtype, np.floating):
        return _float_to_uint8(pixels, what)
    raise ImageError(f"{what} has dtype {pixels.dtype}; expected {_ACCEPTED_DTYPES}")


def _float_to_uint8(pixels: np.ndarray, what: str) -> np.ndarray:
    values = pixels.astype(np.float32, copy=False)
    if not np.isfinite(values).all():
        raise ImageError(f"{what} has NaN or infinite values; expected values in [0, 1]")
    low, high = float(values.min()), float(values.max())
    if low < 0.0 or high > 1.0:
        raise ImageError(
            f"{what} has float values in [{low:g}, {high:g}]; expected values in [0, 1]"
        )
    return np.rint(values * 255).astype(np.uint8)


def preprocess(
    images: Sequence[np.ndarray | torch.Tensor],
    image_size: int = 1024,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Model input (B, 3, S, S) from uint8 RGB (H, W, 3) images of any sizes (arrays, or
    tensors as the device decoder gives them).

    Each image is moved to `device` as uint8 (a quarter of the float bytes; from pinned
    memory without blocking on CUDA), scaled to
    [0, 1], resized to S x S with antialiased bilinear interpolation, then the batch is
    normalised with ImageNet mean/std and cast to `dtype` last, so reduced precision
    never touches the resize. This matches SAM2Transforms (torchvision ToTensor, Resize,
    Normalize), whose tensor Resize is exactly this `interpolate` call.
    """
    if isinstance(images, np.ndarray) or len(images) == 0:
        raise ImageError("preprocess expects a non-empty sequence of (H, W, 3) uint8 arrays")
    resized = [_resize_one(image, image_size, device, i) for i, image in enumerate(images)]
    batch = torch.stack(resized)
    mean, std = imagenet_stats(batch.device)
    batch = (batch - mean) / std
    return batch.to(dtype)


def imagenet_stats(device: torch.device | str) -> tuple[torch.Tensor, torch.Tensor]:
    """ImageNet mean and std as float32 (3, 1, 1) on ``device``, filled in there from
    Python floats: a tensor made from them on the host would be a blocking upload."""
    stats = torch.empty((2, 3, 1, 1), dtype=torch.float32, device=device)
    for channel in range(3):
        stats[0, channel] = IMAGENET_MEAN[channel]
        stats[1, channel] = IMAGENET_STD[channel]
    return stats[0], stats[1]


def to_device(array: np.ndarray | torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """A host array on ``device``, in one copy: on CUDA from pinned memory without
    blocking the host (the caching host allocator keeps the pinned buffer until the copy
    is done). Read-only or strided arrays (Pillow's buffers) are copied to C order first.
    A tensor (pixels decoded on the device: engine.device_decode) is moved if it is
    elsewhere; one already on a CUDA device is marked as used by this stream, since it
    was made on the decoder's."""
    if isinstance(array, torch.Tensor):
        moved = array.to(device)
        if moved.is_cuda and moved is array:
            moved.record_stream(torch.cuda.current_stream(moved.device))
        return moved
    ready = array.flags.writeable and array.flags.c_contiguous
    host = torch.from_numpy(array if ready else np.array(array, order="C"))
    if torch.device(device).type == "cuda":
        host = host.pin_memory()
    return host.to(device, non_blocking=True)


def _resize_one(
    image: Any, image_size: int, device: torch.device | str, index: int
) -> torch.Tensor:
    uint8 = (isinstance(image, np.ndarray) and image.dtype == np.uint8) or (
        isinstance(image, torch.Tensor) and image.dtype == torch.uint8
    )
    if not (uint8 and image.ndim == 3 and image.shape[2] == 3):
        described = (
            f"shape {image.shape}, dtype {image.dtype}"
            if isinstance(image, (np.ndarray, torch.Tensor))
            else type(image).__name__
        )
        raise ImageError(
            f"images[{index}] is {described}; expected a uint8 (H, W, 3) array "
            "(use load_image to convert)"
        )
    pixels = to_device(image, device)  # one uint8 copy
    # CHW and contiguous, as ToTensor produces: interpolate's result depends on layout.
    chw = pixels.permute(2, 0, 1).contiguous()
    if chw[0].numel() <= _WHOLE_IMAGE_PIXELS:
        return _resize(chw.to(torch.float32).div_(255), image_size)
    # A large photo one channel at a time (the same numbers: the resize is per channel):
    # a 36-megapixel image would otherwise hold 432 MB of float32 at once, not 144 MB.
    return torch.stack(
        [_resize(plane.to(torch.float32).div_(255)[None], image_size)[0] for plane in chw]
    )


# Up to this many pixels an image is resized in one call (faster for small images).
_WHOLE_IMAGE_PIXELS = 4_000_000


def _resize(chw: torch.Tensor, image_size: int) -> torch.Tensor:
    resized = torch.nn.functional.interpolate(
        chw[None],
        size=(image_size, image_size),
        mode="bilinear",
        align_corners=False,
        antialias=True,
    )
    return resized[0]
