"""One benchmark run in a fresh process: one mode, one task, every image.

``python -m sam2serve.bench.worker run SPEC.json RESULT.json`` loads the model the way the
mode says, then for each image reads its file (untimed) and times decode + segmentation +
RLE, stage by stage. The result file holds the per-image latencies and stages, the masks
(COCO RLE, for the accuracy comparison), the time from process start to ready and the
peak memory. The parent (:mod:`sam2serve.bench.runner`) starts one worker per run, so
imports, model loading, first-iteration costs and compile caches are really cold.

``python -m sam2serve.bench.worker export --model SIZE --mode MODE --checkpoint PATH --out DIR``
writes ``sam2serve export`` artifacts of those weights for the ``+artifacts`` rows.

``python -m sam2serve.bench.worker write-checkpoint --model SIZE --seed N --out PATH``
writes the seeded random weights as an official-shaped checkpoint (``{"model": ...}``,
with Meta's video-path tensors when Meta's ``sam2`` is installed, so Meta's strict loader
accepts it): every mode, the reference included, then loads the identical weights.
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
from typing import Any

__all__ = ["SPAWN_TIME_ENV", "main", "run", "write_checkpoint"]

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
        from sam2serve.runtime.spec import RuntimeSpec, WeightsSource

        self.tasks = tasks
        self.task = spec["task"]
        runtime = RuntimeSpec.from_label(
            spec["mode"], model=spec["model"], device=spec["device"], threads=spec.get("threads")
        )
        self.mode = get_mode(runtime.mode)
        if spec["artifacts"] is not None:
            weights = WeightsSource(artifacts=spec["artifacts"])
        else:
            weights = WeightsSource(checkpoint=spec["checkpoint"])
        self.predictor = build_predictor(runtime, weights)
        params = AMGParams.from_dict(spec["amg_params"])
        self.generator = tasks.mask_generator(self.predictor, params, self.mode)
        self.timer: Any = None

    def __call__(
        self, image: bytes, points: Sequence[Sequence[float]] | None, timer: Any
    ) -> list[dict[str, Any]]:
        tasks, flags = self.tasks, self.mode
        self.timer = timer
        try:
            if self.task == "amg":
                return tasks.amg(self.generator, image, flags=flags, timer=timer)
            points = list(points or [])
            if self.task == "sps" and points:
                return tasks.sps(self.predictor, image, points[0], flags=flags, timer=timer)
            return tasks.mps(self.predictor, image, points, flags=flags, timer=timer)
        finally:
            self.timer = None


def _make_runner(spec: dict[str, Any]) -> tuple[Runner, dict[str, Any]]:
    if spec["mode"] in ("reference", "reference-bf16"):
        from sam2serve.bench.reference import ReferenceRunner
        from sam2serve.engine.amg import AMGParams

        runner = ReferenceRunner(
            spec["task"],
            spec["model"],
            Path(spec["checkpoint"]),
            spec["device"],
            AMGParams.from_dict(spec["amg_params"]),
            autocast_bf16=spec["mode"] == "reference-bf16",
        )
        return runner, {"torchvision": runner.torchvision, "rle_stage": True}
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


def run(spec_path: Path, result_path: Path) -> int:
    spawn = float(os.environ.get(SPAWN_TIME_ENV, _IMPORTED_AT))
    spec = json.loads(spec_path.read_text(encoding="utf-8"))
    label = f"[{spec['label']} {spec['task']}]"

    import torch

    from sam2serve.engine.tasks import StageTimer

    device = torch.device(spec["device"])
    runner, info = _make_runner(spec)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
    ready_s = time.time() - spawn
    print(f"{label} ready in {ready_s:.1f} s", file=sys.stderr, flush=True)

    latencies, stages, records = [], [], []
    images = spec["images"]
    for index, path in enumerate(images):
        data = Path(path).read_bytes()  # reading the file is not part of the latency
        points = spec["prompts"][index] if spec.get("prompts") is not None else None
        timer = StageTimer(device)
        start = time.perf_counter()
        result = runner(data, points, timer)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
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

    result = {
        "mode": spec["mode"],
        "label": spec["label"],
        "task": spec["task"],
        "ready_s": ready_s,
        "latencies_ms": latencies,
        "stages_ms": stages,
        "records": records,
        "peak_rss_mb": _peak_rss_mb(),
        "cuda_max_allocated_mb": (
            torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else None
        ),
        "torch_threads": torch.get_num_threads(),
        "pid": os.getpid(),
        "compile_cache": os.environ.get("TORCHINDUCTOR_CACHE_DIR"),
        **info,
    }
    tmp = result_path.with_name(result_path.name + ".tmp")
    tmp.write_text(json.dumps(result, allow_nan=True), encoding="utf-8")
    os.replace(tmp, result_path)
    return 0


def write_checkpoint(size: str, seed: int, out: Path) -> int:
    """Our seeded random image weights, plus Meta's video tensors when Meta's package is
    there, saved as ``{"model": state_dict}`` like Meta's published files."""
    import torch

    from sam2serve.bench.reference import missing_requirements
    from sam2serve.checkpoint import random_state_dict
    from sam2serve.config import get_config

    state = random_state_dict(get_config(size), seed)
    with_meta = not missing_requirements()
    if with_meta:
        from sam2serve.bench.reference import build_meta_model

        full = dict(build_meta_model(size, None, "cpu").state_dict())
        unknown = sorted(set(state) - set(full))
        if unknown:
            raise RuntimeError(f"our keys are not all Meta's: {', '.join(unknown[:5])} ...")
        full.update(state)
        state = full
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
    if args.command == "export":
        return export(
            args.model, args.mode, args.checkpoint, args.out, args.decoder, args.device, args.format
        )
    return write_checkpoint(args.model, args.seed, args.out)


if __name__ == "__main__":
    sys.exit(main())
