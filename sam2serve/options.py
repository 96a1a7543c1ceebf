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

__all__ = ["Option", "add_options", "check_options", "flag_of", "option", "option_values"]

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
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def add_options(
    container: argparse._ActionsContainer, cls: type, names: Iterable[str] | None = None
) -> None:
    """One flag per option field of ``cls`` (``names``: those, in that order)."""
    for field, spec in _options(cls, names):
        flag = flag_of(field)
        default = None if field.default is dataclasses.MISSING else field.default
        bounds = ""
        if spec.choices is None and (spec.low is not None or spec.high is not None):
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


def option_values(
    args: argparse.Namespace, cls: type, names: Iterable[str] | None = None
) -> dict[str, Any]:
    """The option fields' values from parsed flags, by field name."""
    return {field.name: getattr(args, field.name) for field, _ in _options(cls, names)}


def check_options(instance: Any, error: type[Exception] = ValueError) -> None:
    """Raise ``error`` naming the first option field of ``instance`` out of its bounds or
    choices (a None value passes: it means "not set")."""
    for field, spec in _options(type(instance), None):
        value = getattr(instance, field.name)
        if value is None:
            continue
        problem = _problem(value, spec)
        if problem is not None:
            raise error(
                f"{flag_of(field)} ({field.name}) must be {spec.accepted(problem)}, got {value!r}"
            )


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
