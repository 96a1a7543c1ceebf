"""Brush RLE: a hand-computed stream, and round trips through a decoder written from the
format's description (Label Studio's own decoder: test_labelstudio_e2e.py)."""

from __future__ import annotations

import numpy as np
import pytest
from support import decode_brush

from sam2serve.labelstudio.brush import mask_to_brush_rle


def test_a_two_pixel_mask_by_hand():
    # 1x2 mask [0, 1] -> 8 values 0,0,0,0,255,255,255,255: two repeat runs of 4.
    fields = [
        f"{8:032b}",  # 8 values
        "00111",  # word size 8 - 1
        "0010",  # run-length field widths 3, 4, 8, 16, each - 1
        "0011",
        "0111",
        "1111",
        "10001100000000",  # repeat, width index 0, length 4 - 1, value 0
        "10001111111111",  # repeat, width index 0, length 4 - 1, value 255
    ]
    bits = "".join(fields)
    bits += "0" * (-len(bits) % 8)
    expected = [int(bits[i : i + 8], 2) for i in range(0, len(bits), 8)]
    assert mask_to_brush_rle(np.array([[False, True]])) == expected


@pytest.mark.parametrize(
    "name",
    ["empty", "full", "noise", "rectangle", "long-runs", "one-pixel", "column"],
)
def test_round_trip(name):
    rng = np.random.default_rng(3)
    masks = {
        "empty": np.zeros((40, 30), bool),
        "full": np.ones((40, 30), bool),
        "noise": rng.random((37, 53)) > 0.5,
        "rectangle": np.pad(np.ones((20, 40), bool), ((10, 30), (25, 5))),
        # runs past the widest field (65536 values = 16384 pixels) are split
        "long-runs": np.pad(np.ones((300, 200), bool), ((0, 1), (0, 0))),
        "one-pixel": np.ones((1, 1), bool),
        "column": rng.random((500, 1)) > 0.3,
    }
    mask = masks[name]
    rle = mask_to_brush_rle(mask)
    assert all(isinstance(b, int) and 0 <= b < 256 for b in rle)
    np.testing.assert_array_equal(decode_brush(rle, *mask.shape), mask)


def test_any_nonzero_value_is_the_region():
    mask = np.array([[0, 3], [255, 0]], dtype=np.uint8)
    np.testing.assert_array_equal(decode_brush(mask_to_brush_rle(mask), 2, 2), mask > 0)


def test_only_2d_masks():
    with pytest.raises(ValueError, match="2-D"):
        mask_to_brush_rle(np.zeros((2, 2, 4)))
