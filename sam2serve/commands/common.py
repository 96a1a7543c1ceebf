"""What every ``sam2serve`` subcommand shares, defined once: the program name, the exit
codes, the parser class and help formatter, how errors and warnings are printed, and the
flags several commands take (``--model``, ``--mode``, ``--backend``, ``--device``,
``--threads``, the weights).

Conventions every command follows:

- A handler takes the parsed arguments and returns :data:`EXIT_OK` or, when some of its
  work failed but the rest was done, :data:`EXIT_FAILED`. Every other outcome is an
  exception: :class:`UsageError` (exit 2) for anything the user can fix in the command
  line or its input files, :class:`StartError` (exit 3) when a service could not start.
  ``cli.main`` turns them into one ``sam2serve: error: ...`` line and the exit status.
- Usage errors come before heavy work: flags are checked by the parser, input files
  before the model loads. This module and the parsers are torch-free, so a bad flag is
  reported in milliseconds; the heavy imports live inside the handlers.
- No prefix matching (``--random-weight`` is an unknown flag, not ``--random-weights``),
  and an unknown flag is named, with the closest known one.
"""

from __future__ import annotations

import argparse
import difflib
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from sam2serve.config import ACCEPTED_MODELS, MODEL_SIZES, model_size
from sam2serve.config_text import Integer, Number
from sam2serve.options import apply_environment, describe_environment, read_environment
from sam2serve.runtime.backend_choice import AUTO, AUTO_DESCRIPTION, BACKEND_CHOICES
from sam2serve.runtime.backends import BACKENDS
from sam2serve.runtime.modes import DEVICE_TYPES, MODES
from sam2serve.runtime.spec import RuntimeSpec
from sam2serve.runtime.threads import MAX_THREADS

PROG = "sam2serve"
# The runtime's defaults: fast, the fastest lossless mode (baseline's masks, sooner); tiny.
DEFAULT_MODE = RuntimeSpec().mode
DEFAULT_MODEL = RuntimeSpec().model
SAMPLES_ARG = "samples"  # stands for the bundled sample photos wherever images are taken

# The one exit-code table: README.md's "Exit status" shows it (a test keeps them equal).
EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_NOT_STARTED = 3
EXIT_INTERRUPTED = 130
# (code, meaning, when): the help of every command ends with the meanings.
EXIT_CODES: tuple[tuple[int, str, str], ...] = (
    (EXIT_OK, "success", "everything asked for was done"),
    (
        EXIT_FAILED,
        "some work failed",
        (
            "an image, a benchmark run or a request failed; each failure got one error line "
            "and the rest of the work was done"
        ),
    ),
    (
        EXIT_USAGE,
        "usage error",
        (
            "found before any work: a bad flag or value, a missing or invalid input file "
            "(image, prompts, config), a checkpoint or artifacts that cannot be used, a device "
            "that is not available"
        ),
    ),
    (
        EXIT_NOT_STARTED,
        "could not start",
        (
            "a service could not start: its port is in use, or 'cluster up' could not start Ray "
            "or the applications"
        ),
    ),
    (EXIT_INTERRUPTED, "interrupted", "stopped by Ctrl-C"),
)
EXIT_STATUS_HELP = "exit status: " + "; ".join(
    f"{code} {meaning}" for code, meaning, _ in EXIT_CODES
)


class CommandError(Exception):
    """An error the command reports as one line; ``exit_code`` is its exit status."""

    exit_code = EXIT_USAGE


class UsageError(CommandError):
    """A mistake in the command line or its inputs, found before any work: exit 2."""


class StartError(CommandError):
    """A service that could not start (its port is taken, ...): exit 3."""

    exit_code = EXIT_NOT_STARTED


class ItemFailure(Exception):
    """One item of a batch (an image, a file) that failed: reported as one error line and
    skipped; the others are still done and the command ends with exit 1."""


# Optional packages a command path may import, by top-level module: (what it is, the extra
# of pyproject.toml that installs it). A missing one is one usage-error line (cli.main).
EXTRAS = {
    "ray": ("Ray", "cluster"),
    "yaml": ("PyYAML", "cluster"),
    "av": ("PyAV", "video"),
    "onnx": ("ONNX", "onnx"),
    "onnxruntime": ("ONNX Runtime", "onnx"),
    "nncf": ("NNCF", "int8"),
    "transformers": ("Hugging Face transformers", "bench"),
}


def install_hint(module: str) -> str:
    """``pip install "sam2serve[EXTRA]"`` for an optional module."""
    return f'pip install "{PROG}[{EXTRAS[module][1]}]"'


def missing_extra(exc: ImportError, command: str) -> str | None:
    """``COMMAND needs Ray: pip install "sam2serve[cluster]"`` when ``exc`` is the import of
    an optional package that is not installed; None for any other import error."""
    module = (exc.name or "").split(".")[0]
    if module not in EXTRAS:
        return None
    return f"{command} needs {EXTRAS[module][0]}: {install_hint(module)}"


def _extras_as_usage(
    handler: Callable[[argparse.Namespace], int], command: str
) -> Callable[[argparse.Namespace], int]:
    """The handler, with an optional package it finds missing turned into one usage-error
    line that says how to install it (any other ImportError is a bug: raised as it is)."""

    def run(args: argparse.Namespace) -> int:
        try:
            return handler(args)
        except ImportError as exc:
            text = missing_extra(exc, command)
            if text is None:
                raise
            raise UsageError(text) from None

    return run


# --------------------------------------------------------------------------- output


def error_line(text: str) -> None:
    """``sam2serve: error: TEXT`` on stderr, without breaking a running progress bar."""
    message(f"{PROG}: error: {text}")


def warning_line(text: str) -> None:
    message(f"{PROG}: warning: {text}")


def info_line(text: str) -> None:
    message(f"{PROG}: {text}")


def message(text: str) -> None:
    """A line on stderr; through tqdm only when it is loaded (a bar may be running)."""
    tqdm = sys.modules.get("tqdm")
    if tqdm is not None:
        tqdm.tqdm.write(text, file=sys.stderr)
    else:
        print(text, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- parser


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Descriptions kept as written; help aligned at one column, 100 characters wide.

    A flag whose default is expensive to compute (it needs torch) carries it as a
    callable in ``action.lazy_default``: it is only called when help is shown.
    """

    def __init__(self, prog: str) -> None:
        super().__init__(prog, max_help_position=36, width=100)

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help
        lazy = getattr(action, "lazy_default", None)
        if text is not None and lazy is not None:
            text += f" (default: {lazy()})".replace("%", "%%")
        return text


class CommandParser(argparse.ArgumentParser):
    """The one parser class of every command and subcommand.

    - ``allow_abbrev=False``: flags are never matched by prefix.
    - An unknown flag is named before anything else is checked (argparse would first
      complain about a required flag the misspelled one was meant to be), with the
      closest known flag.
    - Errors raise :class:`UsageError` instead of printing usage and exiting.
    - :meth:`defer` adds arguments only when this parser is used: a subcommand whose
      flags need a heavy import costs nothing to the others.
    - ``environment``: every flag can also be set by its ``SAM2SERVE_...`` variable
      (sam2serve.options: named in the help; flag > variable > default).
    """

    def __init__(self, *args: Any, environment: bool = False, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)
        # type=int and type=float read as the strict parsers read every number (ASCII,
        # finite, no '1_000' or ' 12 '): any command's flag, and its variable, included.
        self.register("type", int, Integer())
        self.register("type", float, Number())
        self._deferred: list[Callable[[CommandParser], None]] = []
        self.environment = environment

    def defer(self, add_arguments: Callable[[CommandParser], None]) -> None:
        self._deferred.append(add_arguments)

    def _add_deferred(self) -> None:
        while self._deferred:
            self._deferred.pop(0)(self)
        if self.environment:
            describe_environment(self)

    def parse_known_args(  # type: ignore[override]  # argparse's stub overloads it; this is the one form used
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        self._add_deferred()
        argv = list(sys.argv[1:] if args is None else args)
        self._check_flags(argv)
        found: dict[str, tuple[str, str, Any]] = {}
        if self.environment and not {"-h", "--help"} & set(argv):
            found = read_environment(self, argv, os.environ)
        parsed, rest = super().parse_known_args(argv, namespace)
        if self.environment:
            apply_environment(parsed, found)
        return parsed, rest

    def format_usage(self) -> str:
        self._add_deferred()
        return super().format_usage()

    def format_help(self) -> str:
        self._add_deferred()
        return super().format_help()

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see '{self.prog} --help')")

    def _check_flags(self, args: list[str]) -> None:
        """Every flag-like argument must be a flag of this parser (before a subcommand's
        name, for a parser with subcommands)."""
        known = self._option_string_actions
        for arg in args:
            if arg == "--":
                return
            if not arg.startswith("-") or len(arg) == 1 or " " in arg:
                if self._subparsers is not None:
                    return  # the subcommand's name: its own parser checks the rest
                continue
            if self._negative_number_matcher.match(arg) and not self._has_negative_number_optionals:
                continue  # a negative number is a value
            name = arg.split("=", 1)[0]
            if name not in known:
                self.error(unknown_flag_message(name, list(known)))


def unknown_flag_message(name: str, known: Sequence[str]) -> str:
    """``unknown flag --foo; did you mean --bar?`` (no suggestion if nothing is close)."""
    # Compared without the dashes every long flag shares, which would make most look close.
    names = {flag.lstrip("-"): flag for flag in known if flag.startswith("--")}
    close = difflib.get_close_matches(name.lstrip("-"), list(names), n=1)
    return f"unknown flag {name}" + (f"; did you mean {names[close[0]]}?" if close else "")


def add_command(
    subcommands: argparse._SubParsersAction,
    name: str,
    *,
    help: str,
    description: str,
    handler: Callable[[argparse.Namespace], int],
    add_arguments: Callable[[CommandParser], None],
    epilog: str | None = None,
    environment: bool = False,
) -> CommandParser:
    """Register subcommand ``name``; its arguments are added when it is used
    (``environment``: each flag settable by its variable too, see CommandParser)."""
    parser = subcommands.add_parser(
        name,
        help=help,
        description=description,
        epilog=epilog,
        formatter_class=HelpFormatter,
        environment=environment,
    )
    assert isinstance(parser, CommandParser)
    parser.set_defaults(handler=_extras_as_usage(handler, parser.prog.removeprefix(f"{PROG} ")))
    parser.defer(add_arguments)
    return parser


def flag_of(parser: argparse.ArgumentParser) -> dict[str, str]:
    """The flag that sets each destination, to name it in errors found after parsing."""
    return {
        action.dest: next(s for s in action.option_strings if s.startswith("--"))
        for action in parser._actions
        if any(s.startswith("--") for s in action.option_strings)
    }


# --------------------------------------------------------------------------- flag types


positive_int = Integer(low=1)
# --threads: at most MAX_THREADS (runtime.threads), whatever this machine has, so a
# configuration written for a larger one still starts.
threads_value = Integer(low=1, high=MAX_THREADS)
port_value = Integer(low=1, high=65535)
seed_value = Integer(low=0)


def device_value(value: str) -> str:
    """``cpu``, ``cuda`` or ``cuda:N``."""
    kind, _, index = value.partition(":")
    if kind not in DEVICE_TYPES or (index and (kind == "cpu" or not index.isdigit())):
        raise argparse.ArgumentTypeError(
            f"expected one of {', '.join(DEVICE_TYPES)} (or cuda:N), got {value!r}"
        )
    return value


# --------------------------------------------------------------------------- shared flags


def model_value(value: str) -> str:
    """A model size, or a Hugging Face id (``facebook/sam2.1-hiera-tiny``) as its size."""
    try:
        return model_size(value)
    except ValueError as exc:
        if "unknown model" in str(exc):  # as argparse says it for the other choices
            exc = ValueError(f"invalid choice: {value!r} (choose from {ACCEPTED_MODELS})")
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_model_flag(parser: argparse._ActionsContainer, default: str = DEFAULT_MODEL) -> None:
    parser.add_argument(
        "--model",
        type=model_value,
        choices=MODEL_SIZES,
        default=default,
        help="model size, or its Hugging Face id: facebook/sam2.1-hiera-tiny, -small, "
        "-base-plus, -large (default: %(default)s)",
    )


def add_mode_flag(
    parser: argparse._ActionsContainer,
    default: str | None = DEFAULT_MODE,
    modes: Sequence[str] = tuple(MODES),
    video: bool = False,
    concepts: bool = False,
) -> None:
    """--mode; ``video``: described by what each mode means for tracking; ``concepts``:
    also by what it means for SAM 3 (a command that may run it)."""
    sam3 = (
        "; with SAM 3 (concepts): "
        + "; ".join(f"{name}: {MODES[name].concepts_description}" for name in modes)
        if concepts
        else ""
    )
    parser.add_argument(
        "--mode",
        choices=tuple(modes),
        default=default,
        help="what answers you get: "
        + "; ".join(
            f"{name}: {MODES[name].video_description if video else MODES[name].description}"
            for name in modes
        )
        + sam3
        + " (default: %(default)s)",
    )


def add_backend_flag(parser: argparse._ActionsContainer) -> None:
    parser.add_argument(
        "--backend",
        choices=BACKEND_CHOICES,
        default=AUTO,
        help="what executes the mode: "
        + "; ".join(
            f"{info.name}: {info.description} ({', '.join(info.devices)})"
            for info in BACKENDS.values()
        )
        + f"; {AUTO}: {AUTO_DESCRIPTION} (default: %(default)s)",
    )


def add_device_flag(parser: argparse._ActionsContainer) -> None:
    parser.add_argument(
        "--device",
        type=device_value,
        default="cpu",
        metavar="{" + ",".join(DEVICE_TYPES) + "}",
        help="where the model runs; cuda:N picks one GPU (default: %(default)s)",
    )


def add_threads_flag(parser: argparse._ActionsContainer) -> None:
    parser.add_argument(
        "--threads",
        type=threads_value,
        default=None,
        metavar="N",
        help=f"CPU threads for the model, 1 to {MAX_THREADS} (default: the CPUs this process "
        "may use: its CPU affinity, lowered by its cgroup CPU quota, e.g. a container's limit)",
    )


def add_weights_flags(
    parser: argparse._ActionsContainer,
    *,
    artifacts: bool = True,
    required: bool = False,
    random_help: str = "a seeded random model instead of a checkpoint: for smoke tests, "
    "masks are meaningless",
) -> None:
    """--checkpoint | --random-weights [| --artifacts], and --seed."""
    weights = parser.add_mutually_exclusive_group(required=required)
    weights.add_argument(
        "--checkpoint",
        metavar="PATH",
        help="an official SAM 2.1 checkpoint file (.pt) for --model (default: Meta's file "
        "name in the cache's checkpoints folder, $SAM2SERVE_CACHE/checkpoints or "
        "~/.cache/sam2serve/checkpoints, downloaded there if missing)",
    )
    weights.add_argument("--random-weights", action="store_true", help=random_help)
    if artifacts:
        weights.add_argument(
            "--artifacts",
            metavar="DIR",
            help=f"start from '{PROG} export' artifacts (weights included, nothing compiled); "
            "--model and --mode must match their manifest",
        )
    parser.add_argument(
        "--seed",
        type=seed_value,
        default=0,
        metavar="N",
        help="seed of --random-weights (default: %(default)s)",
    )


def described(entries: dict[str, str], indent: int = 2, width: int = 92) -> str:
    """``name  description`` lines for a description, wrapped under the description."""
    import textwrap

    column = indent + max(map(len, entries)) + 2
    return "\n".join(
        textwrap.fill(
            text,
            width=width,
            initial_indent=f"{' ' * indent}{name:<{column - indent}}",
            subsequent_indent=" " * column,
        )
        for name, text in entries.items()
    )


def command_line(args: argparse.Namespace) -> str:
    """The command as typed (for reports that say how to rerun them)."""
    import shlex

    argv = getattr(args, "argv", None)
    return shlex.join([PROG, *(sys.argv[1:] if argv is None else argv)])


def package_version() -> str:
    """The installed package's version (torch-free: from its metadata)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(PROG)
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown"
