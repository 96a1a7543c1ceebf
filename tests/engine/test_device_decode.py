"""Device image decode (engine.device_decode) and the choice of decoder
(engine.decode_choice), on the CPU with a fake nvImageCodec (tests/fake_nvimgcodec.py)
that decodes with Pillow: equal pixels to the host path on real photos, EXIF
orientations, the pixel limit before any device work, and every fallback to the host."""

from __future__ import annotations

import io

import fake_nvimgcodec
import numpy as np
import pytest
import torch
from PIL import Image

from sam2serve.engine import decode_choice, device_decode
from sam2serve.engine.decode_choice import (
    HostImageDecoder,
    ImageDecodeUnavailable,
    check_device_decode,
    image_decoder,
)
from sam2serve.engine.device_decode import DeviceImageDecoder, orient
from sam2serve.engine.image import ImageError, load_image, preprocess

PHOTOS = ("astronaut", "chelsea", "coffee")


def photo(name: str) -> np.ndarray:
    import skimage.data

    return np.ascontiguousarray(getattr(skimage.data, name)())


def encoded(
    pixels: np.ndarray | Image.Image, fmt: str = "JPEG", orientation: int | None = None, **kw
) -> bytes:
    image = pixels if isinstance(pixels, Image.Image) else Image.fromarray(pixels)
    if fmt == "JPEG" and image.mode not in ("RGB", "L", "CMYK"):
        image = image.convert("RGB")
    if orientation is not None:
        exif = Image.Exif()
        exif[0x0112] = orientation
        kw["exif"] = exif.tobytes()
    buffer = io.BytesIO()
    image.save(buffer, format=fmt, **kw)
    return buffer.getvalue()


def adobe_rgb_jpeg() -> bytes:
    """A JPEG whose Adobe marker says its channels are RGB (transform 0), not YCbCr."""
    data = encoded(photo("coffee"))
    marker = b"\xff\xee\x00\x0eAdobe\x00\x64\x00\x00\x00\x00\x00"
    return data[:2] + marker + data[2:]


@pytest.fixture
def fake(monkeypatch):
    return fake_nvimgcodec.install(monkeypatch)


@pytest.fixture
def decoder(fake) -> DeviceImageDecoder:
    return DeviceImageDecoder("cpu", module=fake)


def as_array(pixels) -> np.ndarray:
    return pixels.numpy() if isinstance(pixels, torch.Tensor) else pixels


# --------------------------------------------------------------------------- the device path


@pytest.mark.parametrize("name", PHOTOS)
def test_jpeg_photos_decode_on_the_device_equal_to_the_host(decoder, fake, name):
    data = encoded(photo(name), quality=90)
    pixels = decoder.decode(data, max_pixels=None)
    assert isinstance(pixels, torch.Tensor) and pixels.dtype == torch.uint8
    assert pixels.is_contiguous()
    np.testing.assert_array_equal(pixels.numpy(), load_image(data))
    assert decoder.counts == {"device": 1}
    params = fake.calls[-1]
    # Pillow's reading of the orientation is applied, not the decoder's.
    assert params.apply_exif_orientation is False
    assert params.sample_format is fake.SampleFormat.I_RGB
    assert ":fancy_upsampling=1" in fake.decoders[-1].options
    kinds = {backend.backend_kind for backend in fake.decoders[-1].backends}
    assert fake.BackendKind.CPU_ONLY not in kinds  # never a quiet host decode


@pytest.mark.parametrize("orientation", range(1, 9))
def test_exif_orientations_match_the_host(decoder, orientation):
    pixels = photo("astronaut")[::4, ::3]  # 128 x 171: not square, so turns show
    data = encoded(np.ascontiguousarray(pixels), orientation=orientation, quality=95)
    host = load_image(data)
    device = decoder.decode(data, max_pixels=None)
    assert isinstance(device, torch.Tensor)
    assert device.shape == host.shape
    np.testing.assert_array_equal(device.numpy(), host)
    if orientation in (5, 6, 7, 8):
        assert host.shape[:2] == (pixels.shape[1], pixels.shape[0])


def test_orient_is_pillows_exif_transpose():
    rng = np.random.default_rng(0)
    pixels = rng.integers(0, 256, (5, 7, 3), dtype=np.uint8)
    for orientation in range(10):  # 0 and 9: not orientations, left alone as Pillow does
        image = Image.fromarray(pixels)
        exif = image.getexif()
        exif[0x0112] = orientation
        buffer = io.BytesIO()
        image.save(buffer, format="PNG", exif=exif.tobytes())
        expected = load_image(buffer.getvalue())
        got = orient(torch.from_numpy(pixels), orientation).numpy()
        np.testing.assert_array_equal(got, expected, err_msg=f"orientation {orientation}")


def test_device_pixels_preprocess_like_host_pixels(decoder):
    data = encoded(photo("coffee"), quality=90)
    on_device, on_host = decoder.decode(data, None), load_image(data)
    assert isinstance(on_device, torch.Tensor)
    torch.testing.assert_close(
        preprocess([on_device], 64), preprocess([on_host], 64), rtol=0, atol=0
    )


# --------------------------------------------------------------------------- limits first


def test_the_pixel_limit_is_checked_before_the_device_decodes(decoder, fake):
    data = encoded(photo("chelsea"))  # 451 x 300
    with pytest.raises(ImageError) as device_error:
        decoder.decode(data, max_pixels=100_000)
    assert fake.calls == []  # refused from the header: nothing decoded, nothing allocated
    with pytest.raises(ImageError) as host_error:
        load_image(data, max_pixels=100_000)
    assert str(device_error.value) == str(host_error.value)
    assert "more than the limit of 100000" in str(device_error.value)


def test_a_bomb_header_is_refused_without_any_decode(decoder, fake):
    # A JPEG header claiming 8000 x 8000 pixels over a few hundred bytes.
    data = bytearray(encoded(np.zeros((8, 8, 3), np.uint8)))
    sof = data.index(b"\xff\xc0")
    data[sof + 5 : sof + 9] = (8000).to_bytes(2, "big") * 2
    with pytest.raises(ImageError, match="8000x8000 = 64000000 pixels, more than the limit"):
        decoder.decode(bytes(data), max_pixels=40_000_000)
    assert fake.calls == []


# --------------------------------------------------------------------------- fallbacks


@pytest.mark.parametrize(
    ("make", "why"),
    [
        (lambda: encoded(photo("coffee"), "PNG"), "host: PNG RGB"),
        (lambda: encoded(photo("camera"), "JPEG"), "host: JPEG L"),  # greyscale
        (
            lambda: encoded(Image.fromarray(photo("coffee")).convert("CMYK"), "JPEG"),
            "host: JPEG CMYK",
        ),
        (lambda: encoded(photo("coffee"), "WEBP"), "host: WEBP RGB"),
        (
            lambda: encoded(
                np.dstack([photo("coffee"), np.full(photo("coffee").shape[:2], 9, np.uint8)]),
                "PNG",
            ),
            "host: PNG RGBA",
        ),
        (adobe_rgb_jpeg, "host: JPEG of RGB channels (Adobe)"),
    ],
    ids=["png", "grey-jpeg", "cmyk-jpeg", "webp", "rgba-png", "adobe-rgb-jpeg"],
)
def test_other_formats_and_modes_decode_on_the_host(decoder, fake, make, why):
    data = make()
    pixels = decoder.decode(data, max_pixels=None)
    assert isinstance(pixels, np.ndarray)
    np.testing.assert_array_equal(pixels, load_image(data))
    assert fake.calls == []
    assert decoder.counts == {why: 1}


@pytest.mark.parametrize(
    ("behaviour", "why"),
    [
        ("raise", "host: device error RuntimeError"),
        ("none", "host: device could not decode it"),
        ("wrong_size", "host: device could not decode it"),
    ],
)
def test_a_failed_device_decode_falls_back_to_the_host(decoder, fake, behaviour, why):
    fake.behaviour = behaviour
    data = encoded(photo("chelsea"))
    pixels = decoder.decode(data, max_pixels=None)
    assert isinstance(pixels, np.ndarray)
    np.testing.assert_array_equal(pixels, load_image(data))
    assert len(fake.calls) == 1 and decoder.counts == {why: 1}


def test_a_truncated_jpeg_gets_the_host_paths_error(decoder, fake):
    data = encoded(photo("chelsea"))[:600]
    with pytest.raises(ImageError) as device_error:
        decoder.decode(data, max_pixels=None)
    with pytest.raises(ImageError) as host_error:
        load_image(data)
    assert str(device_error.value) == str(host_error.value)


def test_bytes_that_are_no_image_get_the_host_paths_error(decoder, fake):
    with pytest.raises(ImageError, match="not a readable image"):
        decoder.decode(b"GIF89a but not really", max_pixels=None)
    assert fake.calls == []


# --------------------------------------------------------------------------- the choice


def test_host_is_pillow_everywhere():
    host = image_decoder("host", "cpu")
    assert isinstance(host, HostImageDecoder) and host.where == "host"
    data = encoded(photo("chelsea"))
    np.testing.assert_array_equal(host.decode(data, None), load_image(data))


def test_auto_on_the_cpu_decodes_on_the_host_and_says_why(fake):
    chosen = image_decoder("auto", "cpu")
    assert chosen.where == "host"
    assert "CUDA device" in chosen.describe() and "cpu" in chosen.describe()


def test_device_on_the_cpu_is_an_error_naming_what_is_missing(fake):
    with pytest.raises(ImageDecodeUnavailable, match="needs a CUDA device .*runs on cpu"):
        image_decoder("device", "cpu")
    with pytest.raises(ImageDecodeUnavailable, match="CUDA device"):
        check_device_decode("device", "cpu")
    check_device_decode("auto", "cpu")  # no error: auto falls back
    check_device_decode("host", "cpu")


def test_device_without_the_package_names_it(monkeypatch):
    fake_nvimgcodec.uninstall(monkeypatch)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with pytest.raises(ImageDecodeUnavailable) as error:
        image_decoder("device", "cuda")
    assert "nvImageCodec" in str(error.value) and "sam2serve[gpu-decode]" in str(error.value)
    assert image_decoder("auto", "cuda").where == "host"


def test_device_without_a_gpu_says_so(monkeypatch, fake):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ImageDecodeUnavailable, match="GPU that torch sees"):
        image_decoder("device", "cuda:0")


@pytest.fixture
def cuda_with_fake(monkeypatch, fake):
    """A machine where CUDA and nvImageCodec seem present: the decoder is the fake's, on
    the CPU."""
    monkeypatch.setattr(device_decode, "unavailable_reason", lambda device: None)
    monkeypatch.setattr(
        device_decode, "DeviceImageDecoder", lambda device: DeviceImageDecoder("cpu", module=fake)
    )
    return fake


def test_auto_and_device_choose_the_device_where_it_works(cuda_with_fake):
    for choice in ("auto", "device"):
        chosen = image_decoder(choice, "cuda")
        assert chosen.where == "device" and "nvImageCodec 0.0.0-fake" in chosen.describe()
    assert len(cuda_with_fake.calls) == 2  # each tested with one small JPEG at start-up


def test_a_device_that_fails_its_test_decode_is_not_chosen(cuda_with_fake):
    cuda_with_fake.behaviour = "none"
    assert image_decoder("auto", "cuda").where == "host"
    with pytest.raises(ImageDecodeUnavailable, match="GPU decoder for JPEG"):
        image_decoder("device", "cuda")
    cuda_with_fake.behaviour = "raise"
    with pytest.raises(ImageDecodeUnavailable, match="test JPEG failed"):
        image_decoder("device", "cuda")


def test_an_unknown_choice_is_a_value_error_naming_it():
    with pytest.raises(ValueError, match="auto, host, device.*'gpu'"):
        image_decoder("gpu", "cpu")
    assert decode_choice.IMAGE_DECODES == ("auto", "host", "device")


def test_the_choice_imports_without_torch_or_nvimgcodec():
    # The service's settings import the choice: they stay torch-free, and nothing of
    # nvImageCodec is imported before a decoder is asked for.
    import subprocess
    import sys

    code = (
        "import sys; sys.modules['nvidia.nvimgcodec'] = None\n"
        "import sam2serve.server.settings_groups, sam2serve.engine.decode_choice\n"
        "assert 'torch' not in sys.modules, 'torch imported'\n"
    )
    done = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
