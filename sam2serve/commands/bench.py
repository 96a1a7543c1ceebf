"""``sam2serve bench``: the published SAM2 latency experiment on this machine, one row per
mode (and backend), with accuracy against the baseline."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from sam2serve.commands import model as model_flags
from sam2serve.commands.amg_flags import AMG_GROUP_TITLE, add_amg_flags, amg_params_from
from sam2serve.commands.bench_concepts import (
    CONCEPTS_TASK,
    add_concepts_bench_flags,
    concepts_bench_command,
)
from sam2serve.commands.bench_concepts_video import (
    CONCEPTS_VIDEO_TASK,
    add_concepts_video_bench_flags,
    concepts_video_bench_command,
)
from sam2serve.commands.common import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_STATUS_HELP,
    PROG,
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
from sam2serve.options import add_options, option_values
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

--task concepts measures SAM 3 concept segmentation instead (--sam3-size, --sam3-weights
or --random-weights), in one process on one loaded model: per stage (preprocess + upload,
vision backbone, text encoder, detector + heads, post-processing) for one phrase and for
ten phrases on one image encoding (--phrases), p50/min/max over --repeats, FLOPs per stage
and, with --host-peak, each stage's share of the host's peak in the precision it ran
in; modes (default baseline,furious,int8; fast computes what baseline does) as every
product path runs them: baseline (fp32), furious (backbone, text encoder and detector in
bf16; not timed on a CPU without native bf16, where the product path answers in fp32) and
int8 (the backbone's Linear layers dynamically quantised, the rest in bf16 where native),
each with mIoU and score difference against the baseline. It writes NAME.md and NAME.csv (default NAME: concepts_SIZE_DEVICE).

--task concepts-video measures SAM 3's own video predictor (as 'track --text' runs it):
one phrase (--phrase) on the clip (--video, its first --frames frames) from frame 0, each
mode (default baseline,furious,int8) in a fresh process loaded in the mode: seconds per
frame by stage (detector, tracker, association), frames/s, objects tracked, resident size
and what the clip's state holds, per frame and as means over frames 1..N-1 (frame 0 also
runs the prompt step); after each mode SAM 2.1's tracker (--model) in that mode on the same
clip and object count (--no-sam2-tracker: not). Full size costs about a minute a frame on
2 CPU cores in fp32: give few frames. It writes NAME.md and NAME.json (default NAME:
concepts_video_SIZE_DEVICE).

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
  {PROG} bench --task concepts --sam3-size full --random-weights --repeats 3
  {PROG} bench --task concepts-video --sam3-size full --random-weights --frames 3 \\
      --modes baseline,furious
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
    from sam2serve.bench.runner import DEFAULT_VIDEO_OBJECTS, REFERENCE, REFERENCES, BenchConfig
    from sam2serve.bench.variants import AMG_VARIANTS
    from sam2serve.bench.video import VIDEO_TASK

    parser.add_argument(
        "--task",
        choices=tuple(
            dict.fromkeys((*TASKS, "all", VIDEO_TASK, CONCEPTS_TASK, CONCEPTS_VIDEO_TASK))
        ),
        default="all",
        help="which image task to measure, all three, video tracking, SAM 3 concepts, or "
        "SAM 3's video predictor (default: %(default)s)",
    )
    add_model_flag(parser)
    parser.add_argument(
        "--modes",
        type=modes_value,
        default=None,
        metavar="LIST",
        help="comma-separated rows, each a mode: "
        f"{', '.join((*REFERENCES, *MODES, *HF_PEERS))}; a mode may name its backend as "
        f"MODE+BACKEND ({', '.join(BACKENDS)}, or auto: what --backend auto picks on this "
        f"host, named in the report; 'artifacts' rows start from '{PROG} export' "
        "artifacts, exported once before the runs); reference-bf16 is Meta's code under bf16 "
        f"autocast; {' and '.join(HF_PEERS)} are Hugging Face transformers' Sam2Model on the "
        f"same weights ({', '.join(t.upper() for t in HF_TASKS)} only; hf on our "
        "preprocessed pixels, hf-processor through its own Sam2Processor); --task video "
        f"runs {', '.join((REFERENCE, *VIDEO_MODES))} (default: {_default_modes(False)}; for "
        f"video {_default_modes(True)}; baseline is always run)",
    )
    add_weights_flags(
        parser,
        artifacts=False,
        random_help="seeded random weights, written once as an official-shaped checkpoint "
        "that every mode loads (masks are meaningless, the work is real)",
    )
    add_device_flag(parser)
    add_threads_flag(parser)
    add_options(
        parser,
        BenchConfig,
        (
            "images",
            "n",
            "out_dir",
            "name",
            "point_prompts",
            "mps_prompts",
            "aot_decoder",
            "image_decode",
            "warm",
            "timeout_s",
            "work_dir",
        ),
    )
    video = parser.add_argument_group("video (--task video)")
    add_options(video, BenchConfig, ("video", "video_frames"))
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
    add_concepts_bench_flags(parser)
    add_concepts_video_bench_flags(parser)


def modes_value(text: str) -> str:
    """``--modes``: every row a peer (reference, hf, ...), a mode, or MODE+BACKEND (backend
    a registered one or auto), checked when the flag is read: a misspelt row is a usage
    error before anything runs."""
    from sam2serve.bench.runner import PEERS
    from sam2serve.runtime.backend_choice import AUTO
    from sam2serve.runtime.spec import RuntimeSpec

    for row in (m.strip() for m in text.split(",") if m.strip()):
        if row in PEERS:
            continue
        mode, _, backend = row.partition("+")
        try:
            RuntimeSpec.from_label(mode if backend == AUTO else row)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(
                f"unknown row {row!r} ({exc}); expected some of {', '.join((*PEERS, *MODES))}, "
                f"each mode also as MODE+BACKEND with a backend of {', '.join(BACKENDS)} or "
                f"{AUTO}"
            ) from None
    return text


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


def _cached_checkpoint(model: str) -> str:
    """Without --checkpoint or --random-weights, Meta's file in the cache's checkpoints
    folder, downloaded there if missing: what every command that loads the model reads
    (checkpoint.resolve_checkpoint); why it cannot be had is one usage-error line."""
    from sam2serve.checkpoint import resolve_checkpoint
    from sam2serve.config import get_config

    with model_flags.load_errors_as_usage(None, model):
        return str(resolve_checkpoint(get_config(model), None))


def bench_command(args: argparse.Namespace) -> int:
    from sam2serve.bench.report import markdown, write_outputs
    from sam2serve.bench.runner import BenchConfig, BenchError, RunResult, run_bench
    from sam2serve.bench.variants import parse_variants
    from sam2serve.bench.video import VIDEO_TASK, VideoRun, run_video_bench
    from sam2serve.bench.video_report import video_markdown, write_video_outputs

    if args.task == CONCEPTS_TASK:
        return concepts_bench_command(args)
    if args.task == CONCEPTS_VIDEO_TASK:
        return concepts_video_bench_command(args)
    video = args.task == VIDEO_TASK
    modes_text = args.modes if args.modes is not None else _default_modes(video)
    modes = tuple(m.strip() for m in modes_text.split(",") if m.strip())
    if not modes:
        raise UsageError("--modes is empty; give e.g. --modes baseline,fast")
    objects = _object_counts(args.objects)
    params = amg_params_from(args)
    try:
        variants = parse_variants(args.amg_variants)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    model_flags.check_device(args.device)
    if not video:
        model_flags.check_image_decode(args.image_decode, args.device, decode=False)
    values = option_values(args, BenchConfig)
    values["name"] = values["name"] or (
        f"bench_{args.model}_{args.device.replace(':', '')}" + ("_video" if video else "")
    )
    checkpoint = args.checkpoint
    if checkpoint is None and not args.random_weights:
        checkpoint = _cached_checkpoint(args.model)
    try:
        config = BenchConfig(
            tasks=(
                tuple(t for t in TASKS if t != CONCEPTS_TASK)
                if args.task == "all"
                else ()
                if video
                else (args.task,)
            ),
            model=args.model,
            modes=modes,
            checkpoint=None if checkpoint is None else Path(checkpoint),
            random_weights=args.random_weights,
            seed=args.seed,
            device=args.device,
            threads=args.threads,
            amg_params=params,
            command=command_line(args),
            amg_variants=variants,
            video_objects=objects,
            **values,
        )
    except BenchError as exc:
        raise UsageError(str(exc)) from None
    try:
        with model_flags.load_errors_as_usage(args.checkpoint, args.model):
            video_result = run_video_bench(config) if video else None
            image_result = None if video else run_bench(config)
    except BenchError as exc:
        raise UsageError(str(exc)) from None
    names: list[tuple[str, VideoRun | RunResult]]
    if video_result is not None:
        paths = write_video_outputs(video_result, config.out_dir, config.name)
        print(video_markdown(video_result, paths["png"].name))
        names = [(f"video {run.objects} object(s)", run) for run in video_result.runs]
    else:
        assert image_result is not None
        paths = write_outputs(image_result, config.out_dir, config.name)
        print(markdown(image_result, paths["png"].name))
        names = [(run.task, run) for run in image_result.runs]
    failed = [f"{what} {run.label}" for what, run in names if not run.ok and not run.skipped]
    skipped = [f"{what} {run.label}" for what, run in names if run.skipped]
    print(
        f"{PROG}: bench: wrote {', '.join(str(p) for p in paths.values())}"
        + (f"; skipped: {', '.join(skipped)}" if skipped else "")
        + (f"; FAILED: {', '.join(failed)}" if failed else ""),
        file=sys.stderr,
    )
    return EXIT_FAILED if failed else EXIT_OK
