"""The fast decoder computes the reference decoder's function with >= 3.5x fewer FLOPs."""

from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from sam2serve.checkpoint import load_model
from sam2serve.modeling.fast_mask_decoder import FastMaskDecoder

REFERENCE_GFLOP_PER_PROMPT = 3.555  # the decoder with image features copied per prompt


@pytest.fixture(scope="module")
def parts():
    model = load_model("tiny", random_weights=True, seed=5)
    g = torch.Generator().manual_seed(0)
    image_embed = torch.randn(1, 256, 64, 64, generator=g)
    high_res = (
        torch.randn(1, 32, 256, 256, generator=g),
        torch.randn(1, 64, 128, 128, generator=g),
    )
    return model, image_embed, high_res


def sparse_prompts(model, kind: str, n: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(1)
    pe = model.sam_prompt_encoder
    if kind == "point":
        coords, labels = (
            torch.rand(n, 1, 2, generator=g) * 1024,
            torch.ones(n, 1, dtype=torch.int32),
        )
    elif kind == "points":
        coords = torch.rand(n, 3, 2, generator=g) * 1024
        labels = (torch.rand(n, 3, generator=g) > 0.5).int()
    else:  # box + point
        corners = torch.sort(torch.rand(n, 2, 2, generator=g) * 1024, dim=1).values
        coords = torch.cat([corners, torch.rand(n, 1, 2, generator=g) * 1024], 1)
        labels = torch.tensor([[2, 3, 1]]).expand(n, 3).int()
    return pe.embed_points(coords, labels)


@torch.inference_mode()
@pytest.mark.parametrize("kind", ["point", "points", "box_and_point"])
def test_same_outputs_as_reference_decoder(parts, kind):
    model, image_embed, high_res = parts
    dec, pe = model.sam_mask_decoder, model.sam_prompt_encoder
    sparse = sparse_prompts(model, kind, 6)
    dense_pe, no_mask = pe.dense_positional_encoding(), pe.no_mask_dense()
    ref_logits, ref_iou, _ = dec.predict_all_masks(image_embed, dense_pe, sparse, no_mask, high_res)
    fast = FastMaskDecoder(dec)
    side = fast.prepare(image_embed, dense_pe, no_mask, high_res)
    logits, iou, rows = fast.forward(side, sparse)
    scale = ref_logits.abs().max()
    assert (logits - ref_logits).abs().max() / scale < 1e-5
    assert (iou - ref_iou).abs().max() < 1e-5
    assert rows.tolist() == list(range(6))

    # Only some mask tokens, only some prompts: the same rows of the same answers.
    keep = torch.tensor([4, 1])
    sub_logits, sub_iou, sub_rows = fast.forward(side, sparse, [1, 2, 3], keep=lambda _: keep)
    assert sub_rows.tolist() == [4, 1]
    assert (sub_logits - ref_logits[keep][:, 1:]).abs().max() / scale < 1e-5
    assert (sub_iou - ref_iou).abs().max() < 1e-5  # IoU is returned for every prompt

    none = torch.zeros(0, dtype=torch.int64)
    empty_logits, all_iou, empty_rows = fast.forward(side, sparse, [1, 2, 3], keep=lambda _: none)
    assert empty_logits.shape == (0, 3, 256, 256) and empty_rows.numel() == 0
    assert all_iou.shape == (6, 4)


@torch.inference_mode()
def test_symbolic_keys_are_the_reference_transformers_keys(parts):
    """After the transformer the keys are ``s * (L K + coef^T V)``, L the LayerNorms'
    centring and gains in turn (``diag(gamma) (I - 1/C)``): densified, the reference
    transformer's keys; and the IoU token's state, whose final attention read the low-rank
    scores from the last LayerNorm's product, is the reference's too."""
    model, image_embed, high_res = parts
    dec, pe = model.sam_mask_decoder, model.sam_prompt_encoder
    sparse = sparse_prompts(model, "box_and_point", 5)
    dense_pe, no_mask = pe.dense_positional_encoding(), pe.no_mask_dense()
    fast = FastMaskDecoder(dec)
    side = fast.prepare(image_embed, dense_pe, no_mask, high_res)
    tokens = fast.tokens(sparse)
    hs_ref, keys_ref = dec.transformer(image_embed + no_mask, dense_pe, tokens)
    hs, keys = fast.transformer_forward(side, tokens, [1])
    final = keys.final()
    channels = keys_ref.shape[-1]
    eye = torch.eye(channels)
    linear_map = eye
    for layer in dec.transformer.layers:
        linear_map = layer.norm4.weight[:, None] * (eye - 1 / channels) @ linear_map
    k = (image_embed + no_mask).flatten(2)[0]  # (C, N)
    dense = final.scale * (linear_map @ k + final.vecs.transpose(1, 2) @ final.coef)
    assert (dense.transpose(1, 2) - keys_ref).abs().max() / keys_ref.abs().max() < 1e-5
    assert (hs[:, 0] - hs_ref[:, 1]).abs().max() < 1e-5


@torch.inference_mode()
def test_flops_per_prompt_at_least_3_5x_below_reference(parts):
    model, image_embed, high_res = parts
    dec, pe = model.sam_mask_decoder, model.sam_prompt_encoder
    n = 16
    sparse = sparse_prompts(model, "point", n)
    dense_pe, no_mask = pe.dense_positional_encoding(), pe.no_mask_dense()
    with FlopCounterMode(display=False) as counter:
        dec.predict_all_masks(
            image_embed.expand(n, -1, -1, -1).contiguous(), dense_pe, sparse, no_mask, high_res
        )
    reference = counter.get_total_flops() / n / 1e9
    assert reference == pytest.approx(REFERENCE_GFLOP_PER_PROMPT, rel=1e-3)

    fast = FastMaskDecoder(dec)
    side = fast.prepare(image_embed, dense_pe, no_mask, high_res)
    fast.forward(side, sparse[:1], [1, 2, 3])  # per-image projections, paid once per image
    with FlopCounterMode(display=False) as counter:
        fast.forward(side, sparse, [1, 2, 3])
    per_prompt = counter.get_total_flops() / n / 1e9
    assert reference / per_prompt >= 3.5, (reference, per_prompt)


@torch.inference_mode()
def test_reduced_precision_stays_close(parts):
    """Mode furious: the decoder's products in bf16 (its statistics accumulated in fp32)
    change masks only at the edges (the mode promises mask IoU ~0.99 against the
    baseline) and the predicted IoUs by about 1e-4."""
    model, image_embed, high_res = parts
    dec, pe = model.sam_mask_decoder, model.sam_prompt_encoder
    sparse = sparse_prompts(model, "points", 8)
    dense_pe, no_mask = pe.dense_positional_encoding(), pe.no_mask_dense()
    ref_logits, ref_iou, _ = dec.predict_all_masks(image_embed, dense_pe, sparse, no_mask, high_res)
    fast = FastMaskDecoder(dec, dtype=torch.bfloat16)
    logits, iou, _ = fast.forward(fast.prepare(image_embed, dense_pe, no_mask, high_res), sparse)
    assert logits.dtype == torch.float32
    assert (iou - ref_iou).abs().max() < 2e-3
    ours, ref = (logits > 0).flatten(2), (ref_logits > 0).flatten(2)
    iou_masks = (ours & ref).sum(-1) / (ours | ref).sum(-1).clamp_min(1)
    assert iou_masks.min() > 0.97 and iou_masks.mean() > 0.99, iou_masks
    assert not torch.equal(logits, ref_logits)  # it really ran in reduced precision


def test_only_the_large_token_linears_run_in_reduced_precision(parts):
    """In bf16 the token side's MLPs (256 x 2048) multiply in bf16; its attention
    projections (256 x 256 and less) stay fp32, where their small products are faster."""
    model, _, _ = parts
    transformer = model.sam_mask_decoder.transformer
    layer = transformer.blocks()[0]
    fast, exact = (
        FastMaskDecoder(model.sam_mask_decoder, dtype=d) for d in (torch.bfloat16, torch.float32)
    )
    mlp_layers = list(layer.mlp.layers)
    assert all(fast.reduced(linear) for linear in mlp_layers)
    projections = [
        layer.self_attn.q_proj,
        layer.cross_attn_token_to_image.k_proj,
        layer.self_attn.out_proj,
    ]
    assert not any(fast.reduced(linear) for linear in projections)
    assert not any(exact.reduced(linear) for linear in mlp_layers + projections)
    x = torch.randn(2, 3, layer.self_attn.q_proj.in_features)
    assert torch.equal(fast.linear(layer.self_attn.q_proj, x), layer.self_attn.q_proj(x))


@torch.inference_mode()
def test_the_raster_order_is_kept_per_size(parts):
    model, _, _ = parts
    fast = FastMaskDecoder(model.sam_mask_decoder)
    order = fast.raster_order((4, 3), torch.device("cpu"))
    assert fast.raster_order((4, 3), torch.device("cpu")) is order
    assert sorted(order.tolist()) == list(range(4 * 3 * 16))
    # Pixel (row 1, column 6) of the (16, 12) logits: parent (0, 1), sub-pixels (0, 1), (1, 0).
    assert order[1 * 12 + 6].item() == ((0 * 3 + 1) * 4 + 0 * 2 + 1) * 4 + 1 * 2 + 0
