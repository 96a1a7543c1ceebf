"""Track objects through a video with a `sam2serve export --format onnx --video` directory,
using only onnxruntime, numpy and Pillow (no sam2serve, no torch).

    python onnx_video_loop.py EXPORT_DIR FRAME.png [FRAME.png ...] \
        --click X Y --box X0 Y0 X1 Y1 --out masks.npz

Each --click or --box prompts one object on the first frame (the video's pixels); the
objects are tracked forward to the last frame with SAM 2.1's memory rules (Meta's
SAM2VideoPredictor). masks.npz holds "logits" (frames, objects, 1, H, W): a mask is
logits > 0.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnxruntime as ort
from PIL import Image


class OnnxTracker:
    def __init__(self, directory: str, providers: tuple[str, ...] = ("CPUExecutionProvider",)):
        directory_path = Path(directory)
        manifest = json.loads((directory_path / "manifest.json").read_text())
        self.rules = manifest["video"]["tracking"]
        options = ort.SessionOptions()
        options.log_severity_level = 3  # shape-merge warnings on load are noise

        def session(name: str) -> ort.InferenceSession:
            path = str(directory_path / name)
            return ort.InferenceSession(path, options, providers=list(providers))

        self.frame_encoder = session("frame_encoder.onnx")
        self.memory_attention = session("memory_attention.onnx")
        self.decoder = session("video_decoder.onnx")
        self.memory_encoder = session("memory_encoder.onnx")

    def encode(self, frame: np.ndarray) -> dict[str, np.ndarray]:
        """uint8 (H, W, 3) -> the frame's features, by name (the video path's preprocessing:
        PIL resize of the uint8 frame, then normalise)."""
        size = self.rules["image_size"]
        resized = np.asarray(Image.fromarray(frame).resize((size, size)))
        pixels = (resized / 255.0).astype(np.float32).transpose(2, 0, 1)
        mean = np.array(self.rules["mean"], np.float32)[:, None, None]
        std = np.array(self.rules["std"], np.float32)[:, None, None]
        outputs = self.frame_encoder.run(None, {"image": ((pixels - mean) / std)[None]})
        return {o.name: value for o, value in zip(self.frame_encoder.get_outputs(), outputs)}

    def decode(
        self,
        features: dict[str, np.ndarray],
        image_embed: np.ndarray,
        coords: np.ndarray,
        labels: np.ndarray,
        size: tuple[int, int],
    ) -> list[np.ndarray]:
        """SAM heads for B objects (points (B, N, 2) in the 1024 frame, labels (B, N)) ->
        masks (B, 1, H, W) at ``size``, low-res logits, object pointers, object scores."""
        low, high = self.rules["multimask_points"]
        return self.decoder.run(
            None,
            {
                "image_embed": image_embed,
                "high_res_feats_0": features["high_res_feats_0"],
                "high_res_feats_1": features["high_res_feats_1"],
                "point_coords": coords,
                "point_labels": labels,
                "mask_input": np.zeros((1, 1, 256, 256), np.float32),
                "has_mask_input": np.zeros(1, np.float32),
                "multimask_output": np.array(low <= labels.shape[1] <= high),
                "orig_im_size": np.array(size, np.int64),
            },
        )

    def remember(
        self,
        features: dict[str, np.ndarray],
        low_res: np.ndarray,
        scores: np.ndarray,
        from_points: bool,
    ) -> np.ndarray:
        """The memories (B, 64, 64, 64) of B objects' masks on a frame."""
        feeds = {
            "vision_feats": features["vision_feats"],
            "low_res_masks": low_res,
            "object_score_logits": scores,
            "mask_from_points": np.array(from_points),
        }
        return self.memory_encoder.run(None, feeds)[0]

    def track(
        self, frames: list[np.ndarray], prompts: list[tuple[np.ndarray, np.ndarray]]
    ) -> Iterator[tuple[int, np.ndarray]]:
        """Objects prompted on frame 0 (per object: points (P, 2) in pixels and labels (P,):
        1 / 0 clicks, 2 / 3 a box's corners) -> (frame index, logits (objects, 1, H, W))."""
        rules = self.rules
        height, width = frames[0].shape[:2]
        scale = np.array([width, height], np.float32)
        features = self.encode(frames[0])
        outputs = []
        for points, labels in prompts:  # one object at a time: their point counts differ
            coords = (np.asarray(points, np.float32) / scale) * np.float32(rules["image_size"])
            point_labels = np.asarray(labels, np.float32)[None]
            outputs.append(
                self.decode(
                    features, features["image_embed"], coords[None], point_labels, (height, width)
                )
            )
        masks, low_res, obj_ptr, scores = (np.concatenate(parts) for parts in zip(*outputs))
        # Per tracked frame: its memories and object pointers (frame 0: the prompted one).
        memories = {0: self.remember(features, low_res, scores, from_points=True)}
        pointers = {0: obj_ptr}
        yield 0, masks

        num_maskmem, stride = rules["num_maskmem"], rules["memory_temporal_stride"]
        max_ptrs = min(len(frames), rules["max_obj_ptrs_in_encoder"])
        keep = max(num_maskmem * stride, max_ptrs)  # how far back a frame can reach
        objects = len(prompts)
        for t in range(1, len(frames)):
            features = self.encode(frames[t])
            # Memory bank: the prompted frame, then the num_maskmem - 1 frames before t,
            # oldest first, each in the temporal-embedding slot of its distance.
            bank = [(rules["prompted_memory_tpos_index"], 0)]
            for t_rel in range(num_maskmem - 1, 0, -1):
                prev = t - 1 if t_rel == 1 else ((t - 2) // stride - (t_rel - 2)) * stride
                if prev >= 1:
                    bank.append((t_rel - 1, prev))
            # Object pointers: the prompted frame's, then up to max_ptrs - 1 frames before t,
            # nearest first, at their frame distance over the largest one.
            ptrs = [(t, 0)] + [(d, t - d) for d in range(1, max_ptrs) if t - d >= 1]
            (conditioned,) = self.memory_attention.run(
                None,
                {
                    "vision_feats": features["vision_feats"],
                    "memory_features": np.stack([memories[f] for _, f in bank], axis=1),
                    "memory_tpos_index": np.array([slot for slot, _ in bank], np.int64),
                    "obj_ptrs": np.stack([pointers[f] for _, f in ptrs], axis=1),
                    "obj_ptr_tpos": np.array([d for d, _ in ptrs], np.float32)
                    / np.float32(max_ptrs - 1),
                },
            )
            # A tracked frame has no clicks: one padding point (label -1) per object.
            no_points = np.zeros((objects, 1, 2), np.float32)
            no_labels = np.full((objects, 1), -1, np.float32)
            masks, low_res, obj_ptr, scores = self.decode(
                features, conditioned, no_points, no_labels, (height, width)
            )
            memories[t] = self.remember(features, low_res, scores, from_points=False)
            pointers[t] = obj_ptr
            for old in [f for f in memories if 0 < f <= t - keep]:
                del memories[old], pointers[old]
            yield t, masks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("export_dir")
    parser.add_argument("frames", nargs="+", help="the video's frames, in order")
    prompt = {"action": "append", "dest": "objects", "type": float}
    parser.add_argument("--click", nargs=2, metavar=("X", "Y"), **prompt)
    parser.add_argument("--box", nargs=4, metavar=("X0", "Y0", "X1", "Y1"), **prompt)
    parser.add_argument("--out", default="masks.npz")
    args = parser.parse_args()
    if not args.objects:
        parser.error("prompt at least one object: --click X Y or --box X0 Y0 X1 Y1")
    prompts = [
        (np.reshape(obj, (-1, 2)), np.array([1] if len(obj) == 2 else [2, 3]))
        for obj in args.objects
    ]
    frames = [np.asarray(Image.open(path).convert("RGB")) for path in args.frames]
    tracker = OnnxTracker(args.export_dir)
    started, logits = time.perf_counter(), []
    for frame_idx, masks in tracker.track(frames, prompts):
        logits.append(masks)
        areas = ", ".join(str(int((m > 0).sum())) for m in masks)
        print(f"frame {frame_idx}: mask areas {areas}", flush=True)
    seconds = time.perf_counter() - started
    print(f"{len(frames)} frames in {seconds:.1f} s ({len(frames) / seconds:.3f} frames/s)")
    np.savez(args.out, logits=np.stack(logits))


if __name__ == "__main__":
    main()
