"""Every ``sam2serve ...`` command in README.md, docs/*.md and pyproject.toml's comments parses with the real command
line (``sam2serve.cli.build_parser``): no unknown flag, no invalid value. Nothing runs: only
the parser is called, never a handler.

The rule for what is a command and how it is read:

- Where: fenced code blocks, and inline code spans (`` `sam2serve ...` ``) in the prose.
- In a code block, lines ending in ``\\`` are joined with the next; a ``#`` that starts a
  word begins a comment. Each line is split like a shell line (quotes respected) at
  ``&&``, ``||``, ``;``, ``|``, ``&``, ``(``, ``)`` and redirections; a piece is a command
  when its first word, after ``NAME=value`` environment prefixes and a ``$`` prompt, is
  exactly ``sam2serve``. (Output lines such as ``sam2serve: error: ...`` are not commands.)
  Its environment prefixes are set while it is parsed, so a documented
  ``SAM2SERVE_FLAG=value`` is checked too.
- Placeholders: a word in capitals (``FILE``, ``DIR``, ``N``, ``FILE.md``, ``HOST:PORT``,
  ``AMG_OUT_DIR``), ``<...>``, or ``...`` / ``…`` stands for a value the reader chooses. A
  flag whose value is a placeholder, or that is named without its value in prose (the last
  word of an inline span), is checked to exist and then left out; a placeholder where a
  subcommand's name goes (``sam2serve COMMAND --help``) leaves the command out. Synopsis
  brackets (``[--out FILE]``) are dropped; in ``a|b`` alternatives the shell split keeps
  the first. ``--help`` and ``--version`` are checked to exist and left out (they would
  print and exit).
- An inline span that starts with a flag (`` `--backend aoti` ``) names a flag of some
  command: it must parse, with its value, as the flags of at least one command (other
  tools' flags, such as pip's, are listed in OTHER_TOOLS and left out).
- A command may be partial (prose names ``sam2serve run --task sps`` without its images),
  so argparse's "required" errors are accepted: argparse reports them only after every
  given flag and value has been read and checked. Every other parser error fails the test,
  naming the file, the line and the command.
"""

from __future__ import annotations

import argparse
import functools
import os
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import pytest

from sam2serve.cli import build_parser
from sam2serve.commands.common import UsageError

ROOT = Path(__file__).resolve().parents[1]
# pyproject.toml's comments name the commands each extra serves, in inline code.
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "pyproject.toml"]
OPERATORS = {"&&", "||", ";", "|", "&", "(", ")", ";;", "|&"}
REDIRECTS = re.compile(r"^[<>]+&?$|^>&$|^&>$")
ENV_PREFIX = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
# Flags of other programs the docs name in inline code: pip's, scripts/gpu-check.sh's,
# Label Studio's.
OTHER_TOOLS = {
    "--no-deps",
    "--no-build-isolation",
    "--index-url",
    "--extra-index-url",
    "--part",
    "--download-wheels",
    "--enable-legacy-api-token",
}
# Wrong on purpose: README's example of the error an unknown flag gets.
DELIBERATE = {"--random-weight"}
PLACEHOLDER = re.compile(r"^(?:[A-Z][A-Z0-9_]*(?:[.:][A-Za-z0-9_]+)*|<[^>]*>|\.\.\.|…)$")


@dataclass(frozen=True)
class Command:
    where: str  # file:line
    env: tuple[tuple[str, str], ...]
    argv: tuple[str, ...]  # after 'sam2serve'
    inline: bool
    flags_only: bool = False  # an inline span of flags: of some command

    def __str__(self) -> str:
        return f"{self.where}: sam2serve {shlex.join(self.argv)}"


def shell_pieces(line: str) -> list[list[str]]:
    """The line split like a shell line at its operators (None when it cannot be)."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    lexer.commenters = "#"
    try:
        tokens = list(lexer)
    except ValueError:  # an unbalanced quote: not a shell line
        return []
    pieces: list[list[str]] = [[]]
    skip_next = False
    for token in tokens:
        if skip_next:  # the target of a redirection
            skip_next = False
            continue
        if token in OPERATORS:
            pieces.append([])
        elif REDIRECTS.match(token):
            if pieces[-1] and pieces[-1][-1].isdigit():  # 2>&1: the 2 is the redirection's
                pieces[-1].pop()
            skip_next = True
        else:
            pieces[-1].append(token)
    return [piece for piece in pieces if piece]


def as_command(piece: list[str], where: str, inline: bool) -> Command | None:
    words = list(piece)
    if words and words[0] == "$":
        words.pop(0)
    env = []
    while words and ENV_PREFIX.match(words[0]):
        name, _, value = words.pop(0).partition("=")
        env.append((name, value))
    if not words or words[0] != "sam2serve":
        return None
    return Command(where, tuple(env), tuple(words[1:]), inline)


def commands_in(path: Path) -> list[Command]:
    found: list[Command] = []
    label = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path.name
    lines = path.read_text(encoding="utf-8").splitlines()
    in_block = False
    pending = ""
    pending_line = 0
    for number, line in enumerate(lines, 1):
        where = f"{label}:{number}"
        if line.lstrip().startswith("```"):
            in_block = not in_block
            pending = ""
            continue
        if in_block:
            if not pending:
                pending_line = number
            if line.rstrip().endswith("\\"):
                pending += line.rstrip()[:-1] + " "
                continue
            text, pending = pending + line, ""
            start = f"{label}:{pending_line}"
            for piece in shell_pieces(text):
                command = as_command(piece, start, inline=False)
                if command is not None:
                    found.append(command)
            continue
        for span in re.findall(r"`([^`]+)`", line):
            if span.startswith("--") and not span.startswith("---"):
                words = [w for piece in shell_pieces(span) for w in piece]
                if words and words[0].split("=")[0] not in OTHER_TOOLS | DELIBERATE:
                    found.append(Command(where, (), tuple(words), True, flags_only=True))
                continue
            if "sam2serve " not in span:
                continue
            for piece in shell_pieces(span):
                command = as_command(piece, where, inline=True)
                if command is not None:
                    found.append(command)
    return found


ALL = [command for path in DOCS for command in commands_in(path)]


def subcommand_parser(argv: list[str]) -> tuple[argparse.ArgumentParser, int] | None:
    """The parser the flags of ``argv`` belong to, and where its own words start (None:
    a placeholder stands where a subcommand's name goes)."""
    parser = build_parser()
    index = 0
    while parser._subparsers is not None:
        choices = parser._subparsers._group_actions[0].choices
        words = [w for w in argv[index:] if not w.startswith("-")]
        if not words or words[0] not in choices:
            if words and PLACEHOLDER.match(words[0]):
                return None
            return parser, index
        index = argv.index(words[0], index) + 1
        parser = choices[words[0]]
    parser.format_usage()  # adds the deferred flags
    return parser, index


def cleaned(word: str) -> str:
    """A word without synopsis brackets and a trailing ellipsis."""
    word = word.strip("[]")
    return word[:-3] if word.endswith("...") and len(word) > 3 else word


@functools.cache
def command_flags() -> dict[tuple[str, ...], frozenset[str]]:
    """Every command's words (``("run",)``, ``("cluster", "up")``, ...) and its flags."""
    found: dict[tuple[str, ...], frozenset[str]] = {}

    def walk(parser: argparse.ArgumentParser, path: tuple[str, ...]) -> None:
        if parser._subparsers is None:
            parser.format_usage()  # adds the deferred flags
            found[path] = frozenset(parser._option_string_actions)
            return
        for name, sub in parser._subparsers._group_actions[0].choices.items():
            walk(sub, (*path, name))

    walk(build_parser(), ())
    return found


def parse_only(command: Command) -> str | None:
    """None when the command parses (or lacks only required arguments), else the error."""
    if command.flags_only:
        problems = []
        name = command.argv[0].split("=")[0]
        for path in (p for p, flags in command_flags().items() if name in flags):
            problem = parse_only(Command(command.where, (), (*path, *command.argv), True))
            if problem is None:
                return None
            problems.append(f"{' '.join(path)}: {problem}")
        known = [p for p in problems if "unknown flag" not in p]
        return "no command takes it: " + ("; ".join(known) or "an unknown flag everywhere")
    argv = [w for w in map(cleaned, command.argv) if w and w not in ("...", "…")]
    found = subcommand_parser(argv)
    if found is None:
        return None
    parser, start = found
    known = parser._option_string_actions
    kept = argv[:start]
    index = start
    while index < len(argv):
        word = argv[index]
        index += 1
        if not word.startswith("-") or word == "-" or re.match(r"^-\d", word):
            kept.append(word)
            continue
        name, equals, value = word.partition("=")
        if name not in known:
            return f"unknown flag {name}"
        action = known[name]
        if isinstance(action, (argparse._HelpAction, argparse._VersionAction)):
            continue
        if action.nargs == 0:
            kept.append(word)
            continue
        if not equals:
            at_end = index >= len(argv) or argv[index].startswith("--")
            if at_end:
                if command.inline:
                    continue  # prose names the flag without its value
                return f"{name} has no value"
            value = argv[index]
            index += 1
        if PLACEHOLDER.match(value):
            continue
        choices = re.fullmatch(r"\{(.+)\}", value)
        if choices:  # a synopsis's {a,b,c}: each of them
            for choice in choices.group(1).split(","):
                words = [*argv[:start], name, choice]
                problem = parse_only(Command(command.where, command.env, tuple(words), True))
                if problem is not None:
                    return problem
            continue
        kept += [name, value]
    try:
        build_parser().parse_args(kept)
    except UsageError as exc:
        message = str(exc)
        if "required" in message and "invalid" not in message:
            return None
        return message
    return None


def test_the_docs_name_commands():
    """The extraction finds the documented commands (a broken rule would find none)."""
    assert len(ALL) > 100
    files = {command.where.split(":")[0] for command in ALL}
    assert {"README.md", "docs/api.md", "docs/benchmarks.md", "docs/cluster.md"} <= files
    names = {command.argv[0] for command in ALL if command.argv}
    assert {"run", "serve", "bench", "export", "labelstudio", "cluster", "track"} <= names


@pytest.mark.parametrize("command", ALL, ids=str)
def test_documented_command_parses(command, monkeypatch):
    for name in list(os.environ):
        if name.startswith("SAM2SERVE_"):
            monkeypatch.delenv(name)
    for name, value in command.env:
        monkeypatch.setenv(name, value)
    problem = parse_only(command)
    assert problem is None, f"{command}\n  -> {problem}"


@pytest.mark.parametrize(
    "text, problem",
    [
        ("`sam2serve export --backend aoti`", "unknown flag --backend"),
        ("`sam2serve run --task {amg,sps,xyz}`", "invalid choice: 'xyz'"),
        ("`sam2serve serve --cors-origins http://x`", "unknown flag --cors-origins"),
        ("```\nsam2serve bench --modes fast+aot \\\n  --task sps\n```", "fast+aot"),
        ("```\nSAM2SERVE_PORT=abc sam2serve serve\n```", "$SAM2SERVE_PORT='abc'"),
        ("`sam2serve run --task sps`", None),  # partial: only the images are missing
        ("`sam2serve serve --artifacts`", None),  # a flag named in prose
        ("`sam2serve run IMAGES... --out DIR [--mode MODE]`", None),
        ("```\nsam2serve serve --random-weights 2>&1 | tee log &\n```", None),
        ("`sam2serve COMMAND --help`", None),
        ("`--backend aoti`", "no command takes it"),
        ("`--format aoti`", None),
        ("`--no-public-fetch`", None),
    ],
)
def test_the_rule_finds_what_it_should(tmp_path, monkeypatch, text, problem):
    """The checker itself: the known mistakes are caught, the documented forms pass."""
    for name in list(os.environ):
        if name.startswith("SAM2SERVE_"):
            monkeypatch.delenv(name)
    page = tmp_path / "page.md"
    page.write_text(text + "\n", encoding="utf-8")
    [command] = commands_in(page)
    for name, value in command.env:
        monkeypatch.setenv(name, value)
    found = parse_only(command)
    if problem is None:
        assert found is None, found
    else:
        assert found is not None and problem in found, found
