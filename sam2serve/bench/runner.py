"""The benchmark's parent process: plan the runs, start one worker per run, compare.

For every task and mode a fresh worker process runs every image (see
:mod:`sam2serve.bench.worker`), so start-up and first-iteration costs are real. Each run
gets its own empty ``TORCHINDUCTOR_CACHE_DIR`` and sam2serve cache (a cold compile cache,
no OpenVINO model converted before); with ``warm`` a mode that compiles runs a second time
on the caches its cold run filled.

The baseline runs first: its AMG masks give the SPS / MPS prompts (as in the published
experiment: the centre point of the largest mask for SPS, of every mask for MPS), and
every other run's masks are compared with its masks. With random weights AMG keeps next
to no masks, so point prompts then come from a grid instead and the results say so.

Over 500 lines on purpose: the plan, the runs and the accuracy comparison are one flow
over one BenchConfig; the parts a second caller needs (metrics, the report, the worker)
are modules of their own already.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from sam2serve.bench import hf_peer, metrics
from sam2serve.bench.machine import MachineInfo, load_average, machine_info
from sam2serve.bench.reference import MISSING_MESSAGE, missing_requirements
from sam2serve.bench.variants import AMG_VARIANTS, DEFAULT_VARIANT
from sam2serve.bench.worker import SPAWN_TIME_ENV
from sam2serve.engine.amg import AMGParams
from sam2serve.engine.decode_choice import DEFAULT_IMAGE_DECODE, IMAGE_DECODE_HELP, IMAGE_DECODES
from sam2serve.engine.masks import build_point_grid
from sam2serve.engine.tasks import STAGES, TASKS, prompt_points
from sam2serve.options import OptionError, check_options, option

__all__ = [
    "BASELINE",
    "REFERENCE",
    "BenchConfig",
    "BenchImage",
    "BenchResult",
    "RunResult",
    "grid_prompts",
    "prepare_images",
    "run_bench",
]

BASELINE = "baseline"
REFERENCE = "reference"
REFERENCE_BF16 = "reference-bf16"  # Meta's code under torch.autocast(bfloat16)
REFERENCES = (REFERENCE, REFERENCE_BF16)
# Rows that run another implementation on the same weights (no RuntimeSpec label).
PEERS = (*REFERENCES, *hf_peer.HF_PEERS)
PROMPT_POLICIES = ("auto", "amg", "grid")
SAMPLES = "samples"  # the bundled sample photos, wherever images are taken
SAMPLE_VIDEO = "sample"  # the clip made offline (sam2serve.samples.sample_clip)
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".webp", ".bmp", ".tif", ".tiff")
PACKAGE_ROOT = Path(__file__).resolve().parents[2]
# Task video: 8 frames (the last tracked with a full bank of 7 memories), 1 and 3 objects.
DEFAULT_VIDEO_FRAMES = 8
DEFAULT_VIDEO_OBJECTS = (1, 3)


class BenchError(Exception):
    """A problem with the benchmark's inputs, found before any run (one line for the user)."""


@dataclass(frozen=True)
class BenchConfig:
    """One benchmark: what runs, on what, and where the results go. The fields declared
    with ``option`` are ``sam2serve bench``'s flags (sam2serve.options), checked here."""

    tasks: tuple[str, ...]
    model: str
    modes: tuple[str, ...]
    checkpoint: Path | None
    random_weights: bool
    seed: int
    device: str
    amg_params: AMGParams
    images: str = option(
        SAMPLES,
        help=f"a directory of images, or '{SAMPLES}' for the bundled photos",
        metavar=f"DIR|{SAMPLES}",
    )
    n: int | None = option(
        None,
        help="images to run, cycling through the directory or the samples",
        metavar="N",
        type=int,
        low=1,
        default_text="every image of the directory; the 4 samples",
    )
    out_dir: Path = option(
        Path("bench/results"),
        help="where NAME.csv / .md / .png go",
        flag="--out",
        metavar="DIR",
        type=Path,
    )
    name: str = option(
        "",
        help="file name of the outputs",
        metavar="NAME",
        default_text="bench_MODEL_DEVICE; bench_MODEL_DEVICE_video for --task video",
    )
    mps_prompts: int = option(
        64, help="MPS prompts per image when they come from the grid", metavar="N", low=1
    )
    point_prompts: str = option(
        "auto",
        help="where SPS / MPS prompts come from: the baseline's AMG masks (amg), a grid "
        "(grid), or auto: grid with random weights, amg otherwise",
        choices=PROMPT_POLICIES,
    )
    warm: bool = option(
        False,
        help="also run each mode that compiles a second time, on the compile cache its "
        "cold run filled",
    )
    aot_decoder: str = option(
        "aoti",
        help="how the artifacts rows run the mask decoder: AOTInductor programs, or "
        "eagerly (exports ~2 min faster per mode)",
        choices=("aoti", "eager"),
    )
    image_decode: str = option(
        DEFAULT_IMAGE_DECODE,
        help=IMAGE_DECODE_HELP + "; for SPS and MPS in sam2serve's rows (AMG, Meta's and "
        "Hugging Face's rows decode on the host); the report names the decode that ran",
        choices=IMAGE_DECODES,
    )
    threads: int | None = None  # each worker's torch threads (None: the CPUs it may use)
    command: str = ""
    work_dir: Path | None = option(
        None,
        help="keep the runs' specs, raw results and images here",
        metavar="DIR",
        type=Path,
        default_text="a temporary directory, removed at the end",
    )
    timeout_s: float | None = option(
        None,
        help="give up on a run (one mode, one task) after this long",
        flag="--timeout",
        metavar="SECONDS",
        type=float,
        low=0,
        low_open=True,
        default_text="no limit",
    )
    # AMG variants (sam2serve.bench.variants), each a set of AMG rows with its own baseline.
    amg_variants: tuple[str, ...] = (DEFAULT_VARIANT,)
    # Task video (sam2serve.bench.video): the clip, its first frames, and the object
    # counts, each a run per mode.
    video: str = option(
        SAMPLE_VIDEO,
        help=f"the clip: '{SAMPLE_VIDEO}' (made offline: a disc and a square crossing a "
        "photo, with true masks), a video file or a folder of frames",
        metavar=f"FILE|DIR|{SAMPLE_VIDEO}",
    )
    video_frames: int = option(
        DEFAULT_VIDEO_FRAMES,
        help="frames of the clip to track: the first N (at least 2: a prompted and a "
        "tracked frame; the default's last one holds a full memory bank of 7 frames)",
        flag="--frames",
        metavar="N",
        low=2,
    )
    video_objects: tuple[int, ...] = DEFAULT_VIDEO_OBJECTS

    def __post_init__(self) -> None:
        try:
            check_options(self)
        except OptionError as exc:
            raise BenchError(exc.for_flag()) from None

    def variant_params(self, variant: str) -> AMGParams:
        return AMG_VARIANTS[variant].apply(self.amg_params)


@dataclass(frozen=True)
class BenchImage:
    path: Path
    name: str
    height: int
    width: int


@dataclass
class RunResult:
    """One worker's run of one task in one mode, summarised."""

    task: str
    mode: str
    label: str  # the mode, plus "(warm)" for a warm-cache repeat
    cache: str  # "cold" or "warm"
    stats: metrics.LatencyStats | None = None
    ready_s: float | None = None
    peak_mem_mb: float | None = None
    masks_per_image: float | None = None
    stages_ms: dict[str, float] = field(default_factory=dict)  # steady-state means
    accuracy: metrics.Accuracy | None = None
    error: str | None = None
    skipped: bool = False  # not run on purpose (e.g. sam2 missing), not a failure
    notes: list[str] = field(default_factory=list)
    records: list[list[dict[str, Any]]] | None = field(default=None, repr=False)
    variant: str = ""  # the AMG variant of an AMG run; "" for the point tasks

    @property
    def ok(self) -> bool:
        return self.error is None and self.stats is not None


@dataclass
class BenchResult:
    config: BenchConfig
    machine: MachineInfo
    images: list[BenchImage]
    runs: list[RunResult]
    weights: str
    prompts: dict[str, str]  # task -> how its prompts were made
    notes: list[str]
    load_start: tuple[float, float, float]
    load_end: tuple[float, float, float]
    started: str
    duration_s: float


def _log(message: str) -> None:
    print(f"sam2serve bench: {message}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- inputs


def prepare_images(source: str, n: int | None, work: Path) -> list[BenchImage]:
    """The benchmark's image files, cycled to ``n``: the bundled samples (written once
    as PNG, so decoding is real and lossless) or a directory's image files, sorted."""
    from sam2serve.engine.image import load_image

    if source == SAMPLES:
        from PIL import Image

        from sam2serve.samples import SAMPLE_NAMES, load_sample

        directory = work / "images"
        directory.mkdir(parents=True, exist_ok=True)
        files = []
        for name in SAMPLE_NAMES:
            path = directory / f"{name}.png"
            Image.fromarray(load_sample(name)).save(path)
            files.append(path)
    else:
        directory = Path(source)
        if not directory.is_dir():
            raise BenchError(f"--images {source!r} is neither '{SAMPLES}' nor a directory")
        files = sorted(
            p for p in directory.iterdir() if p.is_file() and p.suffix.lower() in IMAGE_EXTENSIONS
        )
        if not files:
            raise BenchError(
                f"--images directory {source!r} has no image files ({', '.join(IMAGE_EXTENSIONS)})"
            )
    count = n if n is not None else len(files)
    if count < 1:
        raise BenchError(f"--n must be at least 1, got {count}")
    sizes = {}
    for path in files[:count]:
        try:
            sizes[path] = load_image(path).shape[:2]
        except ValueError as exc:
            raise BenchError(str(exc)) from None
    chosen = [files[i % len(files)] for i in range(count)]
    return [BenchImage(p, p.name, *sizes[p]) for p in chosen]


def grid_prompts(image: BenchImage, task: str, count: int) -> list[list[float]]:
    """Prompts that do not need masks: SPS the image centre, MPS ``count`` points of an
    AMG-style grid (cell centres of a ceil(sqrt(count))-per-side grid, row by row)."""
    if task == "sps":
        return [[image.width / 2, image.height / 2]]
    side = math.ceil(math.sqrt(count))
    grid = build_point_grid(side)[:count] * np.array([image.width, image.height])
    return [[round(float(x), 2), round(float(y), 2)] for x, y in grid]


def _point_prompts(
    task: str,
    images: Sequence[BenchImage],
    amg_records: list[list[dict[str, Any]]] | None,
    use_grid: bool,
    count: int,
) -> tuple[list[list[list[float]]], str]:
    """Per image prompts for ``task`` and a sentence saying where they came from."""
    if use_grid or amg_records is None:
        what = "the image centre" if task == "sps" else f"{count} grid points per image"
        return [grid_prompts(image, task, count) for image in images], f"{what} (grid)"
    prompts, fallbacks = [], 0
    for image, records in zip(images, amg_records, strict=True):
        points = prompt_points(records)
        if not points:
            fallbacks += 1
            points = grid_prompts(image, task, count)
        prompts.append(points[:1] if task == "sps" else points)
    what = (
        "the centre point of the largest baseline AMG mask"
        if task == "sps"
        else "the centre points of all baseline AMG masks"
    )
    if fallbacks:
        what += f"; {fallbacks} image(s) without AMG masks used grid prompts"
    return prompts, what


# --------------------------------------------------------------------------- workers


def _worker_env(cache_dir: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["TORCHINDUCTOR_CACHE_DIR"] = str(cache_dir)
    # Backend openvino keeps its converted model in sam2serve's cache: the run's own,
    # so a cold run converts and a warm run imports what its cold run kept.
    env["SAM2SERVE_CACHE"] = str(cache_dir / "sam2serve")
    path = env.get("PYTHONPATH")
    env["PYTHONPATH"] = str(PACKAGE_ROOT) + (os.pathsep + path if path else "")
    return env


def _start_worker(
    args: list[str],
    env: dict[str, str],
    timeout_s: float | None,
    module: str = "sam2serve.bench.worker",
) -> subprocess.CompletedProcess:
    """``python -m MODULE ARGS`` (a bench worker) with its spawn time in the environment."""
    env = {**env, SPAWN_TIME_ENV: repr(time.time())}
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        env=env,
        timeout=timeout_s,
        stdout=subprocess.PIPE,
        text=True,
        check=False,
    )


def _write_checkpoint(config: BenchConfig, work: Path) -> Path:
    path = work / f"random_{config.model}_seed{config.seed}.pt"
    done = _start_worker(
        [
            "write-checkpoint",
            "--model",
            config.model,
            "--seed",
            str(config.seed),
            "--out",
            str(path),
        ],
        _worker_env(work / "inductor" / "checkpoint"),
        config.timeout_s,
    )
    if done.returncode != 0 or not path.exists():
        raise BenchError(f"could not write the random-weights checkpoint (exit {done.returncode})")
    return path


def _summarise(run: RunResult, data: dict[str, Any]) -> None:
    latencies = data["latencies_ms"]
    run.stats = metrics.latency_stats(latencies)
    run.ready_s = data["ready_s"]
    cuda_mb = data.get("cuda_max_allocated_mb")
    run.peak_mem_mb = cuda_mb if cuda_mb is not None else data["peak_rss_mb"]
    run.records = data["records"]
    run.masks_per_image = float(np.mean([len(r) for r in run.records]))
    steady = data["stages_ms"][1:] or data["stages_ms"]
    run.stages_ms = {stage: float(np.mean([s[stage] for s in steady])) for stage in STAGES}
    if not data.get("rle_stage", True):
        run.notes.append("RLE is counted in post-processing")
    if "image_decode" in data:
        run.notes.append(_decode_note(run.label, data))


def _decode_note(label: str, data: dict[str, Any]) -> str:
    """Which decode a run's images went through, and how many went where."""
    counts = data.get("image_decode_counts") or {}
    where = ", ".join(f"{count} {key}" for key, count in sorted(counts.items()))
    return f"{label}: image decode {data['image_decode']}" + (f": {where}" if where else "")


def _run_worker(
    config: BenchConfig,
    work: Path,
    task: str,
    mode: str,
    cache: str,
    checkpoint: Path,
    images: Sequence[BenchImage],
    prompts: list[list[list[float]]] | None,
    variant: str = DEFAULT_VARIANT,
) -> RunResult:
    label = mode if cache == "cold" else f"{mode} (warm)"
    run = RunResult(task=task, mode=mode, label=label, cache=cache)
    # A variant other than the default gets its own files and compile cache.
    key = task if task != "amg" or variant == DEFAULT_VARIANT else f"{task}-{variant}"
    slug = f"{key}-{mode}-{cache}"
    spec = {
        "task": task,
        "mode": mode,
        "label": label,
        "model": config.model,
        "device": config.device,
        "threads": config.threads,
        "checkpoint": str(checkpoint),
        "images": [str(image.path) for image in images],
        "prompts": prompts,
        "amg_params": config.variant_params(variant).to_dict(),
        "artifacts": str(_artifacts_dir(work, mode)) if _from_artifacts(mode) else None,
        "image_decode": config.image_decode,
    }
    spec_path, result_path = work / f"{slug}.spec.json", work / f"{slug}.result.json"
    spec_path.write_text(json.dumps(spec), encoding="utf-8")
    result_path.unlink(missing_ok=True)
    # A cold run gets an empty compile cache; its warm repeat reuses what it filled.
    cache_dir = work / "inductor" / f"{key}-{mode}"
    _log(f"{key} {label}: {len(images)} image(s) in a fresh process ({cache} compile cache)")
    try:
        done = _start_worker(
            ["run", str(spec_path), str(result_path)], _worker_env(cache_dir), config.timeout_s
        )
    except subprocess.TimeoutExpired:
        run.error = f"timed out after {config.timeout_s:g} s"
        return run
    if done.returncode != 0 or not result_path.exists():
        run.error = f"worker failed (exit status {done.returncode}; its error is above)"
        return run
    _summarise(run, json.loads(result_path.read_text(encoding="utf-8")))
    return run


def _artifacts_dir(work: Path, mode: str) -> Path:
    # One directory per row: fast+artifacts and fast+onnxruntime export different formats.
    return work / "artifacts" / mode.replace("+", "-")


def _from_artifacts(label: str) -> bool:
    """Whether the row ``label`` (``MODE+BACKEND``) starts from export artifacts."""
    if label in PEERS:
        return False
    from sam2serve.runtime.backends import BACKENDS
    from sam2serve.runtime.spec import RuntimeSpec

    backend = RuntimeSpec.from_label(label).backend
    assert backend is not None  # RuntimeSpec sets it
    return BACKENDS[backend].needs_artifacts


def _export_artifacts(
    config: BenchConfig, work: Path, modes: Sequence[str], checkpoint: Path, notes: list[str]
) -> None:
    """``sam2serve export`` once per base mode of the ``+artifacts`` rows, before any run,
    so their workers start from artifacts like a replica would."""
    for mode in modes:
        if not _from_artifacts(mode):
            continue
        base, out = mode.partition("+")[0], _artifacts_dir(work, mode)
        onnx = mode.partition("+")[2] == "onnxruntime"
        _log(f"exporting {config.model} {base} artifacts for {mode}")
        # onnxruntime rows run an ONNX export (its decoder graphs included).
        export_format = ["--format", "onnx" if onnx else "artifacts"]
        done = _start_worker(
            [
                "export",
                "--model",
                config.model,
                "--mode",
                base,
                "--checkpoint",
                str(checkpoint),
                "--out",
                str(out),
                *export_format,
                "--decoder",
                config.aot_decoder,
                "--device",
                config.device,
            ],
            dict(os.environ),
            config.timeout_s,
        )
        if done.returncode != 0:
            raise BenchError(f"exporting the artifacts for {mode} failed (its error is above)")
        seconds = json.loads(done.stdout.strip().splitlines()[-1])["export_seconds"]
        decoder = (
            "ONNX Runtime" if onnx else "AOTInductor" if config.aot_decoder == "aoti" else "eager"
        )
        notes.append(
            f"{mode}: artifacts exported once before the runs ('sam2serve export', "
            f"{seconds:.0f} s; mask decoder {decoder}); its worker loads them with no "
            "compilation"
        )


# --------------------------------------------------------------------------- the run


@dataclass(frozen=True)
class Session:
    """When, where and under what load a benchmark started (its report's header)."""

    machine: MachineInfo
    started: str
    load_start: tuple[float, float, float]
    clock: float

    @classmethod
    def start(cls) -> Session:
        started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
        return cls(machine_info(), started, load_average(), time.perf_counter())

    def finish(self) -> dict[str, Any]:
        """The result's machine, started, load_start, load_end and duration_s fields."""
        return {
            "machine": self.machine,
            "started": self.started,
            "load_start": self.load_start,
            "load_end": load_average(),
            "duration_s": time.perf_counter() - self.clock,
        }


def check_weights(config: BenchConfig) -> None:
    if config.checkpoint is not None and not config.checkpoint.is_file():
        raise BenchError(f"--checkpoint file not found: {str(config.checkpoint)!r}")
    if config.checkpoint is None and not config.random_weights:
        raise BenchError("give --checkpoint PATH (official SAM 2.1 weights) or --random-weights")


@contextlib.contextmanager
def work_directory(work_dir: Path | None) -> Iterator[Path]:
    """--work-dir (kept), or a temporary directory removed at the end."""
    if work_dir is not None:
        work_dir.mkdir(parents=True, exist_ok=True)
        yield work_dir
        return
    with tempfile.TemporaryDirectory(prefix="sam2serve-bench-") as temporary:
        yield Path(temporary)


def bench_weights(config: BenchConfig, work: Path) -> tuple[Path, str]:
    """The checkpoint every run loads and how the report names it: the given one, or the
    seeded random weights written once."""
    if not config.random_weights:
        assert config.checkpoint is not None
        return config.checkpoint, f"checkpoint {config.checkpoint.name}"
    weights = (
        f"random (seed {config.seed}), written once as an official-shaped checkpoint "
        "that every mode loads: the masks are meaningless, the work is real"
    )
    return _write_checkpoint(config, work), weights


def mode_compiles(mode: str) -> bool:
    """Whether the row ``mode`` (``MODE+BACKEND``) compiles at start-up."""
    if mode in PEERS:
        return False
    from sam2serve.runtime.spec import RuntimeSpec

    return RuntimeSpec.from_label(mode).backend in COMPILING_BACKENDS


# Backends that compile when the predictor is built or first used (not from artifacts).
COMPILING_BACKENDS = ("openvino", "compile")


def _resolve_auto(modes: Sequence[str], device: str, notes: list[str]) -> list[str]:
    """``MODE+auto`` rows as the backend ``auto`` picks for the mode on this host (the
    report says which), so a row always names what ran."""
    from sam2serve.runtime.backend_choice import AUTO, auto_backend
    from sam2serve.runtime.host import host_isa

    resolved = []
    for mode in modes:
        base, _, backend = mode.partition("+")
        if backend == AUTO:
            chosen = f"{base}+{auto_backend(base, device)}"
            notes.append(
                f"{mode} ran as {chosen}: what backend auto picks for {base} on this "
                f"{device} ({host_isa().describe()})"
            )
            mode = chosen
        resolved.append(mode)
    return resolved


def _plan_modes(modes: Sequence[str], notes: list[str], device: str = "cpu") -> list[str]:
    from sam2serve.runtime.backends import BACKENDS
    from sam2serve.runtime.modes import MODES
    from sam2serve.runtime.spec import RuntimeSpec

    modes = _resolve_auto(modes, device, notes)
    unknown = []
    for mode in modes:
        if mode in PEERS:
            continue
        try:
            RuntimeSpec.from_label(mode)
        except ValueError as exc:
            unknown.append(f"{mode!r} ({exc})")
    if unknown:
        known = [*PEERS, *MODES]
        raise BenchError(
            f"unknown mode(s) {', '.join(unknown)}; expected some of {', '.join(known)}, "
            f"each also as MODE+BACKEND with a backend of {', '.join(BACKENDS)}"
        )
    ordered = list(dict.fromkeys(modes))
    if BASELINE not in ordered:
        notes.append("baseline was added: prompts and accuracy are measured against it")
    else:
        ordered.remove(BASELINE)
    return [BASELINE, *ordered]


def _peer_skips(modes: Sequence[str], tasks: Sequence[str], notes: list[str]) -> dict[str, str]:
    """The peer rows that cannot run here, each with the reason its row shows; the notes
    say how to install what is missing."""
    skips: dict[str, str] = {}
    missing = missing_requirements() if set(REFERENCES) & set(modes) else []
    if missing:
        message = MISSING_MESSAGE.format(missing=", ".join(missing))
        _log(message)
        notes.append(message)
        skips.update(dict.fromkeys(REFERENCES, "sam2 not installed"))
    peers = [mode for mode in modes if mode in hf_peer.HF_PEERS]
    if peers and set(tasks) & set(hf_peer.HF_TASKS):
        notes.append(hf_peer.ROWS_NOTE)
        for mode in peers:
            reason = hf_peer.unavailable(mode)
            if reason is not None:
                _log(reason.message)
                notes.append(reason.message)
                skips[mode] = reason.row
    return skips


def _plan_variants(config: BenchConfig, notes: list[str]) -> list[str]:
    """The AMG variants to run, in order; one whose parameters equal an earlier one's
    (the flags already keep every mask) is not run twice."""
    unknown = [v for v in config.amg_variants if v not in AMG_VARIANTS]
    if unknown or not config.amg_variants:
        raise BenchError(
            f"unknown AMG variant(s) {', '.join(map(repr, unknown))}; expected some of "
            f"{', '.join(AMG_VARIANTS)}"
        )
    if "amg" not in config.tasks:  # only the first variant's baseline, for the prompts
        return list(config.amg_variants[:1])
    planned: dict[str, AMGParams] = {}
    for variant in dict.fromkeys(config.amg_variants):
        params = config.variant_params(variant)
        same = next((name for name, p in planned.items() if p == params), None)
        if same is not None:
            notes.append(
                f"AMG variant {variant} was not run: with these AMG flags its parameters are "
                f"those of variant {same}"
            )
            continue
        planned[variant] = params
    if len(planned) > 1:
        notes.append(
            "AMG runs once per variant, each with its own baseline run; a variant's mIoU and "
            "fails compare each mode's masks with the baseline's masks of the same variant. "
            + "; ".join(f"{name}: {AMG_VARIANTS[name].help}" for name in planned)
        )
    return list(planned)


def _note_empty_amg(runs: Sequence[RunResult], variant: str, notes: list[str]) -> None:
    baseline = next(
        (r for r in runs if r.task == "amg" and r.mode == BASELINE and r.variant == variant),
        None,
    )
    if baseline is not None and baseline.ok and not baseline.masks_per_image:
        what = "AMG" if variant == DEFAULT_VARIANT else f"AMG variant {variant}"
        notes.append(
            f"the baseline's {what} kept no masks (with random weights the predicted IoUs "
            "are about 0.5, under pred_iou_thresh): its time is the encoder and the decoder, "
            "post-processing and RLE have nothing to do, and its mIoU is n/a; variant "
            "keep-all (--amg-variants) keeps every mask"
        )


def _compare(task: str, run: RunResult, baseline: RunResult | None) -> None:
    if not run.ok or baseline is None or not baseline.ok:
        return
    assert run.records is not None and baseline.records is not None
    compare = metrics.amg_accuracy if task == "amg" else metrics.point_accuracy
    run.accuracy = compare(run.records, baseline.records)


def run_bench(config: BenchConfig) -> BenchResult:
    for task in config.tasks:
        if task not in TASKS:
            raise BenchError(f"unknown task {task!r}; expected {', '.join(TASKS)} or all")
    if config.point_prompts not in PROMPT_POLICIES:
        raise BenchError(
            f"--point-prompts must be one of {', '.join(PROMPT_POLICIES)}, got "
            f"{config.point_prompts!r}"
        )
    if config.mps_prompts < 1:
        raise BenchError(f"--mps-prompts must be at least 1, got {config.mps_prompts}")
    check_weights(config)
    notes: list[str] = []
    modes = _plan_modes(config.modes, notes, config.device)
    variants = _plan_variants(config, notes)

    session = Session.start()
    with work_directory(config.work_dir) as work:
        images = prepare_images(config.images, config.n, work)
        checkpoint, weights = bench_weights(config, work)
        _export_artifacts(config, work, modes, checkpoint, notes)
        skips = _peer_skips(modes, config.tasks, notes)
        use_grid = config.point_prompts == "grid" or (
            config.point_prompts == "auto" and config.random_weights
        )
        point_tasks = [t for t in config.tasks if t != "amg"]
        runs: list[RunResult] = []
        prompts_used: dict[str, str] = {}
        baseline_amg: RunResult | None = None

        def run_task(task: str, prompts: list | None, variant: str = DEFAULT_VARIANT) -> None:
            baseline = None
            for mode in modes:
                if mode in hf_peer.HF_PEERS and task not in hf_peer.HF_TASKS:
                    continue  # the peer covers the point tasks only (a note says so)
                if mode in skips:
                    skip = RunResult(task, mode, mode, "cold", error=f"not run: {skips[mode]}")
                    skip.skipped = True
                    skip.variant = variant if task == "amg" else ""
                    runs.append(skip)
                    continue
                caches = ["cold", "warm"] if config.warm and mode_compiles(mode) else ["cold"]
                for cache in caches:
                    run = _run_worker(
                        config,
                        work,
                        task,
                        mode,
                        cache,
                        checkpoint,
                        images,
                        prompts,
                        variant=variant,
                    )
                    run.variant = variant if task == "amg" else ""
                    if mode == BASELINE and cache == "cold":
                        baseline = run
                    _compare(task, run, baseline)
                    runs.append(run)
                    _log(_one_line(run))

        tasks = list(config.tasks)
        if point_tasks and not use_grid and "amg" not in tasks:
            # The prompts come from the baseline's AMG masks, so that run is needed anyway.
            baseline_amg = _run_worker(
                config, work, "amg", BASELINE, "cold", checkpoint, images, None, variants[0]
            )
            if not baseline_amg.ok:
                raise BenchError("the baseline AMG run that makes the prompts failed")
            notes.append("the baseline AMG run that made the point prompts is not reported")
        for task in tasks:
            if task == "amg":
                for variant in variants:
                    run_task("amg", None, variant)
                    _note_empty_amg(runs, variant, notes)
                # Point prompts come from the first variant's baseline masks.
                baseline_amg = next(
                    r
                    for r in runs
                    if r.task == "amg" and r.mode == BASELINE and r.variant == variants[0]
                )
                continue
            amg_records = baseline_amg.records if baseline_amg and baseline_amg.ok else None
            prompts, prompts_used[task] = _point_prompts(
                task, images, amg_records, use_grid, config.mps_prompts
            )
            if amg_records is not None and not use_grid and len(variants) > 1:
                prompts_used[task] += f" ({variants[0]} variant)"
            if use_grid and config.random_weights:
                prompts_used[task] += (
                    "; random weights: AMG keeps next to no masks, so its masks cannot make "
                    "the prompts"
                )
            run_task(task, prompts)
    for run in runs:
        run.records = None  # compared; the masks are not reported
    return BenchResult(
        config=config,
        images=images,
        runs=runs,
        weights=weights,
        prompts=prompts_used,
        notes=notes,
        **session.finish(),
    )


def _one_line(run: RunResult) -> str:
    task = run.task if run.variant in ("", DEFAULT_VARIANT) else f"{run.task} {run.variant}"
    if not run.ok:
        return f"{task} {run.label}: {run.error}"
    assert run.stats is not None
    text = (
        f"{task} {run.label}: p50 {run.stats.p50_ms:.0f} ms, first {run.stats.first_ms:.0f} ms, "
        f"ready {run.ready_s:.1f} s, {run.masks_per_image:.1f} masks/image"
    )
    return text + accuracy_text(run.accuracy, run.mode)


def accuracy_text(accuracy: metrics.Accuracy | None, mode: str) -> str:
    """ ", mIoU ..., fails ..." for a run's log line (nothing for the baseline itself)."""
    if accuracy is None or mode == BASELINE:
        return ""
    miou = "n/a" if accuracy.miou is None else f"{accuracy.miou:.4f}"
    return f", mIoU {miou}, fails {accuracy.fails}"
