"""A settings dataclass's fields as command-line flags: one source for each setting's
help, bounds and default (torch-free).

A field declared with :func:`option` carries an :class:`Option` in its metadata. The
command line's flags are derived from it (:func:`add_options`: the flag, its type, its
help with the field's default), the flags' values are read back by field name
(:func:`option_values`), and the bounds are checked by the dataclass itself
(:func:`check_options`, called from ``__post_init__``), so a library caller and the command
line get the same error. This is how vLLM and sglang keep an engine's arguments and its
flags from drifting; ``engine.amg_params`` does the same for AMG's parameters.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

__all__ = [
    "Option",
    "OptionError",
    "add_option_groups",
    "add_options",
    "check_options",
    "flag_of",
    "option",
    "option_values",
]

OPTION = "option"  # the metadata key


@dataclass(frozen=True)
class Option:
    """How one setting is a flag, and what it accepts.

    ``type`` parses the flag's text (default: the type of the field's default; a bool
    field is a switch). ``low`` / ``high`` bound numbers (``low_open``: exclusive low
    bound). ``default_text`` replaces the default in the help where the default is
    computed (None standing for "decided at run time")."""

    help: str
    type: Callable[[str], Any] | None = None
    metavar: str | None = None
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    choices: tuple[Any, ...] | None = None
    flag: str | None = None  # default: --FIELD-NAME
    default_text: str | None = None
    # The flag's unit in the field's (e.g. 1 MiB for a byte count given as --...-mib): the
    # flag takes a number of units, the help shows the default in units.
    scale: int | None = None
    group: str | None = None  # the help group the flag is listed in

    def accepted(self, kind: str) -> str:
        """What a value must be, as error messages say it."""
        if self.choices is not None:
            return "one of " + ", ".join(map(str, self.choices))
        if self.low is None and self.high is None:
            return kind
        if self.high is None:
            return f"{kind} {'>' if self.low_open else '>='} {self.low:g}"
        if self.low is None:
            return f"{kind} <= {self.high:g}"
        return f"{kind} in {'(' if self.low_open else '['}{self.low:g}, {self.high:g}]"


def option(default: Any = dataclasses.MISSING, **settings: Any) -> Any:
    """A dataclass field with ``default`` whose :class:`Option` is built from ``settings``."""
    return dataclasses.field(default=default, metadata={OPTION: Option(**settings)})


def _options(cls: type, names: Iterable[str] | None) -> list[tuple[dataclasses.Field, Option]]:
    fields = {f.name: f for f in dataclasses.fields(cls) if OPTION in f.metadata}
    chosen = list(fields) if names is None else list(names)
    missing = [name for name in chosen if name not in fields]
    if missing:
        raise TypeError(f"{cls.__name__} has no option field {', '.join(missing)}")
    return [(fields[name], fields[name].metadata[OPTION]) for name in chosen]


def flag_of(field: dataclasses.Field) -> str:
    """The flag of an option field: its Option's, else ``--`` + the name with dashes."""
    spec: Option = field.metadata[OPTION]
    return spec.flag or "--" + field.name.replace("_", "-")


def _default_text(field: dataclasses.Field, spec: Option) -> str:
    if spec.default_text is not None:
        return spec.default_text
    value = field.default
    if isinstance(value, bool):
        return "on" if value else "off"
    if spec.scale is not None and value is not None:
        return f"{value / spec.scale:g}"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def _in_units(scale: int) -> Callable[[str], int]:
    """``type`` of a scaled flag: a number of units -> the field's integer value."""

    def parse(text: str) -> int:
        try:
            number = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if not math.isfinite(number):
            raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
        return int(number * scale)

    return parse


def add_options(
    container: argparse._ActionsContainer, cls: type, names: Iterable[str] | None = None
) -> None:
    """One flag per option field of ``cls`` (``names``: those, in that order)."""
    for field, spec in _options(cls, names):
        flag = flag_of(field)
        default = None if field.default is dataclasses.MISSING else field.default
        bounds = ""
        if (
            spec.choices is None
            and spec.scale is None
            and (spec.low is not None or spec.high is not None)
        ):
            kind = "an integer" if (spec.type or type(default)) is int else "a number"
            bounds = f"; {spec.accepted(kind)}"
        help_text = f"{spec.help} (default: {_default_text(field, spec)}{bounds})"
        help_text = help_text.replace("%", "%%")
        if isinstance(default, bool):
            container.add_argument(
                flag,
                dest=field.name,
                action=argparse.BooleanOptionalAction if default else "store_true",
                default=default,
                help=help_text,
            )
            continue
        if spec.scale is not None:
            kind = _in_units(spec.scale)
        else:
            kind = spec.type or (type(default) if default is not None else str)
        container.add_argument(
            flag,
            dest=field.name,
            type=kind,
            default=default,
            choices=spec.choices,
            metavar=spec.metavar,
            help=help_text,
        )


def add_option_groups(
    parser: argparse.ArgumentParser, cls: type, names: Iterable[str] | None = None
) -> None:
    """The option fields of ``cls`` as flags in argument groups by their Option's group
    (groups in the order of their first field; fields without a group on ``parser``)."""
    grouped: dict[str | None, list[str]] = {}
    for field, spec in _options(cls, names):
        grouped.setdefault(spec.group, []).append(field.name)
    for title, fields in grouped.items():
        container = parser if title is None else parser.add_argument_group(title)
        add_options(container, cls, fields)


def option_values(
    args: argparse.Namespace, cls: type, names: Iterable[str] | None = None
) -> dict[str, Any]:
    """The option fields' values from parsed flags, by field name."""
    return {field.name: getattr(args, field.name) for field, _ in _options(cls, names)}


class OptionError(ValueError):
    """A setting out of its bounds or choices. ``str()`` names the field (what a library
    caller or a config file wrote); :meth:`for_flag` names the flag instead."""

    def __init__(self, field: str, flag: str, requirement: str, value: Any) -> None:
        self.field, self.flag, self.requirement, self.value = field, flag, requirement, value
        super().__init__(f"{field} must be {requirement}, got {value!r}")

    def for_flag(self) -> str:
        return f"{self.flag} must be {self.requirement}, got {self.value!r}"


def check_options(instance: Any) -> None:
    """Raise :class:`OptionError` for the first option field of ``instance`` out of its
    bounds or choices (a None value passes: it means "not set")."""
    for field, spec in _options(type(instance), None):
        value = getattr(instance, field.name)
        if value is None:
            continue
        problem = _problem(value, spec)
        if problem is not None:
            raise OptionError(field.name, flag_of(field), spec.accepted(problem), value)


def _problem(value: Any, spec: Option) -> str | None:
    """The kind of value expected when ``value`` is refused, else None."""
    if spec.choices is not None:
        return None if value in spec.choices else "a choice"
    if spec.low is None and spec.high is None:
        return None
    kind = "an integer" if spec.type is int or isinstance(value, int) else "a number"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return kind
    if isinstance(value, float) and not math.isfinite(value):
        return kind
    if spec.low is not None and (value <= spec.low if spec.low_open else value < spec.low):
        return kind
    if spec.high is not None and value > spec.high:
        return kind
    return None
