"""What the benchmark reports: latency statistics, and accuracy against the baseline.

Accuracy follows the published SAM2 experiment (torchao's ``compare_rle_lists``):

- AMG: an image *fails* when its number of masks differs from the baseline's. For every
  other image, both mask lists are sorted by area (largest first, ties in record order)
  and paired in that order; the image's IoU is the mean IoU of its pairs. mIoU is the
  mean over those images. Images where both sides found no mask have nothing to pair:
  they do not fail and do not enter the mean.
- SPS / MPS: mask i of an image answers prompt i on both sides, so masks are paired by
  prompt; the image's IoU is the mean over its prompts, mIoU the mean over images. An
  image fails when its number of masks differs (which would be a harness error).

The IoU of two empty masks is 1 (they are identical). ``exact`` counts paired masks that
are identical pixel for pixel, the check that a "lossless" mode really is.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from sam2serve.engine.rle import coco_to_rle, rle_to_mask

__all__ = [
    "Accuracy",
    "LatencyStats",
    "amg_accuracy",
    "latency_stats",
    "mask_iou",
    "point_accuracy",
]

Record = dict[str, Any]


@dataclass(frozen=True)
class LatencyStats:
    """Per-image latency of one run. The first image (cold caches, lazy initialisation,
    compilation) is reported on its own; the percentiles and the mean describe the
    remaining, steady-state images (all images when there is only one)."""

    images: int
    first_ms: float
    p50_ms: float
    p90_ms: float
    p99_ms: float
    mean_ms: float
    max_ms: float
    images_per_s: float  # images / total time of all of them, the first included


def latency_stats(latencies_ms: Sequence[float]) -> LatencyStats:
    if len(latencies_ms) == 0:
        raise ValueError("latency_stats needs at least one latency")
    values = np.asarray(latencies_ms, dtype=np.float64)
    steady = values[1:] if values.size > 1 else values
    p50, p90, p99 = np.percentile(steady, [50, 90, 99])
    total_s = float(values.sum()) / 1000
    return LatencyStats(
        images=int(values.size),
        first_ms=float(values[0]),
        p50_ms=float(p50),
        p90_ms=float(p90),
        p99_ms=float(p99),
        mean_ms=float(steady.mean()),
        max_ms=float(steady.max()),
        images_per_s=values.size / total_s if total_s > 0 else math.inf,
    )


def mask_iou(a: np.ndarray, b: np.ndarray) -> float:
    """Intersection over union of two boolean masks of one size; 1.0 for two empty masks."""
    if a.shape != b.shape:
        raise ValueError(f"masks of different sizes: {a.shape} and {b.shape}")
    union = int(np.logical_or(a, b).sum())
    if union == 0:
        return 1.0
    return int(np.logical_and(a, b).sum()) / union


def _mask(record: Record) -> np.ndarray:
    segmentation = record["segmentation"]
    if isinstance(segmentation, np.ndarray):
        return segmentation.astype(bool)
    if isinstance(segmentation.get("counts"), list):
        return rle_to_mask(segmentation)
    return rle_to_mask(coco_to_rle(segmentation))


def _by_area(records: Sequence[Record]) -> list[Record]:
    return sorted(records, key=lambda record: -int(record["area"]))  # stable: ties keep order


@dataclass(frozen=True)
class Accuracy:
    """Agreement of one run's masks with the baseline's, over the same images."""

    miou: float | None  # None when no image had masks to pair
    fails: int  # images whose mask count differs from the baseline's
    images: int  # images compared
    compared_images: int  # images that entered the mIoU
    masks: int  # masks paired
    exact: int  # paired masks identical to the baseline's, pixel for pixel

    @property
    def exact_fraction(self) -> float | None:
        return self.exact / self.masks if self.masks else None


def _accuracy(
    candidate: Sequence[Sequence[Record]],
    baseline: Sequence[Sequence[Record]],
    order_by_area: bool,
) -> Accuracy:
    if len(candidate) != len(baseline):
        raise ValueError(f"{len(candidate)} images to compare with {len(baseline)} baseline images")
    fails = masks = exact = 0
    image_ious = []
    for records, reference in zip(candidate, baseline, strict=True):
        if len(records) != len(reference):
            fails += 1
            continue
        if not records:
            continue
        if order_by_area:
            records, reference = _by_area(records), _by_area(reference)
        ious = []
        for record, expected in zip(records, reference, strict=True):
            mask, expected_mask = _mask(record), _mask(expected)
            ious.append(mask_iou(mask, expected_mask))
            exact += bool(np.array_equal(mask, expected_mask))
        masks += len(ious)
        image_ious.append(float(np.mean(ious)))
    return Accuracy(
        miou=float(np.mean(image_ious)) if image_ious else None,
        fails=fails,
        images=len(baseline),
        compared_images=len(image_ious),
        masks=masks,
        exact=exact,
    )


def amg_accuracy(
    candidate: Sequence[Sequence[Record]], baseline: Sequence[Sequence[Record]]
) -> Accuracy:
    """AMG records per image against the baseline's: fail = different mask count; mIoU
    over the other images, masks paired in area order."""
    return _accuracy(candidate, baseline, order_by_area=True)


def point_accuracy(
    candidate: Sequence[Sequence[Record]], baseline: Sequence[Sequence[Record]]
) -> Accuracy:
    """SPS / MPS records per image against the baseline's, paired prompt by prompt."""
    return _accuracy(candidate, baseline, order_by_area=False)
