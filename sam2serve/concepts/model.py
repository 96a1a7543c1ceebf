"""SAM 3's image detector as transformers' ``Sam3Model``, sized by a small typed config.

``Sam3Size.full()`` is Meta's published configuration; reduced sizes (``Sam3Size.tiny()``)
exist so the fidelity tests build Meta's model and ours in seconds on a CPU. The one
torchvision call in transformers' implementation (RoIAlign for exemplar boxes) is bound to
this project's torch-only ``roi_align``, so torchvision is not a dependency.
"""

from __future__ import annotations

import types
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from sam2serve.concepts.roi_align import roi_align

if TYPE_CHECKING:
    from transformers import Sam3Config, Sam3Model

# Meta's norms: every LayerNorm of SAM 3 is torch's default (eps 1e-5; Meta's ViT asks for
# it by name), where transformers' SAM 3 configs default to 1e-6.
LAYER_NORM_EPS = 1e-5


@dataclass(frozen=True)
class Sam3Size:
    image_size: int = 1008
    vit_dim: int = 1024
    vit_depth: int = 32
    vit_heads: int = 16
    vit_global: tuple[int, ...] = (7, 15, 23, 31)
    text_dim: int = 1024
    text_heads: int = 16
    text_layers: int = 24
    detr_layers: int = 6
    queries: int = 200
    geometry_layers: int = 3

    def __post_init__(self) -> None:
        """Meta's ViT answers with the features of its last global-attention block and
        transformers' with those of its last block: the two agree only when the last block
        is global, so any other layout is refused (no SAM 3 size has one)."""
        blocks = self.vit_global
        if not blocks or list(blocks) != sorted(set(blocks)):
            raise ValueError(f"vit_global must be increasing block indexes; got {blocks!r}")
        if blocks[0] < 0 or blocks[-1] != self.vit_depth - 1:
            raise ValueError(
                f"vit_global must end with the ViT's last block ({self.vit_depth - 1}): "
                f"Meta's ViT outputs its last global block; got {blocks!r}"
            )

    @classmethod
    def full(cls) -> Sam3Size:
        return cls()

    @classmethod
    def tiny(cls) -> Sam3Size:
        """Test size: every module present, small widths/depths, 336 px input."""
        return cls(336, 64, 2, 2, (1,), 64, 2, 1, 1, 20, 1)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def transformers_config(size: Sam3Size) -> Sam3Config:
    from transformers import CLIPTextConfig, Sam3Config, Sam3VisionConfig, Sam3ViTConfig
    from transformers.models.sam3.configuration_sam3 import (
        Sam3DETRDecoderConfig,
        Sam3DETREncoderConfig,
        Sam3GeometryEncoderConfig,
        Sam3MaskDecoderConfig,
    )

    grid = size.image_size // 14
    vit = Sam3ViTConfig(
        hidden_size=size.vit_dim,
        intermediate_size=int(size.vit_dim * 4.625),
        num_hidden_layers=size.vit_depth,
        num_attention_heads=size.vit_heads,
        image_size=size.image_size,
        global_attn_indexes=list(size.vit_global),
        layer_norm_eps=LAYER_NORM_EPS,
    )
    vision = Sam3VisionConfig(
        backbone_config=vit,
        backbone_feature_sizes=[[grid * 4] * 2, [grid * 2] * 2, [grid] * 2],
        layer_norm_eps=LAYER_NORM_EPS,
    )
    text = CLIPTextConfig(
        vocab_size=49408,
        hidden_size=size.text_dim,
        intermediate_size=size.text_dim * 4,
        num_hidden_layers=size.text_layers,
        num_attention_heads=size.text_heads,
        max_position_embeddings=32,
        projection_dim=512,
        hidden_act="gelu",
        layer_norm_eps=LAYER_NORM_EPS,
    )
    return Sam3Config(
        vision_config=vision,
        text_config=text,
        geometry_encoder_config=Sam3GeometryEncoderConfig(
            num_layers=size.geometry_layers, layer_norm_eps=LAYER_NORM_EPS
        ),
        detr_encoder_config=Sam3DETREncoderConfig(
            num_layers=size.detr_layers, layer_norm_eps=LAYER_NORM_EPS
        ),
        detr_decoder_config=Sam3DETRDecoderConfig(
            num_layers=size.detr_layers, num_queries=size.queries, layer_norm_eps=LAYER_NORM_EPS
        ),
        mask_decoder_config=Sam3MaskDecoderConfig(layer_norm_eps=LAYER_NORM_EPS),
    )


def _bind_roi_align() -> None:
    """transformers' Sam3 module calls ``torchvision.ops.roi_align``; give it ours when
    torchvision is absent (its module attribute only, nothing global)."""
    from transformers.models.sam3 import modeling_sam3

    if getattr(modeling_sam3, "torchvision", None) is None:
        ops = types.SimpleNamespace(roi_align=roi_align)
        modeling_sam3.torchvision = types.SimpleNamespace(ops=ops)


def build_model(size: Sam3Size) -> Sam3Model:
    """An untrained ``Sam3Model`` of ``size`` in eval mode (weights come from a checkpoint)."""
    from transformers import Sam3Model

    _bind_roi_align()
    config = transformers_config(size)
    config._attn_implementation = "sdpa"
    model = Sam3Model(config)
    model.eval()
    return model
