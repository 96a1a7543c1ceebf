"""Meta's SAM 3 video model (``build_sam3_video_model``), reduced, run on a CPU: the oracle
of the SAM 3 video tests.

Imports nothing of sam2serve (``meta_video_oracle.py`` runs it with Meta's real stack).
What a CPU run of Meta's predictor needs (docs/concepts-video.md): ``.cuda()`` and
``pin_memory()`` as identities, the tracker features Meta casts to bfloat16 for its
all-gather rounded and handed on in float32 (a CPU refuses a bf16 input to fp32 convs),
its hard-coded 1008-pixel tracker sizes scaled with the detector's input, and decoded
frames given as the input batch (its cv2/decord loaders are not there).
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from unittest import mock

import numpy as np
import torch
from meta_sam3 import _override, _reduced, import_sam3

# Random weights score every query about 0.27 on every frame: thresholds just under the top
# scores let a few instances through and NMS keeps 2 on the first frame; tracks whose masks
# move off the (nearly static) detections go unmatched, and new detections appear on later
# frames. A short hot start (delay 3, 2 unmatched/duplicated frames) lets hot start remove
# tracks within the clip; everything else is Meta's default.
E2E_THRESHOLDS = {"score": 0.262, "new_det": 0.262, "hotstart_delay": 3}
E2E_THRESHOLDS |= {"hotstart_unmatch": 2, "hotstart_dup": 2}
META_NAMES = {
    "score": "score_threshold_detection",
    "new_det": "new_det_thresh",
    "hotstart_delay": "hotstart_delay",
    "hotstart_unmatch": "hotstart_unmatch_thresh",
    "hotstart_dup": "hotstart_dup_thresh",
}


@contextlib.contextmanager
def cpu_patches():
    """Meta's accelerator-only calls as identities on a CPU."""
    from sam3.model.sam3_image import Sam3ImageOnVideoMultiGPU
    from sam3.model.sam3_tracking_predictor import Sam3TrackerPredictor

    original_gather = Sam3ImageOnVideoMultiGPU._gather_tensor
    original_init = Sam3TrackerPredictor.init_state

    def init_state(self, *args, **kwargs):
        state = original_init(self, *args, **kwargs)
        state["storage_device"] = torch.device("cpu")  # Meta's default keeps it on "cuda"
        return state

    def gather(self, x):
        out, handle = original_gather(self, x)
        return [t.float() if t.dtype == torch.bfloat16 else t for t in out], handle

    with contextlib.ExitStack() as stack:
        stack.enter_context(mock.patch.object(torch.Tensor, "cuda", lambda self, *a, **k: self))
        stack.enter_context(
            mock.patch.object(torch.Tensor, "pin_memory", lambda self, *a, **k: self)
        )
        stack.enter_context(mock.patch.object(Sam3ImageOnVideoMultiGPU, "_gather_tensor", gather))
        stack.enter_context(mock.patch.object(Sam3TrackerPredictor, "init_state", init_state))
        yield


def build_meta_video_model(
    reduced: dict, bpe_path: Path, seed: int = 0, thresholds=None, shim=True
):
    """Meta's ``Sam3VideoInferenceWithInstanceInteractivity`` of ``reduced`` detector sizes
    (tracker sizes scaled to its input), eval, CPU, random init under ``seed``;
    ``thresholds``: keyword overrides of the video model's settings."""
    builder = import_sam3(shim)
    image_size = reduced["image_size"]
    mask_side = image_size // 14 * 16
    settings = dict(thresholds or {})
    tracker_patches = {
        "Sam3TrackerPredictor": _override(builder.Sam3TrackerPredictor, image_size=image_size),
        "SimpleMaskDownSampler": _override(
            builder.SimpleMaskDownSampler, interpol_size=[mask_side, mask_side]
        ),
        "PositionEmbeddingSine": _override(
            builder.PositionEmbeddingSine, precompute_resolution=None
        ),
        "Sam3VideoInferenceWithInstanceInteractivity": _override(
            builder.Sam3VideoInferenceWithInstanceInteractivity,
            image_size=image_size,
            **settings,
        ),
    }
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        with _reduced(builder, reduced), contextlib.ExitStack() as stack:
            for name, value in tracker_patches.items():
                stack.enter_context(mock.patch.object(builder, name, value))
            model = builder.build_sam3_video_model(
                bpe_path=str(bpe_path), load_from_HF=False, device="cpu"
            )
    return model.eval()


def meta_video_pair(seed: int = 1):
    """Meta's reduced video model with E2E_THRESHOLDS and random weights from ``seed``,
    and our predictor loaded strictly from the same tensors: ``(meta, ours)``."""
    from sam2serve.concepts.checkpoint import load_strict, meta_to_transformers
    from sam2serve.concepts.model import Sam3Size, build_model
    from sam2serve.concepts.runtime import randomize_
    from sam2serve.concepts.tokenizer import clip_bpe_path, load_tokenizer
    from sam2serve.concepts.tracker_heads import TrackerNeck, neck_state
    from sam2serve.concepts.video_association import VideoThresholds
    from sam2serve.concepts.video_predictor import Sam3VideoPredictor
    from sam2serve.concepts.video_tracker import Sam3Tracker, tracker_state

    size = Sam3Size.tiny()
    settings = {META_NAMES[k]: v for k, v in E2E_THRESHOLDS.items()}
    meta = build_meta_video_model(size.as_dict(), clip_bpe_path(), thresholds=settings)
    randomize_(meta, seed)
    state = meta.state_dict()
    detector = build_model(size)
    detector_state = {
        k: v for k, v in state.items() if k.startswith("detector.") and "sam2_convs" not in k
    }
    load_strict(detector, meta_to_transformers(detector_state))
    neck = TrackerNeck(size.vit_dim).eval()
    load_strict(neck, neck_state(state))
    tracker = Sam3Tracker(size.image_size).eval()
    tracker.load_state_dict(tracker_state(state), strict=True)
    th = VideoThresholds(**E2E_THRESHOLDS)
    return meta, Sam3VideoPredictor(detector, load_tokenizer(), neck, tracker, th)


def meta_track(model, pixels: torch.Tensor, height: int, width: int, phrase: str) -> list[dict]:
    """Meta's session: ``add_prompt`` (text) on frame 0, then ``propagate_in_video``
    forward; per frame (obj ids, probs, masks). ``pixels`` (T, 3, S, S) float32: the
    frames already preprocessed (our engine's preprocessing, so both see the same input)."""
    with cpu_patches(), torch.inference_mode():
        state = {
            "image_size": model.image_size,
            "num_frames": pixels.shape[0],
            "orig_height": height,
            "orig_width": width,
            "constants": {},
        }
        model._construct_initial_input_batch(state, pixels)
        state["tracker_inference_states"] = []
        state["tracker_metadata"] = {}
        state["feature_cache"] = {}
        state["cached_frame_outputs"] = {}
        state["action_history"] = []
        state["is_image_only"] = False
        model.add_prompt(state, frame_idx=0, text_str=phrase)
        frames = []
        for frame_idx, out in model.propagate_in_video(state, start_frame_idx=0, reverse=False):
            frames.append(
                {
                    "frame": int(frame_idx),
                    "obj_ids": [int(i) for i in out["out_obj_ids"]],
                    "probs": [float(p) for p in out["out_probs"]],
                    "masks": np.asarray(out["out_binary_masks"], dtype=bool),
                }
            )
    return frames
