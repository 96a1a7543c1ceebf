"""AMG's parameters: Meta's ``SAM2AutomaticMaskGenerator`` arguments with its defaults, as
one frozen, validated value, and the one description of each.

Every field of :class:`AMGParams` carries a :class:`ParamSpec` (its kind, what it means,
its bounds) in its metadata. The checks in ``__post_init__`` and their messages are read
from the specs, and so are the command line's flags (``commands/amg_flags.py``: type, help,
default) and the service's ``AMGOptions`` schema (``server/schemas.py``: type, description,
default, bounds, with the service's own caps on top). A new parameter is one field here.
Torch-free (numpy only), so the command line can check a value before importing torch.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Literal

import numpy as np

from sam2serve.engine.formats import FORMATS

__all__ = [
    "OUTPUT_MODES",
    "PARAM_SPECS",
    "AMGParamError",
    "AMGParams",
    "OutputMode",
    "ParamSpec",
    "PointGrid",
]

# The library's output modes: every format of engine.formats (binary_mask included).
OutputMode = str
OUTPUT_MODES: tuple[str, ...] = tuple(FORMATS)
PointGrid = tuple[tuple[float, float], ...]
ParamKind = Literal["int", "float", "bool", "choice", "point_grids"]


class AMGParamError(ValueError):
    """An AMG parameter a user got wrong; the message names it and what is accepted."""


@dataclass(frozen=True)
class ParamSpec:
    """What one AMG parameter is and accepts; the checks, flags and schema derive from it.

    ``help`` is one phrase, lower case and without a final period, naming other
    parameters by their Python names (the command line shows them as flags). Bounds:
    ``low`` is inclusive, ``high`` inclusive unless ``high_inclusive`` is False; for
    ``point_grids`` they bound each coordinate.
    """

    kind: ParamKind
    help: str
    low: float | None = None
    high: float | None = None
    high_inclusive: bool = True
    # None is a value too (points_per_side and point_grids: exactly one of them is set).
    nullable: bool = False
    choices: tuple[str, ...] = ()

    def capped(self, high: float) -> ParamSpec:
        """This spec with an upper bound at most ``high`` (a surface's own limit, on top)."""
        if self.high is not None and self.high <= high:
            return self
        return dataclasses.replace(self, high=high, high_inclusive=True)

    def accepted(self) -> str:
        """What a value must be, as error messages say it."""
        if self.kind == "bool":
            return "True or False"
        if self.kind == "choice":
            return f"one of {', '.join(map(repr, self.choices))}"
        if self.kind == "point_grids":
            return f"a list of (N, 2) grids of (x, y) in {self.interval('g')}, one per layer"
        noun = "an integer" if self.kind == "int" else "a number"
        if self.low is None and self.high is None:
            return "a finite number" if self.kind == "float" else noun
        if self.high is None:
            return f"{noun} >= {self.low}"
        if self.low is None:
            return f"{noun} {'<=' if self.high_inclusive else '<'} {self.high}"
        return f"{noun} in {self.interval()}"

    def interval(self, number_format: str = "") -> str:
        """The bounds as an interval, ``[low, high]`` or ``[low, high)``."""
        upper = "]" if self.high_inclusive else ")"
        return f"[{self.low:{number_format}}, {self.high:{number_format}}{upper}"

    def in_bounds(self, value: Any) -> bool:
        """Whether ``value`` (a number or an array of numbers) lies within the bounds."""
        values = np.asarray(value)
        above_low = self.low is None or bool(np.all(values >= self.low))
        if self.high is None:
            return above_low
        below_high = values <= self.high if self.high_inclusive else values < self.high
        return above_low and bool(np.all(below_high))

    def check(self, name: str, value: Any) -> Any:
        """``value`` normalised to this kind (int, float, bool, str), or AMGParamError
        naming ``name``, the value and what is accepted. Not for point_grids."""
        if value is None and self.nullable:
            return None
        wrong = f"{name} must be {self.accepted()}, got {value!r}"
        if self.kind == "bool":
            if not isinstance(value, (bool, np.bool_)):
                raise AMGParamError(wrong)
            return bool(value)
        if self.kind == "choice":
            if not isinstance(value, str) or value not in self.choices:
                raise AMGParamError(wrong)
            return value
        if self.kind == "int":
            if isinstance(value, bool) or not isinstance(value, numbers.Integral):
                raise AMGParamError(wrong)
            if not self.in_bounds(value):
                raise AMGParamError(f"{name} must be {self.accepted()}, got {value}")
            return int(value)
        if self.kind == "float":
            if isinstance(value, bool) or not isinstance(value, numbers.Real):
                raise AMGParamError(wrong)
            number = float(value)
            if not (math.isfinite(number) and self.in_bounds(number)):
                raise AMGParamError(wrong)
            return number
        raise TypeError(f"{name}: a {self.kind} parameter is checked with its neighbours")


def _param(default: Any, spec: ParamSpec) -> Any:
    """A dataclass field with its default and its spec."""
    return dataclasses.field(default=default, metadata={"spec": spec})


def _check_point_grids(value: Any, n_layers: int, spec: ParamSpec) -> tuple[PointGrid, ...]:
    """Normalise explicit grids to tuples of (x, y) in the spec's bounds, one per layer."""
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
        if not (np.isfinite(grid).all() and spec.in_bounds(grid)):
            raise AMGParamError(
                f"point_grids[{layer}] must hold (x, y) normalised to {spec.interval('g')}, "
                f"got values in [{np.nanmin(grid):g}, {np.nanmax(grid):g}]"
            )
    return tuple(tuple((float(x), float(y)) for x, y in grid) for grid in grids)


@dataclass(frozen=True)
class AMGParams:
    """Every parameter of automatic mask generation, with Meta's defaults.

    Built from keyword arguments or from a mapping (``AMGParams.from_dict``, for the CLI
    and the server); validated on construction against each field's :class:`ParamSpec`,
    so a bad value fails early with a message that names it. Immutable and hashable, so
    it can key a cache.
    """

    points_per_side: int | None = _param(
        32,
        ParamSpec(
            "int",
            "points per side of the click grid on the whole image (its square is the number "
            "of clicks, each decoded into up to 3 masks); point_grids replaces it",
            low=1,
            nullable=True,
        ),
    )
    points_per_batch: int = _param(
        64,
        ParamSpec(
            "int",
            "clicks decoded together (fewer when their masks would not fit in the memory "
            "budget); more is faster",
            low=1,
        ),
    )
    pred_iou_thresh: float = _param(
        0.8,
        ParamSpec(
            "float",
            "keep masks whose predicted IoU is above this (0 turns the filter off)",
            low=0.0,
            high=1.0,
        ),
    )
    stability_score_thresh: float = _param(
        0.95,
        ParamSpec(
            "float",
            "keep masks whose stability score is at least this (0 turns the filter off)",
            low=0.0,
            high=1.0,
        ),
    )
    stability_score_offset: float = _param(
        1.0,
        ParamSpec(
            "float",
            "logit shift either side of mask_threshold that the stability score compares",
            low=0.0,
        ),
    )
    mask_threshold: float = _param(
        0.0, ParamSpec("float", "logit above which a pixel belongs to a mask")
    )
    box_nms_thresh: float = _param(
        0.7,
        ParamSpec(
            "float",
            "box IoU above which the lower-scoring of two masks of one crop is dropped",
            low=0.0,
            high=1.0,
        ),
    )
    crop_n_layers: int = _param(
        0,
        ParamSpec(
            "int",
            "extra crop layers: layer i adds (2**i)**2 overlapping crops, each encoded again "
            "(slow)",
            low=0,
        ),
    )
    crop_nms_thresh: float = _param(
        0.7,
        ParamSpec(
            "float",
            "box IoU above which a mask from a larger crop loses to one from a smaller crop",
            low=0.0,
            high=1.0,
        ),
    )
    crop_overlap_ratio: float = _param(
        512 / 1500,
        ParamSpec(
            "float",
            "overlap of neighbouring layer-1 crops, as a fraction of the image's short side",
            low=0.0,
            high=1.0,
            high_inclusive=False,
        ),
    )
    crop_n_points_downscale_factor: int = _param(
        1,
        ParamSpec(
            "int",
            "crop layer i gets a grid of points_per_side / factor**i points per side",
            low=1,
        ),
    )
    point_grids: tuple[PointGrid, ...] | None = _param(
        None,
        ParamSpec(
            "point_grids",
            "explicit click grids instead of points_per_side: one list of [x, y] points "
            "(normalised to [0, 1]) per crop layer",
            low=0.0,
            high=1.0,
            nullable=True,
        ),
    )
    min_mask_region_area: int = _param(
        0,
        ParamSpec(
            "int",
            "if > 0, fill holes and remove islands smaller than this many pixels in every "
            "mask, then remove duplicates again",
            low=0,
        ),
    )
    output_mode: str = _param(
        "binary_mask",
        ParamSpec(
            "choice",
            "form of each record's segmentation (engine.formats.FORMATS)",
            choices=OUTPUT_MODES,
        ),
    )
    use_m2m: bool = _param(
        False,
        ParamSpec(
            "bool",
            "refine each mask once by decoding its click again with its own low-res logits",
        ),
    )
    multimask_output: bool = _param(
        True,
        ParamSpec(
            "bool",
            "three masks per click (whole, part, subpart), else one (the model's choice)",
        ),
    )

    def __post_init__(self) -> None:
        for name, spec in PARAM_SPECS.items():
            if spec.kind != "point_grids":  # normalise types on a frozen instance
                object.__setattr__(self, name, spec.check(name, getattr(self, name)))
        if (self.points_per_side is None) == (self.point_grids is None):
            raise AMGParamError(
                "give exactly one of points_per_side and point_grids (set "
                "points_per_side=None to use point_grids); got "
                f"points_per_side={self.points_per_side!r} and point_grids="
                f"{'None' if self.point_grids is None else 'a list of grids'}"
            )
        if self.points_per_side is not None:
            deepest = self.crop_n_points_downscale_factor**self.crop_n_layers
            if self.points_per_side < deepest:
                raise AMGParamError(
                    f"points_per_side={self.points_per_side} leaves no points in crop layer "
                    f"{self.crop_n_layers}: it is divided by crop_n_points_downscale_factor"
                    f"**layer = {deepest}; use points_per_side >= {deepest}"
                )
        else:
            grids = _check_point_grids(
                self.point_grids, self.crop_n_layers, PARAM_SPECS["point_grids"]
            )
            object.__setattr__(self, "point_grids", grids)

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls))

    @classmethod
    def defaults(cls) -> dict[str, Any]:
        """Every parameter's default (Meta's), in field order."""
        return {f.name: f.default for f in dataclasses.fields(cls)}

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


# Each parameter's spec, by name in field order: what the checks, the CLI and the API read.
PARAM_SPECS: Mapping[str, ParamSpec] = MappingProxyType(
    {f.name: f.metadata["spec"] for f in dataclasses.fields(AMGParams)}
)
