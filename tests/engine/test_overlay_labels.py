"""Labels and legends of concept overlays: a band of the label's colour where it is asked
for, moved inside the image when it would leave it."""

from __future__ import annotations

import numpy as np
from PIL import Image

from sam2serve.engine.overlay import draw_labels, draw_legend

GREEN = np.array([0.0, 255.0, 0.0])


def green_pixels(image: Image.Image) -> np.ndarray:
    pixels = np.asarray(image)
    return (pixels[..., 0] == 0) & (pixels[..., 1] == 255) & (pixels[..., 2] == 0)


def test_a_label_is_a_band_of_its_colour_at_its_corner():
    image = Image.new("RGB", (200, 100), (128, 128, 128))
    draw_labels(image, [((50, 40), "cat 0.93", GREEN)])
    rows, cols = np.nonzero(green_pixels(image))
    assert (rows.min(), cols.min()) == (40, 50)
    assert cols.max() > 60 and rows.max() > 44  # the text's width and height


def test_a_label_past_the_edge_is_moved_inside():
    image = Image.new("RGB", (200, 100), (128, 128, 128))
    draw_labels(image, [((195, 98), "dog 0.5", GREEN)])
    rows, cols = np.nonzero(green_pixels(image))
    assert rows.max() == 99 and cols.max() == 199 and cols.min() < 190


def test_a_legend_stacks_its_rows_in_the_bottom_left_corner():
    image = Image.new("RGB", (200, 100), (128, 128, 128))
    draw_legend(image, [("cat: 3", GREEN), ("dog: 1", np.array([0.0, 0.0, 255.0]))])
    green_rows, green_cols = np.nonzero(green_pixels(image))
    blue = np.all(np.asarray(image) == (0, 0, 255), axis=-1)
    blue_rows, _ = np.nonzero(blue)
    assert green_cols.min() == 0 and blue_rows.max() >= 90  # the last row at the bottom
    assert green_rows.max() < blue_rows.min()  # cat above dog
