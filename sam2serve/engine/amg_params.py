"""AMG's parameters: Meta's ``SAM2AutomaticMaskGenerator`` arguments with its defaults, as
one frozen, validated value. The library, the command line and the HTTP schema all take
their names, defaults and checks from :class:`AMGParams`. Torch-free (numpy only), so the
command line can check a value before importing torch.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

__all__ = ["OUTPUT_MODES", "AMGParamError", "AMGParams", "OutputMode", "PointGrid"]

OutputMode = Literal["binary_mask", "uncompressed_rle", "coco_rle"]
OUTPUT_MODES: tuple[str, ...] = ("binary_mask", "uncompressed_rle", "coco_rle")
PointGrid = tuple[tuple[float, float], ...]


class AMGParamError(ValueError):
    """An AMG parameter a user got wrong; the message names it and what is accepted."""


def _check_int(name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise AMGParamError(f"{name} must be an integer >= {minimum}, got {value!r}")
    if value < minimum:
        raise AMGParamError(f"{name} must be an integer >= {minimum}, got {value}")
    return int(value)


def _check_float(
    name: str,
    value: Any,
    low: float | None = None,
    high: float | None = None,
    high_inclusive: bool = True,
) -> float:
    if low is None and high is None:
        accepted = "a finite number"
    else:
        upper = "]" if high_inclusive else ")"
        accepted = (
            f"a number in [{low}, {high}{upper}" if high is not None else f"a number >= {low}"
        )
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise AMGParamError(f"{name} must be {accepted}, got {value!r}")
    number = float(value)
    too_high = high is not None and (number > high if high_inclusive else number >= high)
    if not math.isfinite(number) or (low is not None and number < low) or too_high:
        raise AMGParamError(f"{name} must be {accepted}, got {value!r}")
    return number


def _check_bool(name: str, value: Any) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise AMGParamError(f"{name} must be True or False, got {value!r}")
    return bool(value)


def _check_point_grids(value: Any, n_layers: int) -> tuple[PointGrid, ...]:
    """Normalise explicit grids to tuples of (x, y) in [0, 1], one grid per crop layer."""
    if isinstance(value, np.ndarray) and value.ndim == 2:
        raise AMGParamError(
            "point_grids must be a list of (N, 2) grids, one per crop layer; "
            "wrap a single grid in a list"
        )
    try:
        grids = [np.asarray(grid, dtype=np.float64) for grid in value]
    except (TypeError, ValueError) as exc:
        raise AMGParamError(
            f"point_grids must be a list of (N, 2) arrays of numbers, got {value!r:.80}: {exc}"
        ) from None
    if len(grids) < n_layers + 1:
        raise AMGParamError(
            f"point_grids has {len(grids)} grid(s) but crop_n_layers={n_layers} needs "
            f"{n_layers + 1} (one for the whole image and one per crop layer)"
        )
    for layer, grid in enumerate(grids):
        if grid.ndim != 2 or grid.shape[1] != 2 or grid.shape[0] == 0:
            raise AMGParamError(
                f"point_grids[{layer}] must have shape (N, 2) with N >= 1, got {grid.shape}"
            )
        if not (np.isfinite(grid).all() and (grid >= 0).all() and (grid <= 1).all()):
            raise AMGParamError(
                f"point_grids[{layer}] must hold (x, y) normalised to [0, 1], got values in "
                f"[{np.nanmin(grid):g}, {np.nanmax(grid):g}]"
            )
    return tuple(tuple((float(x), float(y)) for x, y in grid) for grid in grids)


@dataclass(frozen=True)
class AMGParams:
    """Every parameter of automatic mask generation, with Meta's defaults.

    Built from keyword arguments or from a mapping (``AMGParams.from_dict``, for the CLI
    and the server); validated on construction, so a bad value fails early with a
    message that names it. Immutable and hashable, so it can key a cache.
    """

    # Points per side of the grid on the whole image (points_per_side**2 clicks); None
    # when ``point_grids`` gives the clicks explicitly. Exactly one of the two is set.
    points_per_side: int | None = 32
    # Clicks decoded together; more is faster but holds more masks in memory at once.
    points_per_batch: int = 64
    # Keep masks whose predicted IoU is > this (0 turns the filter off).
    pred_iou_thresh: float = 0.8
    # Keep masks whose stability score is >= this (0 turns the filter off).
    stability_score_thresh: float = 0.95
    # The logit shift either side of mask_threshold the stability score compares.
    stability_score_offset: float = 1.0
    # Logit above which a pixel is in the mask.
    mask_threshold: float = 0.0
    # Box IoU above which the lower-scoring of two masks of one crop is dropped.
    box_nms_thresh: float = 0.7
    # Extra crop layers: layer i adds (2^i)^2 overlapping crops, each encoded anew.
    crop_n_layers: int = 0
    # Box IoU above which a mask from a larger crop loses to one from a smaller crop.
    crop_nms_thresh: float = 0.7
    # Overlap of neighbouring layer-1 crops as a fraction of the image's short side.
    crop_overlap_ratio: float = 512 / 1500
    # Layer i's grid has points_per_side / factor**i points per side.
    crop_n_points_downscale_factor: int = 1
    # Explicit grids of (x, y) in [0, 1], one per crop layer; excludes points_per_side.
    point_grids: tuple[PointGrid, ...] | None = None
    # If > 0, fill holes and drop islands smaller than this many pixels, then NMS again.
    min_mask_region_area: int = 0
    # "binary_mask" (H, W) bool arrays, "uncompressed_rle" or "coco_rle" (string counts).
    output_mode: OutputMode = "binary_mask"
    # Refine each mask once, decoding its click again with its own low-res logits.
    use_m2m: bool = False
    # Three masks per click (whole, part, subpart); False: one, chosen by the model.
    multimask_output: bool = True

    def __post_init__(self) -> None:
        def put(name: str, value: Any) -> None:
            object.__setattr__(self, name, value)  # normalise types on a frozen instance

        put("crop_n_layers", _check_int("crop_n_layers", self.crop_n_layers, 0))
        factor = _check_int(
            "crop_n_points_downscale_factor", self.crop_n_points_downscale_factor, 1
        )
        put("crop_n_points_downscale_factor", factor)
        if (self.points_per_side is None) == (self.point_grids is None):
            raise AMGParamError(
                "give exactly one of points_per_side and point_grids (set "
                "points_per_side=None to use point_grids); got "
                f"points_per_side={self.points_per_side!r} and point_grids="
                f"{'None' if self.point_grids is None else 'a list of grids'}"
            )
        if self.points_per_side is not None:
            side = _check_int("points_per_side", self.points_per_side, 1)
            deepest = factor**self.crop_n_layers
            if side < deepest:
                raise AMGParamError(
                    f"points_per_side={side} leaves no points in crop layer "
                    f"{self.crop_n_layers}: it is divided by crop_n_points_downscale_factor"
                    f"**layer = {deepest}; use points_per_side >= {deepest}"
                )
            put("points_per_side", side)
        else:
            put("point_grids", _check_point_grids(self.point_grids, self.crop_n_layers))
        put("points_per_batch", _check_int("points_per_batch", self.points_per_batch, 1))
        for name in (
            "pred_iou_thresh",
            "stability_score_thresh",
            "box_nms_thresh",
            "crop_nms_thresh",
        ):
            put(name, _check_float(name, getattr(self, name), 0.0, 1.0))
        put(
            "stability_score_offset",
            _check_float("stability_score_offset", self.stability_score_offset, 0.0),
        )
        put("mask_threshold", _check_float("mask_threshold", self.mask_threshold))
        put(
            "crop_overlap_ratio",
            _check_float(
                "crop_overlap_ratio", self.crop_overlap_ratio, 0.0, 1.0, high_inclusive=False
            ),
        )
        put(
            "min_mask_region_area", _check_int("min_mask_region_area", self.min_mask_region_area, 0)
        )
        if self.output_mode not in OUTPUT_MODES:
            raise AMGParamError(
                f"output_mode must be one of {', '.join(map(repr, OUTPUT_MODES))}, "
                f"got {self.output_mode!r}"
            )
        put("use_m2m", _check_bool("use_m2m", self.use_m2m))
        put("multimask_output", _check_bool("multimask_output", self.multimask_output))

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls))

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> AMGParams:
        """Parameters from a mapping (JSON, CLI); unknown names are an error, not ignored."""
        return cls().replace(**values)

    def replace(self, **changes: Any) -> AMGParams:
        """A copy with some parameters changed (and validated)."""
        unknown = sorted(set(changes) - set(self.field_names()))
        if unknown:
            raise AMGParamError(
                f"unknown AMG parameter(s) {', '.join(unknown)}; accepted: "
                f"{', '.join(self.field_names())}"
            )
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready values (grids as nested lists)."""
        values = dataclasses.asdict(self)
        if self.point_grids is not None:
            values["point_grids"] = [[list(p) for p in grid] for grid in self.point_grids]
        return values

    def crop_count(self) -> int:
        """Crops AMG encodes: 4**i in layer i (the whole image is layer 0)."""
        return sum(4**layer for layer in range(self.crop_n_layers + 1))

    def click_count(self) -> int:
        """Clicks AMG decodes over all crops, computed without building any grid."""
        total = 0
        for layer in range(self.crop_n_layers + 1):
            if self.point_grids is not None:
                per_crop = len(self.point_grids[layer])
            else:
                assert self.points_per_side is not None
                per_crop = (self.points_per_side // self.crop_n_points_downscale_factor**layer) ** 2
            total += per_crop * 4**layer
        return total

    def layer_point_grids(self) -> list[np.ndarray]:
        """(N, 2) float64 grid of normalised (x, y) clicks for each crop layer."""
        if self.point_grids is not None:
            return [np.asarray(grid, dtype=np.float64) for grid in self.point_grids]
        from sam2serve.engine.masks import build_all_layer_point_grids  # torch

        assert self.points_per_side is not None
        return build_all_layer_point_grids(
            self.points_per_side, self.crop_n_layers, self.crop_n_points_downscale_factor
        )
