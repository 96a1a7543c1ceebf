"""A stand-in for ``nvidia.nvimgcodec`` on machines without a GPU.

It has the names engine.device_decode uses, with nvImageCodec 0.9's signatures
(``Decoder(device_id=, max_num_cpu_threads=, backends=, options=)``,
``Decoder.decode(CodeStream, params=, cuda_stream=)`` answering an Image or None,
``DecodeParams(apply_exif_orientation=, color_spec=, allow_any_depth=, sample_format=)``,
an Image exporting DLPack), and decodes with Pillow into host memory. Pixels therefore
equal the host path's exactly: tests with it check the plumbing (header, limits,
orientation, layout, fallbacks), not nvJPEG's arithmetic (scripts/decode_check.py measures
that on a GPU).

:func:`make` builds a fresh module; ``module.behaviour`` switches what the decoder does:
``"decode"``, ``"none"`` (answers None, as for an image it cannot decode), ``"raise"``,
``"wrong_size"`` (a 2x2 image). ``module.calls`` records each decode's params.
"""

from __future__ import annotations

import enum
import io
import sys
import types
from typing import Any

import numpy as np
from PIL import Image as PILImage
from PIL import ImageOps


class BackendKind(enum.Enum):
    CPU_ONLY = 0
    GPU_ONLY = 1
    HYBRID_CPU_GPU = 2
    HW_GPU_ONLY = 3


class ColorSpec(enum.Enum):
    UNCHANGED = 0
    SRGB = 1
    GRAY = 2


class SampleFormat(enum.Enum):
    I_AUTO_COMPONENTS = 0
    I_RGB = 1
    I_Y = 2


class ImageBufferKind(enum.Enum):
    STRIDED_DEVICE = 0
    STRIDED_HOST = 1


class Backend:
    def __init__(self, backend_kind: BackendKind = BackendKind.GPU_ONLY, load_hint: float = 1.0):
        self.backend_kind = backend_kind
        self.load_hint = load_hint


class DecodeParams:
    def __init__(
        self,
        apply_exif_orientation: bool = True,
        color_spec: ColorSpec = ColorSpec.SRGB,
        allow_any_depth: bool = False,
        sample_format: SampleFormat = SampleFormat.I_AUTO_COMPONENTS,
    ) -> None:
        self.apply_exif_orientation = apply_exif_orientation
        self.color_spec = color_spec
        self.allow_any_depth = allow_any_depth
        self.sample_format = sample_format


class CodeStream:
    def __init__(self, data: bytes) -> None:
        if not isinstance(data, bytes):
            raise TypeError("CodeStream takes bytes here")
        self.data = data


class Image:
    """Decoded pixels, exported through DLPack (host memory, whatever buffer_kind says)."""

    def __init__(self, pixels: np.ndarray, buffer_kind: ImageBufferKind) -> None:
        self._pixels = np.array(pixels, order="C")  # writeable: DLPack exports no read-only
        self.buffer_kind = buffer_kind
        self.shape = self._pixels.shape
        self.dtype = self._pixels.dtype

    def __dlpack__(self, stream: Any = None) -> Any:
        return self._pixels.__dlpack__()

    def __dlpack_device__(self) -> tuple[int, int]:
        return self._pixels.__dlpack_device__()


def make() -> types.ModuleType:
    """A fresh fake ``nvidia.nvimgcodec`` module (its own behaviour and calls)."""
    module = types.ModuleType("nvidia.nvimgcodec")
    module.__version__ = "0.0.0-fake"
    module.behaviour = "decode"
    module.calls = []
    module.decoders = []

    class Decoder:
        def __init__(
            self,
            device_id: int = -1,
            max_num_cpu_threads: int = 0,
            backends: list[Backend] | None = None,
            options: str = "",
        ) -> None:
            self.device_id = device_id
            self.backends = backends
            self.options = options
            module.decoders.append(self)

        def decode(
            self, src: CodeStream, *, params: DecodeParams | None = None, cuda_stream: int = 0
        ) -> Image | None:
            params = params or DecodeParams()
            module.calls.append(params)
            behaviour = module.behaviour
            if behaviour == "raise":
                raise RuntimeError("fake nvImageCodec: decoding failed")
            if behaviour == "none":
                return None
            if behaviour == "wrong_size":
                return Image(np.zeros((2, 2, 3), np.uint8), ImageBufferKind.STRIDED_DEVICE)
            with PILImage.open(io.BytesIO(src.data)) as image:
                if params.apply_exif_orientation:
                    image = ImageOps.exif_transpose(image)
                pixels = np.asarray(image.convert("RGB"))
            return Image(pixels, ImageBufferKind.STRIDED_DEVICE)

    for name, value in {
        "Backend": Backend,
        "BackendKind": BackendKind,
        "CodeStream": CodeStream,
        "ColorSpec": ColorSpec,
        "DecodeParams": DecodeParams,
        "Decoder": Decoder,
        "Image": Image,
        "ImageBufferKind": ImageBufferKind,
        "SampleFormat": SampleFormat,
    }.items():
        setattr(module, name, value)
    return module


def install(monkeypatch: Any) -> types.ModuleType:
    """A fresh fake, importable as ``from nvidia import nvimgcodec`` until the test ends."""
    module = make()
    parent = sys.modules.get("nvidia")
    if parent is None:
        parent = types.ModuleType("nvidia")
        parent.__path__ = []  # a package, as the real namespace is
        monkeypatch.setitem(sys.modules, "nvidia", parent)
    monkeypatch.setattr(parent, "nvimgcodec", module, raising=False)
    monkeypatch.setitem(sys.modules, "nvidia.nvimgcodec", module)
    return module


def uninstall(monkeypatch: Any) -> None:
    """``from nvidia import nvimgcodec`` raises ImportError until the test ends (whether
    or not the real one is installed)."""
    monkeypatch.setitem(sys.modules, "nvidia.nvimgcodec", None)
    parent = sys.modules.get("nvidia")
    if parent is not None and hasattr(parent, "nvimgcodec"):
        monkeypatch.delattr(parent, "nvimgcodec")
