"""Video object tracking with SAM 2's memory: Meta's SAM2VideoPredictor semantics over a
caller-owned VideoState, its frames from a FrameSource (arrays, a file decoded on demand,
live frames) and what it keeps of tracked frames set by its retention (see docs/video.md).

The names below load on first use: importing a torch-free submodule (``retention``, for
the command line's choices) must not import torch."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sam2serve.engine.video.predictor import FrameMasks, VideoPredictor, VideoPromptError
    from sam2serve.engine.video.sources import (
        ArrayFrames,
        FrameSource,
        LiveFrames,
        VideoFileFrames,
    )
    from sam2serve.engine.video.state import VideoState

_HOMES = {
    "ArrayFrames": "sources",
    "FrameMasks": "predictor",
    "FrameSource": "sources",
    "LiveFrames": "sources",
    "VideoFileFrames": "sources",
    "VideoPredictor": "predictor",
    "VideoPromptError": "predictor",
    "VideoState": "state",
}

__all__ = [
    "ArrayFrames",
    "FrameMasks",
    "FrameSource",
    "LiveFrames",
    "VideoFileFrames",
    "VideoPredictor",
    "VideoPromptError",
    "VideoState",
]


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_HOMES[name]}"), name)
