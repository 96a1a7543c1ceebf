"""One tracker row of the objects-per-call comparison: 8 objects clicked on frame 0 of the
sample clip (4 frames, 320 x 240, JPEG), propagated once; prints each frame's latency.

    python bench/objects_per_call.py --weights W.pt --clip DIR --row ours --per-call 1
    python bench/objects_per_call.py --weights W.pt --clip DIR --row ours --per-call 8
    python bench/objects_per_call.py --weights W.pt --clip DIR --row meta

W.pt: ``python -m sam2serve.bench.worker write-checkpoint --model tiny --seed 0 --out W.pt``;
DIR: a folder of JPEG frames (``sam2serve bench --task video`` writes the sample clip's).
Our row is the bench's baseline tracker (sam2serve.bench.worker), Meta's its reference.
Run each row in its own process, alone on the machine.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

CLICKS = [(64, 120), (256, 85), (32, 24), (96, 24), (160, 24), (224, 24), (288, 24), (32, 72)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--weights", type=Path, required=True)
    parser.add_argument("--clip", type=Path, required=True)
    parser.add_argument("--row", choices=("ours", "meta"), required=True)
    parser.add_argument("--per-call", type=int, default=None, help="ours: objects per call")
    parser.add_argument("--objects", type=int, default=8)
    args = parser.parse_args()
    if args.row == "meta":
        from sam2serve.bench.video_reference import MetaVideoTracker

        torch.set_num_threads(2)
        tracker = MetaVideoTracker("tiny", args.weights, "cpu")
    else:
        from sam2serve.bench.worker import _VideoEngineTracker

        tracker = _VideoEngineTracker(
            {"mode": "baseline", "model": "tiny", "device": "cpu", "checkpoint": str(args.weights)}
        )
        if args.per_call is not None:
            tracker.predictor.objects_per_call = args.per_call
    with torch.inference_mode():
        state = tracker.start(str(args.clip))
        for obj in range(args.objects):
            click = list(CLICKS[obj % len(CLICKS)])
            tracker.prompt(state, obj + 1, {"points": [click], "labels": [1], "box": None})
        latencies, tick = [], time.perf_counter()
        for _ in tracker.propagate(state):
            latencies.append((time.perf_counter() - tick) * 1000)
            tick = time.perf_counter()
    per_call = "" if args.row == "meta" else f", {tracker.predictor.objects_per_call} per call"
    print(f"{args.row}{per_call}: frame ms {', '.join(f'{ms:,.0f}' for ms in latencies)}")


if __name__ == "__main__":
    main()
