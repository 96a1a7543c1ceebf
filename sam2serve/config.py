"""Model sizes of SAM2.1 (and SAM2.0, which shares the image-path architecture) as code.

The numbers are those of Meta's published Hydra configs (``sam2.1_hiera_{t,s,b+,l}.yaml``);
only the image path is described here: Hiera trunk, FPN neck and the SAM heads.
"""

from __future__ import annotations

from dataclasses import dataclass, field

IMAGE_SIZE = 1024
# Stride of the lowest-resolution feature map the SAM heads see (64x64 at 1024 input).
BACKBONE_STRIDE = 16
PROMPT_EMBED_DIM = 256


@dataclass(frozen=True)
class HieraConfig:
    embed_dim: int
    num_heads: int
    stages: tuple[int, ...]
    global_att_blocks: tuple[int, ...]
    window_pos_embed_bkg_spatial_size: tuple[int, int]
    window_spec: tuple[int, ...] = (8, 4, 14, 7)
    q_pool: int = 3
    q_stride: tuple[int, int] = (2, 2)
    dim_mul: float = 2.0
    head_mul: float = 2.0

    @property
    def channel_list(self) -> tuple[int, ...]:
        """Channels of the four stage outputs, lowest resolution first (as the neck wants)."""
        dims = [int(self.embed_dim * self.dim_mul**i) for i in range(len(self.stages))]
        return tuple(reversed(dims))


@dataclass(frozen=True)
class ModelConfig:
    name: str
    trunk: HieraConfig
    image_size: int = IMAGE_SIZE
    d_model: int = PROMPT_EMBED_DIM
    # Output levels 0 and 1 use only lateral features; 2 and 3 get the top-down path.
    fpn_top_down_levels: tuple[int, ...] = (2, 3)
    # Number of lowest-resolution levels the neck computes but the heads never use.
    scalp: int = 1
    checkpoint_names: tuple[str, ...] = field(default_factory=tuple)

    @property
    def embedding_size(self) -> int:
        return self.image_size // BACKBONE_STRIDE


MODEL_CONFIGS: dict[str, ModelConfig] = {
    "tiny": ModelConfig(
        name="tiny",
        trunk=HieraConfig(
            embed_dim=96,
            num_heads=1,
            stages=(1, 2, 7, 2),
            global_att_blocks=(5, 7, 9),
            window_pos_embed_bkg_spatial_size=(7, 7),
        ),
        checkpoint_names=("sam2.1_hiera_tiny.pt", "sam2_hiera_tiny.pt"),
    ),
    "small": ModelConfig(
        name="small",
        trunk=HieraConfig(
            embed_dim=96,
            num_heads=1,
            stages=(1, 2, 11, 2),
            global_att_blocks=(7, 10, 13),
            window_pos_embed_bkg_spatial_size=(7, 7),
        ),
        checkpoint_names=("sam2.1_hiera_small.pt", "sam2_hiera_small.pt"),
    ),
    "base_plus": ModelConfig(
        name="base_plus",
        trunk=HieraConfig(
            embed_dim=112,
            num_heads=2,
            stages=(2, 3, 16, 3),
            global_att_blocks=(12, 16, 20),
            window_pos_embed_bkg_spatial_size=(14, 14),
        ),
        checkpoint_names=("sam2.1_hiera_base_plus.pt", "sam2_hiera_base_plus.pt"),
    ),
    "large": ModelConfig(
        name="large",
        trunk=HieraConfig(
            embed_dim=144,
            num_heads=2,
            stages=(2, 6, 36, 4),
            global_att_blocks=(23, 33, 43),
            window_pos_embed_bkg_spatial_size=(7, 7),
            window_spec=(8, 4, 16, 8),
        ),
        checkpoint_names=("sam2.1_hiera_large.pt", "sam2_hiera_large.pt"),
    ),
}

MODEL_SIZES = tuple(MODEL_CONFIGS)


def get_config(size: str) -> ModelConfig:
    """The config of a model size; a clear error names the accepted sizes."""
    try:
        return MODEL_CONFIGS[size]
    except KeyError:
        raise ValueError(
            f"unknown model size {size!r}; expected one of {', '.join(MODEL_SIZES)}"
        ) from None
