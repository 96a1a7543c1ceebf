"""The AMG flags of ``run`` and ``bench`` come from the one description of each parameter
(engine.amg_params: ParamSpec in the field's metadata): a flag per field, of the spec's
kind, with its help and Meta's default, and a value just outside a bound rejected with
the library's own message (the parameter named as its flag)."""

from __future__ import annotations

import argparse
import math
import re
from pathlib import Path

import pytest

from sam2serve import cli
from sam2serve.commands import amg_flags
from sam2serve.commands.common import UsageError
from sam2serve.engine.amg_params import PARAM_SPECS, AMGParamError, AMGParams, ParamSpec

RUN = ["run", "--task", "amg", "x.jpg", "--out", "o"]


def flag_actions(command: str) -> dict[str, argparse.Action]:
    """The parameter name -> flag action of a command's parser."""
    parser = cli.build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    sub = commands.choices[command]
    sub.format_help()  # adds its deferred arguments
    return {action.dest: action for action in sub._actions if action.option_strings}


def just_outside(spec: ParamSpec) -> list[float]:
    """Values just past each of the spec's bounds."""
    step = 1 if spec.kind == "int" else 1e-3
    values = []
    if spec.low is not None:
        values.append(spec.low - step)
    if spec.high is not None:
        values.append(spec.high + step if spec.high_inclusive else spec.high)
    return values


def test_the_flag_table_is_gone():
    """No second description of the parameters: the flags are derived, not kept in step."""
    assert not hasattr(amg_flags, "AMG_FLAGS")
    assert set(amg_flags.AMG_FLAG_NAMES) | set(amg_flags.AMG_FIXED) == set(PARAM_SPECS)
    assert not set(amg_flags.AMG_FLAG_NAMES) & set(amg_flags.AMG_FIXED)


@pytest.mark.parametrize("command", ["run", "bench"])
def test_every_parameter_has_a_flag_of_its_kind(command):
    actions = flag_actions(command)
    for name in amg_flags.AMG_FLAG_NAMES:
        spec, action = PARAM_SPECS[name], actions[name]
        assert action.option_strings[0] == "--" + name.replace("_", "-")
        assert action.default is None  # not given: Meta's default, from AMGParams
        if spec.kind == "bool":
            assert isinstance(action, argparse.BooleanOptionalAction), name
            assert action.option_strings[1] == "--no-" + name.replace("_", "-")
        elif spec.kind == "point_grids":
            assert action.type is Path and action.metavar == "JSON_FILE"
        else:
            assert action.type is {"int": int, "float": float}[spec.kind], name
            assert action.metavar == spec.kind.upper()


def test_help_is_the_spec_with_flags_for_names_and_meta_default():
    actions = flag_actions("run")
    defaults = AMGParams.defaults()
    for name in amg_flags.AMG_FLAG_NAMES:
        spec, text = PARAM_SPECS[name], actions[name].help
        described = amg_flags.with_flag_names(spec.help)
        # Other parameters are named as the flags a user types, never in Python form.
        assert not re.search(rf"(?<![\w-])({'|'.join(PARAM_SPECS)})(?!\w)", described), name
        if spec.kind == "point_grids":
            assert text == f"JSON file of {described}"
            continue
        shown = re.fullmatch(rf"{re.escape(described)} \(default: (.+)\)", text)
        assert shown, (name, text)
        default = defaults[name]
        if isinstance(default, bool):
            assert shown[1] == ("on" if default else "off")
        else:
            assert math.isclose(float(shown[1]), default, rel_tol=1e-3), name


def test_flags_not_given_keep_the_dataclass_defaults():
    args = cli.build_parser().parse_args(RUN)
    assert amg_flags.amg_params_from(args) == AMGParams(**amg_flags.AMG_FIXED)


def test_each_flag_reaches_its_parameter():
    values = {"int": "3", "float": "0.25"}
    for name in amg_flags.AMG_FLAG_NAMES:
        kind = PARAM_SPECS[name].kind
        if kind in values:
            argv = [*RUN, amg_flags.flag(name), values[kind]]
            if name == "crop_n_points_downscale_factor":
                argv += ["--points-per-side", "9"]
            params = amg_flags.amg_params_from(cli.build_parser().parse_args(argv))
            assert getattr(params, name) == {"int": 3, "float": 0.25}[kind], name
        elif kind == "bool":
            for given, expected in (("--", True), ("--no-", False)):
                argv = [*RUN, given + name.replace("_", "-")]
                params = amg_flags.amg_params_from(cli.build_parser().parse_args(argv))
                assert getattr(params, name) is expected, name


def test_point_grids_file_replaces_the_default_grid(tmp_path):
    grids = tmp_path / "grids.json"
    grids.write_text("[[[0.25, 0.5], [0.75, 0.5]]]")
    args = cli.build_parser().parse_args([*RUN, "--point-grids", str(grids)])
    params = amg_flags.amg_params_from(args)
    assert params.points_per_side is None
    assert params.point_grids == (((0.25, 0.5), (0.75, 0.5)),)


BOUNDED = [
    (name, value)
    for name in amg_flags.AMG_FLAG_NAMES
    if PARAM_SPECS[name].kind in ("int", "float")
    for value in just_outside(PARAM_SPECS[name])
]


@pytest.mark.parametrize(("name", "value"), BOUNDED)
def test_a_value_past_a_bound_gets_the_library_message(name, value):
    spec = PARAM_SPECS[name]
    with pytest.raises(AMGParamError) as library:
        AMGParams(**{name: value})
    assert str(library.value) == f"{name} must be {spec.accepted()}, got {value!r}"
    args = cli.build_parser().parse_args([*RUN, amg_flags.flag(name), str(value)])
    with pytest.raises(UsageError) as command_line:
        amg_flags.amg_params_from(args)
    assert str(command_line.value) == amg_flags.with_flag_names(str(library.value))
    assert str(command_line.value).startswith(amg_flags.flag(name) + " must be ")


def test_every_bounded_parameter_is_checked():
    """Each bound of each numeric spec has its case above (a new bound is tested too)."""
    assert {name for name, _ in BOUNDED} == {
        name
        for name in amg_flags.AMG_FLAG_NAMES
        if PARAM_SPECS[name].kind in ("int", "float")
        and (PARAM_SPECS[name].low is not None or PARAM_SPECS[name].high is not None)
    }
