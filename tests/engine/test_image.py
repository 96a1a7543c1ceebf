"""load_image and preprocess: real photos, every input kind, errors, and fidelity to
Meta's SAM2Transforms (run through the test-only torchvision shim when needed)."""

from __future__ import annotations

import io
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
import skimage.data
import torch
from PIL import Image
from reference import import_reference

from sam2serve.engine.image import (
    DEFAULT_MAX_PIXELS,
    IMAGENET_MEAN,
    IMAGENET_STD,
    ImageError,
    load_image,
    preprocess,
)

EXIF_ORIENTATION = 0x0112


@pytest.fixture(scope="module")
def chelsea() -> np.ndarray:
    return skimage.data.chelsea()  # 300 x 451 RGB, not square: rotations are visible


def encode(image: Image.Image, fmt: str, **options) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format=fmt, **options)
    return buffer.getvalue()


def png_chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def png_header_only(width: int, height: int) -> bytes:
    """A PNG claiming width x height (8-bit RGB) whose pixel data is a few bytes only."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    first_row = zlib.compress(b"\x00" + b"\x7f" * 30)[:-4]  # a cut-off zlib stream
    return b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", ihdr) + png_chunk(b"IDAT", first_row)


# --- decoding ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fmt", "options"),
    [("PNG", {}), ("BMP", {}), ("TIFF", {}), ("WEBP", {"lossless": True})],
)
def test_lossless_formats_round_trip_exactly(chelsea, fmt, options):
    data = encode(Image.fromarray(chelsea), fmt, **options)
    loaded = load_image(data)
    assert loaded.dtype == np.uint8 and loaded.shape == chelsea.shape
    np.testing.assert_array_equal(loaded, chelsea)


def test_jpeg_path_and_str_path(tmp_path: Path):
    photo = skimage.data.coffee()
    path = tmp_path / "coffee.jpg"
    Image.fromarray(photo).save(path, quality=95)
    for source in (path, str(path)):
        loaded = load_image(source)
        assert loaded.shape == photo.shape and loaded.dtype == np.uint8
        assert np.abs(loaded.astype(int) - photo).mean() < 3  # lossy, but the same photo


def test_pil_and_array_sources(chelsea):
    np.testing.assert_array_equal(load_image(Image.fromarray(chelsea)), chelsea)
    assert load_image(chelsea) is chelsea  # already canonical: no copy
    strided = chelsea[:, ::2]
    loaded = load_image(strided)
    assert loaded.flags.c_contiguous
    np.testing.assert_array_equal(loaded, strided)


@pytest.mark.parametrize(
    ("orientation", "expected"),
    [
        (1, lambda a: a),
        (3, lambda a: np.rot90(a, 2)),
        (6, lambda a: np.rot90(a, -1)),  # stored rotated: display turns it 90° clockwise
        (8, lambda a: np.rot90(a, 1)),
    ],
)
def test_exif_orientation_is_applied(chelsea, orientation, expected):
    exif = Image.Exif()
    exif[EXIF_ORIENTATION] = orientation
    data = encode(Image.fromarray(chelsea), "JPEG", quality=95, exif=exif.tobytes())
    loaded = load_image(data)
    want = expected(chelsea)
    assert loaded.shape == want.shape
    assert np.abs(loaded.astype(int) - want).mean() < 3
    # The photo is not symmetric: the unrotated image must be clearly different.
    if orientation == 3:
        assert np.abs(loaded.astype(int) - chelsea).mean() > 20


def test_grayscale_becomes_three_equal_channels():
    camera = skimage.data.camera()  # 512 x 512 uint8 grayscale
    for source in (encode(Image.fromarray(camera), "PNG"), camera, camera[:, :, None]):
        loaded = load_image(source)
        assert loaded.shape == (*camera.shape, 3)
        for channel in range(3):
            np.testing.assert_array_equal(loaded[:, :, channel], camera)


def test_bilevel_image():
    mask = skimage.data.horse()  # bool silhouette
    loaded = load_image(encode(Image.fromarray(mask), "PNG"))
    np.testing.assert_array_equal(loaded[:, :, 0], np.where(mask, 255, 0))
    np.testing.assert_array_equal(load_image(mask)[:, :, 1], np.where(mask, 255, 0))


def test_alpha_is_dropped_not_composited(chelsea):
    alpha = np.zeros(chelsea.shape[:2], dtype=np.uint8)  # fully transparent
    rgba = np.dstack([chelsea, alpha])
    np.testing.assert_array_equal(load_image(encode(Image.fromarray(rgba), "PNG")), chelsea)
    np.testing.assert_array_equal(load_image(rgba), chelsea)


def test_palette_with_transparency():
    palette_image = Image.fromarray(skimage.data.astronaut()).quantize(16)
    palette_image.info["transparency"] = 0
    data = encode(palette_image, "PNG", transparency=0)
    expected = np.asarray(palette_image.convert("RGB"))
    np.testing.assert_array_equal(load_image(data), expected)


def test_sixteen_bit_is_scaled_not_clipped():
    values = np.array([[0, 257, 1000, 32896], [40000, 65278, 65534, 65535]], dtype=np.uint16)
    expected = np.array([[0, 1, 4, 128], [156, 254, 255, 255]], dtype=np.uint8)
    for source in (encode(Image.fromarray(values), "PNG"), values):
        loaded = load_image(source)
        np.testing.assert_array_equal(loaded[:, :, 0], expected)
    # A real photo stored as 16 bits comes back as the 8-bit photo.
    camera = skimage.data.camera()
    camera16 = camera.astype(np.uint16) * 257
    np.testing.assert_array_equal(
        load_image(encode(Image.fromarray(camera16), "PNG"))[..., 2], camera
    )


def test_float_and_bool_arrays(chelsea):
    as_float = chelsea.astype(np.float64) / 255
    np.testing.assert_array_equal(load_image(as_float), chelsea)
    np.testing.assert_array_equal(load_image(as_float.astype(np.float32)), chelsea)
    flags = np.array([[True, False]])
    np.testing.assert_array_equal(load_image(flags)[0, :, 0], [255, 0])


# --- errors --------------------------------------------------------------------------


def test_missing_file_names_the_path(tmp_path):
    missing = tmp_path / "no_such_photo.jpg"
    with pytest.raises(ImageError, match="no_such_photo.jpg"):
        load_image(missing)
    with pytest.raises(ImageError, match="not a file"):
        load_image(tmp_path)


def test_not_an_image(tmp_path):
    path = tmp_path / "notes.png"
    path.write_text("these are not pixels")
    with pytest.raises(ImageError, match="notes.png"):
        load_image(path)
    with pytest.raises(ImageError, match="not a readable image"):
        load_image(b"GIF89a but not really")
    with pytest.raises(ImageError, match="empty"):
        load_image(b"")


@pytest.mark.parametrize("fmt", ["JPEG", "PNG"])
def test_truncated_file(chelsea, fmt):
    data = encode(Image.fromarray(chelsea), fmt)
    with pytest.raises(ImageError, match="truncated"):
        load_image(data[: len(data) // 2])


def test_pixel_limit_is_checked_from_the_header_before_decoding():
    # 12000 x 10000 = 120 MP claimed, and no pixel data. Had it been decoded we would see a
    # truncation error; the limit must trip first.
    header = png_header_only(12000, 10000)
    with (
        pytest.warns(Image.DecompressionBombWarning),  # Pillow's own warning, > 89 MP
        pytest.raises(ImageError, match=r"120000000 pixels, more than the limit"),
    ):
        load_image(header)
    with pytest.raises(ImageError, match="limit of 1000"):
        load_image(png_header_only(100, 11), max_pixels=1000)
    # Far beyond Pillow's hard limit, Pillow refuses at open: still an ImageError.
    with pytest.raises(ImageError, match="too large"):
        load_image(png_header_only(30000, 30000))


def test_pixel_limit_applies_to_every_source(chelsea):
    limit = chelsea.shape[0] * chelsea.shape[1] - 1
    for source in (chelsea, Image.fromarray(chelsea), encode(Image.fromarray(chelsea), "PNG")):
        with pytest.raises(ImageError, match="more than the limit"):
            load_image(source, max_pixels=limit)
    assert load_image(chelsea, max_pixels=None) is chelsea


def test_no_global_pillow_state_changed(chelsea):
    before = Image.MAX_IMAGE_PIXELS
    load_image(encode(Image.fromarray(chelsea), "PNG"), max_pixels=10**12)
    load_image(chelsea, max_pixels=DEFAULT_MAX_PIXELS)
    assert Image.MAX_IMAGE_PIXELS == before


@pytest.mark.parametrize(
    ("array", "message"),
    [
        (np.zeros((0, 0, 3), np.uint8), "empty"),
        (np.zeros((5, 0), np.uint8), "empty"),
        (np.zeros((4, 4, 2), np.uint8), r"shape \(4, 4, 2\)"),
        (np.zeros((2, 4, 4, 3), np.uint8), r"shape \(2, 4, 4, 3\)"),
        (np.zeros(7, np.uint8), r"shape \(7,\)"),
        (np.zeros((4, 4, 3), np.int32), "dtype int32"),
        (np.full((4, 4, 3), 255.0), r"float values in \[255, 255\]"),
        (np.full((4, 4, 3), np.nan, np.float32), "NaN"),
    ],
)
def test_bad_arrays(array, message):
    with pytest.raises(ImageError, match=message):
        load_image(array)


def test_bad_source_type():
    with pytest.raises(ImageError, match="int"):
        load_image(42)  # type: ignore[arg-type]
    assert issubclass(ImageError, ValueError)


# --- preprocess ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def meta_transforms():
    import_reference()
    from sam2.utils.transforms import SAM2Transforms

    return {size: SAM2Transforms(size, 0.0) for size in (1024, 256)}


@pytest.mark.parametrize("name", ["astronaut", "coffee", "chelsea"])
def test_preprocess_matches_meta_transforms(meta_transforms, name):
    photo = getattr(skimage.data, name)()
    ours = preprocess([photo])
    assert ours.shape == (1, 3, 1024, 1024) and ours.dtype == torch.float32
    torch.testing.assert_close(ours[0], meta_transforms[1024](photo), rtol=0, atol=1e-6)


def test_preprocess_batch_of_different_sizes(meta_transforms):
    photos = [skimage.data.astronaut(), skimage.data.chelsea(), skimage.data.coffee()]
    ours = preprocess(photos, image_size=256)
    reference = meta_transforms[256].forward_batch(photos)
    assert ours.shape == (3, 3, 256, 256)
    torch.testing.assert_close(ours, reference, rtol=0, atol=1e-6)
    # Each image is resized on its own: batching does not change any of them.
    torch.testing.assert_close(ours[1:2], preprocess([photos[1]], image_size=256))


def test_preprocess_normalises_a_constant_image_by_hand():
    grey = np.full((37, 53, 3), 128, dtype=np.uint8)
    out = preprocess([grey], image_size=16)
    for channel in range(3):
        expected = (128 / 255 - IMAGENET_MEAN[channel]) / IMAGENET_STD[channel]
        torch.testing.assert_close(
            out[0, channel], torch.full((16, 16), expected), rtol=0, atol=1e-5
        )


def test_preprocess_casts_at_the_end():
    photo = skimage.data.astronaut()
    full = preprocess([photo], image_size=64)
    half = preprocess([photo], image_size=64, dtype=torch.bfloat16)
    assert half.dtype == torch.bfloat16
    assert torch.equal(half, full.to(torch.bfloat16))


def test_preprocess_rejects_non_canonical_input():
    with pytest.raises(ImageError, match="images\\[1\\].*float64"):
        preprocess([np.zeros((4, 4, 3), np.uint8), np.zeros((4, 4, 3))])
    with pytest.raises(ImageError, match="non-empty"):
        preprocess([])
    with pytest.raises(ImageError, match="non-empty"):
        preprocess(np.zeros((4, 4, 3), np.uint8))  # type: ignore[arg-type]


def test_large_photo_is_resized_channel_by_channel_to_meta_numbers(meta_transforms):
    """Past 4 megapixels the resize runs one channel at a time (a third of the float
    memory); the numbers are Meta's transforms' all the same."""
    from sam2serve.engine import image as image_module

    photo = np.tile(skimage.data.astronaut(), (5, 4, 1))  # 2560 x 2048 = 5.2 MP
    assert photo.shape[0] * photo.shape[1] > image_module._WHOLE_IMAGE_PIXELS
    torch.testing.assert_close(
        preprocess([photo])[0], meta_transforms[1024](photo), rtol=0, atol=1e-6
    )
