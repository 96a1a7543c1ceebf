"""The ``sam2serve`` command line: a dispatcher.

Each subcommand is a module of :mod:`sam2serve.commands` that registers its parser and
handler; the conventions they share (exit codes, parser, errors) are in
:mod:`sam2serve.commands.common`. This module builds the top parser, runs the handler
and turns every error into one ``sam2serve: error: ...`` line and its exit status.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from sam2serve.commands import (
    annotate,
    bench,
    cluster,
    download,
    embed,
    export,
    labelstudio,
    loadtest,
    run,
    serve,
    track,
)
from sam2serve.commands.common import (
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_STATUS_HELP,
    PROG,
    CommandError,
    CommandParser,
    UsageError,
    error_line,
    message,
    package_version,
)
from sam2serve.commands.variables import check_variables
from sam2serve.runtime.threads import set_wait_policy

__all__ = ["COMMANDS", "build_parser", "main"]

# In the order `sam2serve --help` lists them.
COMMANDS = (
    run,
    annotate,
    track,
    embed,
    bench,
    export,
    download,
    serve,
    labelstudio,
    loadtest,
    cluster,
)


def build_parser() -> argparse.ArgumentParser:
    parser = CommandParser(
        prog=PROG,
        description="Segment Anything 2 on images and videos: batch masks, video tracking, "
        "benchmark,\nahead-of-time export, checkpoint download, HTTP service and its Ray Serve "
        "cluster.",
        epilog=f"'{PROG} COMMAND --help' explains a command and every flag.\n{EXIT_STATUS_HELP}",
    )
    parser.add_argument("--version", action="version", version=f"{PROG} {package_version()}")
    subcommands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for command in COMMANDS:
        command.register(subcommands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``sam2serve`` console script; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        try:
            set_wait_policy()  # read by OpenMP when torch starts it: before any torch import
        except ValueError as exc:
            raise UsageError(f"$OMP_WAIT_POLICY: {exc}") from None
        check_variables()
        args = build_parser().parse_args(argv)
        args.argv = argv  # the exact command, for reports that say how to rerun them
        return args.handler(args)
    except CommandError as exc:
        error_line(str(exc))
        return exc.exit_code
    except KeyboardInterrupt:
        message(f"{PROG}: interrupted")
        return EXIT_INTERRUPTED
    except SystemExit as exc:  # --help, --version
        return exc.code if isinstance(exc.code, int) else EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
