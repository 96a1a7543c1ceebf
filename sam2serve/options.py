"""A settings dataclass's fields as command-line flags: one source for each setting's
help, bounds and default (torch-free).

A field declared with :func:`option` carries an :class:`Option` in its metadata. The
command line's flags are derived from it (:func:`add_options`: the flag, its type, its
help with the field's default), the flags' values are read back by field name
(:func:`option_values`), and the bounds are checked by the dataclass itself
(:func:`check_options`, called from ``__post_init__``), so a library caller and the command
line get the same error. This is how vLLM and sglang keep an engine's arguments and its
flags from drifting; ``engine.amg_params`` does the same for AMG's parameters.

A settings dataclass may compose groups (a field whose default factory is itself a
settings dataclass, as ``ServerSettings.limits``): the flags of all its groups are derived
by walking them (:func:`setting_fields`), each by its flat name (:func:`key_of`), so the
grouping changes no flag, destination or variable.

For containers, a command's flags can also be read from the environment
(:func:`describe_environment`, :func:`read_environment`): each flag's variable is derived
from the flag (``--max-upload-mib`` -> ``SAM2SERVE_MAX_UPLOAD_MIB``), parsed by the flag's
own type and choices, and the precedence is flag > environment > default.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import textwrap
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sam2serve.config_text import MAX_BYTES, MAX_INTEGER, MAX_NUMBER, Integer, Number, Units, shown

__all__ = [
    "Option",
    "OptionError",
    "add_option_groups",
    "add_options",
    "check_options",
    "describe_environment",
    "env_var",
    "flag_of",
    "flag_type",
    "group_class",
    "key_of",
    "option",
    "option_values",
    "read_environment",
    "setting_fields",
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
    # A flag given once per value (the field is a tuple); its variable takes a comma list.
    repeatable: bool = False
    # Flags of the same ``exclusive`` name (in one group) exclude each other.
    exclusive: str | None = None
    # The setting's flat name where it differs from the field's (a field of a nested
    # settings group, e.g. ``VideoSettings.enabled`` is ``video``): the flag's destination,
    # the default flag (``--KEY``), the name errors and config files use.
    key: str | None = None

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


def key_of(field: dataclasses.Field) -> str:
    """A field's flat name: its Option's ``key``, else the field's name."""
    spec: Option | None = field.metadata.get(OPTION)
    return spec.key if spec is not None and spec.key else field.name


def group_class(field: dataclasses.Field) -> type | None:
    """The settings dataclass a field holds as a nested group (its default factory), else
    None."""
    factory = field.default_factory
    if factory is not dataclasses.MISSING and isinstance(factory, type):
        return factory if dataclasses.is_dataclass(factory) else None
    return None


def setting_fields(cls: type) -> list[tuple[str | None, dataclasses.Field]]:
    """Every setting of ``cls`` as ``(group, field)``, nested groups walked in field order
    (``group``: the nested group's field name; None for a field of ``cls`` itself)."""
    found: list[tuple[str | None, dataclasses.Field]] = []
    for field in dataclasses.fields(cls):
        nested = group_class(field)
        if nested is None:
            found.append((None, field))
        else:
            found.extend((field.name, inner) for inner in dataclasses.fields(nested))
    return found


def _options(cls: type, names: Iterable[str] | None) -> list[tuple[dataclasses.Field, Option]]:
    """The option fields of ``cls`` and of its nested groups, by key (``names``: those)."""
    fields = {key_of(f): f for _, f in setting_fields(cls) if OPTION in f.metadata}
    chosen = list(fields) if names is None else list(names)
    missing = [name for name in chosen if name not in fields]
    if missing:
        raise TypeError(f"{cls.__name__} has no option field {', '.join(missing)}")
    return [(fields[name], fields[name].metadata[OPTION]) for name in chosen]


def flag_of(field: dataclasses.Field) -> str:
    """The flag of an option field: its Option's, else ``--`` + the key with dashes."""
    spec: Option = field.metadata[OPTION]
    return spec.flag or "--" + key_of(field).replace("_", "-")


def _default_text(field: dataclasses.Field, spec: Option) -> str:
    if spec.default_text is not None:
        return spec.default_text
    value = field.default
    if isinstance(value, bool):
        return "on" if value else "off"
    if spec.scale is not None and isinstance(value, int | float):
        return f"{value / spec.scale:g}"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def flag_type(field: dataclasses.Field, spec: Option) -> Callable[[str], Any]:
    """The ``type`` that reads an option field's flag and variable: a scaled field's
    :class:`~sam2serve.config_text.Units` (a count of units that fits, converted without
    overflow), an int or float field's strict :class:`~sam2serve.config_text.Integer` /
    :class:`~sam2serve.config_text.Number` (ASCII, finite), else the Option's type (default:
    str). The field's own bounds are the dataclass's to check (:func:`check_options`), so a
    library caller, a config file and the command line get the same message."""
    if spec.scale is not None:
        low = None if spec.low is None else math.ceil(spec.low)
        high = MAX_BYTES if spec.high is None else int(spec.high)
        return Units(spec.scale, low=low, high=high)
    default = None if field.default is dataclasses.MISSING else field.default
    kind = spec.type or (type(default) if default is not None else str)
    if kind is int:
        return Integer()
    if kind is float:
        return Number()
    return kind


def add_options(
    container: argparse._ActionsContainer, cls: type, names: Iterable[str] | None = None
) -> None:
    """One flag per option field of ``cls`` (``names``: those, in that order)."""
    exclusive: dict[str, argparse._ActionsContainer] = {}
    outer = container
    for field, spec in _options(cls, names):
        container = outer
        if spec.exclusive is not None:
            if spec.exclusive not in exclusive:
                exclusive[spec.exclusive] = outer.add_mutually_exclusive_group()
            container = exclusive[spec.exclusive]
        flag = flag_of(field)
        default = None if field.default is dataclasses.MISSING else field.default
        kind = flag_type(field, spec)
        bounds = ""
        if isinstance(kind, Units):
            bounds = f"; {kind.accepted()}"
        elif spec.choices is None and (spec.low is not None or spec.high is not None):
            bounds = f"; {spec.accepted('an integer' if isinstance(kind, Integer) else 'a number')}"
        # argparse fills in a plain default, so a parser's set_defaults shows in the help.
        shown = _default_text(field, spec).replace("%", "%%")
        if spec.default_text is None and spec.scale is None and not isinstance(default, bool):
            if isinstance(default, float):
                shown = "%(default)g"
            elif isinstance(default, (int, str)):
                shown = "%(default)s"
        help_text = f"{spec.help} (default: ".replace("%", "%%") + shown
        help_text += f"{bounds})".replace("%", "%%")
        if isinstance(default, bool):
            container.add_argument(
                flag,
                dest=key_of(field),
                action=argparse.BooleanOptionalAction if default else "store_true",
                default=default,
                help=help_text,
            )
            continue
        if spec.repeatable:
            container.add_argument(
                flag,
                dest=key_of(field),
                action="append",
                type=spec.type or str,
                default=list(default or ()),
                choices=spec.choices,
                metavar=spec.metavar,
                help=help_text,
            )
            continue
        container.add_argument(
            flag,
            dest=key_of(field),
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
    (groups in the order of their first field, a group of the parser's with the same title
    reused; fields without a group on ``parser``)."""
    grouped: dict[str | None, list[str]] = {}
    for field, spec in _options(cls, names):
        grouped.setdefault(spec.group, []).append(key_of(field))
    for title, fields in grouped.items():
        add_options(argument_group(parser, title), cls, fields)


def argument_group(parser: argparse.ArgumentParser, title: str | None) -> Any:
    """The parser's argument group of ``title`` (made if it has none; None: the parser)."""
    if title is None:
        return parser
    for group in parser._action_groups:
        if group.title == title:
            return group
    return parser.add_argument_group(title)


def option_values(
    args: argparse.Namespace, cls: type, names: Iterable[str] | None = None
) -> dict[str, Any]:
    """The option fields' values from parsed flags, by field name."""
    return {key_of(field): getattr(args, key_of(field)) for field, _ in _options(cls, names)}


class OptionError(ValueError):
    """A setting out of its bounds or choices. ``str()`` names the field (what a library
    caller or a config file wrote); :meth:`for_flag` names the flag instead."""

    def __init__(self, field: str, flag: str, requirement: str, value: Any) -> None:
        self.field, self.flag, self.requirement, self.value = field, flag, requirement, value
        super().__init__(f"{field} must be {requirement}, got {value!r}")

    def for_flag(self, sources: Mapping[str, tuple[str, str]] | None = None) -> str:
        """The message naming the flag, or the environment variable and its text where
        ``sources`` (:func:`read_environment`'s) says the value came from one."""
        if sources is not None and self.field in sources:
            variable, text = sources[self.field]
            return f"${variable} must be {self.requirement}, got {text!r}"
        return f"{self.flag} must be {self.requirement}, got {self.value!r}"


def check_options(instance: Any) -> None:
    """Raise :class:`OptionError` for the first option field of ``instance`` out of its
    bounds or choices (a None value passes: it means "not set"). Only the instance's own
    fields: a nested group checked itself when it was made."""
    for field in dataclasses.fields(instance):
        spec = field.metadata.get(OPTION)
        value = getattr(instance, field.name)
        if spec is None or value is None:
            continue
        problem = _problem(value, spec)
        if problem is not None:
            raise OptionError(key_of(field), flag_of(field), spec.accepted(problem), value)


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


# --------------------------------------------------------------------------- environment

ENV_PREFIX = "SAM2SERVE_"
ENV_NOTE = (
    "every flag can also be set by the environment variable its help names ([env VAR]; a "
    "repeatable flag's variable takes a comma-separated list, a switch's 1/0, true/false, "
    "yes/no or on/off); a flag given on the command line wins over its variable, the "
    "variable over the default. Numbers are written in ASCII digits (not 1_000, nan or inf), "
    f"an integer at most {MAX_INTEGER}, any other number at most {MAX_NUMBER:,.0f} in size"
)
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")
_VALUED = (argparse._StoreAction, argparse._AppendAction)
_SWITCHES = (argparse._StoreConstAction, argparse.BooleanOptionalAction)


def env_var(flag: str) -> str:
    """The environment variable of a flag: ``--max-upload-mib`` -> SAM2SERVE_MAX_UPLOAD_MIB."""
    return ENV_PREFIX + flag.lstrip("-").replace("-", "_").upper()


def _env_actions(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    """The parser's actions a variable can set: flags that take a value, and switches."""
    return [
        action
        for action in parser._actions
        if isinstance(action, (*_VALUED, *_SWITCHES))
        and any(s.startswith("--") for s in action.option_strings)
        and action.dest != argparse.SUPPRESS
    ]


def _action_var(action: argparse.Action) -> str:
    return env_var(next(s for s in action.option_strings if s.startswith("--")))


def describe_environment(parser: argparse.ArgumentParser) -> None:
    """Name each flag's variable in its help (``[env VAR]``) and the precedence in the
    epilog; once per parser."""
    if getattr(parser, "_environment_described", False):
        return
    parser._environment_described = True  # type: ignore[attr-defined]  # our marker on argparse's parser, read by getattr above
    for action in _env_actions(parser):
        tag = f"[env {_action_var(action)}]"
        action.help = tag if not action.help else f"{action.help} {tag}"
    note = textwrap.fill(ENV_NOTE, width=92)
    parser.epilog = note if not parser.epilog else f"{parser.epilog}\n{note}"


def _given(action: argparse.Action, argv: Sequence[str]) -> bool:
    """Whether ``argv`` gives one of the action's flags (before a ``--``)."""
    for arg in argv:
        if arg == "--":
            return False
        if arg.split("=", 1)[0] in action.option_strings:
            return True
    return False


def _switch(parser: argparse.ArgumentParser, action: argparse.Action, variable: str, text: str):
    word = text.strip().lower()
    if word not in _TRUE + _FALSE:
        parser.error(
            f"${variable}={shown(text)}: expected one of {', '.join(_TRUE)} (on) or "
            f"{', '.join(_FALSE)} (off)"
        )
    on = word in _TRUE
    if isinstance(action, argparse.BooleanOptionalAction):
        return on
    return action.const if on else action.default


def _value(parser: argparse.ArgumentParser, action: argparse.Action, variable: str, text: str):
    """The value of one flag's variable, as the flag's own type and choices read it."""
    if isinstance(action, _SWITCHES):
        return _switch(parser, action, variable, text)
    parts = [p.strip() for p in text.split(",")] if isinstance(action, _VALUED[1]) else [text]
    values = []
    for part in parts:
        try:
            value = parser._get_value(action, part)
            parser._check_value(action, value)
        except argparse.ArgumentError as exc:
            parser.error(f"${variable}={shown(text)}: {exc.message}")
        values.append(value)
    return values if isinstance(action, _VALUED[1]) else values[0]


def read_environment(
    parser: argparse.ArgumentParser, argv: Sequence[str], environ: Mapping[str, str]
) -> dict[str, tuple[str, str, Any]]:
    """The values the environment gives the flags ``argv`` does not, by destination, as
    ``{dest: (variable, text, value)}``; call before parsing ``argv``, then
    :func:`apply_environment` after. A variable set to the empty string counts as unset. A
    flag given on the command line hides the variables of its own and of the flags it
    excludes; two variables of flags that exclude each other are an error, as the flags
    would be. A bad value is ``parser.error`` naming the variable and its text. Flags and
    groups the environment satisfies are no longer required."""
    found: dict[str, tuple[str, str, Any]] = {}
    exclusive = {
        id(action): group
        for group in parser._mutually_exclusive_groups
        for action in group._group_actions
    }
    for action in _env_actions(parser):
        variable = _action_var(action)
        text = environ.get(variable, "")
        group = exclusive.get(id(action))
        members = group._group_actions if group is not None else [action]
        if not text or any(_given(member, argv) for member in members):
            continue
        value = _value(parser, action, variable, text)
        if isinstance(action, _SWITCHES) and value == action.default:
            continue  # a switch turned off: as if unset
        if group is not None:
            for other in members:
                if other.dest in found and other is not action:
                    parser.error(
                        f"${found[other.dest][0]} and ${variable} are both set, but "
                        f"{other.option_strings[0]} and {action.option_strings[0]} exclude "
                        "each other: unset one"
                    )
            group.required = False
        action.required = False
        found[action.dest] = (variable, text, value)
    return found


def apply_environment(
    namespace: argparse.Namespace, found: Mapping[str, tuple[str, str, Any]]
) -> argparse.Namespace:
    """Set the parsed ``namespace``'s values from :func:`read_environment`'s, and record
    their sources as ``namespace.env_sources`` ({dest: (variable, text)}) for messages."""
    for dest, (_, _, value) in found.items():
        setattr(namespace, dest, value)
    namespace.env_sources = {dest: (var, text) for dest, (var, text, _) in found.items()}
    return namespace
