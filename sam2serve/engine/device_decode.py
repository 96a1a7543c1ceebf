"""Decoding JPEG bytes on the CUDA device with NVIDIA nvImageCodec (nvJPEG), the host
path (Pillow, :func:`sam2serve.engine.image.load_image`) as the fallback.

A photo decoded by Pillow costs 9-10 ms of an 85 ms single-point request on an H100 host;
nvJPEG decodes it on the GPU, where the pixels are needed next (the encoder's resize), so
they never cross the bus as a 3-bytes-a-pixel array. What :class:`DeviceImageDecoder`
gives back is what the host path gives, a uint8 (H, W, 3) RGB image with the EXIF
orientation applied, as a tensor on the device.

It decodes on the device only what it can decode as the host does:

- the header is read with Pillow first (nothing decoded): the pixel limit is checked
  there, before the device allocates anything, with the host path's own check and
  message; the EXIF orientation is Pillow's reading of it, applied here with the same
  transposes as ``ImageOps.exif_transpose`` (nvImageCodec's own is turned off, so both
  paths read the tag the same way);
- only JPEG with three YCbCr channels (Pillow's mode "RGB", no Adobe marker saying they
  are RGB) goes to the device: greyscale, CMYK/YCCK, and every other format (PNG, WebP,
  TIFF, ...) is decoded on the host, where its conversions (alpha dropped, 16 bits
  scaled) are defined;
- a decode that fails on the device, or answers with the wrong size, is decoded again on
  the host, which then says what is wrong with the file if anything is.

nvJPEG's IDCT and chroma upsampling are not libjpeg's: pixels may differ by a few levels
(the decoder asks for libjpeg's "fancy" upsampling to stay close); scripts/decode_check.py
measures it on a GPU. Imports of torch and nvImageCodec are lazy: this module imports on a
machine that has neither.
"""

from __future__ import annotations

import contextlib
import io
import threading
from collections import Counter
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Any

import numpy as np

from sam2serve.engine.image import check_image_size, load_image

if TYPE_CHECKING:
    import torch

__all__ = [
    "DEVICE_FORMATS",
    "NVIMGCODEC_PACKAGES",
    "DeviceDecodeUnavailable",
    "DeviceImageDecoder",
    "Header",
    "orient",
    "read_header",
    "unavailable_reason",
]

# Pillow's names of the formats decoded on the device, and the modes of them.
DEVICE_FORMATS = ("JPEG",)
DEVICE_MODES = ("RGB",)
# What provides the decoder: nvImageCodec's bindings, and nvJPEG's library they load.
NVIMGCODEC_PACKAGES = (
    "nvidia-nvimgcodec-cu13 and nvidia-nvjpeg (pip install 'sam2serve[gpu-decode]')"
)
_ORIENTATION_TAG = 0x0112
# libjpeg's (and so Pillow's) default chroma upsampling; nvJPEG's default differs more.
_DECODER_OPTIONS = ":fancy_upsampling=1"
# A few CPU threads for the decoder's own host work (Huffman decoding of the hybrid
# backend): the default is every core, per decoder.
_DECODER_CPU_THREADS = 4


class DeviceDecodeUnavailable(RuntimeError):
    """Device decoding cannot run here; the message says what is missing."""


@dataclass(frozen=True)
class Header:
    """What Pillow reads from an image's header without decoding it."""

    format: str | None
    mode: str
    width: int
    height: int
    orientation: int
    # An Adobe marker saying the three channels are RGB, not YCbCr (transform 0): libjpeg
    # honours it; whether nvJPEG does is not known, so such files stay on the host.
    adobe_rgb: bool = False


def read_header(data: bytes) -> Header | None:
    """The header of encoded image bytes; None where Pillow cannot read one (the host
    path then says why)."""
    from PIL import Image

    try:
        with Image.open(io.BytesIO(data)) as image:
            width, height = image.size
            orientation = image.getexif().get(_ORIENTATION_TAG, 1)
            adobe_rgb = "adobe" in image.info and image.info.get("adobe_transform", 1) == 0
            return Header(image.format, image.mode, width, height, int(orientation), adobe_rgb)
    except Exception:  # noqa: BLE001 - unreadable or a bomb: load_image raises the error
        return None


def orient(pixels: torch.Tensor, orientation: int) -> torch.Tensor:
    """(H, W, C) pixels as ``ImageOps.exif_transpose`` turns them for an EXIF orientation
    (1-8; anything else leaves them as they are, as Pillow does)."""
    import torch

    if orientation == 2:  # mirrored left-right
        return pixels.flip(1)
    if orientation == 3:  # rotated 180
        return pixels.flip(0, 1)
    if orientation == 4:  # mirrored top-bottom
        return pixels.flip(0)
    if orientation == 5:  # transposed
        return pixels.transpose(0, 1)
    if orientation == 6:  # shown rotated 90 degrees clockwise
        return torch.rot90(pixels, k=-1, dims=(0, 1))
    if orientation == 7:  # transversed
        return pixels.transpose(0, 1).flip(0, 1)
    if orientation == 8:  # shown rotated 90 degrees counter-clockwise
        return torch.rot90(pixels, k=1, dims=(0, 1))
    return pixels


def import_nvimgcodec() -> ModuleType:
    """nvImageCodec's Python bindings; DeviceDecodeUnavailable naming the packages."""
    try:
        from nvidia import nvimgcodec
    except ImportError as exc:
        raise DeviceDecodeUnavailable(
            f"NVIDIA nvImageCodec, which is not installed ({exc}): install {NVIMGCODEC_PACKAGES}"
        ) from None
    module: ModuleType = nvimgcodec
    return module


def unavailable_reason(device: Any) -> str | None:
    """What device decoding on ``device`` lacks here (None: nothing), cheapest checks
    first: a CUDA device, a GPU torch sees, nvImageCodec installed."""
    import torch

    where = torch.device(device)
    if where.type != "cuda":
        return f"a CUDA device (the model runs on {where})"
    if not torch.cuda.is_available():
        return f"a GPU that torch sees (torch {torch.__version__} sees none)"
    try:
        import_nvimgcodec()
    except DeviceDecodeUnavailable as exc:
        return str(exc)
    return None


class DeviceImageDecoder:
    """Image bytes -> uint8 (H, W, 3) RGB on ``device``, or on the host where the device
    cannot decode them as the host would (see the module's docstring). Thread-safe: one
    decode at a time on the device (they take a millisecond or two), any number on the
    host."""

    where = "device"

    def __init__(self, device: Any, module: ModuleType | None = None) -> None:
        import torch

        self.device = torch.device(device)
        if self.device.type == "cuda" and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.nvimgcodec = import_nvimgcodec() if module is None else module
        codec = self.nvimgcodec
        # GPU backends only: where nvJPEG is missing, a CPU backend would quietly decode
        # into host memory; a decode with no backend fails and the host path takes it.
        backends = [
            codec.Backend(codec.BackendKind.HW_GPU_ONLY),
            codec.Backend(codec.BackendKind.GPU_ONLY),
            codec.Backend(codec.BackendKind.HYBRID_CPU_GPU),
        ]
        self._decoder = codec.Decoder(
            device_id=self.device.index if self.device.type == "cuda" else -1,
            max_num_cpu_threads=_DECODER_CPU_THREADS,
            backends=backends,
            options=_DECODER_OPTIONS,
        )
        self._params = codec.DecodeParams(
            apply_exif_orientation=False,  # applied here, as Pillow reads the tag
            color_spec=codec.ColorSpec.SRGB,
            allow_any_depth=False,
            sample_format=codec.SampleFormat.I_RGB,
        )
        self._stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None
        self._lock = threading.Lock()
        self.counts: Counter[str] = Counter()  # "device", "host: <why>"

    def describe(self) -> str:
        version = getattr(self.nvimgcodec, "__version__", "?")
        return f"device ({self.device}, nvImageCodec {version}; JPEG, the rest on the host)"

    def check(self) -> None:
        """Decode a small JPEG on the device once: DeviceDecodeUnavailable if it cannot
        (nvJPEG's library missing, the driver too old), so that a start-up finds out, not
        the first request."""
        from PIL import Image

        buffer = io.BytesIO()
        Image.new("RGB", (16, 16), (200, 30, 90)).save(buffer, format="JPEG")
        try:
            pixels = self._on_device(buffer.getvalue(), 1)
        except Exception as exc:  # noqa: BLE001 - any failure means: not usable here
            raise DeviceDecodeUnavailable(
                f"an nvImageCodec that decodes on {self.device}: a test JPEG failed "
                f"({type(exc).__name__}: {exc}); is nvJPEG installed ({NVIMGCODEC_PACKAGES})?"
            ) from None
        if pixels is None:
            raise DeviceDecodeUnavailable(
                f"an nvImageCodec GPU decoder for JPEG on {self.device}, which it lacks "
                f"(nvJPEG missing?): install {NVIMGCODEC_PACKAGES}"
            )

    def decode(self, data: bytes, max_pixels: int | None) -> Any:
        """uint8 (H, W, 3) RGB pixels of ``data``: a tensor on the device, or a host array
        where the host decoded them. ImageError (the host path's) for a bad image."""
        header = read_header(data)
        if header is None:
            return self._host(data, max_pixels, "unreadable header")
        if header.format not in DEVICE_FORMATS or header.mode not in DEVICE_MODES:
            return self._host(data, max_pixels, f"{header.format} {header.mode}")
        if header.adobe_rgb:
            return self._host(data, max_pixels, "JPEG of RGB channels (Adobe)")
        # Before the device allocates anything (the host path's own check and message).
        check_image_size((header.width, header.height), max_pixels, "image data")
        try:
            decoded = self._on_device(data, header.orientation)
        except Exception as exc:  # noqa: BLE001 - the host decodes it, or says what is wrong
            return self._host(data, max_pixels, f"device error {type(exc).__name__}")
        expected = _oriented_size(header)
        if decoded is None or tuple(decoded.shape) != (*expected, 3):
            return self._host(data, max_pixels, "device could not decode it")
        self._count("device")
        return decoded

    def _host(self, data: bytes, max_pixels: int | None, why: str) -> np.ndarray:
        self._count(f"host: {why}")
        return load_image(data, max_pixels=max_pixels)

    def _count(self, key: str) -> None:
        with self._lock:
            self.counts[key] += 1

    def _on_device(self, data: bytes, orientation: int) -> torch.Tensor | None:
        """The decoded, oriented pixels in memory of torch's own (None: not decodable).
        Everything runs on a stream of the decoder's and ends with waiting for it, so the
        nvImageCodec buffer is done with when it is dropped; the caller's stream is not
        waited for."""
        import torch

        codec = self.nvimgcodec
        stream = self._stream
        on_stream = torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext()
        with self._lock, on_stream:
            try:
                image = self._decoder.decode(
                    codec.CodeStream(data),
                    params=self._params,
                    cuda_stream=0 if stream is None else stream.cuda_stream,
                )
                if image is None:
                    return None
                on_host = image.buffer_kind != codec.ImageBufferKind.STRIDED_DEVICE
                if on_host and stream is not None:
                    return None  # a host buffer: not what was asked for
                decoded = torch.from_dlpack(image)
                if decoded.dtype != torch.uint8 or decoded.ndim != 3 or decoded.shape[2] != 3:
                    return None
                return orient(decoded, orientation).clone(memory_format=torch.contiguous_format)
            finally:
                if stream is not None:
                    # The decode and the copy are done before nvImageCodec's buffer goes.
                    stream.synchronize()


def _oriented_size(header: Header) -> tuple[int, int]:
    """(height, width) once the orientation is applied."""
    if header.orientation in (5, 6, 7, 8):
        return header.width, header.height
    return header.height, header.width
