"""Backend ``onnxruntime`` for tracking: the VideoPredictor with its model calls answered by
the video graphs of ``sam2serve export --format onnx --video`` (:mod:`.onnx_video`).

The VideoPredictor keeps everything it keeps with the eager model (prompts, memory
selection, the memory bank, batching of objects with the same bank); only its five model
calls change: the frame encoder, conditioning without memory (the frame encoder's
``image_embed``), memory attention, the SAM heads and the memory encoder each run one
ONNX Runtime session. Mask prompts (``add_mask``) have no graph: they are refused, named.
Everything runs in float32 (the export is mode ``fast``); the memories the memory encoder
graph gives hold bfloat16 values, which the predictor stores as bfloat16, as with eager.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from sam2serve.checkpoint import WeightsInfo
from sam2serve.config import get_config
from sam2serve.engine.video.predictor import VideoPredictor, VideoPromptError
from sam2serve.modeling.prompt_encoder import points_or_padding
from sam2serve.modeling.sam2_video import (
    FrameFeatures,
    HeadsOutput,
    ObjectPointers,
    SpatialMemory,
    resize_mask,
)
from sam2serve.runtime.backends.onnxruntime import open_session
from sam2serve.runtime.spec import RuntimeSpec, WeightsSource

if TYPE_CHECKING:
    from sam2serve.runtime.trackers import TrackerBuilder

__all__ = ["OrtVideoModel", "load_onnx_video_predictor"]


@dataclass
class OrtFrameFeatures(FrameFeatures):
    """A frame's features from ``frame_encoder.onnx``, with its ``image_embed`` (the
    features plus no_mem_embed, which only the graph holds)."""

    image_embed: torch.Tensor


def _numpy(tensor: torch.Tensor) -> np.ndarray:
    return tensor.detach().to("cpu", torch.float32).contiguous().numpy()


class OrtVideoModel:
    """The :class:`~sam2serve.engine.video.model.VideoModel` of the four video graphs'
    sessions: what VideoPredictor calls on a SAM2Video, run by ONNX Runtime."""

    # memory_attention.onnx takes one bank for its B objects (one temporal slot per
    # memory): objects whose banks differ run in separate calls.
    per_object_banks = False

    def __init__(
        self, manifest: dict[str, Any], sessions: dict[str, Any], device: torch.device
    ) -> None:
        from sam2serve.runtime.onnx_video import (
            FRAME_ENCODER_ONNX,
            MEMORY_ATTENTION_ONNX,
            MEMORY_ENCODER_ONNX,
            VIDEO_DECODER_ONNX,
        )

        config = get_config(manifest["model"])
        self.config = config
        self.video_config = config.video
        self.image_size = config.image_size
        self.device = device
        self.frame_encoder = sessions[FRAME_ENCODER_ONNX]
        self.memory_attention = sessions[MEMORY_ATTENTION_ONNX]
        self.decoder = sessions[VIDEO_DECODER_ONNX]
        self.memory_encoder = sessions[MEMORY_ENCODER_ONNX]
        info = manifest["weights"]
        self.weights_info = WeightsInfo(
            info["source"], path=info.get("path"), seed=info.get("seed")
        )

    def _tensor(self, array: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(array).to(self.device)

    def encode_frames(
        self, images: torch.Tensor, autocast_dtype: torch.dtype | None = None
    ) -> OrtFrameFeatures:
        """A normalised frame (1, 3, 1024, 1024) -> its features (the graph is float32;
        ``autocast_dtype`` must be None)."""
        if images.shape[0] != 1 or autocast_dtype is not None:
            raise ValueError("frame_encoder.onnx encodes one frame at a time, in float32")
        vision_feats, image_embed, s0, s1 = (
            self._tensor(a) for a in self.frame_encoder.run(None, {"image": _numpy(images)})
        )
        # vision_pos: the sine encoding is a constant inside memory_attention.onnx.
        return OrtFrameFeatures(vision_feats, torch.empty(0), (s0, s1), image_embed)

    def condition_without_memory(self, frame: FrameFeatures) -> torch.Tensor:
        assert isinstance(frame, OrtFrameFeatures)
        return frame.image_embed

    def memory_position(self, device: torch.device) -> torch.Tensor:
        """A constant inside memory_attention.onnx: nothing to pass."""
        return torch.empty(0)

    def use_multimask(self, is_init_cond_frame: bool, num_points: int) -> bool:
        return self.video_config.use_multimask(is_init_cond_frame, num_points)

    def condition_on_memory(
        self,
        frame: FrameFeatures,
        batch: int,
        memories: list[SpatialMemory],
        memory_pos: torch.Tensor,
        pointers: ObjectPointers | None,
        autocast_dtype: torch.dtype | None = None,
        static_bank: tuple[int, int] | None = None,
    ) -> torch.Tensor:
        if static_bank is not None:  # the graphs take the bank as it is (never compiled)
            raise ValueError("the onnxruntime tracker takes no padded (static) memory bank")
        features = torch.stack([memory.features for memory in memories], dim=1)
        if pointers is not None and pointers.distances:
            obj_ptrs = _numpy(pointers.pointers.permute(1, 0, 2))
            distances = torch.tensor(pointers.distances) / pointers.max_distance
            tpos = _numpy(distances)
        else:
            obj_ptrs = np.zeros((batch, 0, self.config.d_model), np.float32)
            tpos = np.zeros(0, np.float32)
        (out,) = self.memory_attention.run(
            None,
            {
                "vision_feats": _numpy(frame.vision_feats),
                "memory_features": _numpy(features),
                "memory_tpos_index": np.array([m.tpos_index for m in memories], np.int64),
                "obj_ptrs": obj_ptrs,
                "obj_ptr_tpos": tpos,
            },
        )
        return self._tensor(out)

    def forward_heads(
        self,
        pix_feat: torch.Tensor,
        high_res_feats: tuple[torch.Tensor, torch.Tensor],
        point_coords: torch.Tensor | None,
        point_labels: torch.Tensor | None,
        mask_input: torch.Tensor | None,
        multimask_output: bool,
    ) -> HeadsOutput:
        """SAM2Video.forward_heads through video_decoder.onnx."""
        point_coords, point_labels = points_or_padding(
            point_coords, point_labels, pix_feat.shape[0], pix_feat.device
        )
        side = self.image_size // 4
        if mask_input is None:
            masks = np.zeros((1, 1, side, side), np.float32)
            has_mask = np.zeros(1, np.float32)
        else:
            masks = _numpy(resize_mask(mask_input, (side, side)))
            has_mask = np.ones(masks.shape[0], np.float32)
        _, low_res, obj_ptr, score = self.decoder.run(
            None,
            {
                "image_embed": _numpy(pix_feat),
                "high_res_feats_0": _numpy(high_res_feats[0]),
                "high_res_feats_1": _numpy(high_res_feats[1]),
                "point_coords": _numpy(point_coords),
                "point_labels": _numpy(point_labels),
                "mask_input": masks,
                "has_mask_input": has_mask,
                "multimask_output": np.array(multimask_output),
                # The masks at the video's size are the predictor's to make: the smallest.
                "orig_im_size": np.array([1, 1], np.int64),
            },
        )
        return HeadsOutput(self._tensor(low_res), self._tensor(obj_ptr), self._tensor(score))

    def mask_as_output(self, frame: FrameFeatures, batch: int, masks: torch.Tensor) -> HeadsOutput:
        raise VideoPromptError(
            "mask prompts have no ONNX graph: track with backend eager to prompt with a mask"
        )

    def encode_memory(
        self,
        frame: FrameFeatures,
        low_res_masks: torch.Tensor,
        object_score_logits: torch.Tensor,
        from_points: bool,
    ) -> torch.Tensor:
        (memory,) = self.memory_encoder.run(
            None,
            {
                "vision_feats": _numpy(frame.vision_feats),
                "low_res_masks": _numpy(low_res_masks),
                "object_score_logits": _numpy(object_score_logits),
                "mask_from_points": np.array(from_points),
            },
        )
        return self._tensor(memory)


def load_onnx_video_predictor(
    spec: RuntimeSpec, weights: WeightsSource, *, feature_cache_frames: int = 2
) -> VideoPredictor:
    """Tracker ``onnxruntime``: a VideoPredictor running the video graphs in the export
    directory ``weights.artifacts`` (an export with ``--video``), after the manifest is
    checked (every mismatch named)."""
    from sam2serve.runtime.onnx_export import (
        OnnxArtifactError,
        open_onnx_export,
    )
    from sam2serve.runtime.onnx_video import VIDEO_GRAPHS

    if weights.artifacts is None:
        raise ValueError("backend onnxruntime tracks with an ONNX export: give its directory")
    directory = Path(weights.artifacts)
    manifest = open_onnx_export(directory, spec.model, spec.mode)
    if manifest.get("video") is None:
        raise OnnxArtifactError(
            f"ONNX export in {str(directory)!r} has no video graphs: export it with --video "
            "to track with backend onnxruntime"
        )
    sessions = {
        name: open_session(directory / name, spec.device, spec.threads) for name in VIDEO_GRAPHS
    }
    device = torch.device(spec.device)
    model = OrtVideoModel(manifest, sessions, device)
    return VideoPredictor(
        model,
        feature_cache_frames=feature_cache_frames,
        runtime=spec.replace(dtype="float32"),
    )


if TYPE_CHECKING:  # the registered builder, checked against the protocol
    _ONNX: TrackerBuilder = load_onnx_video_predictor
