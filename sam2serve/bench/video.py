"""``sam2serve bench --task video``: propagation with SAM 2's memory, one row per mode and
object count, with Meta's ``SAM2VideoPredictor`` on the same weights as row ``reference``.

The clip (the offline sample clip by default, or the first frames of a video file or frame
folder) is written once as a JPEG folder, the input Meta's predictor reads, and every row
reads those same files. Each object count is a scenario: its objects are prompted on
frame 0 (on the sample clip: a click on the disc, a box on the square, then clicks on the
background; elsewhere clicks on a grid), then tracked forward to the last frame. Every row
runs in a fresh worker process (:func:`sam2serve.bench.worker.run_video`); the baseline
runs first in each scenario and every other row's masks are compared with its masks, frame
by frame and object by object (:func:`sam2serve.bench.metrics.point_accuracy`), and with
the sample clip's true masks where it has them.
"""

from __future__ import annotations

import json
import math
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from sam2serve.bench import metrics
from sam2serve.bench.machine import MachineInfo
from sam2serve.bench.runner import (
    BASELINE,
    PEERS,
    REFERENCE,
    SAMPLE_VIDEO,
    BenchConfig,
    BenchError,
    Session,
    _log,
    _peer_skips,
    _plan_modes,
    _start_worker,
    _worker_env,
    accuracy_text,
    bench_weights,
    check_weights,
    work_directory,
)
from sam2serve.bench.worker import tracker_spec
from sam2serve.engine.masks import build_point_grid
from sam2serve.runtime.modes import VIDEO_MODES

__all__ = [
    "SAMPLE_VIDEO",
    "VIDEO_TASK",
    "VideoBenchResult",
    "VideoClip",
    "VideoRun",
    "object_prompts",
    "prepare_clip",
    "run_video_bench",
]

VIDEO_TASK = "video"
JPEG_QUALITY = 95

Prompt = dict[str, Any]  # {"points": [[x, y]], "labels": [1], "box": [x0, y0, x1, y1] | None}


@dataclass(frozen=True)
class VideoClip:
    frames_dir: Path  # 00000.jpg, 00001.jpg, ...: what every row reads
    num_frames: int
    height: int
    width: int
    source: str  # what the report calls it
    truth: dict[int, list[np.ndarray]] | None = field(default=None, repr=False)


@dataclass
class VideoRun:
    """One worker's run: one mode, one object count."""

    objects: int
    mode: str
    dtype: str = ""
    stats: metrics.LatencyStats | None = None  # per frame: the first yield, then the rest
    ready_s: float | None = None
    init_ms: float | None = None
    prompt_ms: float | None = None
    peak_mem_mb: float | None = None
    objects_bytes: int | None = None
    frames_bytes: int | None = None
    accuracy: metrics.Accuracy | None = None  # against the baseline of the same object count
    truth: metrics.Accuracy | None = None  # against the clip's true masks, where it has them
    error: str | None = None
    skipped: bool = False
    frames: list[list[dict[str, Any]]] | None = field(default=None, repr=False)
    objects_per_call: int | None = None  # objects one frame step batches (None: not said)

    @property
    def ok(self) -> bool:
        return self.error is None and self.stats is not None

    @property
    def label(self) -> str:
        return self.mode

    @property
    def first_masks_ms(self) -> float | None:
        """From reading the clip to the prompts' masks (the interactive first answer)."""
        if self.init_ms is None or self.prompt_ms is None:
            return None
        return self.init_ms + self.prompt_ms

    @property
    def held_bytes_per_frame(self) -> float | None:
        """The objects' state over the frames tracked (every object of the run)."""
        if self.objects_bytes is None or self.stats is None:
            return None
        return self.objects_bytes / self.stats.images


@dataclass
class VideoBenchResult:
    config: BenchConfig
    machine: MachineInfo
    clip: VideoClip
    prompts: dict[int, dict[int, Prompt]]  # object count -> object id -> its frame-0 prompt
    runs: list[VideoRun]
    weights: str
    notes: list[str]
    load_start: tuple[float, float, float]
    load_end: tuple[float, float, float]
    started: str
    duration_s: float


# --------------------------------------------------------------------------- inputs


def prepare_clip(source: str, num_frames: int, work: Path) -> VideoClip:
    """The clip's first ``num_frames`` frames as a JPEG folder in ``work``."""
    from PIL import Image

    truth = None
    if source == SAMPLE_VIDEO:
        from sam2serve.samples import sample_clip

        frames, truth = sample_clip(num_frames)  # 320x240, as `sam2serve track sample`
        what = "the sample clip (synthetic, made offline by sam2serve.samples.sample_clip)"
    else:
        from sam2serve.engine.video_io import VideoError, read_frames

        try:
            frames = read_frames(source).frames[:num_frames]
        except VideoError as exc:
            raise BenchError(str(exc)) from None
        what = source
    directory = work / "clip"
    directory.mkdir(parents=True, exist_ok=True)
    for index, frame in enumerate(frames):
        Image.fromarray(frame).save(directory / f"{index:05d}.jpg", quality=JPEG_QUALITY)
    height, width = frames[0].shape[:2]
    source_text = (
        f"{what}: {len(frames)} frames of {width}x{height}, written once as JPEG "
        f"(quality {JPEG_QUALITY}), the folder every row reads"
    )
    return VideoClip(directory, len(frames), height, width, source_text, truth)


def object_prompts(count: int, clip: VideoClip) -> dict[int, Prompt]:
    """Prompts on frame 0 for objects 1..count: the sample clip's own (a click on the
    disc, a box on the square) first, then single clicks on grid points outside every
    true mask (the background, on the sample clip)."""
    prompts: dict[int, Prompt] = {}
    occupied = np.zeros((clip.height, clip.width), bool)
    if clip.truth is not None:
        from sam2serve.samples import sample_clip_prompts

        prompts = dict(list(sample_clip_prompts(clip.truth).items())[:count])
        for masks in clip.truth.values():
            occupied |= masks[0]
    side = math.ceil(math.sqrt(count + len(prompts))) + 1
    grid = build_point_grid(side) * np.array([clip.width, clip.height])
    free = [(x, y) for x, y in grid if not occupied[int(y), int(x)]]
    for x, y in free[: count - len(prompts)]:
        prompts[len(prompts) + 1] = {
            "points": [[round(float(x), 2), round(float(y), 2)]],
            "labels": [1],
            "box": None,
        }
    return prompts


def _plan_video_modes(modes: Sequence[str], notes: list[str], device: str = "cpu") -> list[str]:
    """The rows, baseline first: the reference and the modes the tracker runs (a
    ``MODE+auto`` row as the tracker auto picks)."""
    planned = _plan_modes([_auto_tracker_row(label, device, notes) for label in modes], notes)
    refused = []
    for label in planned:
        if label == REFERENCE:
            continue
        try:
            if label in PEERS:
                raise ValueError("an image peer")
            tracker_spec(label, "tiny", device, None)
        except ValueError:
            refused.append(label)
    if refused:
        raise BenchError(
            f"--task video cannot run mode(s) {', '.join(refused)}; its rows are "
            f"{', '.join((REFERENCE, *VIDEO_MODES))}"
        )
    return planned


def _auto_tracker_row(label: str, device: str, notes: list[str]) -> str:
    """``MODE+auto`` as the row of the tracker auto picks for the mode from weights
    (the report says which); any other row as it is."""
    from sam2serve.runtime.backend_choice import AUTO

    mode, _, backend = label.partition("+")
    if backend != AUTO:
        return label
    try:
        chosen = tracker_spec(mode, "tiny", device, None).label
    except ValueError:
        return mode  # refused by the plan, named by its mode
    notes.append(f"{label} ran as {chosen}: the tracker auto picks for {mode} on this {device}")
    return chosen


# --------------------------------------------------------------------------- runs


def _run_worker(
    config: BenchConfig,
    work: Path,
    mode: str,
    checkpoint: Path,
    clip: VideoClip,
    prompts: dict[int, Prompt],
) -> VideoRun:
    run = VideoRun(objects=len(prompts), mode=mode)
    slug = f"video{len(prompts)}-{mode}"
    spec = {
        "mode": mode,
        "label": mode,
        "objects": len(prompts),
        "model": config.model,
        "device": config.device,
        "threads": config.threads,
        "checkpoint": str(checkpoint),
        "frames_dir": str(clip.frames_dir),
        "prompts": {str(obj_id): prompt for obj_id, prompt in prompts.items()},
    }
    spec_path, result_path = work / f"{slug}.spec.json", work / f"{slug}.result.json"
    spec_path.write_text(json.dumps(spec), encoding="utf-8")
    result_path.unlink(missing_ok=True)
    _log(f"video {mode}, {len(prompts)} object(s): {clip.num_frames} frames in a fresh process")
    try:
        done = _start_worker(
            ["video", str(spec_path), str(result_path)],
            _worker_env(work / "inductor" / slug),
            config.timeout_s,
        )
    except subprocess.TimeoutExpired:
        run.error = f"timed out after {config.timeout_s:g} s"
        return run
    if done.returncode != 0 or not result_path.exists():
        run.error = f"worker failed (exit status {done.returncode}; its error is above)"
        return run
    data = json.loads(result_path.read_text(encoding="utf-8"))
    run.stats = metrics.latency_stats(data["latencies_ms"])
    run.dtype = data["dtype"]
    run.objects_per_call = data.get("objects_per_call")
    run.ready_s, run.init_ms, run.prompt_ms = data["ready_s"], data["init_ms"], data["prompt_ms"]
    cuda_mb = data.get("cuda_max_allocated_mb")
    run.peak_mem_mb = cuda_mb if cuda_mb is not None else data["peak_rss_mb"]
    run.objects_bytes, run.frames_bytes = data["objects_bytes"], data["frames_bytes"]
    run.frames = [frame["objects"] for frame in data["frames"]]
    return run


def _truth_records(clip: VideoClip, obj_ids: Sequence[int]) -> list[list[dict[str, Any]]]:
    assert clip.truth is not None
    return [
        [{"segmentation": clip.truth[obj_id][t], "area": 0} for obj_id in obj_ids]
        for t in range(clip.num_frames)
    ]


def _compare(run: VideoRun, baseline: VideoRun | None, clip: VideoClip) -> None:
    if not run.ok or run.frames is None:
        return
    if baseline is not None and baseline.ok and baseline.frames is not None:
        run.accuracy = metrics.point_accuracy(run.frames, baseline.frames)
    if clip.truth is not None:
        known = [r["obj_id"] for r in run.frames[0] if r["obj_id"] in clip.truth]
        if known:
            tracked = [[r for r in frame if r["obj_id"] in known] for frame in run.frames]
            run.truth = metrics.point_accuracy(tracked, _truth_records(clip, known))


def _one_line(run: VideoRun) -> str:
    where = f"video {run.mode}, {run.objects} object(s)"
    if not run.ok:
        return f"{where}: {run.error}"
    assert run.stats is not None
    text = (
        f"{where}: {run.stats.images_per_s:.3g} frames/s, per frame p50 "
        f"{run.stats.p50_ms:.0f} ms, p90 {run.stats.p90_ms:.0f} ms"
    )
    return text + accuracy_text(run.accuracy, run.mode)


def run_video_bench(config: BenchConfig) -> VideoBenchResult:
    if config.video_frames < 2:
        raise BenchError(
            f"--frames must be at least 2 (one tracked frame), got {config.video_frames}"
        )
    if not config.video_objects or min(config.video_objects) < 1:
        raise BenchError(
            f"--objects must list counts of at least 1, got {','.join(map(str, config.video_objects))}"
        )
    if config.video != SAMPLE_VIDEO and not Path(config.video).exists():
        raise BenchError(
            f"--video {config.video!r} is neither '{SAMPLE_VIDEO}' nor a video file or frame folder"
        )
    check_weights(config)
    notes: list[str] = []
    modes = _plan_video_modes(config.modes, notes, config.device)

    session = Session.start()
    runs: list[VideoRun] = []
    with work_directory(config.work_dir) as work:
        clip = prepare_clip(config.video, config.video_frames, work)
        checkpoint, weights = bench_weights(config, work)
        skips = _peer_skips(modes, (VIDEO_TASK,), notes)
        prompts = {
            count: object_prompts(count, clip) for count in dict.fromkeys(config.video_objects)
        }
        for count, scenario in prompts.items():
            if len(scenario) < count:
                raise BenchError(f"found room for only {len(scenario)} object prompts, not {count}")
            baseline = None
            for mode in modes:
                if mode in skips:
                    run = VideoRun(count, mode, error=f"not run: {skips[mode]}", skipped=True)
                else:
                    run = _run_worker(config, work, mode, checkpoint, clip, scenario)
                    if mode == BASELINE:
                        baseline = run
                    _compare(run, baseline, clip)
                    _log(_one_line(run))
                runs.append(run)
    for run in runs:
        run.frames = None  # compared; the masks are not reported
    return VideoBenchResult(
        config=config,
        clip=clip,
        prompts=prompts,
        runs=runs,
        weights=weights,
        notes=notes,
        **session.finish(),
    )
