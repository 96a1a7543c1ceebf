"""Bundled sample photographs for a first run: ``sam2serve run ... samples``.

Four real RGB photos that scikit-image ships inside its own package, so they load offline
(no pooch, no download): an astronaut, a cup of coffee, a cat and a rocket.
"""

from __future__ import annotations

import numpy as np

__all__ = ["SAMPLE_NAMES", "load_sample", "load_samples"]

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
