"""The uploaded image: base64 text to bytes, and bytes to pixels.

Both steps enforce the server's limits (``max_upload_bytes``, ``max_pixels``) before the
expensive work, and answer a bad image with an :class:`~sam2serve.server.errors.ApiError`
that says what was wrong and what would be accepted.
"""

from __future__ import annotations

import base64
import binascii
import io
import re
import struct
from typing import Any

from PIL import Image

from sam2serve.engine.decode_choice import ImageDecoder
from sam2serve.engine.image import ImageError, load_image
from sam2serve.server.errors import ApiError

ACCEPTED_IMAGES = "JPEG, PNG, WebP, BMP, TIFF or another format Pillow reads"
_B64_SLICE = 4 * 1024 * 1024  # characters, a multiple of 4
_STREAM_REPR = re.compile(r" <_io\.BytesIO object at 0x[0-9a-fA-F]+>")


def probe_image(data: bytes, max_pixels: int, what: str = "image") -> tuple[int, int]:
    """(width, height) from the image's header, nothing decoded; 413 past ``max_pixels``.
    (0, 0) for bytes Pillow cannot read: decoding them then says why."""
    try:
        with Image.open(io.BytesIO(data)) as probe:
            width, height = probe.size
    except Image.DecompressionBombError as exc:
        raise ApiError(
            413,
            "too_many_pixels",
            f"{what} is too large to decode safely ({exc}); the limit is "
            f"{max_pixels} pixels (max_pixels)",
        ) from None
    except (OSError, SyntaxError, ValueError, EOFError, IndexError, struct.error):
        # unreadable: load_image says why
        return 0, 0
    if width * height > max_pixels:
        raise ApiError(
            413,
            "too_many_pixels",
            f"{what} is {width}x{height} = {width * height} pixels; the limit is "
            f"{max_pixels} pixels (max_pixels)",
        )
    return width, height


def decode_image(data: bytes, max_pixels: int, decoder: ImageDecoder | None = None) -> Any:
    """uint8 RGB pixels of an uploaded image; the pixel limit is checked from the header
    first, so a decompression bomb is refused before any pixel is decoded. ``decoder``
    (engine.decode_choice; None: the host's) may give them as a tensor on the device."""
    probe_image(data, max_pixels)
    try:
        if decoder is not None:
            return decoder.decode(data, max_pixels)
        return load_image(data, max_pixels=max_pixels)
    except ImageError as exc:
        message = _STREAM_REPR.sub("", str(exc))  # Pillow names our in-memory stream
        raise ApiError(400, "invalid_image", f"{message}; accepted: {ACCEPTED_IMAGES}") from None


def decode_base64_image(text: str, max_bytes: int) -> bytes:
    """The bytes of a base64 (or base64url, or data-URL) image; 413 past ``max_bytes``."""
    if text.startswith("data:"):
        header, comma, text = text.partition(",")
        if not comma or not header.endswith(";base64"):
            raise ApiError(
                400,
                "invalid_base64",
                "image: a data URL must look like 'data:image/png;base64,<data>'",
            )
    compact = "".join(text.split())
    if len(compact) // 4 * 3 > max_bytes + 3:
        raise ApiError(
            413,
            "upload_too_large",
            f"image: about {len(compact) // 4 * 3} bytes once decoded; the limit "
            f"is {max_bytes} bytes (max_upload_bytes)",
        )
    altchars = b"-_" if ("-" in compact or "_" in compact) else None
    try:
        # In slices (multiples of 4 characters decode on their own): each C call holds
        # the GIL, and a 20 MB one would stall the event loop for ~60 ms.
        data = b"".join(
            base64.b64decode(compact[start : start + _B64_SLICE], altchars=altchars, validate=True)
            for start in range(0, len(compact), _B64_SLICE)
        )
    except (binascii.Error, ValueError) as exc:
        raise ApiError(
            400,
            "invalid_base64",
            f"image: not valid base64 ({exc}); send the file's bytes base64-encoded "
            "(standard or URL-safe alphabet, padding included)",
        ) from None
    if not data:
        raise ApiError(400, "invalid_image", "image: the image is empty")
    if len(data) > max_bytes:
        raise ApiError(
            413,
            "upload_too_large",
            f"image: {len(data)} bytes; the limit is {max_bytes} bytes (max_upload_bytes)",
        )
    return data
