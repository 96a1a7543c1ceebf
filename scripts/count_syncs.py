"""Count the host syncs of the tracker's frame step and of the image decode loop, per
stage, with :class:`sam2serve.runtime.sync_guard.SyncGuard` in counting mode (no GPU
needed: the guard sees the requests themselves).

    PYTHONPATH=. python scripts/count_syncs.py [--objects 3] [--frames 4]

Prints one table per path: requests per tracked frame (video) or per call (image), by
stage and kind. The tiny model with seeded random weights, small frames.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
from collections import Counter

import numpy as np
import torch

from sam2serve.checkpoint import random_state_dict
from sam2serve.config import get_config
from sam2serve.engine import amg as amg_module
from sam2serve.engine.amg import MaskGenerator
from sam2serve.engine.predictor import Predictor
from sam2serve.engine.video import VideoPredictor
from sam2serve.engine.video import predictor as video_module
from sam2serve.engine.video.outputs import object_masks
from sam2serve.modeling.sam2_video import SAM2Video
from sam2serve.runtime.sync_guard import SyncGuard
from sam2serve.samples import sample_clip


def staged(guard: SyncGuard, name: str, fn):
    @functools.wraps(fn)
    def run(*args, **kwargs):
        with guard.stage(name):
            return fn(*args, **kwargs)

    return run


def tiny(image_size: int) -> SAM2Video:
    """SAM 2.1 tiny, seeded random weights, at ``image_size`` (the counts do not depend on
    it: the same code runs; 256 is 16x less work than 1024)."""
    cfg = dataclasses.replace(get_config("tiny"), image_size=image_size)
    model = SAM2Video(cfg)
    model.load_state_dict(random_state_dict(cfg, 0, video=True))
    return model.eval()


def video_counts(objects: int, frames: int, image_size: int) -> tuple[Counter, int]:
    model = tiny(image_size)
    predictor = VideoPredictor(model)
    clip, _ = sample_clip(frames, (96, 128))
    state = predictor.init_state(clip)
    for obj in range(objects):
        # Prompts on different frames, so the objects' memory banks differ in length.
        predictor.add_points(state, obj % 2, obj + 1, [[20 + 10 * obj, 40]], [1])
    guard = SyncGuard(raise_on_sync=False)
    patches = {
        (predictor, "frame_features"): "frame features",
        (predictor, "_store"): "store",
        (predictor, "_to_video_size"): "to video size",
        (model, "condition_on_memory"): "memory attention",
        (model, "forward_heads"): "heads",
        (model, "encode_memory"): "memory encoder",
        (video_module, "gather_memories"): "memory bank",
        (video_module, "select_memories"): "memory selection",
    }
    for (owner, attr), name in patches.items():
        setattr(owner, attr, staged(guard, name, getattr(owner, attr)))
    predictor.commit_prompts(state)
    tracked = 0
    with guard:
        for frame in predictor.propagate(state, start_frame_idx=1):
            tracked += 1
            with guard.stage("hand-out (object_masks)"):
                object_masks(frame)
    return Counter((s.stage or "other", s.kind, s.where) for s in guard.syncs), tracked


def image_counts(image_size: int) -> dict[str, Counter]:
    model = tiny(image_size)
    image = np.random.default_rng(0).integers(0, 255, (96, 128, 3), dtype=np.uint8)
    out = {}
    for decoder in ("reference", "fast"):
        predictor = Predictor(model, decoder=decoder)
        embedding = predictor.encode(image)
        guard = SyncGuard(raise_on_sync=False)
        with guard:
            predictor.predict(embedding, [[30.0, 40.0], [60.0, 50.0]], [1, 0], boxes=None)
        out[f"predict ({decoder})"] = Counter((s.kind, s.where) for s in guard.syncs)
    predictor = Predictor(model, decoder="fast")
    generator = MaskGenerator(
        predictor, points_per_side=4, pred_iou_thresh=0.0, stability_score_thresh=0.0
    )
    guard = SyncGuard(raise_on_sync=False)
    generator._process_batch = staged(guard, "decoder loop", generator._process_batch)
    amg_module._nms = staged(guard, "nms", amg_module._nms)
    with guard:
        generator.generate(image)
    out["amg (fast, 16 clicks, 1 batch)"] = Counter(
        (s.stage or "other", s.kind, s.where) for s in guard.syncs
    )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--objects", type=int, default=3)
    parser.add_argument("--frames", type=int, default=4)
    parser.add_argument("--image-size", type=int, default=1024)
    args = parser.parse_args()
    torch.manual_seed(0)
    counts, tracked = video_counts(args.objects, args.frames, args.image_size)
    print(f"video: {args.objects} objects, {tracked} tracked frames; requests per frame")
    for (stage, kind, where), n in sorted(counts.items()):
        print(f"  {stage:24s} {kind:14s} {n / tracked:6.2f}  {where}")
    for name, counter in image_counts(args.image_size).items():
        print(name)
        for key, n in sorted(counter.items(), key=str):
            print(f"  {key}: {n}")


if __name__ == "__main__":
    main()
