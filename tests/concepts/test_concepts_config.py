"""Our transformers ``Sam3Config`` against the modules Meta's own builder
(``sam3.model_builder``) makes: every norm's eps, the activations, RoPE, the sine position
encodings, window/global layout, dropout and context length, read off Meta's modules (reduced
size, tests/shim stand-ins). And the one ViT layout the two cannot agree on is refused."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
if importlib.util.find_spec("sam3") is None:  # Meta's package: pip install --no-deps sam3
    pytest.skip("Meta's sam3 is not installed", allow_module_level=True)
from meta_sam3 import build_meta_image_model, import_sam3

from sam2serve.concepts.checkpoint import rename
from sam2serve.concepts.model import Sam3Size, build_model
from sam2serve.concepts.tokenizer import clip_bpe_path

# two global blocks around a windowed one, and 672 px: the global blocks' RoPE is
# interpolated (24 / 48) while the windowed block's is not
SIZE = Sam3Size(672, 64, 3, 2, (0, 2), 64, 2, 1, 1, 20, 1)
NORMS = (torch.nn.LayerNorm, torch.nn.GroupNorm)


@pytest.fixture(scope="module")
def pair():
    meta = build_meta_image_model(SIZE.as_dict(), clip_bpe_path())
    return meta, build_model(SIZE)


def norm_facts(module: torch.nn.Module) -> tuple:
    if isinstance(module, torch.nn.LayerNorm):
        return ("LayerNorm", tuple(module.normalized_shape), module.eps, module.elementwise_affine)
    return ("GroupNorm", module.num_groups, module.num_channels, module.eps, module.affine)


def test_every_norm_is_metas(pair):
    """Each of Meta's norms, found in ours through the checkpoint's key map, has Meta's
    kind, shape, eps and affinity; and ours has no norm Meta lacks."""
    meta, ours = pair
    modules = dict(ours.named_modules())
    matched = set()
    for name, module in meta.named_modules():
        if not isinstance(module, NORMS):
            continue
        counterpart = rename(f"{name}.weight").removesuffix(".weight")
        assert counterpart in modules, f"{name} has no counterpart ({counterpart})"
        assert norm_facts(modules[counterpart]) == norm_facts(module), name
        matched.add(counterpart)
    ours_norms = {n for n, m in ours.named_modules() if isinstance(m, NORMS)}
    assert ours_norms == matched
    parts = {name.split(".")[0] for name in matched}
    assert parts == {
        "vision_encoder",
        "text_encoder",
        "geometry_encoder",
        "detr_encoder",
        "detr_decoder",
        "dot_product_scoring",
        "mask_decoder",
    }


def test_config_eps_is_metas(pair):
    meta, ours = pair
    trunk_eps = meta.backbone.vision_backbone.trunk.blocks[0].norm1.eps
    assert trunk_eps == 1e-5
    config = ours.config
    for sub in (
        config.vision_config.backbone_config,
        config.vision_config,
        config.text_config,
        config.geometry_encoder_config,
        config.detr_encoder_config,
        config.detr_decoder_config,
        config.mask_decoder_config,
    ):
        assert sub.layer_norm_eps == trunk_eps, type(sub).__name__


def test_activations_are_metas(pair):
    meta, ours = pair
    x = torch.linspace(-8, 8, 4001)
    backbone = meta.backbone
    pairs = {
        "ViT MLP": (
            backbone.vision_backbone.trunk.blocks[0].mlp.act,
            ours.vision_encoder.backbone.layers[0].mlp.activation_fn,
        ),
        "neck": (
            backbone.vision_backbone.convs[0].gelu,
            ours.vision_encoder.neck.fpn_layers[0].scale_layers[1],
        ),
        "text MLP": (
            backbone.language_backbone.encoder.transformer.resblocks[0].mlp.gelu,
            ours.text_encoder.text_model.encoder.layers[0].mlp.activation_fn,
        ),
        "DETR encoder": (
            meta.transformer.encoder.layers[0].activation,
            ours.detr_encoder.layers[0].mlp.activation_fn,
        ),
        "DETR decoder": (
            meta.transformer.decoder.layers[0].activation,
            ours.detr_decoder.layers[0].mlp.activation_fn,
        ),
        "geometry encoder": (
            meta.geometry_encoder.encode[0].activation,
            ours.geometry_encoder.layers[0].mlp.activation_fn,
        ),
    }
    for where, (theirs, mine) in pairs.items():
        torch.testing.assert_close(mine(x), theirs(x), rtol=0, atol=0, msg=where)
    assert ours.config.text_config.hidden_act == "gelu"  # not CLIP's default quick_gelu


def test_rope_is_metas(pair):
    """Theta and every block's rotation table (window and interpolated global ones)."""
    meta, ours = pair
    vit = ours.config.vision_config.backbone_config
    blocks = meta.backbone.vision_backbone.trunk.blocks
    for index, block in enumerate(blocks):
        assert vit.rope_parameters["rope_theta"] == block.attn.rope_theta
        layer = ours.vision_encoder.backbone.layers[index]
        cos, sin = layer.rotary_emb(torch.zeros(1), layer.position_ids)
        table = block.attn.freqs_cis  # complex (tokens, head_dim / 2)
        torch.testing.assert_close(cos[0, :, ::2], table.real, rtol=0, atol=1e-6)
        torch.testing.assert_close(sin[0, :, ::2], table.imag, rtol=0, atol=1e-6)


def test_layout_and_positions_are_metas(pair):
    meta, ours = pair
    trunk = meta.backbone.vision_backbone.trunk
    vit = ours.config.vision_config.backbone_config
    assert list(vit.global_attn_indexes) == trunk.full_attn_ids
    for block, layer in zip(trunk.blocks, ours.vision_encoder.backbone.layers, strict=True):
        assert layer.window_size == block.window_size
        assert isinstance(block.ls1, torch.nn.Identity) and vit.layer_scale_init_value is None
    sines = {
        "neck": (meta.backbone.vision_backbone.position_encoding, ours.vision_encoder.neck),
        "geometry": (meta.geometry_encoder.pos_enc, ours.geometry_encoder),
    }
    for where, (theirs, owner) in sines.items():
        mine = owner.position_encoding
        facts = ("temperature", "normalize", "scale")
        assert [getattr(mine, f) for f in facts] == [getattr(theirs, f) for f in facts], where
        assert mine.num_position_features == theirs.num_pos_feats, where
    text = meta.backbone.language_backbone
    assert ours.config.text_config.max_position_embeddings == text.context_length == 32


def test_dropout_is_metas(pair):
    """Training-time only (both run in eval), but the same numbers all the same."""
    meta, ours = pair
    config = ours.config
    assert meta.transformer.encoder.layers[0].dropout1.p == config.detr_encoder_config.dropout
    assert meta.transformer.decoder.layers[0].dropout1.p == config.detr_decoder_config.dropout
    assert meta.geometry_encoder.encode[0].dropout1.p == config.geometry_encoder_config.dropout
    assert meta.dot_prod_scoring.prompt_mlp.drop.p == ours.dot_product_scoring.text_mlp_dropout.p
    vit_block = meta.backbone.vision_backbone.trunk.blocks[0]
    assert vit_block.mlp.drop1.p == config.vision_config.backbone_config.hidden_dropout == 0.0


def test_meta_vit_answers_with_its_last_global_block():
    """Why ``Sam3Size`` refuses such a layout: Meta's ViT answers with the last global
    block's features (later blocks run and are ignored); transformers' with the last block's."""
    import_sam3()
    from sam3.model.vitdet import ViT

    vit = ViT(
        img_size=56,
        pretrain_img_size=28,
        patch_size=14,
        embed_dim=32,
        depth=2,
        num_heads=2,
        global_att_blocks=(0,),
        rel_pos_blocks=(),
        window_size=2,
        use_rope=True,
        use_interp_rope=True,
        tile_abs_pos=True,
        bias_patch_embed=False,
        retain_cls_token=False,
    ).eval()
    image = torch.randn(1, 3, 56, 56, generator=torch.Generator().manual_seed(0))
    before = vit(image)[-1]
    with torch.no_grad():
        for parameter in vit.blocks[1].parameters():
            parameter.add_(1.0)
    assert torch.equal(vit(image)[-1], before)


@pytest.mark.parametrize(
    ("depth", "blocks", "message"),
    [
        (4, (1,), "end with the ViT's last block \\(3\\)"),
        (4, (1, 2), "end with the ViT's last block \\(3\\)"),
        (4, (), "increasing"),
        (4, (3, 1), "increasing"),
        (4, (1, 1, 3), "increasing"),
        (4, (-1, 3), "last block"),
        (4, (1, 4), "last block"),
    ],
)
def test_sizes_refuse_a_vit_whose_last_block_is_not_global(depth, blocks, message):
    with pytest.raises(ValueError, match=message):
        Sam3Size(vit_depth=depth, vit_global=blocks)


def test_shipped_sizes_end_with_a_global_block():
    for size in (Sam3Size.full(), Sam3Size.tiny(), SIZE):
        assert size.vit_global[-1] == size.vit_depth - 1
