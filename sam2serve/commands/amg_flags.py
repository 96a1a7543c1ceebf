"""The AMG flags of ``run`` and ``bench``: one flag per AMG parameter, derived from its
:class:`~sam2serve.engine.amg_params.ParamSpec` (the flag's type from its kind, its help
from its description, Meta's default from the dataclass) and checked by
:class:`~sam2serve.engine.amg_params.AMGParams` itself in the handler, so a flag cannot
drift from its parameter. ``engine.amg_params`` imports no torch: usage errors still come
before any heavy import.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any

from sam2serve.commands.common import UsageError
from sam2serve.engine.amg_params import PARAM_SPECS, AMGParamError, AMGParams

# AMGParams fields that are not flags: the engine hands the commands COCO RLE (run writes
# it in the form --mask-format asks for).
AMG_FIXED: dict[str, Any] = {"output_mode": "coco_rle"}
# The parameters that are flags, in the dataclass's order.
AMG_FLAG_NAMES: tuple[str, ...] = tuple(name for name in PARAM_SPECS if name not in AMG_FIXED)
AMG_GROUP_TITLE = "automatic mask generation (defaults are Meta's)"
# A parameter's kind -> the flag's value type and metavar (bool and point_grids differ).
_TYPES = {"int": int, "float": float}


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def default_text(value: Any) -> str:
    """A parameter's default as help shows it."""
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def flag_help(name: str) -> str:
    """The help of a parameter's flag: its spec's description, the other parameters it
    names written as flags, and its default (a JSON file has none)."""
    spec = PARAM_SPECS[name]
    text = with_flag_names(spec.help)
    if spec.kind == "point_grids":
        return f"JSON file of {text}"
    return f"{text} (default: {default_text(AMGParams.defaults()[name])})"


def add_amg_flags(group: argparse._ActionsContainer) -> None:
    """One flag per AMG parameter; a flag not given leaves Meta's default."""
    for name in AMG_FLAG_NAMES:
        kind = PARAM_SPECS[name].kind
        help_text = flag_help(name).replace("%", "%%")
        if kind == "point_grids":
            group.add_argument(flag(name), metavar="JSON_FILE", type=Path, help=help_text)
        elif kind == "bool":
            group.add_argument(
                flag(name), action=argparse.BooleanOptionalAction, default=None, help=help_text
            )
        elif kind in _TYPES:
            group.add_argument(flag(name), type=_TYPES[kind], metavar=kind.upper(), help=help_text)
        else:
            raise TypeError(f"AMG parameter {name} ({kind}) has no flag kind: add it to AMG_FIXED")


def amg_params_from(args: argparse.Namespace) -> AMGParams:
    """AMGParams from the flags that were given (the rest keep Meta's defaults); a bad
    value is a usage error naming its flag."""
    given = {
        name: getattr(args, name)
        for name in AMG_FLAG_NAMES
        if name != "point_grids" and getattr(args, name) is not None
    }
    if args.point_grids is not None:
        given["point_grids"] = _load_point_grids(args.point_grids)
        given.setdefault("points_per_side", None)
    try:
        return AMGParams(**{**AMG_FIXED, **given})
    except AMGParamError as exc:
        raise UsageError(with_flag_names(str(exc))) from None


def _load_point_grids(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UsageError(f"--point-grids file not found: {str(path)!r}") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UsageError(f"--point-grids file {str(path)!r} is not readable JSON: {exc}") from None


def with_flag_names(text: str) -> str:
    """AMGParams names its parameters as in Python; the command line says the flag."""
    for name in sorted(AMG_FLAG_NAMES, key=len, reverse=True):
        text = re.sub(rf"(?<![\w-]){name}(?!\w)", flag(name), text)
    return text
