"""Video object tracking with SAM 2's memory: Meta's SAM2VideoPredictor semantics over a
caller-owned VideoState (see docs/video.md)."""

from sam2serve.engine.video.predictor import FrameMasks, VideoPredictor, VideoPromptError
from sam2serve.engine.video.state import VideoState

__all__ = ["FrameMasks", "VideoPredictor", "VideoPromptError", "VideoState"]
