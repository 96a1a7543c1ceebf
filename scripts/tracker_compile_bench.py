"""Per-frame time of the tracker: eager against compiled (backend compile: static memory
banks, the frame step's parts through torch.compile), and Meta's predictors (eager
SAM2VideoPredictor and ``vos_optimized`` SAM2VideoPredictorVOS) in the same run.

    python scripts/tracker_compile_bench.py --device cpu --objects 1,3 \
        --rows fast,fast+compile --out bench/results/tracker_compile_cpu.md

Each (row, object count) runs in its own process (a compiled row compiles there: its
first frames are the warm-up). Tiny (or --model), random weights, the sample clip at
320 x 240, every object clicked on frame 0; the time of a frame is the propagate loop's
step (the device synchronised on CUDA), p50 over the frames after --warmup (default 8:
past num_maskmem, so the bank is full and compiled shapes are steady).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROWS = ("baseline", "fast", "fast+compile", "furious", "furious+compile", "meta", "meta-vos")


def clicks(count: int, width: int, height: int) -> list[list[float]]:
    side = int(count**0.5) + 2
    grid = [
        [width * (i + 1) / side, height * (j + 1) / side]
        for j in range(side - 1)
        for i in range(side - 1)
    ]
    return grid[:count]


def one(row: str, objects: int, args: argparse.Namespace) -> dict:
    import torch

    from sam2serve.checkpoint import random_state_dict
    from sam2serve.config import get_config
    from sam2serve.samples import sample_clip

    clip, _ = sample_clip(args.frames, (240, 320))
    frames = list(clip)
    height, width = frames[0].shape[:2]
    points = clicks(objects, width, height)
    sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)
    work = Path(tempfile.mkdtemp(prefix="tracker-bench-"))
    cfg = get_config(args.model)
    checkpoint = work / "random.pt"
    torch.save({"model": random_state_dict(cfg, 0, video=True)}, checkpoint)
    if row.startswith("meta"):
        from PIL import Image

        from sam2serve.bench.reference import activate, meta_config_name

        activate()
        from sam2.build_sam import build_sam2_video_predictor

        for i, frame in enumerate(frames):
            Image.fromarray(frame).save(work / f"{i:05d}.jpg", quality=95)
        predictor = build_sam2_video_predictor(
            meta_config_name(args.model),
            str(checkpoint),
            device=args.device,
            vos_optimized=row == "meta-vos",
        )
        with torch.inference_mode():
            state = predictor.init_state(str(work))
            for obj, point in enumerate(points, 1):
                predictor.add_new_points_or_box(state, 0, obj, points=[point], labels=[1])
            steps = predictor.propagate_in_video(state)
            times = timed(steps, sync)
        dtype = "float32"
    else:
        from sam2serve.runtime.process import configure_process
        from sam2serve.runtime.spec import RuntimeSpec, WeightsSource
        from sam2serve.runtime.video import build_video_predictor

        spec = RuntimeSpec.from_label(row, model=args.model, device=args.device)
        configure_process(spec)
        predictor = build_video_predictor(spec, WeightsSource(checkpoint=checkpoint))
        state = predictor.init_state(frames)
        for obj, point in enumerate(points, 1):
            predictor.add_points(state, 0, obj, [point], [1])
        times = timed(predictor.propagate(state), sync)
        dtype = predictor.runtime.dtype
    steady = times[args.warmup :]
    return {
        "row": row,
        "objects": objects,
        "dtype": dtype,
        "frames": len(times),
        "first_ms": round(times[0], 1),
        "warmup_total_ms": round(sum(times[: args.warmup]), 1),
        "p50_ms": round(statistics.median(steady), 2) if steady else None,
    }


def timed(steps, sync) -> list[float]:
    times = []
    start = time.perf_counter()
    for _ in steps:
        sync()
        now = time.perf_counter()
        times.append((now - start) * 1000)
        start = now
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--objects", default="1,3")
    parser.add_argument("--rows", default="fast,fast+compile")
    parser.add_argument("--frames", type=int, default=24)
    parser.add_argument("--warmup", type=int, default=8)
    parser.add_argument("--timeout", type=int, default=540)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--one", nargs=2, metavar=("ROW", "OBJECTS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one(args.one[0], int(args.one[1]), args)))
        return 0
    rows = args.rows.split(",")
    unknown = [row for row in rows if row not in ROWS]
    if unknown:
        parser.error(f"--rows: {', '.join(unknown)} not among {', '.join(ROWS)}")
    results = []
    for objects in [int(n) for n in args.objects.split(",")]:
        for row in rows:
            command = [sys.executable, __file__, *sys.argv[1:], "--one", row, str(objects)]
            try:
                done = subprocess.run(
                    command, capture_output=True, text=True, timeout=args.timeout, check=False
                )
                lines = done.stdout.strip().splitlines()
                result = json.loads(lines[-1]) if done.returncode == 0 and lines else None
            except subprocess.TimeoutExpired:
                done, result = None, None
            if result is None:
                tail = "timed out" if done is None else done.stderr.strip()[-400:]
                result = {"row": row, "objects": objects, "error": tail}
            print(json.dumps(result), flush=True)
            results.append(result)
            if args.out:  # after each row: a run cut short keeps what it measured
                write(args, results)
    return 0 if all("error" not in r for r in results) else 1


def write(args: argparse.Namespace, results: list[dict]) -> None:
    import torch

    device = (
        torch.cuda.get_device_name(0) if args.device == "cuda" else platform.processor() or "cpu"
    )
    lines = [
        f"# Tracker per-frame time: {args.model}, {args.device}",
        "",
        f"Command: `python scripts/tracker_compile_bench.py {' '.join(sys.argv[1:])}`",
        (
            f"Host: {device}, {os.cpu_count()} CPUs; torch {torch.__version__}; "
            f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}"
        ),
        f"Load average (1, 5, 15 min) when written: {os.getloadavg()}",
        "",
        (
            f"{args.frames} frames 320x240, random weights; p50 over frames {args.warmup}.., "
            f"'warm-up' = the first {args.warmup} frames' total (compilation included)."
        ),
        "",
        "| row | objects | dtype | p50 ms/frame | first frame ms | warm-up ms |",
        "|---|---|---|---|---|---|",
    ]
    for r in results:
        if "error" in r:
            lines.append(f"| {r['row']} | {r['objects']} | failed: {r['error'][-120:]!r} | | | |")
        else:
            lines.append(
                f"| {r['row']} | {r['objects']} | {r['dtype']} | {r['p50_ms']} | "
                f"{r['first_ms']} | {r['warmup_total_ms']} |"
            )
    args.out.write_text("\n".join(lines) + "\n", encoding="utf-8")


if __name__ == "__main__":
    raise SystemExit(main())
