"""Where image bytes are decoded: on the host (Pillow) or on the model's CUDA device
(nvImageCodec, :mod:`sam2serve.engine.device_decode`), chosen once when a command or the
service starts, never per request.

``auto`` decodes on the device when the model runs on CUDA, nvImageCodec is installed and
decodes a test JPEG there, else on the host; ``device`` insists (an error naming what is
missing, at start-up); ``host`` never tries. The surfaces' ``--image-decode`` flags and the
service's ``image_decode`` setting are derived from the definitions here. Torch-free to
import (the service's settings import it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal, Protocol, cast, get_args

if TYPE_CHECKING:
    import numpy as np

__all__ = [
    "DEFAULT_IMAGE_DECODE",
    "IMAGE_DECODES",
    "IMAGE_DECODE_HELP",
    "HostImageDecoder",
    "ImageDecode",
    "ImageDecodeUnavailable",
    "ImageDecoder",
    "check_device_decode",
    "check_image_decode",
    "image_decoder",
]

ImageDecode = Literal["auto", "host", "device"]
IMAGE_DECODES: tuple[str, ...] = get_args(ImageDecode)
DEFAULT_IMAGE_DECODE: ImageDecode = "auto"
IMAGE_DECODE_HELP = (
    "where image files are decoded: host: Pillow on the CPU; device: NVIDIA nvImageCodec "
    "(nvJPEG) on the model's CUDA device, JPEG only (other formats, and files it cannot "
    "decode, on the host; needs the gpu-decode extra); auto: device when the model runs on "
    "CUDA and nvImageCodec works there, else host"
)


class ImageDecodeUnavailable(ValueError):
    """``device`` decoding was asked for where it cannot run; the message says why."""


class ImageDecoder(Protocol):
    """Image bytes -> uint8 (H, W, 3) RGB pixels (a host array, or a tensor on the
    device), with the pixel limit checked from the header first; ImageError for a bad
    image."""

    where: str  # "host" or "device"

    def decode(self, data: bytes, max_pixels: int | None) -> Any: ...

    def describe(self) -> str: ...


class HostImageDecoder:
    """Pillow (:func:`sam2serve.engine.image.load_image`); ``why``: why not the device
    (for ``auto``, shown by :meth:`describe`)."""

    where = "host"

    def __init__(self, why: str | None = None) -> None:
        self.why = why

    def decode(self, data: bytes, max_pixels: int | None) -> np.ndarray:
        from sam2serve.engine.image import load_image

        return load_image(data, max_pixels=max_pixels)

    def describe(self) -> str:
        return "host (Pillow)" + (f"; not the device: it needs {self.why}" if self.why else "")


def check_image_decode(choice: str) -> ImageDecode:
    """``choice`` if it is one of IMAGE_DECODES; ValueError naming it otherwise."""
    if choice not in IMAGE_DECODES:
        raise ValueError(f"image_decode must be one of {', '.join(IMAGE_DECODES)}, got {choice!r}")
    return cast(ImageDecode, choice)  # one of IMAGE_DECODES, the Literal's values


def image_decoder(choice: str, device: Any) -> ImageDecoder:
    """The decoder ``choice`` means for a model on ``device`` (checks, and for the device
    a test decode, run now); ImageDecodeUnavailable where ``device`` cannot run."""
    from sam2serve.engine import device_decode

    choice = check_image_decode(choice)
    if choice == "host":
        return HostImageDecoder()
    missing = device_decode.unavailable_reason(device)
    decoder = None
    if missing is None:
        try:
            decoder = device_decode.DeviceImageDecoder(device)
            decoder.check()
        except device_decode.DeviceDecodeUnavailable as exc:
            missing, decoder = str(exc), None
    if decoder is not None:
        return decoder
    if choice == "auto":
        return HostImageDecoder(why=missing)
    raise _unavailable(missing)


def check_device_decode(choice: str, device: Any) -> None:
    """The cheap part of :func:`image_decoder`'s checks, for a process that decodes
    nothing itself (the bench's parent): ImageDecodeUnavailable when ``choice`` is
    ``device`` and the device, its GPU or nvImageCodec is missing."""
    if check_image_decode(choice) != "device":
        return
    from sam2serve.engine import device_decode

    missing = device_decode.unavailable_reason(device)
    if missing is not None:
        raise _unavailable(missing)


def _unavailable(missing: str | None) -> ImageDecodeUnavailable:
    return ImageDecodeUnavailable(
        f"device decoding needs {missing}; use 'host' (or 'auto': the device where it can)"
    )
