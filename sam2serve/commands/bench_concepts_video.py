"""``sam2serve bench --task concepts-video``: the flags and the handler of SAM 3's video
predictor bench (:mod:`sam2serve.bench.concepts_video`); ``commands/bench.py`` adds them and
hands over. The clip (--video, --frames), the modes (--modes), SAM 3 (--sam3-size,
--sam3-weights or --random-weights, --score-thresh) and SAM 2.1 (--model, --checkpoint)
flags are the bench's own."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from sam2serve.commands.bench_concepts import CONCEPT_MODES
from sam2serve.commands.common import (
    EXIT_FAILED,
    EXIT_OK,
    PROG,
    UsageError,
    command_line,
    positive_int,
)
from sam2serve.commands.concepts_flags import concepts_spec

CONCEPTS_VIDEO_TASK = "concepts-video"  # sam2serve.bench.concepts_video's name (torch-free here)
DEFAULT_VIDEO_MODES = ("baseline", "furious", "int8")
DEFAULT_PHRASE = "red disc"  # the sample clip's disc
MAX_OBJECTS = 10000  # Meta's VideoThresholds.max_objects


def add_concepts_video_bench_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        f"concepts video (--task {CONCEPTS_VIDEO_TASK}: SAM 3's video predictor; also reads "
        "--video, --frames, --modes and the concepts flags)"
    )
    group.add_argument(
        "--phrase",
        default=DEFAULT_PHRASE,
        metavar="TEXT",
        help="the one phrase tracked through the clip (default: %(default)r)",
    )
    group.add_argument(
        "--max-objects",
        type=positive_int,
        default=MAX_OBJECTS,
        metavar="N",
        help="objects tracked at once, at most (default: %(default)s, Meta's)",
    )
    group.add_argument(
        "--sam2-tracker",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="after each SAM 3 row, time SAM 2.1's tracker (--model; --checkpoint or "
        "--random-weights) in the same mode where it runs it, on the same clip and object "
        "count (default: on)",
    )


def _sam2_checkpoint(args: argparse.Namespace) -> str | None:
    """SAM 2.1's weights for its rows: --checkpoint, seeded random weights
    (--random-weights: None), or Meta's file from the cache (downloaded if missing)."""
    if args.checkpoint is not None:
        if not Path(args.checkpoint).is_file():
            raise UsageError(f"--checkpoint file not found: {args.checkpoint!r}")
        return str(args.checkpoint)
    if args.random_weights:
        return None
    from sam2serve.checkpoint import resolve_checkpoint
    from sam2serve.commands import model as model_flags
    from sam2serve.config import get_config

    with model_flags.load_errors_as_usage(None, args.model):
        return str(resolve_checkpoint(get_config(args.model), None))


def concepts_video_bench_command(args: argparse.Namespace) -> int:
    from sam2serve.bench.concepts_video import (
        ConceptsVideoConfig,
        ConceptsVideoError,
        run_concepts_video_bench,
    )
    from sam2serve.bench.concepts_video_report import (
        concepts_video_markdown,
        write_concepts_video_outputs,
    )
    from sam2serve.commands import model as model_flags
    from sam2serve.concepts.phrases import default_score_thresh

    modes = tuple(
        m.strip() for m in (args.modes or ",".join(DEFAULT_VIDEO_MODES)).split(",") if m.strip()
    )
    unknown = [m for m in modes if m not in CONCEPT_MODES]
    if unknown or not modes:
        raise UsageError(
            f"--task {CONCEPTS_VIDEO_TASK} runs the modes {', '.join(CONCEPT_MODES)}; got "
            f"{', '.join(map(repr, unknown)) or 'none'}"
        )
    model_flags.check_device(args.device)
    spec = concepts_spec(args, args.device)
    score = args.score_thresh
    if score is None:
        score = default_score_thresh(args.random_weights)  # track --text's rule
    checkpoint = _sam2_checkpoint(args) if args.sam2_tracker else None
    try:
        config = ConceptsVideoConfig(
            spec=spec,
            modes=modes,
            video=args.video,
            frames=args.video_frames,
            phrase=args.phrase,
            score_thresh=score,
            max_objects=args.max_objects,
            threads=args.threads,
            sam2_model=args.model if args.sam2_tracker else None,
            sam2_checkpoint=checkpoint,
            timeout_s=args.timeout_s,
            work_dir=args.work_dir,
            command=command_line(args),
        )
    except ConceptsVideoError as exc:
        raise UsageError(str(exc)) from None
    name = args.name or f"concepts_video_{spec.size}_{args.device.replace(':', '')}"
    out_dir = Path(args.out_dir)

    def partial(result) -> None:  # each finished row on disk, in case a later one fails
        write_concepts_video_outputs(result, out_dir, name)

    try:
        result = run_concepts_video_bench(
            config,
            log=lambda line: print(f"{PROG}: bench: {line}", file=sys.stderr, flush=True),
            after_row=partial,
        )
    except ConceptsVideoError as exc:
        raise UsageError(str(exc)) from None
    paths = write_concepts_video_outputs(result, out_dir, name)
    print(concepts_video_markdown(result))
    failed = [row.label for row in result.rows if not row.ok and not row.skipped]
    print(
        f"{PROG}: bench: wrote {', '.join(str(p) for p in paths.values())}"
        + (f"; FAILED: {', '.join(failed)}" if failed else ""),
        file=sys.stderr,
    )
    return EXIT_FAILED if failed else EXIT_OK
