"""Video object tracking with SAM 2's memory: Meta's SAM2VideoPredictor semantics over a
caller-owned VideoState, its frames from a FrameSource (arrays, a file decoded on demand,
live frames) and what it keeps of tracked frames set by its retention (see docs/video.md)."""

from sam2serve.engine.video.predictor import FrameMasks, VideoPredictor, VideoPromptError
from sam2serve.engine.video.sources import ArrayFrames, FrameSource, LiveFrames, VideoFileFrames
from sam2serve.engine.video.state import VideoState

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
