"""Bundled sample photographs for a first run: ``sam2serve run ... samples``.

Four real RGB photos that scikit-image ships inside its own package, so they load offline
(no pooch, no download): an astronaut, a cup of coffee, a cat and a rocket.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["SAMPLE_NAMES", "load_sample", "load_samples", "sample_clip", "sample_clip_prompts"]

# Each name is the skimage.data function that returns the photo (uint8 RGB, H x W x 3).
SAMPLE_NAMES: tuple[str, ...] = ("astronaut", "coffee", "chelsea", "rocket")


def load_sample(name: str) -> np.ndarray:
    """The sample photo ``name`` as a uint8 RGB (H, W, 3) array."""
    if name not in SAMPLE_NAMES:
        raise ValueError(f"unknown sample {name!r}; expected one of {', '.join(SAMPLE_NAMES)}")
    import skimage.data  # imported here: scikit-image is slow to import and rarely needed

    image = np.ascontiguousarray(getattr(skimage.data, name)())
    if image.dtype != np.uint8 or image.ndim != 3 or image.shape[2] != 3:
        raise RuntimeError(  # only if scikit-image changed what it ships
            f"skimage.data.{name}() returned {image.dtype} {image.shape}, not uint8 RGB"
        )
    return image


def load_samples() -> dict[str, np.ndarray]:
    """Every sample photo, by name, in a fixed order."""
    return {name: load_sample(name) for name in SAMPLE_NAMES}


def sample_clip(
    num_frames: int = 8, size: tuple[int, int] = (240, 320)
) -> tuple[list[np.ndarray], dict[int, list[np.ndarray]]]:
    """A synthetic clip made offline: ``num_frames`` uint8 (H, W, 3) frames of ``size``
    (height, width) - a red disc moving right and growing, a blue square moving left and
    passing in front of it - over the coffee photograph, and each object's true mask per
    frame ({1: disc masks, 2: square masks}, bool (H, W)). Deterministic."""
    if num_frames < 1:
        raise ValueError(f"a clip needs at least one frame, got num_frames={num_frames}")
    height, width = size
    if height < 32 or width < 32:
        raise ValueError(f"clip frames must be at least 32x32, got {width}x{height}")
    from PIL import Image

    background = Image.fromarray(load_sample("coffee")).resize((width, height))
    base = (np.asarray(background, dtype=np.float32) * 0.6).astype(np.uint8)
    rows, cols = np.mgrid[0:height, 0:width]
    frames: list[np.ndarray] = []
    truth: dict[int, list[np.ndarray]] = {1: [], 2: []}
    for i in range(num_frames):
        t = i / max(num_frames - 1, 1)
        frame = base.copy()
        cy, cx = height * 0.5, width * (0.2 + 0.5 * t)
        radius = min(height, width) * (0.12 + 0.06 * t)
        disc = (rows - cy) ** 2 + (cols - cx) ** 2 <= radius**2
        half = min(height, width) * 0.13
        sy, sx = height * (0.35 + 0.3 * t), width * (0.8 - 0.5 * t)
        square = (np.abs(rows - sy) <= half) & (np.abs(cols - sx) <= half)
        frame[disc] = (220, 40, 40)
        frame[square] = (40, 70, 220)  # drawn last: the square occludes the disc
        frames.append(frame)
        truth[1].append(disc & ~square)
        truth[2].append(square)
    return frames, truth


def sample_clip_prompts(
    truth: dict[int, list[np.ndarray]], frame: int = 0
) -> dict[int, dict[str, list[Any] | None]]:
    """The sample clip's prompts on ``frame``, from its true masks: a click at the centre of
    the disc (object 1) and a box around the square (object 2), as
    ``{obj_id: {"points": [[x, y]], "labels": [1], "box": [x0, y0, x1, y1] or None}}``."""
    rows, cols = np.nonzero(truth[1][frame])
    click = [[float(cols.mean()), float(rows.mean())]]
    rows, cols = np.nonzero(truth[2][frame])
    box = [float(cols.min()), float(rows.min()), float(cols.max() + 1), float(rows.max() + 1)]
    return {
        1: {"points": click, "labels": [1], "box": None},
        2: {"points": [], "labels": [], "box": box},
    }
