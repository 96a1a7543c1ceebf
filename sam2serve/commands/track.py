"""``sam2serve track``: objects followed through a video from a few prompts, with SAM 2's
memory (Meta's video predictor semantics), one COCO RLE JSON file per frame.

It checks the flags, the prompts file and the video before the model loads, adds every
prompt (any frame, any object; or, with --text --tracker sam2.1, the objects SAM 3 finds on
one frame: :mod:`sam2serve.commands.track_concepts`), propagates forward from the first prompted
frame to the end and, when that frame is not the first, in reverse to frame 0; each frame's
file is written as soon as it is computed (a run stopped half way keeps what it wrote).
With --text (default --tracker sam3) SAM 3's own video predictor does the whole run
(:mod:`sam2serve.commands.track_sam3`).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from sam2serve.commands import model as model_flags
from sam2serve.commands import track_concepts
from sam2serve.commands.common import (
    EXIT_OK,
    EXIT_STATUS_HELP,
    PROG,
    CommandParser,
    UsageError,
    add_command,
    add_device_flag,
    add_mode_flag,
    add_model_flag,
    add_threads_flag,
    add_weights_flags,
    positive_int,
)
from sam2serve.commands.run_outputs import json_safe, prepare_out_dir
from sam2serve.commands.track_outputs import (
    SUMMARY_NAME,
    TrackResults,
    print_summary,
    write_frame,
    write_overlay,
)
from sam2serve.commands.track_prompts import (
    check_prompts,
    load_video_prompts,
    sample_prompts,
)
from sam2serve.commands.track_sam3 import track_sam3
from sam2serve.engine.video.retention import RETENTION_MODES
from sam2serve.runtime.backend_choice import AUTO, choose_tracker
from sam2serve.runtime.modes import VIDEO_MODES
from sam2serve.runtime.spec import RuntimeSpec
from sam2serve.runtime.trackers import EAGER_TRACKER, TRACKERS, VIDEO_BACKENDS

SAMPLE_VIDEO = "sample"
SAMPLE_FRAMES = 8
OVERLAY_SUFFIXES = (".mp4", ".gif")
DEFAULT_MAX_FRAMES = 2_000
# As run and serve; for tracking, fast computes what baseline does (runtime/modes.py).
DEFAULT_MODE = "fast"

DESCRIPTION = f"""\
Track objects through a video: prompts (clicks and boxes) for any object on any frame,
then SAM 2's memory carries each object from frame to frame, forward to the last frame
and, when the first prompt is not on frame 0, backward to frame 0.

video:
  a video file (.mp4, .mov, .mkv, .avi, .webm, .gif; decoded with PyAV: pip install av),
  a folder of frames (.jpg/.png/...; in the order of their integer names 0.jpg, 1.jpg,
  ..., else by name), or the word '{SAMPLE_VIDEO}': a clip made offline ({SAMPLE_FRAMES}
  frames, 320x240: a red disc and a blue square crossing a photo, the square passing in
  front) with built-in prompts (a click on the disc and a box on the square, frame 0)

prompts (--prompts FILE, JSON): frame index -> object id -> an object, e.g.
  {{"0": {{"1": {{"points": [[120, 80], [140, 90]], "labels": [1, 0]}},
         "2": {{"box": [10, 20, 60, 90]}}}},
   "5": {{"1": {{"points": [[130, 85]]}}}}}}
  points are [x, y] in the video's pixels, labels 1 (object) or 0 (not the object; default
  1), a box is [x0, y0, x1, y1]; a later entry for an object corrects it on that frame.

outputs, in --out:
  frame_NNNNN.json   per frame: every object's mask as COCO RLE, its area and bbox
  {SUMMARY_NAME}         the run: video, frames, objects, prompts, model, weights, frames/s
  --overlay FILE     the masks drawn over the video (.mp4 or .gif), one colour per object

--mode: what each mode means for tracking is in --mode's help; fast (the default, as for
run and serve) computes what baseline computes, furious is reduced precision only where the
device runs it natively (on a CPU without native bf16 it is float32: the same masks).
{PROG} bench --task video measures them.

{track_concepts.HELP}
--backend onnxruntime (mode fast) tracks with the ONNX graphs of '{PROG} export --format
onnx --video' in --artifacts DIR, run by ONNX Runtime (mask prompts have no graph); it is
the default when --artifacts is given.

stderr: a progress bar, then frames/s and per-frame latency p50/p90 of the propagation

{EXIT_STATUS_HELP}
"""

EPILOG = f"""\
examples:
  {PROG} track {SAMPLE_VIDEO} --out tracked/ --random-weights --overlay tracked/clip.gif
  {PROG} track clip.mp4 --prompts prompts.json --out tracked/ --checkpoint sam2.1_hiera_tiny.pt
  {PROG} track frames/ --prompts prompts.json --out tracked/ --model large --device cuda \\
      --mode furious
  {PROG} track clip.mp4 --prompts prompts.json --out tracked/ --artifacts onnx-tiny-video/
  {PROG} track clip.mp4 --text "cat,dog" --concept-frame 10 --out tracked/
"""


def register(subcommands: argparse._SubParsersAction) -> None:
    add_command(
        subcommands,
        "track",
        help="track objects through a video from a few prompts (SAM 2's memory)",
        description=DESCRIPTION,
        epilog=EPILOG,
        handler=track_command,
        add_arguments=add_arguments,
    )


def add_arguments(parser: CommandParser) -> None:
    parser.add_argument(
        "video",
        metavar="VIDEO_OR_FRAME_DIR",
        help=f"a video file, a folder of frames, or '{SAMPLE_VIDEO}'",
    )
    parser.add_argument(
        "--prompts",
        type=Path,
        metavar="FILE",
        help=f"the prompts (JSON, see above); required unless the video is '{SAMPLE_VIDEO}' "
        "or --text names concepts",
    )
    parser.add_argument("--out", type=Path, required=True, metavar="DIR", help="output directory")
    parser.add_argument(
        "--overlay",
        type=Path,
        metavar="FILE",
        help="also write the masks over the video to FILE (.mp4 or .gif)",
    )
    parser.add_argument(
        "--max-frames",
        type=positive_int,
        default=DEFAULT_MAX_FRAMES,
        metavar="N",
        help="refuse videos with more frames (a folder's frames are held in memory as "
        "pixels; a video file's are decoded as they are needed) (default: %(default)s)",
    )
    parser.add_argument(
        "--retention",
        choices=RETENTION_MODES,
        default="exact",
        help="what the tracker keeps of tracked frames: exact (every frame's memory, "
        "Meta's: 0.75 MiB per object and frame) or bounded (only what the memory reads "
        "next: memory stays flat on long clips; the reverse pass of a run whose first "
        "prompt is not on frame 0 can differ, docs/video.md) (default: %(default)s)",
    )
    model = parser.add_argument_group("model")
    add_model_flag(model)
    add_mode_flag(model, DEFAULT_MODE, VIDEO_MODES, video=True)
    add_device_flag(model)
    add_threads_flag(model)
    model.add_argument(
        "--backend",
        choices=(AUTO, *VIDEO_BACKENDS),
        default=None,
        help=backend_help(),
    )
    add_weights_flags(model)
    track_concepts.add_arguments(parser)


def backend_help() -> str:
    """--backend's help, from the trackers' registry: each tracker with its modes and
    devices (and, for one that runs an export, that it reads --artifacts)."""
    trackers = "; ".join(
        f"{info.name}: {info.description}, on {', '.join(info.devices)}"
        + (", from --artifacts" if info.needs_artifacts else "")
        for info in TRACKERS.values()
    )
    exports = " or ".join(
        f"{info.name} for --format {info.export_format}"
        for info in TRACKERS.values()
        if info.needs_artifacts
    )
    return (
        f"what runs the model: {trackers} (default, {AUTO}: with --artifacts the tracker of "
        f"its format, {exports}; else {EAGER_TRACKER})"
    )


def track_command(args: argparse.Namespace) -> int:
    if args.overlay is not None and args.overlay.suffix.lower() not in OVERLAY_SUFFIXES:
        raise UsageError(
            f"--overlay {str(args.overlay)!r}: the file must end in {' or '.join(OVERLAY_SUFFIXES)}"
        )
    phrases = track_concepts.check_flags(args)
    sample = args.video == SAMPLE_VIDEO
    if args.prompts is None and not sample and phrases is None:
        raise UsageError(
            f"--prompts FILE is required (or --text \"PHRASES\", or the video '{SAMPLE_VIDEO}')"
        )
    if not sample and not Path(args.video).exists():
        raise UsageError(f"no such video or frame folder: {args.video!r}")
    spec = video_spec(args)
    prompts = None if args.prompts is None else load_video_prompts(args.prompts)
    out_dir = prepare_out_dir(args.out)

    frames, names, fps, source = _read_video(args, sample)
    seeded: list[track_concepts.ConceptObject] = []
    if phrases is not None:
        track_concepts.check_frame(args, len(frames))
        if args.tracker == "sam3":
            _prepare_process(args, spec)
            header = {"video": source, "frames": len(frames), "width": int(frames.width)}
            header |= {"height": int(frames.height), "fps": fps, "device": args.device}
            return track_sam3(args, phrases, frames, names, out_dir, header)
        prompts = []
    elif prompts is None:
        prompts = sample_prompts(frames)
    height, width = frames.height, frames.width
    check_prompts(prompts, len(frames), (height, width), args.prompts)
    if phrases is not None:
        _prepare_process(args, spec)
        seeded = track_concepts.find_seeds(args, phrases, frames[args.concept_frame])

    predictor, weights = _load_predictor(args, spec)
    state = predictor.init_state(frames, retention=args.retention)
    for prompt in sorted(prompts, key=lambda p: (p.frame, p.obj_id)):
        predictor.add_prompt(state, prompt.frame, prompt.obj_id, prompt.prompt)
    for obj in seeded:
        predictor.add_mask(state, args.concept_frame, obj.obj_id, obj.mask)
    object_names = {obj.obj_id: obj.phrase for obj in seeded}
    header = {
        "video": source,
        "frames": len(frames),
        "width": int(width),
        "height": int(height),
        "retention": args.retention,
        "fps": fps,
        "objects": sorted(state.obj_ids),
        "prompts": {
            str(p.frame): {str(q.obj_id): q.prompt.as_json() for q in prompts if q.frame == p.frame}
            for p in prompts
        },
        "model": args.model,
        "device": args.device,
        "runtime": predictor.runtime.as_dict(),
        "weights": weights,
    }
    if phrases is not None:
        header["names"] = {str(obj_id): name for obj_id, name in object_names.items()}
        header["concepts"] = track_concepts.summary(args, phrases, seeded)
        first = args.concept_frame
    else:
        first = min(prompt.frame for prompt in prompts)
    results = _propagate(
        predictor, state, first, names, out_dir, args.overlay is not None, object_names
    )
    header["timings"] = results.summary()
    (out_dir / SUMMARY_NAME).write_text(json.dumps(json_safe(header), indent=2) + "\n")
    if args.overlay is not None:
        write_overlay(args.overlay, frames, results.records, fps, weights["random"])
    print_summary(results, out_dir, args.overlay)
    return EXIT_OK


# --------------------------------------------------------------------------- video and model


def _read_video(args: argparse.Namespace, sample: bool) -> tuple[Any, Any, float, str]:
    """The frames as a FrameSource (a video file's decoded on demand, a small window held;
    a folder's or the sample's held), a name per frame, the fps and what to call it."""
    from sam2serve.engine.video.sources import ArrayFrames, VideoFileFrames

    if sample:
        from sam2serve.samples import sample_clip

        frames, _ = sample_clip(SAMPLE_FRAMES)
        names = [str(i) for i in range(len(frames))]
        return ArrayFrames(frames), names, 5.0, "sample clip (synthetic)"
    from sam2serve.engine.video_io import VideoError, read_frames

    try:
        if Path(args.video).is_file():
            source = VideoFileFrames(args.video, max_frames=args.max_frames)
            return source, _IndexNames(), source.fps or 10.0, str(args.video)
        video = read_frames(args.video, max_frames=args.max_frames)
    except VideoError as exc:
        raise UsageError(str(exc)) from None
    return ArrayFrames(video.frames), video.names, video.fps or 10.0, video.source


class _IndexNames:
    """A video file's frame names: their indices (no list as long as the video)."""

    def __getitem__(self, index: int) -> str:
        return str(index)


def video_spec(args: argparse.Namespace) -> RuntimeSpec:
    """The RuntimeSpec of --model, --mode, --backend, --device and --threads (torch-free;
    --mode's choices are the video modes), the tracker chosen with --artifacts by
    :func:`~sam2serve.runtime.backend_choice.choose_tracker`."""
    artifacts = getattr(args, "artifacts", None)
    if args.mode not in VIDEO_MODES and getattr(args, "text", None) is None:
        raise UsageError(
            f"--mode {args.mode!r}: tracking prompts runs the modes {', '.join(VIDEO_MODES)}; "
            f"{args.mode} is for SAM 3's own video predictor (--text, --tracker sam3)"
        )
    try:
        if args.mode not in VIDEO_MODES and getattr(args, "text", None) is not None:
            # SAM 3's own video predictor (--tracker sam3, checked by track_concepts) runs
            # every concept mode; the process reads only threads from this spec.
            return RuntimeSpec(
                model=args.model, mode=args.mode, device=args.device, threads=args.threads
            )
        backend = choose_tracker(
            getattr(args, "backend", None),
            args.mode,
            args.device,
            None if artifacts is None else str(artifacts),
        )
        return RuntimeSpec(
            model=args.model,
            mode=args.mode,
            backend=backend,
            device=args.device,
            threads=args.threads,
        )
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def _prepare_process(args: argparse.Namespace, spec: RuntimeSpec) -> None:
    from sam2serve.runtime.process import configure_process

    model_flags.check_device(args.device)
    configure_process(spec)  # the command's process runs this one spec; before any loading


def _load_predictor(args: argparse.Namespace, spec: RuntimeSpec) -> tuple[Any, dict[str, Any]]:
    from sam2serve.runtime.video import build_video_predictor

    _prepare_process(args, spec)
    start = time.perf_counter()
    with model_flags.load_errors_as_usage(args.checkpoint, args.model):
        predictor = build_video_predictor(spec, model_flags.weights_source(args))
    info = predictor.model.weights_info
    runtime = predictor.runtime
    assert runtime is not None  # build_video_predictor sets it
    model_flags.announce_weights(
        args.model,
        info,
        f"on {args.device}",
        f"mode {runtime.mode}, {runtime.dtype}; loaded in {time.perf_counter() - start:.1f} s",
    )
    return predictor, model_flags.weights_record(info)


# --------------------------------------------------------------------------- propagation


def _propagate(
    predictor: Any,
    state: Any,
    first: int,
    names: Any,
    out_dir: Path,
    keep_records: bool,
    object_names: dict[int, str] | None = None,
) -> TrackResults:
    """Each frame's file written as it is computed; the records kept only for the overlay
    (``keep_records``), else a frame count. ``object_names``: each object's name (its
    phrase, with --text), written beside its mask."""
    from tqdm import tqdm

    passes = [(first, False)] + ([(first, True)] if first > 0 else [])
    records: dict[int, list[dict[str, Any]]] = {}
    written = 0
    seconds: list[float] = []
    progress = tqdm(
        total=state.num_frames,
        desc=f"{PROG} track",
        unit="frame",
        file=sys.stderr,
        dynamic_ncols=True,
    )
    start = time.perf_counter()
    for start_frame, reverse in passes:
        frames = predictor.propagate(state, start_frame_idx=start_frame, reverse=reverse)
        tick = time.perf_counter()
        for result in frames:
            if not (reverse and result.frame_idx == start_frame):  # written going forward
                written_records = write_frame(result, names, out_dir, object_names or {})
                if keep_records:
                    records[result.frame_idx] = written_records
                written += 1
                progress.update(1)
            now = time.perf_counter()
            seconds.append(now - tick)
            tick = now
    progress.close()
    return TrackResults(records, written, seconds, time.perf_counter() - start)
