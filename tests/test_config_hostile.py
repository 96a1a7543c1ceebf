"""Hostile configuration: every flag of every command, and every ``SAM2SERVE_*`` variable,
fed values a careless or hostile operator writes.

The table is enumerated from the parsers themselves (each command's actions, each
environment-enabled flag's variable), so a flag added later is covered without editing
this file. Each case runs ``sam2serve``'s ``main`` in-process and stops where work would
begin: ``serve`` and ``labelstudio`` run their real handler up to the address check (their
settings' bounds are checked there, by the settings dataclasses), every other command's
handler is a stub (its flags' types are checked by the parser). So what is checked is the
configuration phase, in milliseconds. A refused value must give exit status 2 and one
line on stderr naming its flag (``--max-upload-mib``) or variable
(``SAM2SERVE_MAX_UPLOAD_MIB``), never a traceback. A handful of real subprocess runs prove
the same end to end, and the variables that are not flags (the store, the checkpoint URL
base) are run through the real handler up to the point where work would begin.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from sam2serve import cli
from sam2serve.commands import common

# Numbers a person does not mean, or cannot mean here: each must be refused by every
# numeric flag (and variable), whatever its bounds.
NOT_NUMBERS = (
    "1e309",  # inf once read
    "1e308",  # finite, but * MiB overflows: int(inf) raised OverflowError
    "1e300",  # finite, but no setting means it
    "nan",
    "inf",
    "-inf",
    "１２",  # fullwidth digits: int() and float() take them
    "١٢",  # Arabic-Indic digits
    "12abc",
    "",
    " ",
    " 12 ",  # int() strips it
    "1_000",  # int() takes it
    "0x10",
    "9" * 400,
)
# A negative number: refused where the flag's type states a low bound above it.
NEGATIVE = "-1"
BAD_URLS = (
    "http://h:99999",
    "http://h:abc",
    "http://[::1",
    "ftp://x",
    "http://",
    "http:// h/",
    "h:8080",
)
STRINGS = ("", " ", "9" * 400)
BAD_SWITCH = "maybe"

# The commands whose parse phase is checked, with the arguments they need besides the
# flag under test (their handlers are stubbed: the values need not exist).
COMMANDS: dict[tuple[str, ...], tuple[str, ...]] = {
    ("serve",): (),
    ("labelstudio",): (),
    ("cluster", "up"): ("--config", "cluster.yaml"),
    ("cluster", "status"): (),
    ("cluster", "burst"): ("--url", "http://127.0.0.1:9"),
    ("download",): (),
    ("run",): ("samples", "--task", "amg", "--out", "out"),
    ("bench",): (),
    ("track",): ("sample", "--out", "out"),
    ("embed",): ("samples", "--store", "emb"),
    ("export",): ("--out", "art", "--mode", "fast"),
    ("loadtest",): ("--url", "http://127.0.0.1:9"),
}


@dataclass(frozen=True)
class Outcome:
    code: int | None  # None: an exception escaped main
    stderr: str
    error: str = ""  # the escaped exception, if any

    @property
    def lines(self) -> list[str]:
        return [line for line in self.stderr.splitlines() if line.strip()]


class _Stubbed(Exception):
    pass


# The commands whose real handler runs, up to the address check (the service's settings
# are checked there); every other command's handler is a stub.
CONFIGURED_BY_HANDLER = ("serve", "labelstudio")


def _configured(args: argparse.Namespace) -> int:
    return 0


def _address_reached(host: str, port: int) -> None:
    raise SystemExit(0)  # main returns 0: the configuration was accepted


@contextlib.contextmanager
def stubbed_handlers() -> Iterator[None]:
    """Stop every command where its work would begin (see the module's docstring). The
    parser is built once (with every command's flags) and reused: parsing does not change
    it, and a variable only lifts a requirement the table's base arguments meet anyway."""
    from sam2serve.commands import serve

    original_wrap, original_build = common._extras_as_usage, cli.build_parser
    original_address = serve.check_address

    def wrap(handler, command):
        return original_wrap(handler, command) if command in CONFIGURED_BY_HANDLER else _configured

    common._extras_as_usage = wrap  # type: ignore[assignment]
    serve.check_address = _address_reached  # type: ignore[assignment]
    parser = original_build()
    _add_all_deferred(parser)
    cli.build_parser = lambda: parser  # type: ignore[assignment]
    try:
        yield
    finally:
        common._extras_as_usage = original_wrap  # type: ignore[assignment]
        cli.build_parser = original_build  # type: ignore[assignment]
        serve.check_address = original_address  # type: ignore[assignment]


def _add_all_deferred(parser: argparse.ArgumentParser) -> None:
    if isinstance(parser, common.CommandParser):
        parser._add_deferred()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                _add_all_deferred(sub)


@contextlib.contextmanager
def environment(values: dict[str, str]) -> Iterator[None]:
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def run_main(argv: list[str], env: dict[str, str] | None = None) -> Outcome:
    stderr = io.StringIO()
    with environment(env or {}), contextlib.redirect_stderr(stderr):
        try:
            code = cli.main(argv)
        except BaseException as exc:  # noqa: BLE001 - a traceback is what is looked for
            return Outcome(None, stderr.getvalue(), f"{type(exc).__name__}: {exc}")
    return Outcome(code, stderr.getvalue())


# --------------------------------------------------------------------------- the table


@dataclass(frozen=True)
class Flag:
    command: tuple[str, ...]
    flag: str
    action: argparse.Action
    variable: str | None  # its SAM2SERVE_* variable, for commands that read them


def _command_parser(words: tuple[str, ...]) -> common.CommandParser:
    parser: argparse.ArgumentParser = cli.build_parser()
    for word in words:
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = sub.choices[word]
    assert isinstance(parser, common.CommandParser)
    parser._add_deferred()
    return parser


def flags_of(words: tuple[str, ...]) -> list[Flag]:
    from sam2serve.options import env_var

    parser = _command_parser(words)
    found = []
    for action in parser._actions:
        longs = [s for s in action.option_strings if s.startswith("--")]
        if not longs or isinstance(action, (argparse._HelpAction, argparse._VersionAction)):
            continue
        if action.dest == argparse.SUPPRESS:
            continue
        variable = env_var(longs[0]) if parser.environment else None
        found.append(Flag(words, longs[0], action, variable))
    return found


def takes_value(action: argparse.Action) -> bool:
    return action.nargs != 0


def is_numeric(action: argparse.Action) -> bool:
    """Whether the flag reads a number: its type turns '3', '1' or '0' into one
    (independent of how the type is written, so the table is the same before and after a
    fix)."""
    if not takes_value(action) or action.choices is not None or action.type is None:
        return False
    kind = action.type
    if kind in (int, float):
        return True
    for probe in ("3", "1", "0"):  # one of them is within any numeric flag's bounds
        try:
            value = kind(probe)
        except Exception:  # noqa: BLE001, S112 - a type that refuses it may take another
            continue
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return False


def is_url(action: argparse.Action) -> bool:
    return takes_value(action) and (
        action.metavar == "URL" or action.dest in ("url", "url_base", "label_studio_url")
    )


def low_bound(flag: Flag) -> float | None:
    """The low bound the flag's type states, or for ``serve`` / ``labelstudio`` (whose
    settings' bounds the handler checks) its setting's Option, if either states one."""
    low = getattr(flag.action.type, "low", None)
    if low is None and flag.command[0] in CONFIGURED_BY_HANDLER:
        spec = _setting_options().get(flag.flag)
        low = None if spec is None else spec.low
    return low


def _setting_options() -> dict[str, object]:
    """Every option field of the service's settings and the Label Studio options, by flag."""
    from sam2serve.commands.serve import Listen
    from sam2serve.labelstudio.options import LabelStudioOptions
    from sam2serve.options import OPTION, flag_of, setting_fields
    from sam2serve.server.settings import ServerSettings

    found = {}
    for cls in (ServerSettings, Listen, LabelStudioOptions):
        for _, field in setting_fields(cls):
            if OPTION in field.metadata:
                found[flag_of(field)] = field.metadata[OPTION]
    return found


def cases() -> list[tuple[Flag, str, bool]]:
    """(flag, value, must be refused) for every flag of every command."""
    table = []
    for words in COMMANDS:
        for flag in flags_of(words):
            action = flag.action
            if not takes_value(action):
                continue
            if is_numeric(action):
                table += [(flag, value, True) for value in NOT_NUMBERS]
                low = low_bound(flag)
                table.append((flag, NEGATIVE, low is not None and low > -1))
            elif is_url(action):
                table += [(flag, value, True) for value in BAD_URLS]
                table += [(flag, value, False) for value in STRINGS]
            elif action.choices is not None:
                table.append((flag, "no-such-choice", True))
            else:
                table += [(flag, value, False) for value in STRINGS]
    return table


def env_cases() -> list[tuple[Flag, str, bool]]:
    """(flag, its variable's value, must be refused) for every flag a variable can set."""
    table = []
    for words in COMMANDS:
        for flag in flags_of(words):
            if flag.variable is None:
                continue
            action = flag.action
            if not takes_value(action):
                table.append((flag, BAD_SWITCH, True))
            elif is_numeric(action):
                # An empty variable counts as unset (documented): not a refusal.
                table += [(flag, value, True) for value in NOT_NUMBERS if value]
                low = low_bound(flag)
                table.append((flag, NEGATIVE, low is not None and low > -1))
            elif is_url(action):
                table += [(flag, value, True) for value in BAD_URLS]
            elif action.choices is not None:
                table.append((flag, "no-such-choice", True))
            else:
                table += [(flag, value, False) for value in STRINGS if value]
    return table


def problems(outcome: Outcome, names: tuple[str, ...], refused: bool) -> str | None:
    """What is wrong with one run, or None."""
    text = outcome.stderr + outcome.error
    if outcome.code is None or "Traceback" in text:
        return f"escaped: {outcome.error or text[-200:]}"
    if outcome.code not in (0, 2):
        return f"exit {outcome.code}: {outcome.stderr[-200:]!r}"
    if refused and outcome.code != 2:
        return "accepted"
    if outcome.code == 2:
        if len(outcome.lines) != 1:
            return f"{len(outcome.lines)} lines: {outcome.stderr[:300]!r}"
        if not any(name in outcome.lines[0] for name in names):
            return f"does not name {names[0]}: {outcome.lines[0][:200]!r}"
    return None


def _flag_argv(flag: Flag, value: str | None) -> list[str]:
    """The command line of one case (``value`` None: the flag is not given, its variable
    is); the flag under test replaces the base arguments' value of it."""
    base = list(COMMANDS[flag.command])
    if flag.flag in base:
        at = base.index(flag.flag)
        del base[at : at + 2]
    given = [] if value is None else [f"{flag.flag}={value}"]
    return [*flag.command, *base, *given]


def _clean_environment() -> dict[str, str]:
    """The SAM2SERVE_* variables of this test process, emptied (empty: unset)."""
    return {name: "" for name in os.environ if name.startswith("SAM2SERVE_")}


def run_table(tmp_path: Path) -> tuple[int, list[str]]:
    """Every case; returns (runs, failures)."""
    failures = []
    runs = 0
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        with stubbed_handlers():
            clean = _clean_environment()
            for flag, value, refused in cases():
                outcome = run_main(_flag_argv(flag, value), clean)
                runs += 1
                problem = problems(outcome, (flag.flag,), refused)
                if problem:
                    failures.append(
                        f"{' '.join(flag.command)} {flag.flag}={value[:20]!r}: {problem}"
                    )
            for flag, value, refused in env_cases():
                assert flag.variable is not None
                argv = _flag_argv(flag, None)
                outcome = run_main(argv, {**clean, flag.variable: value})
                runs += 1
                problem = problems(outcome, (flag.variable,), refused)
                if problem:
                    failures.append(
                        f"{' '.join(flag.command)} ${flag.variable}={value[:20]!r}: {problem}"
                    )
            for variable, value, argv in OTHER_VARIABLES:
                outcome = run_main(list(argv), {**clean, variable: value})
                runs += 1
                problem = problems(outcome, (variable,), True)
                if problem:
                    failures.append(f"{' '.join(argv)} ${variable}={value[:20]!r}: {problem}")
    finally:
        os.chdir(cwd)
    return runs, failures


# The SAM2SERVE_* variables that are not a flag's, with a command that reads them.
OTHER_VARIABLES = [
    *(("SAM2SERVE_CHECKPOINT_URL_BASE", url, ("download",)) for url in BAD_URLS),
    *(("SAM2SERVE_CHECKPOINT_URL_BASE", url, ("serve",)) for url in BAD_URLS[:3]),
    *(
        ("SAM2SERVE_CHECKPOINT_URL_BASE", url, ("run", "samples", "--task", "amg", "--out", "o"))
        for url in BAD_URLS[:3]
    ),
    ("SAM2SERVE_CACHE", " ", ("download",)),
    ("SAM2SERVE_OFFLINE", BAD_SWITCH, ("serve",)),
    ("SAM2SERVE_API_KEY", " ", ("serve",)),  # read through --api-key-env's name
    ("SAM2SERVE_API_KEY", " ", ("labelstudio",)),
]


def test_every_flag_and_variable_refuses_hostile_values_in_one_line(tmp_path):
    runs, failures = run_table(tmp_path)
    print(f"configuration runs: {runs}, failed: {len(failures)}")
    assert runs > 2000  # the table really enumerated the commands' flags
    assert not failures, f"{len(failures)} of {runs} runs failed:\n" + "\n".join(failures[:60])


def test_the_table_covers_every_command_and_its_numeric_flags():
    """The enumeration finds what it must: the MiB flags, the thread count, URLs."""
    serve = {f.flag: f.action for f in flags_of(("serve",))}
    assert is_numeric(serve["--max-upload-mib"]) and is_numeric(serve["--threads"])
    assert is_numeric(serve["--port"]) and not is_numeric(serve["--host"])
    download = {f.flag: f.action for f in flags_of(("download",))}
    assert is_url(download["--url-base"])
    labelstudio = {f.flag: f for f in flags_of(("labelstudio",))}
    assert labelstudio["--max-video-total-mib"].variable == "SAM2SERVE_MAX_VIDEO_TOTAL_MIB"


# --------------------------------------------------------------------------- handlers


def test_store_variable_is_named_when_it_cannot_be_used(tmp_path, monkeypatch):
    """$SAM2SERVE_STORE that is a file: the error names the variable, not --store (the real
    handler runs up to the address check, which would bind the port)."""
    from sam2serve.commands import serve

    def reached(*args, **kwargs):
        raise AssertionError("the store was not checked before the address")

    monkeypatch.setattr(serve, "check_address", reached)
    store = tmp_path / "a-file"
    store.write_text("x")
    outcome = run_main(["serve", "--random-weights"], {"SAM2SERVE_STORE": str(store)})
    assert outcome.code == 2, outcome
    assert len(outcome.lines) == 1 and "SAM2SERVE_STORE" in outcome.lines[0], outcome.stderr
    assert "--store" not in outcome.lines[0]
    outcome = run_main(["serve", "--random-weights", "--store", str(store)])
    assert outcome.code == 2 and "--store" in outcome.lines[0], outcome


def test_thread_counts_are_bounded():
    with stubbed_handlers():
        too_many = run_main(["serve", "--threads=100000"])
        assert too_many.code == 2 and "--threads" in too_many.lines[0], too_many
        assert run_main(["serve", "--threads=4"]).code == 0
        from_env = run_main(["serve"], {"SAM2SERVE_THREADS": "100000"})
        assert from_env.code == 2 and "SAM2SERVE_THREADS" in from_env.lines[0], from_env


def test_plain_numbers_are_still_read():
    """The strict parsers take what a person writes: signs, fractions, exponents."""
    with stubbed_handlers():
        for argv in (
            ["serve", "--max-upload-mib=0.5", "--request-timeout=1e2", "--port=+8001"],
            ["serve", "--cache-mib=0", "--max-wait-ms=.5", "--seed=007"],
            ["download", "--timeout=2.5", "--url-base=http://[::1]:8080/mirror"],
        ):
            outcome = run_main(argv)
            assert outcome.code == 0, (argv, outcome)


# --------------------------------------------------------------------------- end to end


def _sam2serve(argv: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("SAM2SERVE_")}
    full_env.update(env)
    full_env["PYTHONPATH"] = str(Path(__file__).resolve().parents[1])
    return subprocess.run(
        [sys.executable, "-m", "sam2serve", *argv],
        env=full_env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.parametrize(
    ("argv", "env", "named"),
    [
        (["serve", "--max-upload-mib", "1e308"], {}, "--max-upload-mib"),
        (
            ["labelstudio"],
            {"SAM2SERVE_MAX_VIDEO_TOTAL_MIB": "1e300"},
            "SAM2SERVE_MAX_VIDEO_TOTAL_MIB",
        ),
        (["download", "--url-base", "http://h:99999"], {}, "--url-base"),
        (
            ["download"],
            {"SAM2SERVE_CHECKPOINT_URL_BASE": "http://[::1"},
            "SAM2SERVE_CHECKPOINT_URL_BASE",
        ),
        (["serve", "--threads", "１２"], {}, "--threads"),
    ],
)
def test_end_to_end_one_line_exit_2(argv, env, named, tmp_path):
    done = _sam2serve(argv, env, tmp_path)
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2, done.stderr
    assert len(lines) == 1 and named in lines[0], done.stderr
    assert "Traceback" not in done.stderr
