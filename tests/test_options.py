"""Settings fields as flags (sam2serve.options): one source for help, bounds, default."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

import pytest

from sam2serve.options import OptionError, add_options, check_options, option, option_values


@dataclass(frozen=True)
class Workload:
    name: str
    requests: int = option(300, help="requests in all", metavar="N", low=1, high=1000)
    duration_s: float = option(
        60.0, help="seconds", flag="--duration", low=0, low_open=True, high=3600
    )
    fraction: float = option(0.1, help="a share", low=0, high=1)
    shape: str = option("box", help="what to send", choices=("box", "click"))
    warm: bool = option(False, help="warm first")
    check: bool = option(True, help="check answers")

    def __post_init__(self) -> None:
        check_options(self)


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(exit_on_error=False)
    add_options(parser, Workload)
    return parser.parse_args(argv)


def test_flags_defaults_and_values_come_from_the_fields():
    args = parse()
    assert option_values(args, Workload) == {
        "requests": 300,
        "duration_s": 60.0,
        "fraction": 0.1,
        "shape": "box",
        "warm": False,
        "check": True,
    }
    args = parse("--requests", "5", "--duration", "2.5", "--shape", "click", "--warm", "--no-check")
    workload = Workload(name="x", **option_values(args, Workload))
    assert (workload.requests, workload.duration_s, workload.shape) == (5, 2.5, "click")
    assert (workload.warm, workload.check) == (True, False)


def test_help_shows_default_and_bounds():
    parser = argparse.ArgumentParser()
    add_options(parser, Workload, ("requests", "duration_s"))
    text = parser.format_help()
    assert "requests in all (default: 300; an integer in [1, 1000])" in " ".join(text.split())
    assert "--duration" in text and "(default: 60; a number in (0, 3600])" in " ".join(text.split())
    assert "--fraction" not in text


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"requests": 0}, r"requests must be an integer in \[1, 1000\], got 0"),
        ({"duration_s": 0.0}, r"duration_s must be a number in \(0, 3600\]"),
        ({"fraction": float("nan")}, r"fraction must be a number in \[0, 1\]"),
        ({"requests": True}, r"requests must be an integer"),
        ({"shape": "blob"}, r"shape must be one of box, click, got 'blob'"),
    ],
)
def test_the_dataclass_checks_its_bounds_for_every_caller(changes, message):
    """A library caller reads the field's name; the command line the flag's."""
    with pytest.raises(OptionError, match=message) as error:
        Workload(name="x", **changes)
    flag = "--duration" if "duration_s" in changes else "--" + next(iter(changes))
    assert error.value.for_flag().startswith(f"{flag} must be ")
