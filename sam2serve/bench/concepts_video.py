"""``sam2serve bench --task concepts-video``: SAM 3's own video predictor per frame, by
stage, per mode, with SAM 2.1's tracker on the same clip beside it.

The clip (the offline sample clip by default, or the first frames of a video file or frame
folder; :func:`sam2serve.bench.video.prepare_clip`) is written once as a JPEG folder that
every row reads. Each row runs in a fresh worker process
(:mod:`sam2serve.bench.concepts_video_worker`), so its peak resident size is its own:

- a **SAM 3 row** per mode loads the concept model in that mode in place and builds its
  video predictor as ``track --text --mode`` does
  (:func:`sam2serve.runtime.concepts.video_predictor_in_mode`), then runs one phrase over
  the clip from frame 0. Per frame: the seconds of each stage from
  ``VideoState.stage_seconds`` (``detector``: ViT, both necks, DETR, NMS; ``tracker``:
  track steps, memory encoding, new objects; ``association``: matching, hot start,
  occlusion, outputs), the frame's wall time, the objects tracked and shown, the process's
  resident size and the records and tensor bytes the clip's state holds. Frame 0 also runs
  Meta's ``add_prompt`` step (a second detector pass on it), so means are over frames
  1..N-1. Hot-start delay 0: every frame is answered when it is processed, so a frame's
  cost is its own (Meta's delay of 15 only holds answers back; the work is the same).
- a **SAM 2.1 row** per mode the SAM 2.1 tracker runs (:data:`VIDEO_MODES`) tracks as many
  objects as the SAM 3 row of that mode ended with (prompts on frame 0 as ``--task video``
  gives them: the sample clip's disc and square first, then clicks on the background),
  frame by frame: what ``track --text --tracker sam2.1`` costs per frame after its one
  detector pass. Its frame step (image encoder, memory attention, decoder, memory encoder)
  is not split by stage.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from sam2serve.bench.machine import MachineInfo, load_average, machine_info
from sam2serve.bench.runner import (
    SAMPLE_VIDEO,
    BenchError,
    _start_worker,
    _worker_env,
    work_directory,
)
from sam2serve.concepts.runtime import ConceptsSpec
from sam2serve.concepts.video_association import VideoThresholds
from sam2serve.runtime.concepts import CONCEPT_MODES
from sam2serve.runtime.modes import VIDEO_MODES

__all__ = [
    "CONCEPTS_VIDEO_TASK",
    "DEFAULT_PHRASE",
    "SAM2",
    "SAM3",
    "STAGES",
    "ConceptsVideoConfig",
    "ConceptsVideoError",
    "ConceptsVideoResult",
    "FrameCost",
    "VideoRow",
    "run_concepts_video_bench",
    "thresholds",
]

CONCEPTS_VIDEO_TASK = "concepts-video"
STAGES = ("detector", "tracker", "association")
DEFAULT_PHRASE = "red disc"  # the sample clip's disc
SAM3, SAM2 = "sam3", "sam2.1"
BASELINE = "baseline"


class ConceptsVideoError(Exception):
    """A problem with the bench's inputs, found before any run (one line for the user)."""


@dataclass(frozen=True)
class ConceptsVideoConfig:
    spec: ConceptsSpec  # SAM 3: size, weights or seeded random ones, device
    modes: tuple[str, ...] = (BASELINE, "furious", "int8")
    video: str = SAMPLE_VIDEO
    frames: int = 3
    phrase: str = DEFAULT_PHRASE
    score_thresh: float = 0.0  # detections kept above; new objects from 0.2 above it
    max_objects: int = VideoThresholds().max_objects
    threads: int | None = None
    sam2_model: str | None = "tiny"  # SAM 2.1's rows (None: none)
    sam2_checkpoint: str | None = None  # None: seeded random weights (spec.seed)
    timeout_s: float | None = None
    work_dir: Path | None = None
    command: str = ""

    def __post_init__(self) -> None:
        unknown = [m for m in self.modes if m not in CONCEPT_MODES]
        if unknown or not self.modes:
            raise ConceptsVideoError(
                f"--task {CONCEPTS_VIDEO_TASK} runs the modes {', '.join(CONCEPT_MODES)}; got "
                f"{', '.join(map(repr, unknown)) or 'none'}"
            )
        if self.frames < 2:
            raise ConceptsVideoError(
                f"--frames must be at least 2 (the prompt frame and one more), got {self.frames}"
            )
        if not self.phrase.strip():
            raise ConceptsVideoError("--phrase is empty; give the concept to track, e.g. 'disc'")
        if not 0.0 <= self.score_thresh <= 1.0:  # NaN too
            raise ConceptsVideoError(f"--score-thresh must be in [0, 1], got {self.score_thresh}")
        if self.max_objects < 1:
            raise ConceptsVideoError(f"--max-objects must be at least 1, got {self.max_objects}")
        if self.video != SAMPLE_VIDEO and not Path(self.video).exists():
            raise ConceptsVideoError(
                f"--video {self.video!r} is neither '{SAMPLE_VIDEO}' nor a video file or "
                "frame folder"
            )


def thresholds(config: ConceptsVideoConfig) -> VideoThresholds:
    """Meta's video settings as every surface reads one threshold (new objects 0.2 above
    it), with the object limit, and hot-start delay 0 (each frame answered when done)."""
    from dataclasses import replace

    chosen = VideoThresholds.from_detection(config.score_thresh, config.max_objects)
    return replace(chosen, hotstart_delay=0)


@dataclass
class FrameCost:
    """One frame of one row: seconds, objects, memory."""

    frame: int
    seconds: float  # wall time from asking for the frame to its answer
    objects: int  # objects tracked after this frame
    shown: int  # objects in the frame's answer
    rss_mib: float | None  # the process's resident size after it
    held_mib: float  # tensors the clip's state holds for its objects
    records: int | None = None  # SAM 3: per-frame records the state holds
    stages: dict[str, float] = field(default_factory=dict)  # SAM 3: seconds per stage


@dataclass
class VideoRow:
    """One worker's run: SAM 3's predictor or SAM 2.1's tracker in one mode."""

    model: str  # SAM3 or SAM2
    mode: str
    size: str  # SAM 3's size or SAM 2.1's model
    frames: list[FrameCost] = field(default_factory=list)
    precisions: dict[str, str] = field(default_factory=dict)
    load_s: float | None = None  # model built, from process start
    peak_rss_mib: float | None = None
    threads: int | None = None
    load_start: tuple[float, float, float] = (0.0, 0.0, 0.0)
    load_end: tuple[float, float, float] = (0.0, 0.0, 0.0)
    error: str | None = None
    skipped: bool = False

    @property
    def ok(self) -> bool:
        return self.error is None and bool(self.frames)

    @property
    def label(self) -> str:
        return f"{'SAM 3' if self.model == SAM3 else 'SAM 2.1'} {self.size} {self.mode}"

    def _later(self) -> list[FrameCost]:
        """Frames 1..N-1 (frame 0 also runs the prompt step), or frame 0 alone."""
        return self.frames[1:] or self.frames

    def stage_mean(self, stage: str) -> float | None:
        later = self._later()
        if not later or stage not in later[0].stages:
            return None
        return sum(f.stages[stage] for f in later) / len(later)

    def seconds_per_frame(self) -> float:
        later = self._later()
        return sum(f.seconds for f in later) / len(later)

    def frames_per_s(self) -> float:
        seconds = self.seconds_per_frame()
        return 1.0 / seconds if seconds > 0 else float("inf")

    def objects(self) -> int:
        return self.frames[-1].objects if self.frames else 0


@dataclass
class ConceptsVideoResult:
    config: ConceptsVideoConfig
    machine: MachineInfo
    clip: str  # what the report calls the clip
    thresholds: dict[str, Any]
    rows: list[VideoRow]
    started: str
    load_start: tuple[float, float, float]
    load_end: tuple[float, float, float]
    duration_s: float
    niceness: int
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        """Every number, JSON-ready."""
        config = asdict(self.config)
        config["spec"] = {
            k: str(v) if isinstance(v, Path) else v for k, v in config["spec"].items()
        }
        config["work_dir"] = None if self.config.work_dir is None else str(self.config.work_dir)
        return {
            "task": CONCEPTS_VIDEO_TASK,
            "config": config,
            "machine": self.machine.as_dict(),
            "clip": self.clip,
            "thresholds": self.thresholds,
            "started": self.started,
            "load_start": list(self.load_start),
            "load_end": list(self.load_end),
            "duration_s": self.duration_s,
            "niceness": self.niceness,
            "notes": self.notes,
            "rows": [
                {
                    **asdict(row),
                    "stage_means": {s: row.stage_mean(s) for s in STAGES} if row.ok else {},
                    "seconds_per_frame": row.seconds_per_frame() if row.ok else None,
                    "frames_per_s": row.frames_per_s() if row.ok else None,
                }
                for row in self.rows
            ],
        }


# --------------------------------------------------------------------------- runs


def _row_from(data: dict[str, Any], row: VideoRow) -> VideoRow:
    row.frames = [FrameCost(**frame) for frame in data["frames"]]
    row.precisions = data["precisions"]
    row.load_s, row.peak_rss_mib = data["load_s"], data["peak_rss_mib"]
    row.threads = data["threads"]
    return row


def _run_worker(
    config: ConceptsVideoConfig, work: Path, row: VideoRow, spec: dict[str, Any]
) -> VideoRow:
    slug = f"{row.model}-{row.mode}"
    spec_path, result_path = work / f"{slug}.spec.json", work / f"{slug}.result.json"
    spec_path.write_text(json.dumps(spec), encoding="utf-8")
    result_path.unlink(missing_ok=True)
    row.load_start = load_average()
    try:
        done = _start_worker(
            [str(spec_path), str(result_path)],
            _worker_env(work / "inductor" / slug),
            config.timeout_s,
            module="sam2serve.bench.concepts_video_worker",
        )
    except subprocess.TimeoutExpired:
        row.error = f"timed out after {config.timeout_s:g} s"
        return row
    finally:
        row.load_end = load_average()
    if done.returncode != 0 or not result_path.exists():
        row.error = f"worker failed (exit status {done.returncode}; its error is above)"
        return row
    return _row_from(json.loads(result_path.read_text(encoding="utf-8")), row)


def _sam3_spec(config: ConceptsVideoConfig, mode: str, frames_dir: Path) -> dict[str, Any]:
    spec = config.spec
    return {
        "model": SAM3,
        "mode": mode,
        "size": spec.size,
        "weights": None if spec.weights is None else str(spec.weights),
        "random_weights": spec.random_weights,
        "seed": spec.seed,
        "device": spec.device,
        "threads": config.threads,
        "frames_dir": str(frames_dir),
        "phrase": config.phrase,
        "thresholds": asdict(thresholds(config)),
    }


def _sam2_spec(
    config: ConceptsVideoConfig, mode: str, frames_dir: Path, prompts: dict[int, Any]
) -> dict[str, Any]:
    return {
        "model": SAM2,
        "mode": mode,
        "size": config.sam2_model,
        "checkpoint": config.sam2_checkpoint,
        "seed": config.spec.seed,
        "device": config.spec.device,
        "threads": config.threads,
        "frames_dir": str(frames_dir),
        "prompts": {str(obj_id): prompt for obj_id, prompt in prompts.items()},
    }


def _log_row(log: Callable[[str], None], row: VideoRow) -> None:
    if not row.ok:
        log(f"{row.label}: {row.error}")
        return
    stages = ", ".join(f"{s} {row.stage_mean(s):.2f} s" for s in STAGES if row.stage_mean(s))
    log(
        f"{row.label}: {row.seconds_per_frame():.2f} s/frame"
        + (f" ({stages})" if stages else "")
        + f", {row.objects()} object(s)"
    )


def run_concepts_video_bench(
    config: ConceptsVideoConfig,
    log: Callable[[str], None] = lambda line: None,
    after_row: Callable[[ConceptsVideoResult], None] | None = None,
) -> ConceptsVideoResult:
    """Every mode's SAM 3 row (the baseline first), each followed by its SAM 2.1 row where
    SAM 2.1's tracker runs the mode; ``after_row`` gets the result so far after each row."""
    from sam2serve.bench.video import object_prompts, prepare_clip

    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    clock, load_start, machine = time.perf_counter(), load_average(), machine_info()
    rows: list[VideoRow] = []
    notes: list[str] = []
    with work_directory(config.work_dir) as work:
        try:
            clip = prepare_clip(config.video, config.frames, work)
        except BenchError as exc:  # a video that cannot be read
            raise ConceptsVideoError(str(exc)) from None

        def result() -> ConceptsVideoResult:
            return ConceptsVideoResult(
                config=config,
                machine=machine,
                clip=clip.source,
                thresholds=asdict(thresholds(config)),
                rows=list(rows),
                started=started,
                load_start=load_start,
                load_end=load_average(),
                duration_s=time.perf_counter() - clock,
                niceness=os.nice(0),
                notes=list(notes),
            )

        for mode in dict.fromkeys((BASELINE, *config.modes)):
            row = VideoRow(SAM3, mode, config.spec.size)
            if mode == "int8" and config.spec.device != "cpu":
                row.error, row.skipped = "not run: int8 is a CPU mode", True
            else:
                log(f"SAM 3 {config.spec.size} {mode}: {clip.num_frames} frames in a fresh process")
                _run_worker(config, work, row, _sam3_spec(config, mode, clip.frames_dir))
            _log_row(log, row)
            rows.append(row)
            if after_row is not None:
                after_row(result())
            if config.sam2_model is None or not row.ok:
                continue
            if mode not in VIDEO_MODES:
                notes.append(
                    f"no SAM 2.1 row for {mode}: SAM 2.1's tracker runs {', '.join(VIDEO_MODES)}"
                )
                continue
            prompts = object_prompts(max(row.objects(), 1), clip)
            sam2 = VideoRow(SAM2, mode, config.sam2_model)
            log(f"SAM 2.1 {config.sam2_model} {mode}: {len(prompts)} object(s) in a fresh process")
            _run_worker(config, work, sam2, _sam2_spec(config, mode, clip.frames_dir, prompts))
            _log_row(log, sam2)
            rows.append(sam2)
            if after_row is not None:
                after_row(result())
    return result()
