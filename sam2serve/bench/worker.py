"""One benchmark run in a fresh process: one mode, one task, every image.

``python -m sam2serve.bench.worker run SPEC.json RESULT.json`` loads the model the way the
mode says, then for each image reads its file (untimed) and times decode + segmentation +
RLE, stage by stage. The result file holds the per-image latencies and stages, the masks
(COCO RLE, for the accuracy comparison), the time from process start to ready and the
peak memory. The parent (:mod:`sam2serve.bench.runner`) starts one worker per run, so
imports, model loading, first-iteration costs and compile caches are really cold.

``python -m sam2serve.bench.worker export --model SIZE --mode MODE --checkpoint PATH --out DIR``
writes ``sam2serve export`` artifacts of those weights for the ``+artifacts`` rows.

``python -m sam2serve.bench.worker video SPEC.json RESULT.json`` is one run of the video
task (:mod:`sam2serve.bench.video`): one mode, one object count, the clip's frames
propagated from prompts on frame 0, each frame's interval and masks recorded.

A row of ``--task concepts-video`` runs in its own worker,
:mod:`sam2serve.bench.concepts_video_worker` (it builds on this one's helpers).

``python -m sam2serve.bench.worker write-checkpoint --model SIZE --seed N --out PATH``
writes the seeded random weights as an official-shaped checkpoint (``{"model": ...}``,
every key of Meta's SAM2Base, the video path's included, so Meta's strict loader and our
video model accept it): every mode, the reference included, then loads the identical
weights.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sam2serve.runtime.spec import RuntimeSpec

__all__ = ["SPAWN_TIME_ENV", "main", "run", "run_video", "write_checkpoint"]

# Set by the parent just before it starts this process: "start to ready" includes the
# interpreter's start and every import.
SPAWN_TIME_ENV = "SAM2SERVE_BENCH_SPAWN_TIME"
_IMPORTED_AT = time.time()

Runner = Callable[[bytes, Sequence[Sequence[float]] | None, Any], list[dict[str, Any]]]


def _peak_rss_mb() -> float:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 2**10  # bytes vs KiB


class _EngineRunner:
    """Our engine in one of the modes of :data:`sam2serve.runtime.modes.MODES`."""

    def __init__(self, spec: dict[str, Any]) -> None:
        from sam2serve.engine import tasks
        from sam2serve.engine.amg import AMGParams
        from sam2serve.runtime.build import build_predictor
        from sam2serve.runtime.modes import get_mode
        from sam2serve.runtime.process import configure_process
        from sam2serve.runtime.spec import RuntimeSpec, WeightsSource

        self.tasks = tasks
        self.task = spec["task"]
        runtime = RuntimeSpec.from_label(
            spec["mode"], model=spec["model"], device=spec["device"], threads=spec.get("threads")
        )
        self.mode = get_mode(runtime.mode)
        configure_process(runtime)  # a worker's process runs this one spec
        if spec["artifacts"] is not None:
            weights = WeightsSource(artifacts=spec["artifacts"])
        else:
            weights = WeightsSource(checkpoint=spec["checkpoint"])
        self.predictor = build_predictor(runtime, weights)
        params = AMGParams.from_dict(spec["amg_params"])
        self.generator = tasks.mask_generator(self.predictor, params, self.mode)
        self.timer: Any = None
        # SPS / MPS decode the bytes as --image-decode says (AMG reads its crops' pixels
        # on the host: it decodes there).
        self.decoder: Any = None
        if self.task != "amg":
            from sam2serve.engine.decode_choice import image_decoder

            self.decoder = image_decoder(spec.get("image_decode", "host"), runtime.device)

    def describe_decode(self) -> dict[str, Any]:
        """Which decode ran, for the report: the decoder, and where each image went."""
        if self.decoder is None:
            return {"image_decode": "host (Pillow; AMG decodes on the host)"}
        counts = dict(getattr(self.decoder, "counts", {}))
        return {"image_decode": self.decoder.describe(), "image_decode_counts": counts}

    def __call__(
        self, image: bytes, points: Sequence[Sequence[float]] | None, timer: Any
    ) -> list[dict[str, Any]]:
        tasks, flags = self.tasks, self.mode
        self.timer = timer
        try:
            if self.task == "amg":
                return tasks.amg(self.generator, image, flags=flags, timer=timer)
            points = list(points or [])
            pixels: Any = image
            if self.decoder is not None:
                from sam2serve.engine.image import DEFAULT_MAX_PIXELS

                with timer.stage("decode"):
                    pixels = self.decoder.decode(image, DEFAULT_MAX_PIXELS)
            image = pixels
            if self.task == "sps" and points:
                return tasks.sps(self.predictor, image, points[0], flags=flags, timer=timer)
            return tasks.mps(self.predictor, image, points, flags=flags, timer=timer)
        finally:
            self.timer = None


def _make_runner(spec: dict[str, Any]) -> tuple[Runner, dict[str, Any]]:
    if spec["mode"] in ("reference", "reference-bf16"):
        from sam2serve.bench.reference import ReferenceRunner
        from sam2serve.engine.amg import AMGParams

        reference = ReferenceRunner(
            spec["task"],
            spec["model"],
            Path(spec["checkpoint"]),
            spec["device"],
            AMGParams.from_dict(spec["amg_params"]),
            autocast_bf16=spec["mode"] == "reference-bf16",
        )
        return reference, {"torchvision": reference.torchvision, "rle_stage": True}
    from sam2serve.bench.hf_peer import HF_PEERS, HF_PROCESSOR, HFRunner

    if spec["mode"] in HF_PEERS:
        runner = HFRunner(
            spec["task"],
            spec["model"],
            Path(spec["checkpoint"]),
            spec["device"],
            use_processor=spec["mode"] == HF_PROCESSOR,
        )
        return runner, {"rle_stage": True}
    engine = _EngineRunner(spec)
    return engine, {"rle_stage": True}


def _ready(device: Any, spawn: float, label: str) -> float:
    """Seconds from process start to ready (the model loaded); peak GPU memory counted
    from here."""
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
    ready_s = time.time() - spawn
    print(f"{label} ready in {ready_s:.1f} s", file=sys.stderr, flush=True)
    return ready_s


def _synchronize(device: Any) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _write_result(result_path: Path, device: Any, result: dict[str, Any]) -> int:
    """The run's result with the process's peak memory and threads, written atomically."""
    import torch

    result = {
        **result,
        "peak_rss_mb": _peak_rss_mb(),
        "cuda_max_allocated_mb": (
            torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else None
        ),
        "torch_threads": torch.get_num_threads(),
        "pid": os.getpid(),
        "compile_cache": os.environ.get("TORCHINDUCTOR_CACHE_DIR"),
    }
    tmp = result_path.with_name(result_path.name + ".tmp")
    tmp.write_text(json.dumps(result, allow_nan=True), encoding="utf-8")
    os.replace(tmp, result_path)
    return 0


def run(spec_path: Path, result_path: Path) -> int:
    spawn = float(os.environ.get(SPAWN_TIME_ENV, _IMPORTED_AT))
    spec = json.loads(spec_path.read_text(encoding="utf-8"))
    label = f"[{spec['label']} {spec['task']}]"

    import torch

    from sam2serve.engine.tasks import StageTimer

    device = torch.device(spec["device"])
    runner, info = _make_runner(spec)
    ready_s = _ready(device, spawn, label)

    latencies, stages, records = [], [], []
    images = spec["images"]
    for index, path in enumerate(images):
        data = Path(path).read_bytes()  # reading the file is not part of the latency
        points = spec["prompts"][index] if spec.get("prompts") is not None else None
        timer = StageTimer(device)
        start = time.perf_counter()
        result = runner(data, points, timer)
        _synchronize(device)
        latency_ms = (time.perf_counter() - start) * 1000
        latencies.append(latency_ms)
        stages.append(dict(timer.ms))
        records.append(
            [{"segmentation": r["segmentation"], "area": int(r["area"])} for r in result]
        )
        print(
            f"{label} image {index + 1}/{len(images)} {Path(path).name}: "
            f"{latency_ms:.0f} ms, {len(result)} masks",
            file=sys.stderr,
            flush=True,
        )

    summary = {
        "mode": spec["mode"],
        "label": spec["label"],
        "task": spec["task"],
        "ready_s": ready_s,
        "latencies_ms": latencies,
        "stages_ms": stages,
        "records": records,
        **info,
    }
    if isinstance(runner, _EngineRunner):
        summary.update(runner.describe_decode())  # after the runs: where the images went
    return _write_result(result_path, device, summary)


# --------------------------------------------------------------------------- video


def tracker_spec(label: str, model: str, device: str, threads: int | None) -> RuntimeSpec:
    """The RuntimeSpec a video row (``MODE`` or ``MODE+BACKEND``) runs: its tracker is
    :func:`~sam2serve.runtime.backend_choice.choose_tracker`'s answer from weights (the bench
    tracks from the checkpoint), as ``sam2serve track`` and the server choose it."""
    from sam2serve.runtime.backend_choice import choose_tracker
    from sam2serve.runtime.spec import RuntimeSpec

    mode, _, backend = label.partition("+")
    tracker = choose_tracker(backend or None, mode, device, None)
    return RuntimeSpec(model=model, mode=mode, backend=tracker, device=device, threads=threads)


class _VideoEngineTracker:
    """Our VideoPredictor in one of the video modes (:mod:`sam2serve.runtime.video`)."""

    def __init__(self, spec: dict[str, Any]) -> None:
        from sam2serve.runtime.process import configure_process
        from sam2serve.runtime.spec import WeightsSource
        from sam2serve.runtime.video import build_video_predictor

        runtime = tracker_spec(spec["mode"], spec["model"], spec["device"], spec.get("threads"))
        configure_process(runtime)  # a worker's process runs this one spec
        self.predictor = build_video_predictor(
            runtime, WeightsSource(checkpoint=spec["checkpoint"])
        )
        assert self.predictor.runtime is not None  # build_video_predictor sets it
        self.dtype = self.predictor.runtime.dtype
        self.objects_per_call = self.predictor.objects_per_call

    def start(self, frames_dir: str) -> Any:
        from sam2serve.engine.video_io import read_frames

        return self.predictor.init_state(read_frames(frames_dir).frames)

    def prompt(self, state: Any, obj_id: int, prompt: dict[str, Any]) -> None:
        from sam2serve.engine.prompts import Prompt

        self.predictor.add_prompt(state, 0, obj_id, Prompt.from_json(prompt))

    def propagate(self, state: Any) -> Any:  # (frame index, object ids, (N, 1, H, W) logits)
        for out in self.predictor.propagate(state):
            yield out.frame_idx, out.obj_ids, out.mask_logits

    def held_bytes(self, state: Any) -> tuple[int, int]:
        """(the objects' memories, masks and pointers; the frames' pixels)."""
        return state.memory_bytes(), sum(frame.nbytes for frame in state.frames)


def _tracker(spec: dict[str, Any]) -> Any:
    if spec["mode"] == "reference":
        from sam2serve.bench.video_reference import MetaVideoTracker

        return MetaVideoTracker(spec["model"], Path(spec["checkpoint"]), spec["device"])
    return _VideoEngineTracker(spec)


def _frame_records(obj_ids: Sequence[int], logits: Any) -> list[dict[str, Any]]:
    """One frame's masks (logits > 0) as COCO RLE, one record per object."""
    from sam2serve.engine.rle import area_from_rle, masks_to_rle, rle_to_coco

    rles = masks_to_rle(logits[:, 0] > 0)
    return [
        {"obj_id": int(obj_id), "segmentation": rle_to_coco(rle), "area": area_from_rle(rle)}
        for obj_id, rle in zip(obj_ids, rles, strict=True)
    ]


def run_video(spec_path: Path, result_path: Path) -> int:
    """Prompts on frame 0 for every object, then one propagation: the interval before each
    frame's masks is its latency (turning them into RLE is not timed)."""
    spawn = float(os.environ.get(SPAWN_TIME_ENV, _IMPORTED_AT))
    spec = json.loads(spec_path.read_text(encoding="utf-8"))
    label = f"[{spec['label']} video, {spec['objects']} object(s)]"

    import torch

    device = torch.device(spec["device"])
    tracker = _tracker(spec)
    ready_s = _ready(device, spawn, label)
    with torch.inference_mode():
        start = time.perf_counter()
        state = tracker.start(spec["frames_dir"])
        init_ms = (time.perf_counter() - start) * 1000
        start = time.perf_counter()
        for obj_id, prompt in spec["prompts"].items():
            tracker.prompt(state, int(obj_id), prompt)
        _synchronize(device)
        prompt_ms = (time.perf_counter() - start) * 1000
        latencies, frames = [], []
        tick = time.perf_counter()
        for frame_idx, obj_ids, logits in tracker.propagate(state):
            _synchronize(device)
            latencies.append((time.perf_counter() - tick) * 1000)
            frames.append({"frame": int(frame_idx), "objects": _frame_records(obj_ids, logits)})
            print(
                f"{label} frame {frame_idx}: {latencies[-1]:.0f} ms",
                file=sys.stderr,
                flush=True,
            )
            tick = time.perf_counter()
        objects_bytes, frames_bytes = tracker.held_bytes(state)
    result = {
        "mode": spec["mode"],
        "label": spec["label"],
        "objects": spec["objects"],
        "dtype": tracker.dtype,
        "objects_per_call": min(tracker.objects_per_call, spec["objects"]),
        "ready_s": ready_s,
        "init_ms": init_ms,
        "prompt_ms": prompt_ms,
        "latencies_ms": latencies,
        "frames": frames,
        "objects_bytes": objects_bytes,
        "frames_bytes": frames_bytes,
    }
    return _write_result(result_path, device, result)


def write_checkpoint(size: str, seed: int, out: Path) -> int:
    """Our seeded random weights, image and video paths (every tensor perturbed, so each
    one matters), saved as ``{"model": state_dict}`` like Meta's published files; where
    Meta's package is there, its key set is checked to be exactly ours."""
    import torch

    from sam2serve.bench.reference import missing_requirements
    from sam2serve.checkpoint import random_state_dict
    from sam2serve.config import get_config

    state = random_state_dict(get_config(size), seed, video=True)
    with_meta = not missing_requirements()
    if with_meta:
        from sam2serve.bench.reference import build_meta_model

        meta_keys = set(build_meta_model(size, None, "cpu").state_dict())
        different = sorted(set(state) ^ meta_keys)
        if different:
            raise RuntimeError(f"our keys are not Meta's: {', '.join(different[:5])} ...")
    out.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"model": state}, out)
    print(json.dumps({"path": str(out), "meta_keys": with_meta}))
    return 0


def export(
    size: str, mode: str, checkpoint: Path, out: Path, decoder: str, device: str, fmt: str
) -> int:
    """``sam2serve export`` of the benchmark's weights, for the rows that start from an
    export: the image path as OpenVINO on the CPU, as AOTInductor on CUDA (``+artifacts``),
    or the ONNX graphs (``fmt`` "onnx", for ``+onnxruntime``)."""
    from sam2serve.runtime.export import export_artifacts

    if fmt == "onnx":
        from sam2serve.runtime.onnx_export import export_onnx

        manifest = export_onnx(size, mode, out, checkpoint=str(checkpoint))
        print(json.dumps({"path": str(out), "export_seconds": manifest["export_seconds"]}))
        return 0
    backend = "openvino" if device == "cpu" else "aoti"
    manifest = export_artifacts(
        size,
        mode,
        out,
        backend=backend,
        decoder=decoder,
        checkpoint=str(checkpoint),
        device=device,
    )
    print(json.dumps({"path": str(out), "export_seconds": manifest["export_seconds"]}))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sam2serve.bench.worker")
    commands = parser.add_subparsers(dest="command", required=True)
    run_parser = commands.add_parser("run", help="one mode and task over every image")
    run_parser.add_argument("spec", type=Path)
    run_parser.add_argument("result", type=Path)
    video_parser = commands.add_parser("video", help="one mode and object count on the clip")
    video_parser.add_argument("spec", type=Path)
    video_parser.add_argument("result", type=Path)
    ckpt = commands.add_parser("write-checkpoint", help="seeded random official-shaped weights")
    ckpt.add_argument("--model", required=True)
    ckpt.add_argument("--seed", type=int, required=True)
    ckpt.add_argument("--out", type=Path, required=True)
    exp = commands.add_parser("export", help="artifacts of the benchmark's weights")
    exp.add_argument("--model", required=True)
    exp.add_argument("--mode", required=True)
    exp.add_argument("--checkpoint", type=Path, required=True)
    exp.add_argument("--out", type=Path, required=True)
    exp.add_argument("--decoder", choices=("aoti", "eager"), default="aoti")
    exp.add_argument("--device", default="cpu")
    exp.add_argument("--format", choices=("artifacts", "onnx"), default="artifacts")
    args = parser.parse_args(argv)
    if args.command == "run":
        return run(args.spec, args.result)
    if args.command == "video":
        return run_video(args.spec, args.result)
    if args.command == "export":
        return export(
            args.model, args.mode, args.checkpoint, args.out, args.decoder, args.device, args.format
        )
    return write_checkpoint(args.model, args.seed, args.out)


if __name__ == "__main__":
    sys.exit(main())
