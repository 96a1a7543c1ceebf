"""Settings fields as flags (sam2serve.options): one source for help, bounds, default."""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from pathlib import Path

import pytest

from sam2serve.cli import build_parser, main
from sam2serve.options import (
    OptionError,
    add_options,
    check_options,
    env_var,
    option,
    option_values,
)


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


# --------------------------------------------------------------------------- environment

# Variables the program reads that are no flag's: no flag's variable may take their names.
RESERVED = {"SAM2SERVE_CACHE", "SAM2SERVE_API_KEY", "SAM2SERVE_OFFLINE"}
ENV_COMMANDS = (
    ("serve",),
    ("labelstudio",),
    ("cluster", "up"),
    ("cluster", "status"),
    ("cluster", "down"),
    ("cluster", "burst"),
)


def subparser(*names: str) -> argparse.ArgumentParser:
    """The real parser of ``sam2serve NAMES...``, its deferred flags added."""
    parser = build_parser()
    for name in names:
        parser = parser._subparsers._group_actions[0].choices[name]
    parser.format_help()  # adds the deferred flags and their help
    return parser


def parse_cli(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(list(argv))


def cli_error(capsys, *argv: str) -> str:
    """The one error line of ``sam2serve ARGV`` (exit 2, no traceback)."""
    assert main(list(argv)) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("sam2serve: error: "), err
    return lines[0]


@pytest.fixture
def clean_env(monkeypatch):
    for name in list(os.environ):
        if name.startswith(("SAM2SERVE_", "LABEL_STUDIO_")):
            monkeypatch.delenv(name)
    return monkeypatch


@pytest.mark.parametrize("names", ENV_COMMANDS, ids=" ".join)
def test_every_flag_of_the_service_commands_has_its_variable(names):
    """Enumerated from the real parser: each flag's help names the variable derived from
    the flag, and no two flags of a command share one."""
    parser = subparser(*names)
    seen: dict[str, str] = {}
    for action in parser._actions:
        if not action.option_strings or action.dest == "help":
            continue
        flag = next(s for s in action.option_strings if s.startswith("--"))
        variable = env_var(flag)
        assert variable == "SAM2SERVE_" + flag[2:].replace("-", "_").upper()
        assert f"[env {variable}]" in action.help, (flag, action.help)
        assert variable not in RESERVED, flag
        assert variable not in seen, (flag, seen.get(variable))
        seen[variable] = flag
    assert seen, names
    assert "wins over its variable, the variable over the default" in " ".join(
        parser.format_help().split()
    )


def test_other_commands_read_no_variables(clean_env):
    clean_env.setenv("SAM2SERVE_OUT", "elsewhere")
    clean_env.setenv("SAM2SERVE_MODE", "baseline")
    args = parse_cli("run", "--task", "amg", "samples", "--out", "out")
    assert Path(args.out) == Path("out") and args.mode == "fast"
    assert "[env " not in subparser("run").format_help()


def test_a_variable_sets_the_setting(clean_env):
    from sam2serve.commands.serve import settings_from

    clean_env.setenv("SAM2SERVE_MAX_QUEUE", "7")
    clean_env.setenv("SAM2SERVE_MAX_UPLOAD_MIB", "2")  # the flag's unit, as the flag
    clean_env.setenv("SAM2SERVE_CORS_ORIGIN", "http://a.test, http://b.test")
    clean_env.setenv("SAM2SERVE_VIDEO", "yes")
    clean_env.setenv("SAM2SERVE_WARMUP", "0")
    clean_env.setenv("SAM2SERVE_MODE", "baseline")
    clean_env.setenv("SAM2SERVE_RANDOM_WEIGHTS", "1")
    clean_env.setenv("SAM2SERVE_PORT", "9001")
    args = parse_cli("serve")
    settings = settings_from(args)
    assert settings.batching.max_queue == 7 and settings.limits.max_upload_bytes == 2 * 1024 * 1024
    assert settings.access.cors_origins == ("http://a.test", "http://b.test")
    assert settings.video.enabled is True and settings.runtime.warmup is False
    assert (settings.runtime.mode, settings.runtime.random_weights, args.port) == (
        "baseline",
        True,
        9001,
    )
    assert args.env_sources["max_queue"] == ("SAM2SERVE_MAX_QUEUE", "7")


def test_labelstudio_and_burst_read_their_variables(clean_env):
    clean_env.setenv("SAM2SERVE_PREANNOTATE", "none")
    clean_env.setenv("SAM2SERVE_PUBLIC_FETCH", "off")
    clean_env.setenv("SAM2SERVE_ALLOW_FETCH_HOST", "images.test:8081,10.0.0.0/8")
    args = parse_cli("labelstudio")
    assert args.preannotate == "none" and args.public_fetch is False
    assert args.allow_fetch_hosts == ["images.test:8081", "10.0.0.0/8"]
    assert args.port == 9090  # labelstudio's own default, no variable set
    # A required choice of flags is met by a variable.
    clean_env.setenv("SAM2SERVE_URL", "http://127.0.0.1:9")
    clean_env.setenv("SAM2SERVE_TASKS", "sps,mps")
    args = parse_cli("cluster", "burst")
    assert (args.url, args.tasks) == ("http://127.0.0.1:9", ("sps", "mps"))


def test_a_flag_beats_its_variable_and_the_variables_of_flags_it_excludes(clean_env):
    clean_env.setenv("SAM2SERVE_PORT", "9001")
    clean_env.setenv("SAM2SERVE_CHECKPOINT", "/no/such/file.pt")
    clean_env.setenv("SAM2SERVE_CORS_ORIGIN", "http://a.test")
    args = parse_cli(
        "serve", "--port", "9002", "--random-weights", "--cors-origin", "http://c.test"
    )
    assert args.port == 9002
    assert args.random_weights is True and args.checkpoint is None
    assert args.cors_origins == ["http://c.test"]
    args = parse_cli("serve", "--port=9003")
    assert args.port == 9003 and args.checkpoint == "/no/such/file.pt"
    # A variable beats the default; --help shows the default, not the variable's value.
    assert parse_cli("serve").port == 9001
    assert "(default: 8000;" in " ".join(subparser("serve").format_help().split())


@pytest.mark.parametrize(
    "variable, value, fragment",
    [
        ("SAM2SERVE_PORT", "abc", "$SAM2SERVE_PORT='abc': expected an integer, got 'abc'"),
        (
            "SAM2SERVE_PORT",
            "70000",
            "$SAM2SERVE_PORT must be an integer in [1, 65535], got '70000'",
        ),
        ("SAM2SERVE_MODE", "fastest", "$SAM2SERVE_MODE='fastest': invalid choice: 'fastest'"),
        ("SAM2SERVE_MAX_QUEUE", "0", "$SAM2SERVE_MAX_QUEUE must be an integer >= 1, got '0'"),
        ("SAM2SERVE_MAX_UPLOAD_MIB", "lots", "$SAM2SERVE_MAX_UPLOAD_MIB='lots': expected a number"),
        ("SAM2SERVE_VIDEO", "maybe", "$SAM2SERVE_VIDEO='maybe': expected one of 1, true"),
        ("SAM2SERVE_THREADS", "0", "$SAM2SERVE_THREADS='0'"),
        ("SAM2SERVE_STORE_DTYPE", "int4", "$SAM2SERVE_STORE_DTYPE='int4': invalid choice"),
    ],
)
def test_a_bad_variable_is_one_usage_error_naming_it(capsys, clean_env, variable, value, fragment):
    clean_env.setenv(variable, value)
    # Every one is found before the model loads or the port is tried.
    line = cli_error(capsys, "serve", "--random-weights")
    assert fragment in line, line


def test_bad_variables_of_labelstudio_and_burst_name_themselves(capsys, clean_env):
    clean_env.setenv("SAM2SERVE_FETCH_TIMEOUT", "0")
    line = cli_error(capsys, "labelstudio", "--random-weights")
    assert "$SAM2SERVE_FETCH_TIMEOUT: fetch_timeout_s must be a number > 0" in line
    clean_env.delenv("SAM2SERVE_FETCH_TIMEOUT")
    clean_env.setenv("SAM2SERVE_LOCAL_ROOT", "/no/such/folder")
    line = cli_error(capsys, "labelstudio", "--random-weights")
    assert "$SAM2SERVE_LOCAL_ROOT: local_roots: '/no/such/folder'" in line
    line = cli_error(capsys, "cluster", "burst", "--url", "http://127.0.0.1:9", "--n", "0")
    assert "--n must be an integer in [1, 10000], got 0" in line
    clean_env.setenv("SAM2SERVE_N", "0")
    line = cli_error(capsys, "cluster", "burst", "--url", "http://127.0.0.1:9")
    assert "$SAM2SERVE_N must be an integer in [1, 10000], got '0'" in line


def test_two_variables_of_flags_that_exclude_each_other(capsys, clean_env):
    clean_env.setenv("SAM2SERVE_CHECKPOINT", "x.pt")
    clean_env.setenv("SAM2SERVE_RANDOM_WEIGHTS", "true")
    line = cli_error(capsys, "serve")
    assert "$SAM2SERVE_CHECKPOINT and $SAM2SERVE_RANDOM_WEIGHTS are both set" in line
    clean_env.setenv("SAM2SERVE_RANDOM_WEIGHTS", "false")  # off: as if unset
    assert parse_cli("serve").checkpoint == "x.pt"


def test_serve_help_lists_the_settings_in_groups(capsys):
    text = subparser("serve").format_help()
    titles = [line[:-1] for line in text.splitlines() if line.endswith(":") and line[0] != " "]
    for title in (
        "model and runtime",
        "network and access",
        "annotation page (GET /)",
        "limits",
        "connections and slow clients",
        "batching and queue",
        "caches",
        "embedding store (docs/labelling.md)",
        "video tracking sessions (--video; docs/api.md)",
        "live video sessions (--video; WebSocket, docs/video.md)",
        "concept prompts (--concepts; SAM 3, docs/concepts.md)",
    ):
        assert title in titles, titles
    assert "Label Studio" in [
        line[:-1] for line in subparser("labelstudio").format_help().splitlines()
    ]
