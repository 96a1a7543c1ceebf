"""Predictor behaviour: batched encode, concurrency, and clear errors for bad prompts."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch
from skimage import data, transform

from sam2serve.engine.predictor import Predictor, PromptError


@pytest.fixture(scope="module")
def predictor(tiny_model):
    return Predictor(tiny_model)


@pytest.fixture(scope="module")
def images():
    chelsea = data.chelsea()  # 300 x 451
    rocket = (transform.rescale(data.rocket(), 0.5, channel_axis=2) * 255).astype(np.uint8)
    return [chelsea, rocket]


@pytest.fixture(scope="module")
def batch_embedding(predictor, images):
    return predictor.encode(images)


def test_batch_encode_equals_single_encodes(predictor, images, batch_embedding):
    assert len(batch_embedding) == 2
    assert batch_embedding.original_sizes == tuple(im.shape[:2] for im in images)
    for i, image in enumerate(images):
        single = predictor.encode(image)
        torch.testing.assert_close(
            batch_embedding[i].image_embed, single.image_embed, atol=1e-4, rtol=1e-4
        )
        for a, b in zip(batch_embedding[i].high_res_feats, single.high_res_feats):
            torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)


def test_output_shapes_and_clamp(predictor, batch_embedding, images):
    emb = batch_embedding[1]
    h, w = images[1].shape[:2]
    out = predictor.predict(
        emb, np.array([[[10, 20]], [[50, 60]], [[w - 1, h - 1]]]), np.ones((3, 1))
    )
    assert out.masks.shape == (3, 3, h, w) and out.masks.dtype == torch.bool
    assert out.iou_scores.shape == (3, 3)
    assert out.low_res_logits.shape == (3, 3, 256, 256)
    assert out.low_res_logits.abs().max() <= 32.0
    masks, iou, low = out.numpy()
    assert masks.dtype == bool and iou.dtype == np.float32 and low.shape == (3, 3, 256, 256)


def test_concurrent_predictions_are_independent(predictor, batch_embedding):
    """Several threads on one Predictor get exactly what each gets alone."""
    rng = np.random.default_rng(0)
    jobs = []
    for i in range(8):
        emb = batch_embedding[i % 2]
        h, w = emb.original_size
        points = rng.uniform([0, 0], [w, h], size=(2, 1, 2)).astype(np.float32)
        jobs.append((emb, points))
    alone = [predictor.predict(e, p, np.ones((2, 1))).low_res_logits for e, p in jobs]
    with ThreadPoolExecutor(max_workers=4) as pool:
        together = list(pool.map(lambda j: predictor.predict(j[0], j[1], np.ones((2, 1))), jobs))
    for a, t in zip(alone, together):
        torch.testing.assert_close(t.low_res_logits, a, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"point_coords": [[1, 2]]}, "point_coords and point_labels must be given together"),
        ({"point_coords": [[1, 2, 3]], "point_labels": [1]}, r"shape \(N, 2\) or \(B, N, 2\)"),
        ({"point_coords": [[1, 2]], "point_labels": [1, 1]}, "does not match point_coords"),
        ({"point_coords": [[1, 2]], "point_labels": [7]}, r"got \[7\.0\]"),
        ({"point_coords": [[np.nan, 2]], "point_labels": [1]}, "NaN or infinite"),
        ({"point_coords": "abc", "point_labels": [1]}, "must be numeric"),
        ({"boxes": [1, 2, 3]}, r"\[x0, y0, x1, y1\], got \(1, 3\)"),
        (
            {
                "point_coords": [[[1, 2]]] * 2,
                "point_labels": [[1]] * 2,
                "boxes": [[0, 0, 5, 5]] * 3,
            },
            "3 boxes but 2 point groups",
        ),
        ({"mask_input": np.zeros((1, 64, 64))}, r"mask_input must have shape \(1, 256, 256\)"),
        ({}, "give at least one prompt"),
    ],
)
def test_bad_prompts_name_the_problem(predictor, batch_embedding, kwargs, message):
    with pytest.raises(PromptError, match=message):
        predictor.predict(batch_embedding[0], **kwargs)


def test_predict_needs_one_image(predictor, batch_embedding):
    with pytest.raises(ValueError, match="index one first"):
        predictor.predict(batch_embedding, [[1, 2]], [1])


def test_upsampling_stays_within_the_mask_byte_budget(tiny_model, batch_embedding):
    """Chunks never hold more than the budget's worth of full-size masks, and chunking
    changes no pixel: a budget of about one mask gives the same answer as the default."""
    one = batch_embedding[0]  # 300 x 451
    points = np.array([[[40.0 * i + 20, 30.0 * i + 10]] for i in range(5)])
    labels = np.ones((5, 1))
    whole = Predictor(tiny_model).predict(one, points, labels)
    one_mask = 300 * 451 * 5  # float32 logits + bool mask
    tight = Predictor(tiny_model, mask_bytes_budget=one_mask + 1)
    assert tight.masks_per_chunk(one.original_size) == 1
    assert torch.equal(tight.predict(one, points, labels).masks, whole.masks)
    low, iou = tight.predict_low_res(one, points, labels)
    assert torch.equal(iou, whole.iou_scores)
    chunks = list(tight.upscale_chunks(low.flatten(0, 1), one.original_size))
    assert [start for start, _ in chunks] == list(range(15))  # 5 objects x 3 masks, one each
    assert all(masks.shape == (1, 300, 451) and masks.dtype == torch.bool for _, masks in chunks)
    assert torch.equal(torch.cat([m for _, m in chunks]).view(5, 3, 300, 451), whole.masks)
    with pytest.raises(ValueError, match="mask_bytes_budget"):
        Predictor(tiny_model, mask_bytes_budget=0)
