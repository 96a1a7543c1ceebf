"""Concept seeds for tracking: SAM 3's instances on one frame, deduplicated by mask IoU,
highest score first, capped (sam2serve.concepts.video_seed)."""

from __future__ import annotations

import numpy as np
import pytest

from sam2serve.concepts.engine import Instance
from sam2serve.concepts.video_seed import concept_seeds, dedupe_by_mask_iou, seeds_of


def _mask(rows: slice, cols: slice, shape=(10, 20)) -> np.ndarray:
    mask = np.zeros(shape, dtype=bool)
    mask[rows, cols] = True
    return mask


# A 70 px; B 60 px inside A (IoU 60/70 = 0.857: a duplicate); D 100 px around A (IoU
# 70/100 = 0.7 exactly: not above the threshold, kept); C apart from all; E empty.
A = _mask(slice(0, 7), slice(0, 10))
B = _mask(slice(0, 6), slice(0, 10))
C = _mask(slice(0, 5), slice(10, 20))
D = _mask(slice(0, 10), slice(0, 10))
E = np.zeros((10, 20), dtype=bool)


def test_dedupe_drops_duplicates_and_empties_keeps_score_order():
    masks = [C, B, A, E, D]
    scores = [0.7, 0.85, 0.9, 0.99, 0.8]
    assert dedupe_by_mask_iou(masks, scores, 0.7) == [2, 4, 0]  # A, D, C
    assert dedupe_by_mask_iou(masks, scores, 0.69) == [2, 0]  # D is a duplicate of A now
    assert dedupe_by_mask_iou(masks, scores, 1.0) == [2, 1, 4, 0]  # only the empty one goes
    assert dedupe_by_mask_iou(masks, scores, 0.7, limit=2) == [2, 4]
    assert dedupe_by_mask_iou([A, A], [0.5, 0.5], 0.7) == [0]  # ties: input order
    assert dedupe_by_mask_iou([], [], 0.7) == []
    with pytest.raises(ValueError, match="1.5"):
        dedupe_by_mask_iou(masks, scores, 1.5)
    with pytest.raises(ValueError, match="2 masks but 1 scores"):
        dedupe_by_mask_iou([A, B], [0.1], 0.7)


def test_seeds_dedupe_across_phrases():
    found = {
        "cat": [Instance(C, (10, 0, 20, 5), 0.7), Instance(A, (0, 0, 10, 7), 0.9)],
        "animal": [Instance(B, (0, 0, 10, 6), 0.85)],
    }
    seeds = seeds_of(found, max_instances=10)
    assert [(s.phrase, s.score) for s in seeds] == [("cat", 0.9), ("cat", 0.7)]
    assert seeds[0].mask is A and seeds[0].box == (0, 0, 10, 7)
    assert [s.phrase for s in seeds_of(found, 10, dedupe_iou=1.0)] == ["cat", "animal", "cat"]
    assert len(seeds_of(found, max_instances=1)) == 1


def test_concept_seeds_on_a_frame(concepts_tiny):
    frame = np.random.default_rng(5).integers(0, 256, (96, 128, 3), dtype=np.uint8)
    phrases = ["cat", "dog"]
    (encoding,) = concepts_tiny.encode([frame])
    found = concepts_tiny.detect(encoding, phrases, (), score_thresh=0.0)
    everything = sorted(
        (inst.score for insts in found.values() for inst in insts if inst.mask.any()),
        reverse=True,
    )
    assert len(everything) > 3  # random weights: most of the 2 x 20 queries have a mask
    top = concept_seeds(concepts_tiny, frame, phrases, score_thresh=0.0, max_instances=3)
    assert len(top) == 3
    assert all(s.mask.shape == (96, 128) and s.mask.dtype == bool for s in top)
    assert all(s.phrase in phrases and s.mask.any() for s in top)
    scores = [s.score for s in top]
    assert scores == sorted(scores, reverse=True)
    assert scores[0] == pytest.approx(everything[0], abs=1e-6)
    kept_all = seeds_of(found, max_instances=100, dedupe_iou=1.0)
    assert len(kept_all) == len(everything)  # only the empty masks dropped
    deduped = seeds_of(found, max_instances=100)
    assert len(deduped) <= len(kept_all)
    for i, later in enumerate(deduped):  # no kept pair overlaps past the threshold
        for earlier in deduped[:i]:
            inter = np.count_nonzero(later.mask & earlier.mask)
            assert inter / np.count_nonzero(later.mask | earlier.mask) <= 0.7
    with pytest.raises(ValueError, match="max_instances"):
        concept_seeds(concepts_tiny, frame, phrases, max_instances=0)
