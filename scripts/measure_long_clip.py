"""One-off measurements behind docs/video.md's "Long clips" section (not part of the suite).

``rss``: a synthetic 1080p clip made with PyAV, tracked from a file decoded on demand
(VideoFileFrames) in bounded and in exact retention, the process's RSS read every 50
frames. The network is replaced by outputs of its real sizes (per object and frame: the
memory features 64x64x64 bf16, the mask logits 256x256 fp32, the object pointer; per
frame: 16 MiB of encoder features into the FeatureCache), so what is measured is what a
run holds from frame to frame (decoder window, cached features, retained outputs, each
frame's masks upscaled to 1080p and run-length encoded), at a cost this CPU can pay for
hundreds of frames (the tiny network takes seconds a frame here). The network's own
activations are transient: they raise the peak by a constant, not the slope.

``iou``: the real network (tiny, seeded random weights: no real weights here) on a small
clip prompted mid-way, forward then reverse: exact retention against bounded (the state
after the forward pass pruned as bounded mode prunes it), per-frame mask IoU of the
reverse pass, where bounded mode can differ.

    PYTHONPATH=. python scripts/measure_long_clip.py rss --frames 600 --out /tmp/clip.mp4
    PYTHONPATH=. python scripts/measure_long_clip.py iou --frames 40 --prompt-frame 10
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import time
from pathlib import Path

import numpy as np
import torch


def rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def make_clip(path: Path, frames: int, width: int = 1920, height: int = 1080) -> None:
    import av

    yy, xx = np.mgrid[0:height, 0:width]
    background = ((xx * 255 // width) ^ (yy * 255 // height)).astype(np.uint8)
    with av.open(str(path), mode="w") as container:
        stream = container.add_stream("libx264", rate=30)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        stream.options = {"preset": "ultrafast"}
        for i in range(frames):
            frame = np.repeat(background[..., None], 3, axis=2)
            x = int((width - 300) * (0.5 + 0.5 * np.sin(i / 40)))
            frame[300:600, x : x + 300] = (220, 40, 40)
            for packet in stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)


def real_size_stub(model):
    from sam2serve.engine.video.frames import preprocess_frame
    from sam2serve.engine.video.predictor import VideoPredictor
    from sam2serve.engine.video.state import FrameOutput

    class RealSizeStub(VideoPredictor):
        def frame_features(self, state, frame_idx):
            features = state.features.get(frame_idx)
            if features is None:
                preprocess_frame(state.source.frame(frame_idx), self.model.image_size)
                features = (
                    torch.zeros(1, 256, 64, 64),
                    torch.zeros(1, 32, 256, 256),
                    torch.zeros(1, 64, 128, 128),
                )
                state.features.put(frame_idx, features)
            return features

        def _track_frame(self, state, tracks, frame_idx, **kwargs):
            self.frame_features(state, frame_idx)
            batch = len(tracks)
            low_res = torch.randn(batch, 1, 256, 256)
            outputs = [
                FrameOutput(
                    low_res[i : i + 1].clone(),
                    torch.zeros(1, 256),
                    torch.ones(1, 1),
                    torch.zeros(1, 64, 64, 64, dtype=torch.bfloat16),
                )
                for i in range(batch)
            ]
            return outputs, low_res

    return RealSizeStub(model)


def measure_rss(args: argparse.Namespace) -> None:
    from sam2serve.checkpoint import load_video_model
    from sam2serve.engine.video.outputs import object_masks
    from sam2serve.engine.video.retention import retained_entries
    from sam2serve.engine.video.sources import VideoFileFrames

    path = Path(args.out)
    if not path.exists():
        started = time.perf_counter()
        make_clip(path, args.frames)
        print(json.dumps({"clip": str(path), "made_s": round(time.perf_counter() - started, 1)}))
    predictor = real_size_stub(load_video_model("tiny", random_weights=True, seed=0))
    for retention in args.retention:
        gc.collect()
        source = VideoFileFrames(path, window=4, max_frames=None)
        state = predictor.init_state(source, retention=retention)
        for obj_id, x in ((1, 400), (2, 1400)):
            predictor.add_points(state, 0, obj_id, [[x, 450]], [1])
        base = rss_mib()
        started = time.perf_counter()
        rows = []
        for frame in predictor.propagate(state):
            object_masks(frame)  # what a sink writes: RLE at 1080p
            n = frame.frame_idx + 1
            if n % 50 == 0 or n == len(source):
                gc.collect()
                rows.append((n, rss_mib()))
                print(
                    json.dumps(
                        {
                            "retention": retention,
                            "frames": n,
                            "rss_mib": round(rows[-1][1], 1),
                            "retained_entries": retained_entries(state),
                            "tracking_mib": round(state.memory_bytes() / 2**20, 1),
                            "source_held_frames": source.held_frames(),
                        }
                    ),
                    flush=True,
                )
        xs, ys = np.array([r[0] for r in rows[1:]]), np.array([r[1] for r in rows[1:]])
        slope = float(np.polyfit(xs, ys, 1)[0]) if len(xs) > 1 else float("nan")
        print(
            json.dumps(
                {
                    "retention": retention,
                    "summary": True,
                    "frames": len(source),
                    "rss_before_mib": round(base, 1),
                    "rss_last_mib": round(rows[-1][1], 1),
                    "slope_mib_per_frame": round(slope, 4),
                    "slope_mib_per_10min_30fps": round(slope * 18000, 1),
                    "seconds": round(time.perf_counter() - started, 1),
                }
            ),
            flush=True,
        )
        source.close()
        del state


def mask_iou(a: np.ndarray, b: np.ndarray) -> float:
    union = np.logical_or(a, b).sum()
    return 1.0 if union == 0 else float(np.logical_and(a, b).sum() / union)


def measure_iou(args: argparse.Namespace) -> None:
    from sam2serve.checkpoint import load_video_model
    from sam2serve.engine.video.predictor import VideoPredictor
    from sam2serve.engine.video.retention import Retention
    from sam2serve.samples import sample_clip

    frames, _ = sample_clip(args.frames, (120, 160))
    predictor = VideoPredictor(
        load_video_model("tiny", random_weights=True, seed=1), feature_cache_frames=args.frames
    )
    state = predictor.init_state(frames)
    predictor.add_points(state, args.prompt_frame, 1, [[40, 60]], [1])
    predictor.add_points(state, args.prompt_frame, 2, [[120, 60]], [1])
    started = time.perf_counter()
    forward = list(predictor.propagate(state, start_frame_idx=args.prompt_frame))
    print(json.dumps({"forward_frames": len(forward), "s": round(time.perf_counter() - started)}))
    bounded = copy.deepcopy(state)
    bounded.retention = Retention("bounded")
    bounded.retention.after_frame(bounded, forward[-1].frame_idx, False, predictor.config)
    results = {}
    for name, st in (("exact", state), ("bounded", bounded)):
        results[name] = {
            f.frame_idx: f.masks.numpy()
            for f in predictor.propagate(st, start_frame_idx=args.prompt_frame, reverse=True)
        }
    ious = []
    for frame_idx in sorted(results["exact"]):
        for row in range(2):
            ious.append(
                (
                    frame_idx,
                    row,
                    mask_iou(results["exact"][frame_idx][row], results["bounded"][frame_idx][row]),
                )
            )
    values = np.array([iou for _, _, iou in ious])
    print(
        json.dumps(
            {
                "reverse_frames": len(results["exact"]),
                "iou_mean": round(float(values.mean()), 4),
                "iou_min": round(float(values.min()), 4),
                "frames_differing": sorted({f for f, _, iou in ious if iou < 1.0}),
                "per_frame": [(f, r, round(i, 4)) for f, r, i in ious],
                "dropped": bounded.retention.dropped,
            }
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="what", required=True)
    rss = sub.add_parser("rss")
    rss.add_argument("--frames", type=int, default=600)
    rss.add_argument("--out", default="/tmp/long_clip_1080p.mp4")
    rss.add_argument("--retention", nargs="+", default=["bounded", "exact"])
    iou = sub.add_parser("iou")
    iou.add_argument("--frames", type=int, default=40)
    iou.add_argument("--prompt-frame", type=int, default=10)
    args = parser.parse_args()
    torch.set_num_threads(2)
    measure_rss(args) if args.what == "rss" else measure_iou(args)


if __name__ == "__main__":
    main()
