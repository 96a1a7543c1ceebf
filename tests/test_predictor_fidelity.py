"""Our encoder and predictor against Meta's SAM2ImagePredictor on identical weights.

Both models load the same official-shaped checkpoint file (ours through our loader,
Meta's through Meta's), see the same real photograph, and get the same prompts.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from oracle import load_meta_model
from reference import import_reference
from skimage import data

from sam2serve.checkpoint import load_model
from sam2serve.engine.predictor import Embedding, Predictor

RTOL = 1e-4


def rel_err(ours: torch.Tensor, ref: torch.Tensor) -> float:
    return ((ours.float() - ref.float()).abs().max() / ref.float().abs().max()).item()


def mask_iou(a: np.ndarray, b: np.ndarray) -> float:
    union = np.logical_or(a, b).sum()
    return 1.0 if union == 0 else np.logical_and(a, b).sum() / union


def prompt_cases(h: int, w: int) -> dict[str, dict]:
    rng = np.random.default_rng(11)
    n_objects = 4
    points = rng.uniform([0, 0], [w, h], size=(n_objects, 3, 2)).astype(np.float32)
    labels = (rng.uniform(size=(n_objects, 3)) > 0.3).astype(np.int32)
    x0y0 = rng.uniform([0, 0], [w / 2, h / 2], size=(n_objects, 2))
    boxes = np.concatenate([x0y0, x0y0 + rng.uniform(40, min(h, w) / 2, (n_objects, 2))], 1)
    mask_input = rng.normal(0, 8, size=(n_objects, 1, 256, 256)).astype(np.float32)
    return {
        "one_point": {"point_coords": points[0, :1], "point_labels": labels[0, :1] * 0 + 1},
        "points": {"point_coords": points, "point_labels": labels},
        "box": {"box": boxes.astype(np.float32)},
        "points_and_box": {"point_coords": points, "point_labels": labels, "box": boxes},
        "points_and_mask": {
            "point_coords": points,
            "point_labels": labels,
            "mask_input": mask_input,
        },
        "mask_only": {"mask_input": mask_input[:1]},
    }


@pytest.fixture(
    scope="module", params=["tiny", pytest.param("base_plus", marks=pytest.mark.extended)]
)
def pair(request, checkpoint_factory):
    """(our predictor, Meta's predictor, image) on one size's shared weights."""
    size = request.param
    path = checkpoint_factory(size)
    ours = Predictor(load_model(size, checkpoint=path))
    import_reference()
    from sam2.sam2_image_predictor import SAM2ImagePredictor

    meta = SAM2ImagePredictor(load_meta_model(size, path))
    image = data.coffee()  # 400 x 600, not square: exercises the coordinate scaling
    meta.set_image(image)
    return ours, meta, image


@pytest.fixture(scope="module")
def embedding(pair):
    ours, _, image = pair
    return ours.encode(image)


def test_image_features_match(pair, embedding):
    _, meta, _ = pair
    ref = meta._features
    assert embedding.original_size == (400, 600)
    assert rel_err(embedding.image_embed, ref["image_embed"]) < RTOL
    for ours_feat, ref_feat in zip(embedding.high_res_feats, ref["high_res_feats"]):
        assert ours_feat.shape == ref_feat.shape
        assert rel_err(ours_feat, ref_feat) < RTOL


@pytest.mark.parametrize("decoder", ["reference", "fast"])
@pytest.mark.parametrize("multimask", [True, False])
@pytest.mark.parametrize(
    "case", ["one_point", "points", "box", "points_and_box", "points_and_mask", "mask_only"]
)
def test_predictions_match(pair, embedding, case, multimask, decoder):
    ours, meta, image = pair
    # fast_min_prompts=1: every case goes through the decoder under test, even one prompt.
    ours = Predictor(ours.model, decoder=decoder, fast_min_prompts=1)
    prompts = prompt_cases(*image.shape[:2])[case]
    ref_masks, ref_iou, ref_low = meta.predict(**prompts, multimask_output=multimask)
    if ref_masks.ndim == 3:  # Meta squeezes a single object
        ref_masks, ref_iou, ref_low = ref_masks[None], ref_iou[None], ref_low[None]
    kwargs = {("boxes" if k == "box" else k): v for k, v in prompts.items()}
    out = ours.predict(embedding, **kwargs, multimask_output=multimask)

    assert out.low_res_logits.shape == ref_low.shape
    assert rel_err(out.low_res_logits, torch.from_numpy(ref_low)) < RTOL
    np.testing.assert_allclose(out.iou_scores.numpy(), ref_iou, atol=RTOL, rtol=0)
    masks = out.masks.numpy()
    assert masks.shape == ref_masks.shape and masks.dtype == bool
    ious = [
        mask_iou(a, b)
        for a, b in zip(
            masks.reshape(-1, *masks.shape[2:]),
            ref_masks.reshape(-1, *masks.shape[2:]).astype(bool),
        )
    ]
    assert min(ious) >= 0.999, ious


def test_chunked_decoding_equals_one_call(pair, embedding):
    """Chunking the prompts to bound memory does not change any answer."""
    ours, _, _ = pair
    rng = np.random.default_rng(5)
    points = rng.uniform([0, 0], [600, 400], size=(10, 1, 2)).astype(np.float32)
    labels = np.ones((10, 1), np.int32)
    whole = ours.predict(embedding, points, labels)
    chunked = Predictor(ours.model, prompt_chunk=3).predict(embedding, points, labels)
    torch.testing.assert_close(chunked.low_res_logits, whole.low_res_logits, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(chunked.iou_scores, whole.iou_scores, atol=1e-6, rtol=1e-6)


def test_the_fast_side_travels_with_the_embedding(pair, embedding):
    """An embedding without the fast decoder's image side: a click below fast_min_prompts
    is decoded the reference way; enough prompts build the side once, in the embedding,
    and every later decode of it (a click, through another context) reuses it. Encoding
    with a fast predictor builds it at once."""
    ours, _, image = pair
    predictor = Predictor(ours.model, decoder="fast", fast_min_prompts=4)
    bare = Embedding(embedding.image_embed, embedding.high_res_feats, embedding.original_sizes)
    features_bytes = bare.nbytes
    context = predictor.decoder_context(bare)
    one = torch.tensor([[[300.0, 200.0]]]), torch.tensor([[1]])
    predictor.decode_low_res(context, *one, None, True)
    assert not context.has_side and not bare.derived
    many = torch.rand(4, 1, 2) * 1024, torch.ones(4, 1, dtype=torch.int64)
    predictor.decode_low_res(context, *many, None, True)
    side = bare.derived[predictor.fast_decoder]
    assert predictor.decoder_context(bare).use_fast(1)
    predictor.decode_low_res(bare, *one, None, True)
    assert bare.derived[predictor.fast_decoder] is side
    assert bare.nbytes == features_bytes + side.nbytes
    assert predictor.decoder_context(predictor.encode(image)).has_side
