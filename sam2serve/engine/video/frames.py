"""Video frames -> the model's input, exactly as Meta's video predictor prepares them.

Meta's SAM2VideoPredictor resizes each frame with PIL (``Image.resize`` to 1024x1024, its
default filter) and normalises in float32 after a float64 division by 255; its image
predictor resizes with torch instead, so the two paths are not interchangeable and the
video path follows the video predictor. Frames are kept as the caller's uint8 arrays and
converted when their features are computed: a 1024x1024 float frame is 12 MB, a 480p
uint8 frame 0.9 MB.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from PIL import Image

from sam2serve.engine.image import IMAGENET_MEAN, IMAGENET_STD


class FrameError(ValueError):
    """Frames that cannot be tracked; the message names the bad frame."""


def check_frames(frames: Sequence[np.ndarray]) -> tuple[int, int]:
    """(height, width) shared by all frames; uint8 (H, W, 3) arrays, at least one."""
    if len(frames) == 0:
        raise FrameError("a video needs at least one frame")
    size: tuple[int, int] | None = None
    for index, frame in enumerate(frames):
        if not isinstance(frame, np.ndarray) or frame.dtype != np.uint8:
            kind = getattr(frame, "dtype", type(frame).__name__)
            raise FrameError(f"frame {index} must be a uint8 numpy array, got {kind}")
        if frame.ndim != 3 or frame.shape[2] != 3 or 0 in frame.shape:
            raise FrameError(f"frame {index} must have shape (H, W, 3), got {frame.shape}")
        if size is None:
            size = frame.shape[:2]
        elif frame.shape[:2] != size:
            raise FrameError(
                f"frame {index} is {frame.shape[1]}x{frame.shape[0]}, "
                f"frame 0 is {size[1]}x{size[0]}: all frames must have one size"
            )
    assert size is not None
    return int(size[0]), int(size[1])


def preprocess_frame(frame: np.ndarray, image_size: int) -> torch.Tensor:
    """uint8 (H, W, 3) -> normalised float32 (3, image_size, image_size)."""
    resized = np.asarray(Image.fromarray(frame).resize((image_size, image_size)))
    pixels = torch.from_numpy(resized / 255.0).permute(2, 0, 1).to(torch.float32)
    mean = torch.tensor(IMAGENET_MEAN, dtype=torch.float32)[:, None, None]
    std = torch.tensor(IMAGENET_STD, dtype=torch.float32)[:, None, None]
    return (pixels - mean) / std
