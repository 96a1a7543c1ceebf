"""The AMG flags of ``run`` and ``bench``: one flag per :class:`~sam2serve.engine.amg.AMGParams`
field, defaults and checks from the dataclass itself.

The parsers must not import torch (usage errors come before heavy imports), and the
dataclass lives next to the generator, which does. So this table gives each flag's kind
and help; its default is read from ``AMGParams`` only when help is shown, and the values
are checked by ``AMGParams`` itself in the handler. ``tests/commands`` checks that every
field has a flag of the right kind.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sam2serve.commands.common import UsageError

if TYPE_CHECKING:
    from sam2serve.engine.amg import AMGParams

# Kind and help of every AMGParams field the CLI exposes; a new field needs a line here.
AMG_FLAGS: dict[str, tuple[str, str]] = {
    "points_per_side": (
        "int",
        (
            "points per side of the click grid on the whole image: points_per_side**2 clicks, "
            "each decoded into up to 3 masks"
        ),
    ),
    "points_per_batch": (
        "int",
        "clicks decoded together; more is faster but holds more masks in memory",
    ),
    "pred_iou_thresh": (
        "float",
        "keep masks whose predicted IoU is above this (0 turns the filter off)",
    ),
    "stability_score_thresh": (
        "float",
        "keep masks whose stability score is at least this (0 turns the filter off)",
    ),
    "stability_score_offset": (
        "float",
        "logit shift either side of --mask-threshold that the stability score compares",
    ),
    "mask_threshold": ("float", "logit above which a pixel belongs to a mask"),
    "box_nms_thresh": (
        "float",
        "box IoU above which the lower-scoring of two masks of one crop is dropped",
    ),
    "crop_n_layers": (
        "int",
        "extra crop layers: layer i adds (2**i)**2 overlapping crops, each encoded again (slow)",
    ),
    "crop_nms_thresh": (
        "float",
        "box IoU above which a mask from a larger crop loses to one from a smaller crop",
    ),
    "crop_overlap_ratio": (
        "float",
        "overlap of neighbouring layer-1 crops, as a fraction of the image's short side",
    ),
    "crop_n_points_downscale_factor": (
        "int",
        "crop layer i gets points_per_side / factor**i points per side",
    ),
    "point_grids": (
        "json_file",
        (
            "JSON file with explicit click grids instead of --points-per-side: a list of "
            "[[x, y], ...] grids normalised to [0, 1], one per crop layer"
        ),
    ),
    "min_mask_region_area": (
        "int",
        "if > 0, fill holes and remove islands smaller than this many pixels in every mask",
    ),
    "use_m2m": (
        "bool",
        "refine each mask once by decoding its click again with its own low-res logits",
    ),
    "multimask_output": (
        "bool",
        "three masks per click (whole, part, subpart); --no-multimask-output: one per click",
    ),
}
# AMGParams fields that are not flags: the JSON output always holds COCO RLE.
AMG_FIXED: dict[str, Any] = {"output_mode": "coco_rle"}
AMG_GROUP_TITLE = "automatic mask generation (defaults are Meta's)"
_TYPES = {"int": int, "float": float}


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _default_text(name: str) -> str:
    """The AMGParams default of ``name`` as help shows it (imports the engine: help only)."""
    from sam2serve.engine.amg import AMGParams

    value = getattr(AMGParams(), name)
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def add_amg_flags(group: argparse._ActionsContainer) -> None:
    """One flag per AMG parameter; a flag not given leaves Meta's default."""
    for name, (kind, help_text) in AMG_FLAGS.items():
        if kind == "json_file":
            group.add_argument(flag(name), metavar="JSON_FILE", type=Path, help=help_text)
            continue
        if kind == "bool":
            action = group.add_argument(
                flag(name), action=argparse.BooleanOptionalAction, default=None, help=help_text
            )
        else:
            action = group.add_argument(
                flag(name), type=_TYPES[kind], metavar=kind.upper(), help=help_text
            )
        action.lazy_default = lambda name=name: _default_text(name)  # type: ignore[attr-defined]


def amg_params_from(args: argparse.Namespace) -> AMGParams:
    """AMGParams from the flags that were given (the rest keep Meta's defaults); a bad
    value is a usage error naming its flag."""
    from sam2serve.engine.amg import AMGParamError, AMGParams

    given = {
        name: getattr(args, name)
        for name in AMG_FLAGS
        if name != "point_grids" and getattr(args, name) is not None
    }
    if args.point_grids is not None:
        given["point_grids"] = _load_point_grids(args.point_grids)
        given.setdefault("points_per_side", None)
    try:
        return AMGParams(**{**AMG_FIXED, **given})
    except AMGParamError as exc:
        raise UsageError(_with_flag_names(str(exc))) from None


def _load_point_grids(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UsageError(f"--point-grids file not found: {str(path)!r}") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UsageError(f"--point-grids file {str(path)!r} is not readable JSON: {exc}") from None


def _with_flag_names(message: str) -> str:
    """AMGParams names its parameters as in Python; the command line says the flag."""
    for name in sorted(AMG_FLAGS, key=len, reverse=True):
        message = re.sub(rf"(?<![\w-]){name}(?!\w)", flag(name), message)
    return message
