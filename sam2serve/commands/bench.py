"""``sam2serve bench``: the published SAM2 latency experiment on this machine, one row per
mode (and backend), with accuracy against the baseline."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from sam2serve.commands import model as model_flags
from sam2serve.commands.amg_flags import AMG_GROUP_TITLE, add_amg_flags, amg_params_from
from sam2serve.commands.common import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_STATUS_HELP,
    PROG,
    SAMPLES_ARG,
    CommandParser,
    UsageError,
    add_command,
    add_device_flag,
    add_model_flag,
    add_threads_flag,
    add_weights_flags,
    command_line,
)
from sam2serve.commands.run import TASKS
from sam2serve.runtime.backends import BACKENDS
from sam2serve.runtime.modes import MODES, VIDEO_MODES

DESCRIPTION = f"""\
Measure the published SAM2 experiment on this machine: AMG, SPS and MPS latency per
image (decode + segmentation + RLE), first-iteration time, start-up time, peak memory and
accuracy against the baseline (mIoU, fail count), one row per mode.

Every mode and task runs in its own fresh process, with its own empty compile cache
(--warm repeats a compiling mode on the cache its cold run filled). The baseline always
runs first: SPS prompts are the centre point of its largest AMG mask, MPS prompts the
centre points of all its AMG masks, and every other mode's masks are compared with its
masks. Mode 'reference' runs Meta's own sam2 code on the same weights when the sam2
package is installed. With --random-weights AMG keeps next to no masks, so the point
tasks then use grid prompts (SPS: the image centre; MPS: --mps-prompts grid points) and
the report says so.

--task video measures tracking instead (SAM 2's memory, Meta's video predictor semantics):
a clip (--video: the offline sample clip, or a video file or frame folder; its first
--frames frames) with 1 and several objects (--objects) prompted on frame 0 and propagated
to the end, each object count x mode in a fresh process: frames/s, per-frame latency
p50/p90, first-frame time and time to the first masks, memory held per frame, peak
memory, and mIoU / fails against the baseline (and the sample clip's true masks); row
'reference' is Meta's SAM2VideoPredictor on the same weights. --task all is the three
image tasks: a tracked frame costs several image tasks' time, so video runs only when
asked for.

outputs, in --out (default bench/results): NAME.csv (every number), NAME.md (tables
shaped like the published ones, with the command, machine and date) and NAME.png (where
the time goes, by stage; for video, per-frame latency). The Markdown tables are also
printed. NAME defaults to bench_MODEL_DEVICE (bench_MODEL_DEVICE_video for video).

{EXIT_STATUS_HELP} (1: a run failed; the others are reported)
"""

EPILOG = f"""\
examples:
  {PROG} bench --task all --model tiny --modes reference,baseline,fast,furious \\
      --images samples --n 4 --random-weights
  {PROG} bench --task amg --modes baseline,fast,fast+artifacts --images photos/ --n 100 \\
      --checkpoint sam2.1_hiera_tiny.pt --points-per-side 16
  {PROG} bench --task video --model tiny --modes reference,baseline,fast,furious \\
      --random-weights --frames 8 --objects 1,3
"""


def register(subcommands: argparse._SubParsersAction) -> None:
    add_command(
        subcommands,
        "bench",
        help="latency, memory and accuracy of the modes (the published SAM2 experiment)",
        description=DESCRIPTION,
        epilog=EPILOG,
        handler=bench_command,
        add_arguments=add_arguments,
    )


def add_arguments(parser: CommandParser) -> None:
    # The bench's own vocabulary lives with the harness (which imports torch): this parser
    # is only built when 'bench' is the command.
    from sam2serve.bench.hf_peer import HF_PEERS, HF_TASKS
    from sam2serve.bench.runner import (
        DEFAULT_VIDEO_FRAMES,
        DEFAULT_VIDEO_OBJECTS,
        PROMPT_POLICIES,
        REFERENCE,
        REFERENCES,
    )
    from sam2serve.bench.variants import AMG_VARIANTS
    from sam2serve.bench.video import SAMPLE_VIDEO, VIDEO_TASK

    parser.add_argument(
        "--task",
        choices=(*TASKS, "all", VIDEO_TASK),
        default="all",
        help="which image task to measure, all three, or video tracking (default: %(default)s)",
    )
    add_model_flag(parser)
    parser.add_argument(
        "--modes",
        default=None,
        metavar="LIST",
        help="comma-separated rows, each a mode: "
        f"{', '.join((*REFERENCES, *MODES, *HF_PEERS))}; a mode may name its backend as "
        f"MODE+BACKEND ({', '.join(BACKENDS)}; 'artifacts' rows start from '{PROG} export' "
        "artifacts, exported once before the runs); reference-bf16 is Meta's code under bf16 "
        f"autocast; {' and '.join(HF_PEERS)} are Hugging Face transformers' Sam2Model on the "
        f"same weights ({', '.join(t.upper() for t in HF_TASKS)} only; hf on our "
        "preprocessed pixels, hf-processor through its own Sam2Processor); --task video "
        f"runs {', '.join((REFERENCE, *VIDEO_MODES))} (default: {_default_modes(False)}; for "
        f"video {_default_modes(True)}; baseline is always run)",
    )
    parser.add_argument(
        "--images",
        default=SAMPLES_ARG,
        metavar=f"DIR|{SAMPLES_ARG}",
        help=f"a directory of images, or '{SAMPLES_ARG}' for the bundled photos "
        "(default: %(default)s)",
    )
    parser.add_argument(
        "--n",
        type=int,
        metavar="N",
        help="images to run, cycling through the directory or the samples "
        "(default: every image of the directory; the 4 samples)",
    )
    add_weights_flags(
        parser,
        artifacts=False,
        required=True,
        random_help="seeded random weights, written once as an official-shaped checkpoint "
        "that every mode loads (masks are meaningless, the work is real)",
    )
    add_device_flag(parser)
    add_threads_flag(parser)
    parser.add_argument(
        "--out",
        type=Path,
        default=Path("bench/results"),
        metavar="DIR",
        help="where NAME.csv / .md / .png go (default: %(default)s)",
    )
    parser.add_argument(
        "--name",
        metavar="NAME",
        help="file name of the outputs (default: bench_MODEL_DEVICE; bench_MODEL_DEVICE_video "
        "for --task video)",
    )
    parser.add_argument(
        "--point-prompts",
        choices=PROMPT_POLICIES,
        default="auto",
        help="where SPS / MPS prompts come from: the baseline's AMG masks (amg), a grid "
        "(grid), or auto: grid with random weights, amg otherwise (default: %(default)s)",
    )
    parser.add_argument(
        "--mps-prompts",
        type=int,
        default=64,
        metavar="N",
        help="MPS prompts per image when they come from the grid (default: %(default)s)",
    )
    parser.add_argument(
        "--aot-decoder",
        choices=("aoti", "eager"),
        default="aoti",
        help="how the artifacts rows run the mask decoder: AOTInductor programs, or "
        "eagerly (exports ~2 min faster per mode) (default: %(default)s)",
    )
    parser.add_argument(
        "--warm",
        action="store_true",
        help="also run each mode that compiles a second time, on the compile cache its "
        "cold run filled",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        metavar="SECONDS",
        help="give up on a run (one mode, one task) after this long (default: no limit)",
    )
    parser.add_argument(
        "--work-dir",
        type=Path,
        metavar="DIR",
        help="keep the runs' specs, raw results and images here (default: a temporary "
        "directory, removed at the end)",
    )
    video = parser.add_argument_group("video (--task video)")
    video.add_argument(
        "--video",
        default=SAMPLE_VIDEO,
        metavar=f"FILE|DIR|{SAMPLE_VIDEO}",
        help=f"the clip: '{SAMPLE_VIDEO}' (made offline: a disc and a square crossing a photo, "
        "with true masks), a video file or a folder of frames (default: %(default)s)",
    )
    video.add_argument(
        "--frames",
        type=int,
        default=DEFAULT_VIDEO_FRAMES,
        metavar="N",
        help="frames of the clip to track: the first N (default: %(default)s: the last one "
        "holds a full memory bank of 7 frames)",
    )
    video.add_argument(
        "--objects",
        default=",".join(map(str, DEFAULT_VIDEO_OBJECTS)),
        metavar="LIST",
        help="object counts, each a scenario run per mode (default: %(default)s)",
    )
    amg = parser.add_argument_group(AMG_GROUP_TITLE)
    amg.add_argument(
        "--amg-variants",
        default=",".join(AMG_VARIANTS),
        metavar="LIST",
        help="comma-separated AMG variants, each reported in its own table with its own "
        "baseline run: "
        + "; ".join(f"{name}: {variant.help}" for name, variant in AMG_VARIANTS.items())
        + " (default: %(default)s)",
    )
    add_amg_flags(amg)


def _default_modes(video: bool) -> str:
    """Every image row (Meta's code, our modes, the Hugging Face peers); for --task video
    Meta's tracker and the video modes."""
    from sam2serve.bench.hf_peer import HF_PEERS
    from sam2serve.bench.runner import REFERENCE

    return ",".join((REFERENCE, *VIDEO_MODES) if video else (REFERENCE, *MODES, *HF_PEERS))


def _object_counts(text: str) -> tuple[int, ...]:
    try:
        counts = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        counts = ()
    if not counts or min(counts) < 1:
        raise UsageError(f"--objects must list object counts of at least 1, e.g. 1,3; got {text!r}")
    return counts


def bench_command(args: argparse.Namespace) -> int:
    from sam2serve.bench.report import markdown, write_outputs
    from sam2serve.bench.runner import BenchConfig, BenchError, run_bench
    from sam2serve.bench.variants import parse_variants
    from sam2serve.bench.video import VIDEO_TASK, run_video_bench
    from sam2serve.bench.video_report import video_markdown, write_video_outputs

    video = args.task == VIDEO_TASK
    modes_text = args.modes if args.modes is not None else _default_modes(video)
    modes = tuple(m.strip() for m in modes_text.split(",") if m.strip())
    if not modes:
        raise UsageError("--modes is empty; give e.g. --modes baseline,fast")
    if args.n is not None and args.n < 1:
        raise UsageError(f"--n must be at least 1, got {args.n}")
    if args.frames < 2:
        raise UsageError(
            f"--frames must be at least 2 (a prompted and a tracked frame), got {args.frames}"
        )
    objects = _object_counts(args.objects)
    params = amg_params_from(args)
    try:
        variants = parse_variants(args.amg_variants)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    model_flags.check_device(args.device)
    config = BenchConfig(
        tasks=TASKS if args.task == "all" else () if video else (args.task,),
        model=args.model,
        modes=modes,
        images=args.images,
        n=args.n,
        checkpoint=None if args.checkpoint is None else Path(args.checkpoint),
        random_weights=args.random_weights,
        seed=args.seed,
        device=args.device,
        threads=args.threads,
        amg_params=params,
        out_dir=args.out,
        name=args.name
        or f"bench_{args.model}_{args.device.replace(':', '')}" + ("_video" if video else ""),
        mps_prompts=args.mps_prompts,
        point_prompts=args.point_prompts,
        warm=args.warm,
        aot_decoder=args.aot_decoder,
        command=command_line(args),
        work_dir=args.work_dir,
        timeout_s=args.timeout,
        amg_variants=variants,
        video=args.video,
        video_frames=args.frames,
        video_objects=objects,
    )
    try:
        with model_flags.load_errors_as_usage(args.checkpoint, args.model):
            result = run_video_bench(config) if video else run_bench(config)
    except BenchError as exc:
        raise UsageError(str(exc)) from None
    if video:
        paths = write_video_outputs(result, config.out_dir, config.name)
        print(video_markdown(result, paths["png"].name))
        names = [(f"video {run.objects} object(s)", run) for run in result.runs]
    else:
        paths = write_outputs(result, config.out_dir, config.name)
        print(markdown(result, paths["png"].name))
        names = [(run.task, run) for run in result.runs]
    failed = [f"{what} {run.label}" for what, run in names if not run.ok and not run.skipped]
    skipped = [f"{what} {run.label}" for what, run in names if run.skipped]
    print(
        f"{PROG}: bench: wrote {', '.join(str(p) for p in paths.values())}"
        + (f"; skipped: {', '.join(skipped)}" if skipped else "")
        + (f"; FAILED: {', '.join(failed)}" if failed else ""),
        file=sys.stderr,
    )
    return EXIT_FAILED if failed else EXIT_OK
