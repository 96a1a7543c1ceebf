"""``sam2serve annotate``: point prompts for the point tasks from the outputs of ``run
--task amg``."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from sam2serve.commands.common import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_STATUS_HELP,
    PROG,
    CommandParser,
    ItemFailure,
    UsageError,
    add_command,
    error_line,
)
from sam2serve.commands.inputs import DEFAULT_PROMPTS_NAME, MASKS_SUFFIX, Points
from sam2serve.commands.run_outputs import write_json

DESCRIPTION = f"""\
Make point prompts for --task sps / mps from the outputs of --task amg.

Reads every <stem>{MASKS_SUFFIX} written by '{PROG} run --task amg' in AMG_OUT_DIR and
writes one JSON object mapping each image name to a list of [x, y] points: one point per
mask, largest mask first. The point is the mask's centroid when that lies inside the mask,
otherwise the inside point farthest from the mask's edge. So sps uses a point of the
largest mask and mps one point per mask. Pass the file to '{PROG} run --prompts'.

{EXIT_STATUS_HELP}
"""


def register(subcommands: argparse._SubParsersAction) -> None:
    add_command(
        subcommands,
        "annotate",
        help="point prompts for sps/mps from amg outputs",
        description=DESCRIPTION,
        handler=annotate_command,
        add_arguments=add_arguments,
    )


def add_arguments(parser: CommandParser) -> None:
    parser.add_argument(
        "amg_out_dir",
        type=Path,
        metavar="AMG_OUT_DIR",
        help=f"directory with the <stem>{MASKS_SUFFIX} files of --task amg",
    )
    parser.add_argument(
        "--out",
        type=Path,
        metavar="FILE",
        help=f"prompts file to write (default: AMG_OUT_DIR/{DEFAULT_PROMPTS_NAME})",
    )


def annotate_file(path: Path) -> tuple[str, Points]:
    """Image name and prompt points (largest mask first) of one amg output file."""
    from sam2serve.engine.tasks import prompt_points

    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ItemFailure(f"cannot read {str(path)!r}: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("masks"), list):
        raise ItemFailure(f'{str(path)!r} is not a {PROG} output (no "masks" list)')
    if data.get("task") != "amg":
        raise ItemFailure(
            f"{str(path)!r} holds {data.get('task')!r} results; annotate needs --task amg outputs"
        )
    name = data.get("image") or path.name[: -len(MASKS_SUFFIX)]
    try:
        points = prompt_points(data["masks"])  # largest mask first
    except (KeyError, TypeError, ValueError) as exc:
        raise ItemFailure(f"{str(path)!r} has a malformed mask record: {exc!r}") from None
    return str(name), points


def annotate_command(args: argparse.Namespace) -> int:
    directory: Path = args.amg_out_dir
    if not directory.is_dir():
        raise UsageError(f"AMG_OUT_DIR {str(directory)!r} is not a directory")
    files = sorted(directory.glob(f"*{MASKS_SUFFIX}"))
    if not files:
        raise UsageError(
            f"no *{MASKS_SUFFIX} files in {str(directory)!r}; run "
            f"'{PROG} run --task amg IMAGES --out {directory}' first"
        )
    out: Path = args.out or directory / DEFAULT_PROMPTS_NAME
    prompts: dict[str, Points] = {}
    failed = 0
    for path in files:
        try:
            name, points = annotate_file(path)
        except ItemFailure as exc:
            failed += 1
            error_line(f"{exc}; skipped")
            continue
        if name in prompts:
            failed += 1
            error_line(f"{str(path)!r} repeats image {name!r}; skipped")
            continue
        prompts[name] = points
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        write_json(out, prompts)
    except OSError as exc:
        raise UsageError(f"cannot write prompts file {str(out)!r}: {exc.strerror}") from None
    total = sum(len(p) for p in prompts.values())
    print(
        f"{PROG}: wrote {total} prompt point(s) for {len(prompts)} image(s) to "
        f"{str(out)!r}" + (f"; {failed} file(s) failed" if failed else ""),
        file=sys.stderr,
    )
    return EXIT_FAILED if failed else EXIT_OK
