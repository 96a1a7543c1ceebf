"""The conventions every subcommand shares (sam2serve.commands.common), checked on the
real parsers: no prefix matching, unknown flags named, usage errors without torch, one
exit-code table that README.md shows, --version, a dispatcher-only cli.py."""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import re
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest

from sam2serve import cli
from sam2serve.commands import common, export, run
from sam2serve.commands.common import EXIT_CODES, EXIT_USAGE, CommandParser

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "sam2serve"


def run_main(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(list(argv))
    return code, out.getvalue(), err.getvalue()


def error_lines(stderr: str) -> list[str]:
    assert "Traceback" not in stderr
    return [line for line in stderr.splitlines() if line.startswith("sam2serve: error: ")]


def all_parsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    """The parser and every subcommand parser below it, arguments added."""
    parser.format_help()  # adds a subcommand's deferred arguments
    found = [parser]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                found += all_parsers(sub)
    return found


PARSERS = all_parsers(cli.build_parser())


def test_every_parser_is_the_shared_class_without_prefix_matching():
    names = {p.prog for p in PARSERS}
    for command in ("run", "annotate", "bench", "export", "serve", "loadtest", "cluster"):
        assert f"sam2serve {command}" in names
    for parser in PARSERS:
        assert isinstance(parser, CommandParser), parser.prog
        assert parser.allow_abbrev is False, parser.prog
        assert isinstance(parser.formatter_class, type)
        assert issubclass(parser.formatter_class, common.HelpFormatter), parser.prog


@pytest.mark.parametrize(
    ("argv", "unknown", "suggestion"),
    [
        (["run", "--task", "amg", "x.jpg", "--out", "o", "--random-weight"], "--random-weight", "--random-weights"),
        (["run", "--tsk", "amg", "x.jpg", "--out", "o"], "--tsk", "--task"),  # not "--task is required"
        (["serve", "--max-quue", "3"], "--max-quue", "--max-queue"),
        (["serve", "--port=80", "--rand"], "--rand", None),
        (["export", "--out", "o", "--chekpoint", "x.pt"], "--chekpoint", "--checkpoint"),
        (["cluster", "burst", "--url", "http://127.0.0.1:9", "--pts-per-side", "2"], "--pts-per-side", "--points-per-side"),
        (["--versoin", "run"], "--versoin", "--version"),
    ],
)  # fmt: skip
def test_an_unknown_flag_is_named_with_the_closest_one(argv, unknown, suggestion):
    code, _, stderr = run_main(*argv)
    assert code == EXIT_USAGE
    [line] = error_lines(stderr)
    assert f"unknown flag {unknown}" in line
    if suggestion:
        assert f"did you mean {suggestion}?" in line
    else:
        assert "did you mean" not in line


def test_negative_numbers_are_values_not_flags(tmp_path):
    parser = cli.build_parser()
    args = parser.parse_args(
        ["run", "--task", "amg", "x.jpg", "--out", str(tmp_path), "--mask-threshold", "-1.5"]
    )
    assert args.mask_threshold == -1.5


def test_version_is_the_installed_package_version(capsys):
    assert cli.main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"sam2serve {version('sam2serve')}"


# --------------------------------------------------------------------------- no torch


USAGE_ERRORS = [
    (["run", "--task", "amg", "samples", "--out", "o", "--model", "huge"], "invalid choice: 'huge'"),
    (["run", "--task", "amg", "samples", "--out", "o", "--mode", "turbo"], "invalid choice: 'turbo'"),
    (["run", "--task", "amg", "samples", "--out", "o", "--random-weight"], "unknown flag --random-weight"),
    (["run", "--task", "amg", "samples", "--out", "o", "--threads", "0"], "--threads"),
    (["run", "--task", "amg", "samples", "--out", "o", "--backend", "openvino", "--device", "cuda"], "openvino"),
    (["run", "--task", "amg", "nowhere.jpg", "--out", "o"], "image file not found: 'nowhere.jpg'"),
    (["serve", "--mode", "turbo"], "invalid choice: 'turbo'"),
    (["serve", "--max-queue", "0"], "--max-queue must be an integer >= 1, got 0"),
    (["export", "--out", "o", "--mode", "baseline"], "invalid choice: 'baseline'"),
    (["loadtest", "--url", "http://127.0.0.1:9", "--concurrency", "x"], "--concurrency"),
    (["cluster", "up"], "--config"),
    (["annotate", "nowhere"], "is not a directory"),
    (["download", "--model", "huge"], "invalid choice: 'huge'"),
    (["export", "--out", "o", "--model", "facebook/sam2.1-hiera-huge"], "invalid choice"),
]  # fmt: skip


def test_usage_errors_come_before_torch_is_imported():
    """In a fresh interpreter: the exit status, one error line, and torch never imported
    (a torch import costs seconds; these errors must not)."""
    script = (
        "import contextlib, io, json, sys\n"
        "from sam2serve.cli import main\n"
        "results = []\n"
        "for argv in json.loads(sys.argv[1]):\n"
        "    err = io.StringIO()\n"
        "    with contextlib.redirect_stderr(err):\n"
        "        code = main(argv)\n"
        "    results.append([code, err.getvalue(), 'torch' in sys.modules])\n"
        "print(json.dumps(results))\n"
    )
    import json

    argvs = [argv for argv, _ in USAGE_ERRORS]
    proc = subprocess.run(
        [sys.executable, "-c", script, json.dumps(argvs)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    for (argv, fragment), (code, stderr, torch_loaded) in zip(
        USAGE_ERRORS, json.loads(proc.stdout), strict=True
    ):
        assert code == EXIT_USAGE, (argv, stderr)
        [line] = error_lines(stderr)
        assert fragment in line, (argv, line)
        assert not torch_loaded, argv


def test_python_m_sam2serve_reports_a_bad_model_with_exit_2():
    proc = subprocess.run(
        [sys.executable, "-m", "sam2serve", "run", "--task", "amg", "x.jpg", "--out", "o",
         "--model", "huge"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )  # fmt: skip
    assert proc.returncode == 2
    assert proc.stderr.startswith("sam2serve: error: argument --model: invalid choice: 'huge'")
    assert proc.stderr.count("\n") == 1 and proc.stdout == ""


def test_the_cli_sets_the_openmp_wait_policy(monkeypatch):
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    assert cli.main(["--version"]) == 0
    assert os.environ["OMP_WAIT_POLICY"] == "passive"
    monkeypatch.setenv("OMP_WAIT_POLICY", "sometimes")
    code, _, stderr = run_main("--version")
    assert code == EXIT_USAGE and "OMP_WAIT_POLICY" in error_lines(stderr)[0]


# --------------------------------------------------------------------------- one place


def test_threads_flag_on_every_command_that_runs_the_model():
    by_prog = {p.prog: p for p in PARSERS}
    for command in ("run", "bench", "serve", "export"):
        parser = by_prog[f"sam2serve {command}"]
        [action] = [a for a in parser._actions if "--threads" in a.option_strings]
        assert action.default is None
        assert "affinity" in action.help and "cgroup" in action.help


def test_names_kept_without_torch_match_their_source():
    from sam2serve.engine.tasks import TASKS
    from sam2serve.runtime.export import BACKENDS, DECODERS

    # run.TASKS are SAM 2.1's tasks (bench and the burst run them); --task also takes
    # "concepts", SAM 3's task in sam2serve.concepts, which is not an engine.tasks task.
    assert run.TASKS == TASKS
    assert run.RUN_TASKS == (*TASKS, "concepts")
    assert export.EXPORT_IMAGE_PATHS == BACKENDS and export.EXPORT_DECODERS == DECODERS


def test_cli_is_a_dispatcher_and_command_modules_are_small():
    source = (PACKAGE / "cli.py").read_text()
    assert source.count("add_argument(") == 1  # --version; every other flag is a command's
    assert len(source.splitlines()) < 100
    for path in [*(PACKAGE / "commands").glob("*.py"), PACKAGE / "server" / "api_docs.py"]:
        assert len(path.read_text().splitlines()) < 500, path.name
    for old in ("server/commands.py", "accel/commands.py", "cluster/commands.py"):
        assert not (PACKAGE / old).exists(), old


def test_every_command_help_ends_with_the_exit_status(capsys):
    for parser in PARSERS:
        if parser.prog.count(" ") == 1 or parser.prog == "sam2serve":  # top level, commands
            text = parser.format_help()
            assert "exit status: 0 success; 1 some work failed; 2 usage error; 3 could not " in " ".join(text.split()), parser.prog  # fmt: skip


# --------------------------------------------------------------------------- README


def readme_section(title: str) -> str:
    text = (ROOT / "README.md").read_text()
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end]


def test_readme_exit_status_table_is_the_code_table():
    section = readme_section("Command line")
    rows = re.findall(r"^\| `(\d+)` \| (.+?) \| (.+?) \|$", section, flags=re.MULTILINE)
    assert [(int(code), meaning) for code, meaning, _ in rows] == [
        (code, meaning) for code, meaning, _ in EXIT_CODES
    ]


def test_readme_command_line_flags_exist():
    """Every flag the README's command-line section names is a flag of some command, and
    its run synopsis lists every run flag."""
    section = readme_section("Command line")
    known = {s for parser in PARSERS for s in parser._option_string_actions}
    named = {
        "--" + name for name in re.findall(r"(?<![\w-])--(?:\[no-\])?([a-z][a-z0-9-]*)", section)
    }
    examples_of_mistakes = {"--random-weight"}
    assert named - examples_of_mistakes <= known, sorted(named - known)
    synopsis = section[section.index("sam2serve run --task") :]
    synopsis = synopsis[: synopsis.index("```")]
    run_parser = next(p for p in PARSERS if p.prog == "sam2serve run")
    for action in run_parser._actions:
        flags = [s for s in action.option_strings if s.startswith("--") and s != "--help"]
        if flags and not flags[0].startswith("--no-"):
            assert re.search(rf"--(\[no-\])?{flags[0][2:]}(?![\w-])", synopsis), flags[0]
