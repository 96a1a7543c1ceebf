"""What the tracker reads from its model: the :class:`VideoModel` protocol.

:class:`~sam2serve.engine.video.predictor.VideoPredictor` and the state's memory count
(:func:`~sam2serve.engine.video.state.object_frame_bytes`) read exactly these members, and
nothing else, from the model they are given. Two models implement it: SAM 2's own
(:class:`~sam2serve.modeling.sam2_video.SAM2Video`, tracker ``eager``) and the video graphs
of an ONNX export (:class:`~sam2serve.runtime.ort_video.OrtVideoModel`, tracker
``onnxruntime``); a new tracker implements it too (tests/video/test_video_model.py checks
each, by name and signature, and tracks with each). ``weights_info`` is not read by the
engine: the surfaces record it (``sam2serve track``'s summary, the server's /healthz).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    import torch
    from torch import nn

    from sam2serve.checkpoint import WeightsInfo
    from sam2serve.config import ModelConfig, VideoConfig
    from sam2serve.modeling.mask_decoder import MaskDecoder
    from sam2serve.modeling.sam2_video import (
        FrameFeatures,
        HeadsOutput,
        ObjectPointers,
        SpatialMemory,
    )


@runtime_checkable
class VideoModel(Protocol):
    """SAM 2's tracking model as the tracker calls it (docs/architecture.md, "Video")."""

    config: ModelConfig  # d_model: the object pointer's width
    video_config: VideoConfig  # the memory rules and the memory's dtype
    image_size: int  # the square input frame (1024)
    weights_info: WeightsInfo  # where the weights came from (recorded by the surfaces)
    # Whether condition_on_memory takes banks that differ per object (same length): then
    # the predictor runs all objects of a frame as one batch, else one batch per bank.
    per_object_banks: bool

    @property
    def device(self) -> torch.device:
        """Where the model computes (the state's tensors live there)."""
        ...

    def encode_frames(
        self, images: torch.Tensor, autocast_dtype: torch.dtype | None = None
    ) -> FrameFeatures:
        """Normalised (B, 3, S, S) frames -> their features."""
        ...

    def condition_without_memory(self, frame: FrameFeatures) -> torch.Tensor:
        """A prompted frame's features (B, C, S/16, S/16): no memory, no_mem_embed added."""
        ...

    def memory_position(self, device: torch.device) -> torch.Tensor:
        """The memory's position encoding, passed back to condition_on_memory."""
        ...

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
        """A tracked frame's features (B, C, S/16, S/16) attended to B objects' memories
        (``static_bank``: the bank padded to (memory slots, pointer slots), masked, for a
        compiled tracker; None: as it is)."""
        ...

    def use_multimask(self, is_init_cond_frame: bool, num_points: int) -> bool:
        """Whether the heads give three candidates for this many clicks."""
        ...

    def forward_heads(
        self,
        pix_feat: torch.Tensor,
        high_res_feats: tuple[torch.Tensor, torch.Tensor],
        point_coords: torch.Tensor | None,
        point_labels: torch.Tensor | None,
        mask_input: torch.Tensor | None,
        multimask_output: bool,
    ) -> HeadsOutput:
        """The SAM heads on conditioned features: masks, pointers, object scores."""
        ...

    def mask_as_output(self, frame: FrameFeatures, batch: int, masks: torch.Tensor) -> HeadsOutput:
        """A mask prompt used as the output (VideoPromptError where there is no such path)."""
        ...

    def encode_memory(
        self,
        frame: FrameFeatures,
        low_res_masks: torch.Tensor,
        object_score_logits: torch.Tensor,
        from_points: bool,
    ) -> torch.Tensor:
        """The memory (B, mem_dim, S/16, S/16) of B objects' masks on a frame."""
        ...


@runtime_checkable
class CompilableParts(Protocol):
    """What the compiled tracker (:mod:`sam2serve.engine.video.compiled`) hands to
    torch.compile, beyond :class:`VideoModel`: SAM 2's own model
    (:class:`~sam2serve.modeling.sam2_video.SAM2Video`) has them; a model without them
    (the ONNX graphs) tracks uncompiled."""

    @property
    def memory_encoder(self) -> nn.Module: ...

    @property
    def sam_mask_decoder(self) -> MaskDecoder: ...

    def memory_attention_in(self, dtype: torch.dtype) -> nn.Module:
        """The memory attention with its weights in ``dtype`` (the one the tracker runs)."""
        ...


# The members VideoModel names, for the structural checks.
VIDEO_MODEL_ATTRIBUTES = (
    "config",
    "video_config",
    "image_size",
    "weights_info",
    "per_object_banks",
)
VIDEO_MODEL_METHODS = (
    "encode_frames",
    "condition_without_memory",
    "memory_position",
    "condition_on_memory",
    "use_multimask",
    "forward_heads",
    "mask_as_output",
    "encode_memory",
)

__all__ = ["VIDEO_MODEL_ATTRIBUTES", "VIDEO_MODEL_METHODS", "CompilableParts", "VideoModel"]
