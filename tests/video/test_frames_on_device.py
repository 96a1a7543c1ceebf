"""Frames on the device (issue 28 item 2): the uint8 frame crosses once and is resized
and normalised where the model runs, with Pillow's bytes; the host keeps uint8 only."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from sam2serve.engine.image import to_device
from sam2serve.engine.video import frames as frames_module
from sam2serve.engine.video.frames import (
    normalise,
    pillow_order_known,
    preprocess_frame,
    resize_like_pil,
)
from sam2serve.engine.video.sources import ArrayFrames, LiveFrames
from sam2serve.runtime.sync_guard import SyncGuard

# (height, width, side): up- and downscales, one side equal, 1080p and 4K-wide shapes.
SIZES = [
    (48, 64, 1024),
    (240, 320, 1024),
    (1080, 1920, 1024),
    (37, 1500, 256),
    (300, 451, 1024),
    (408, 409, 270),
    (1024, 2048, 1024),
    (500, 500, 1024),
    (2000, 2000, 512),
    (7, 9, 16),
]


def random_frame(height: int, width: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)


@pytest.mark.parametrize(("height", "width", "side"), SIZES)
def test_torch_resize_is_pillows_bytes(height, width, side):
    frame = random_frame(height, width)
    expected = np.asarray(Image.fromarray(frame).resize((side, side)))
    got = resize_like_pil(torch.from_numpy(frame).permute(2, 0, 1), side)
    assert got.dtype == torch.uint8
    np.testing.assert_array_equal(got.permute(1, 2, 0).numpy(), expected)


def test_pillow_order_rule_holds_on_random_sizes():
    """Every size the rule sends to the device kernel is Pillow's bytes."""
    rng = np.random.default_rng(3)
    checked = 0
    for _ in range(60):
        height, width, side = (int(v) for v in rng.integers(4, 300, 3))
        if not pillow_order_known(height, width):
            continue
        frame = random_frame(height, width, seed=checked)
        expected = np.asarray(Image.fromarray(frame).resize((side, side)))
        got = resize_like_pil(torch.from_numpy(frame).permute(2, 0, 1), side)
        np.testing.assert_array_equal(got.permute(1, 2, 0).numpy(), expected)
        checked += 1
    assert checked >= 20


def test_device_path_equals_the_pillow_path_exactly():
    """The device path's numbers (run here on the CPU) are the CPU path's, bit for bit,
    which is Meta's: PIL resize, /255, (x - mean) / std in float32."""
    frame = random_frame(240, 320)
    on_device = normalise(
        resize_like_pil(to_device(frame, torch.device("cpu")).permute(2, 0, 1), 1024)
    )
    reference = preprocess_frame(frame, 1024)
    resized = np.asarray(Image.fromarray(frame).resize((1024, 1024)))
    meta = torch.from_numpy(resized / 255.0).permute(2, 0, 1).to(torch.float32)
    mean = torch.tensor([0.485, 0.456, 0.406])[:, None, None]
    std = torch.tensor([0.229, 0.224, 0.225])[:, None, None]
    assert torch.equal(on_device, reference)
    assert torch.equal(reference, (meta - mean) / std)


@pytest.mark.parametrize(
    ("height", "width", "on_device"), [(240, 320, True), (320, 240, False), (100, 100, True)]
)
def test_dispatch_resizes_on_the_device_unless_pillows_order_is_unknown(
    monkeypatch, height, width, on_device
):
    """On a device (here 'meta': shapes only) the frame crosses as uint8 and is resized
    there; a tall frame whose height shrinks is resized by Pillow on the host first."""
    calls = []
    real = frames_module.resize_like_pil

    def spy(pixels, size):
        calls.append((pixels.device.type, pixels.dtype))
        return real(pixels, size)

    monkeypatch.setattr(frames_module, "resize_like_pil", spy)
    out = preprocess_frame(random_frame(height, width), 64, "meta", torch.bfloat16)
    assert out.device.type == "meta" and out.dtype == torch.bfloat16
    assert out.shape == (3, 64, 64)
    assert calls == ([("meta", torch.uint8)] if on_device else [])


def test_the_frame_step_preprocessing_asks_for_no_host_value():
    frame = random_frame(48, 64)
    with SyncGuard(device="cpu") as guard:
        pixels = to_device(frame, torch.device("cpu")).permute(2, 0, 1)
        normalise(resize_like_pil(pixels, 128))
    assert guard.syncs == []


def test_the_frame_stores_hold_uint8_only():
    frames = [random_frame(24, 32, seed=i) for i in range(3)]
    held = ArrayFrames(frames)
    live = LiveFrames(24, 32, keep=2)
    for frame in frames:
        live.append(frame)
        preprocess_frame(frame, 64)  # the float frame is the model's input, not stored
    for source in (held, live):
        for index in range(len(source) - source.held_frames(), len(source)):
            assert source.frame(index).dtype == np.uint8
    # uint8 bytes only, and the live source stays bounded to its newest frames.
    assert held.held_bytes() == sum(frame.nbytes for frame in frames) == 3 * 24 * 32 * 3
    assert live.held_bytes() == 2 * 24 * 32 * 3
