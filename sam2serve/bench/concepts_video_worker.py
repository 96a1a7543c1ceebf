"""One row of ``sam2serve bench --task concepts-video`` (:mod:`sam2serve.bench.concepts_video`)
in its own process: ``python -m sam2serve.bench.concepts_video_worker SPEC.json RESULT.json``.

A SAM 3 row loads the concept model in the row's mode in place and its video predictor as
``track --text --mode`` does, then measures the phrase over the clip
(:func:`measure_sam3`); a SAM 2.1 row builds SAM 2.1's tracker in the mode, prompts its
objects on frame 0 and measures the propagation (:func:`measure_sam2`). The result file
holds every frame's :class:`~sam2serve.bench.concepts_video.FrameCost`, the precisions,
the seconds from process start to the model built and the peak resident size.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from sam2serve.bench.concepts_video import SAM3, FrameCost

if TYPE_CHECKING:
    from sam2serve.concepts.video_predictor import Sam3VideoPredictor, VideoState
    from sam2serve.engine.video.predictor import VideoPredictor

__all__ = ["held_by", "measure_sam2", "measure_sam3", "rss_mib", "run_concepts_video"]

MiB = 2**20


def rss_mib() -> float | None:
    """The process's resident size now (None where /proc has none)."""
    try:
        with open("/proc/self/statm") as statm:
            pages = int(statm.read().split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return pages * os.sysconf("SC_PAGE_SIZE") / MiB


def held_by(state: VideoState) -> tuple[int, int]:
    """The per-frame records SAM 3's clip state holds (every group's conditioning and
    tracked frames) and their tensors' bytes."""
    records, size = 0, 0
    for group in state.groups:
        for record in (*group.cond.values(), *group.non_cond.values()):
            records += 1
            for value in vars(record).values():
                if isinstance(value, torch.Tensor):
                    size += value.numel() * value.element_size()
    return records, size


def measure_sam3(
    predictor: Sam3VideoPredictor, frames: Sequence[np.ndarray], phrase: str
) -> list[FrameCost]:
    """``phrase`` over ``frames`` from frame 0 (Meta's add_prompt on it, then forward
    propagation), each frame's cost: stage seconds, wall seconds, objects, memory. The
    predictor's thresholds should have hot-start delay 0 (each answer when its frame is
    done)."""
    height, width = frames[0].shape[:2]
    tick = time.perf_counter()
    state = predictor.start(len(frames), height, width, phrase)
    costs: list[FrameCost] = []
    before = dict(state.stage_seconds)
    for result in predictor.run(state, frames):
        now = time.perf_counter()
        stages = {k: v - before[k] for k, v in state.stage_seconds.items()}
        before = dict(state.stage_seconds)
        records, held = held_by(state)
        costs.append(
            FrameCost(
                frame=result.frame,
                seconds=now - tick,
                objects=len(state.obj_ids),
                shown=len(result.obj_ids),
                rss_mib=rss_mib(),
                held_mib=held / MiB,
                records=records,
                stages=stages,
            )
        )
        tick = time.perf_counter()
    return costs


def measure_sam2(
    predictor: VideoPredictor, frames: Sequence[np.ndarray], prompts: dict[int, dict[str, Any]]
) -> list[FrameCost]:
    """SAM 2.1's tracker: ``prompts`` (object id -> clicks and/or a box, ``--task video``'s
    form) on frame 0, then propagation; each frame's wall time from asking for it to its
    masks (frame 0's includes the prompts)."""
    from sam2serve.engine.prompts import Prompt

    with torch.inference_mode():
        tick = time.perf_counter()
        state = predictor.init_state(frames)
        for obj_id, prompt in prompts.items():
            predictor.add_prompt(state, 0, int(obj_id), Prompt.from_json(prompt))
        costs: list[FrameCost] = []
        for out in predictor.propagate(state):
            shown = int(out.masks.flatten(1).any(dim=1).sum())
            now = time.perf_counter()
            costs.append(
                FrameCost(
                    frame=out.frame_idx,
                    seconds=now - tick,
                    objects=len(out.obj_ids),
                    shown=shown,
                    rss_mib=rss_mib(),
                    held_mib=state.memory_bytes() / MiB,
                )
            )
            tick = time.perf_counter()
    return costs


def _load_sam3(spec: dict[str, Any]) -> tuple[Sam3VideoPredictor, dict[str, str]]:
    """SAM 3 in the row's mode, in place, and its video predictor: ``track --text --mode``'s
    loading; with what each part computes in."""
    from sam2serve.concepts.runtime import ConceptsSpec
    from sam2serve.concepts.video_association import VideoThresholds
    from sam2serve.runtime.concepts import (
        load_concepts_in_mode,
        stage_precisions,
        tracker_precisions,
        video_predictor_in_mode,
    )

    concepts_spec = ConceptsSpec(
        weights=None if spec["weights"] is None else Path(spec["weights"]),
        random_weights=spec["random_weights"],
        seed=spec["seed"],
        size=spec["size"],
        device=spec["device"],
    )
    mode = spec["mode"]
    concepts = load_concepts_in_mode(concepts_spec, mode)
    predictor = video_predictor_in_mode(concepts, VideoThresholds(**spec["thresholds"]), mode=mode)
    tracker = tracker_precisions(predictor.neck, predictor.tracker)
    precisions = {
        **stage_precisions(concepts, mode),
        **{f"tracker {part}": dtype for part, dtype in tracker.items()},
    }
    return predictor, precisions


def _load_sam2(spec: dict[str, Any]) -> tuple[VideoPredictor, dict[str, str]]:
    """SAM 2.1's tracker in the row's mode (the tracker ``track`` chooses for it), from the
    checkpoint or seeded random weights; with the dtype it tracks in and its backend."""
    from sam2serve.bench.worker import tracker_spec
    from sam2serve.runtime.process import configure_process
    from sam2serve.runtime.spec import WeightsSource
    from sam2serve.runtime.video import build_video_predictor

    runtime = tracker_spec(spec["mode"], spec["size"], spec["device"], spec["threads"])
    configure_process(runtime)  # this process runs this one spec
    checkpoint = spec["checkpoint"]
    weights = (
        WeightsSource(checkpoint=checkpoint)
        if checkpoint is not None
        else WeightsSource(random_weights=True, seed=spec["seed"])
    )
    predictor = build_video_predictor(runtime, weights)
    assert predictor.runtime is not None  # build_video_predictor sets it
    return predictor, {"tracker": str(predictor.runtime.dtype), "backend": str(runtime.backend)}


def run_concepts_video(spec_path: Path, result_path: Path) -> int:
    """The row ``spec_path`` describes, its result written atomically to ``result_path``."""
    from sam2serve.bench.worker import SPAWN_TIME_ENV, _peak_rss_mb
    from sam2serve.engine.video_io import read_frames

    spawn = float(os.environ.get(SPAWN_TIME_ENV, time.time()))
    spec = json.loads(spec_path.read_text(encoding="utf-8"))
    label = f"[{spec['model']} {spec['size']} {spec['mode']}]"
    if spec.get("threads"):
        torch.set_num_threads(spec["threads"])
    frames = read_frames(spec["frames_dir"]).frames
    costs: list[FrameCost]
    if spec["model"] == SAM3:
        sam3, precisions = _load_sam3(spec)
        load_s = time.time() - spawn
        print(f"{label} ready in {load_s:.1f} s", file=sys.stderr, flush=True)
        costs = measure_sam3(sam3, frames, spec["phrase"])
    else:
        sam2, precisions = _load_sam2(spec)
        load_s = time.time() - spawn
        print(f"{label} ready in {load_s:.1f} s", file=sys.stderr, flush=True)
        costs = measure_sam2(sam2, frames, spec["prompts"])
    for cost in costs:
        print(f"{label} frame {cost.frame}: {cost.seconds:.2f} s", file=sys.stderr, flush=True)
    result = {
        "frames": [asdict(cost) for cost in costs],
        "precisions": precisions,
        "load_s": load_s,
        "peak_rss_mib": _peak_rss_mb(),
        "threads": torch.get_num_threads(),
    }
    tmp = result_path.with_name(result_path.name + ".tmp")
    tmp.write_text(json.dumps(result), encoding="utf-8")
    os.replace(tmp, result_path)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m sam2serve.bench.concepts_video_worker SPEC.json RESULT.json``."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m sam2serve.bench.concepts_video_worker")
    parser.add_argument("spec", type=Path)
    parser.add_argument("result", type=Path)
    args = parser.parse_args(argv)
    return run_concepts_video(args.spec, args.result)


if __name__ == "__main__":
    sys.exit(main())
