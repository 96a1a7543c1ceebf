"""Where one tracked frame's time goes: the tracker's frame step by stage, per frame, for
a mode, an object count and an objects-per-call setting (issue 38 item 5's profile, and
the measurement behind ``objects_per_call`` in :mod:`sam2serve.runtime.auto_table`).

    python -m sam2serve.bench.worker write-checkpoint --model tiny --seed 0 --out W.pt
    python bench/video_stages.py --weights W.pt --mode furious --objects 1 --per-call 1
    python bench/video_stages.py --weights W.pt --mode furious --objects 8 --per-call 1,3,8

The objects are the bench's (``sam2serve bench --task video``: a click on the disc, a box
on the square, then clicks on the background) on frame 0 of the sample clip (320 x 240),
propagated forward. The model's four calls are timed where the predictor makes them
(``encode_frames``: the image encoder, once a frame; ``condition_on_memory``: memory
attention and its bank; ``forward_heads``: prompt encoder and mask decoder;
``encode_memory``: the memory encoder); "other" is the rest of the frame step (selecting
and gathering the banks, storing outputs, resizing masks to the video). The settings of
``--per-call`` track in this process on one model, frame by frame in turn, so a loaded
machine's load falls on all of them alike: compare them within one run. Prints one line per tracked frame and the shares over the tracked
frames after the first (the bank still filling).
"""

from __future__ import annotations

import argparse
import copy
import functools
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

STAGES = {
    "encode_frames": "encoder",
    "condition_on_memory": "memory attention",
    "forward_heads": "heads",
    "encode_memory": "memory encoder",
}


def _timed(fn: Callable[..., Any], name: str, spent: dict[str, float]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        tick = time.perf_counter()
        out = fn(*args, **kwargs)
        spent[name] += (time.perf_counter() - tick) * 1000
        return out

    return wrapper


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--weights", type=Path, required=True)
    parser.add_argument("--mode", default="furious")
    parser.add_argument("--objects", type=int, default=1)
    parser.add_argument("--per-call", default="1", help="comma-separated objects per call")
    parser.add_argument("--frames", type=int, default=4)
    args = parser.parse_args()
    torch.set_num_threads(2)

    from sam2serve.bench.video import VideoClip, object_prompts
    from sam2serve.engine.prompts import Prompt
    from sam2serve.runtime.spec import RuntimeSpec, WeightsSource
    from sam2serve.runtime.video import build_video_predictor
    from sam2serve.samples import sample_clip

    spec = RuntimeSpec(model="tiny", mode=args.mode, backend="eager", device="cpu", threads=2)
    built = build_video_predictor(spec, WeightsSource(checkpoint=args.weights))
    spent: dict[str, float] = defaultdict(float)
    for method, stage in STAGES.items():
        setattr(built.model, method, _timed(getattr(built.model, method), stage, spent))
    frames, truth = sample_clip(args.frames)
    clip = VideoClip(Path("."), len(frames), 240, 320, "sample clip", truth)
    settings = [int(n) for n in args.per_call.split(",")]
    runs = []
    with torch.inference_mode():
        for per_call in settings:
            predictor = copy.copy(built)  # the same model, its own objects_per_call
            predictor.objects_per_call = per_call
            state = predictor.init_state(frames)
            for obj_id, prompt in object_prompts(args.objects, clip).items():
                predictor.add_prompt(state, 0, obj_id, Prompt.from_json(prompt))
            runs.append(predictor.propagate(state))
        rows: dict[int, list[dict[str, float]]] = {n: [] for n in settings}
        # Frame by frame, each setting in turn: the settings share the machine's load.
        for frame_idx in range(args.frames):
            for per_call, frames_out in zip(settings, runs, strict=True):
                spent.clear()
                tick = time.perf_counter()
                next(frames_out)
                total = (time.perf_counter() - tick) * 1000
                row = {**spent, "total": total, "other": total - sum(spent.values())}
                if frame_idx == 0:
                    continue  # the prompted frame: its masks exist already
                rows[per_call].append(row)
                stages = ", ".join(f"{k} {v:,.0f}" for k, v in row.items() if k != "total")
                print(
                    f"{args.mode} {args.objects} obj, {per_call}/call, frame {frame_idx}: "
                    f"{total:,.0f} ms ({stages})",
                    flush=True,
                )
    names = (*STAGES.values(), "other")
    for per_call in settings:
        full = rows[per_call][1:] or rows[per_call]  # frame 1 makes the bf16 weight copies
        mean = {k: sum(r.get(k, 0.0) for r in full) / len(full) for k in ("total", *names)}
        shares = ", ".join(
            f"{k} {mean[k]:,.0f} ms ({100 * mean[k] / mean['total']:.0f} %)" for k in names
        )
        print(
            f"SUMMARY {args.mode} {args.objects} obj, {per_call}/call, mean of frames "
            f"2-{len(rows[per_call])}: {mean['total']:,.0f} ms per frame = {shares}",
            flush=True,
        )


if __name__ == "__main__":
    main()
