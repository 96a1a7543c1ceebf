"""On a CUDA GPU with nvImageCodec installed (the gpu-decode extra): JPEG photos decoded
on the device are the host's pixels within nvJPEG's rounding, EXIF orientations included,
and the start-up choice picks the device. Marked ``cuda``: skipped where torch sees no GPU
(tests/conftest.py), run by ``scripts/gpu-check.sh --part decode``."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from PIL import Image
from skimage import data

from sam2serve.engine.decode_choice import image_decoder
from sam2serve.engine.image import load_image, preprocess

pytestmark = pytest.mark.cuda
DEVICE = "cuda"


@pytest.fixture(scope="module")
def decoder():
    pytest.importorskip("nvidia.nvimgcodec", reason="the gpu-decode extra is not installed")
    chosen = image_decoder("device", DEVICE)
    assert chosen.where == "device"
    return chosen


def jpeg(pixels: np.ndarray, orientation: int | None = None) -> bytes:
    buffer = io.BytesIO()
    extra = {}
    if orientation is not None:
        exif = Image.Exif()
        exif[0x0112] = orientation
        extra["exif"] = exif.tobytes()
    Image.fromarray(pixels).save(buffer, format="JPEG", quality=90, **extra)
    return buffer.getvalue()


@pytest.mark.parametrize("name", ["astronaut", "chelsea", "coffee"])
@pytest.mark.parametrize("orientation", [None, 3, 6, 8])
def test_device_pixels_are_the_hosts_within_rounding(decoder, name, orientation):
    encoded = jpeg(getattr(data, name)(), orientation)
    host = load_image(encoded)
    pixels = decoder.decode(encoded, None)
    assert isinstance(pixels, torch.Tensor) and pixels.is_cuda and pixels.dtype == torch.uint8
    assert tuple(pixels.shape) == host.shape
    diff = np.abs(pixels.cpu().numpy().astype(np.int16) - host.astype(np.int16))
    # scripts/decode_check.py: why these bounds (IDCT and chroma upsampling differ).
    assert diff.mean() <= 1.0 and np.percentile(diff, 99.9) <= 4, (diff.mean(), diff.max())


def test_the_encoder_input_is_close_to_the_hosts(decoder):
    encoded = jpeg(data.chelsea())
    on_device = preprocess([decoder.decode(encoded, None)], 1024, DEVICE)
    on_host = preprocess([load_image(encoded)], 1024, DEVICE)
    assert (on_device - on_host).abs().mean().item() < 0.01


def test_png_and_greyscale_stay_on_the_host(decoder):
    png = io.BytesIO()
    Image.fromarray(data.coffee()).save(png, format="PNG")
    assert isinstance(decoder.decode(png.getvalue(), None), np.ndarray)
    assert isinstance(decoder.decode(jpeg(data.camera()), None), np.ndarray)
