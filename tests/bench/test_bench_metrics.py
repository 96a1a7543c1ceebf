"""The benchmark's numbers on hand-built cases: latency statistics, mask IoU, and the
experiment's accuracy rules (AMG: fail = different mask count, masks paired in area
order; SPS / MPS: paired by prompt). Masks are encoded with pycocotools, independently
of sam2serve's RLE code."""

from __future__ import annotations

import numpy as np
import pytest
from pycocotools import mask as mask_utils

from sam2serve.bench.metrics import (
    amg_accuracy,
    latency_stats,
    mask_iou,
    point_accuracy,
)

H, W = 10, 12


def box(x0: int, y0: int, x1: int, y1: int) -> np.ndarray:
    mask = np.zeros((H, W), dtype=bool)
    mask[y0:y1, x0:x1] = True
    return mask


def record(mask: np.ndarray) -> dict:
    coco = mask_utils.encode(np.asfortranarray(mask.astype(np.uint8)))
    return {
        "segmentation": {"size": list(coco["size"]), "counts": coco["counts"].decode()},
        "area": int(mask.sum()),
    }


def records(*masks: np.ndarray) -> list[dict]:
    return [record(m) for m in masks]


# --------------------------------------------------------------------------- latency


def test_first_iteration_is_reported_apart_from_the_percentiles():
    stats = latency_stats([1000.0, 10.0, 20.0, 30.0, 40.0])
    assert stats.images == 5
    assert stats.first_ms == 1000.0
    assert stats.p50_ms == pytest.approx(25.0)  # median of 10, 20, 30, 40
    assert stats.p90_ms == pytest.approx(37.0)  # numpy's linear interpolation
    assert stats.p99_ms == pytest.approx(39.7)
    assert stats.mean_ms == pytest.approx(25.0)
    assert stats.max_ms == 40.0
    assert stats.images_per_s == pytest.approx(5 / 1.1)  # every image, the first included


def test_one_image_is_its_own_steady_state():
    stats = latency_stats([250.0])
    assert (stats.first_ms, stats.p50_ms, stats.p99_ms, stats.max_ms) == (250.0,) * 4
    assert stats.images_per_s == pytest.approx(4.0)
    with pytest.raises(ValueError):
        latency_stats([])


# --------------------------------------------------------------------------- IoU


def test_mask_iou_by_hand():
    a, b = box(0, 0, 4, 4), box(2, 0, 6, 4)  # 16 px each, 8 shared, union 24
    assert mask_iou(a, b) == pytest.approx(8 / 24)
    assert mask_iou(a, a) == 1.0
    assert mask_iou(a, box(6, 6, 8, 8)) == 0.0
    empty = np.zeros((H, W), dtype=bool)
    assert mask_iou(empty, empty) == 1.0  # identical
    assert mask_iou(a, empty) == 0.0
    with pytest.raises(ValueError, match="different sizes"):
        mask_iou(a, np.zeros((3, 3), dtype=bool))


# --------------------------------------------------------------------------- AMG


def test_amg_fail_is_a_different_mask_count_and_is_left_out_of_the_miou():
    big, small = box(0, 0, 8, 8), box(9, 0, 11, 2)
    baseline = [records(big, small), records(big)]
    candidate = [records(big), records(big)]  # image 0 lost a mask
    accuracy = amg_accuracy(candidate, baseline)
    assert accuracy.fails == 1
    assert accuracy.images == 2 and accuracy.compared_images == 1
    assert accuracy.miou == 1.0
    assert (accuracy.masks, accuracy.exact) == (1, 1)


def test_amg_pairs_masks_in_area_order_not_record_order():
    big, medium, small = box(0, 0, 8, 8), box(0, 8, 6, 10), box(9, 0, 11, 2)
    baseline = [records(big, medium, small)]
    shuffled = [records(small, big, medium)]
    accuracy = amg_accuracy(shuffled, baseline)
    assert accuracy.fails == 0 and accuracy.miou == 1.0 and accuracy.exact == 3
    # Paired by prompt instead, the same lists disagree.
    assert point_accuracy(shuffled, baseline).miou < 0.5


def test_amg_miou_is_the_mean_of_per_image_means():
    a = box(0, 0, 4, 4)  # 16 px
    shifted = box(2, 0, 6, 4)  # IoU 8/24 with a
    c = box(8, 5, 12, 10)  # 20 px
    baseline = [records(a, c), records(a)]
    candidate = [records(shifted, c), records(a)]
    accuracy = amg_accuracy(candidate, baseline)
    # image 0: (1/3 + 1) / 2; image 1: 1  ->  mean over images
    assert accuracy.miou == pytest.approx(((1 / 3 + 1) / 2 + 1) / 2)
    assert (accuracy.masks, accuracy.exact, accuracy.fails) == (3, 2, 0)
    assert accuracy.exact_fraction == pytest.approx(2 / 3)


def test_amg_images_without_masks_on_both_sides_neither_fail_nor_count():
    a = box(0, 0, 4, 4)
    accuracy = amg_accuracy([[], records(a)], [[], records(a)])
    assert accuracy.fails == 0 and accuracy.compared_images == 1 and accuracy.miou == 1.0
    nothing = amg_accuracy([[], []], [[], []])
    assert nothing.miou is None and nothing.fails == 0 and nothing.exact_fraction is None


def test_amg_area_ties_keep_record_order():
    left, right = box(0, 0, 2, 2), box(10, 0, 12, 2)  # same area, disjoint
    same_order = amg_accuracy([records(left, right)], [records(left, right)])
    swapped = amg_accuracy([records(right, left)], [records(left, right)])
    assert same_order.miou == 1.0
    assert swapped.miou == 0.0  # ties are paired in record order, as a stable sort does


# --------------------------------------------------------------------------- SPS / MPS


def test_point_accuracy_pairs_by_prompt():
    a, b = box(0, 0, 4, 4), box(2, 0, 6, 4)
    accuracy = point_accuracy([records(a, b)], [records(a, a)])
    assert accuracy.miou == pytest.approx((1 + 8 / 24) / 2)
    assert (accuracy.masks, accuracy.exact, accuracy.fails) == (2, 1, 0)


def test_point_accuracy_counts_a_missing_mask_as_a_fail():
    a = box(0, 0, 4, 4)
    accuracy = point_accuracy([records(a), records(a)], [records(a, a), records(a)])
    assert accuracy.fails == 1 and accuracy.compared_images == 1


def test_different_image_counts_are_an_error():
    with pytest.raises(ValueError, match="images to compare"):
        amg_accuracy([[]], [[], []])


def test_uncompressed_and_compressed_rle_compare_alike():
    from sam2serve.engine.rle import coco_to_rle

    a = box(1, 1, 5, 7)
    compressed = record(a)
    uncompressed = {**compressed, "segmentation": coco_to_rle(compressed["segmentation"])}
    accuracy = point_accuracy([[uncompressed]], [[compressed]])
    assert accuracy.miou == 1.0 and accuracy.exact == 1
