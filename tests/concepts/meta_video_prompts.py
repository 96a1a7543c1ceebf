"""Meta's video session with any prompt and direction: ``add_prompt`` (text and/or one box)
on a frame, then ``Sam3VideoPredictor.propagate_in_video``'s passes (forward, backward or
both), on Meta's reduced video model (``meta_sam3_video.build_meta_video_model``).

Imports nothing of sam2serve (the real-stack oracle can run it too)."""

from __future__ import annotations

import numpy as np
import torch
from meta_sam3_video import cpu_patches


def _initial_state(model, pixels: torch.Tensor, height: int, width: int) -> dict:
    """Meta's ``init_state`` on frames already preprocessed (``pixels`` (T, 3, S, S))."""
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
    return state


def _frame(frame_idx, out) -> dict:
    return {
        "frame": int(frame_idx),
        "obj_ids": [int(i) for i in out["out_obj_ids"]],
        "probs": [float(p) for p in out["out_probs"]],
        "masks": np.asarray(out["out_binary_masks"], dtype=bool),
    }


def meta_session(
    model,
    pixels: torch.Tensor,
    height: int,
    width: int,
    frame_idx: int,
    phrase: str | None,
    box_xywh: list[float] | None,
    positive: bool,
    direction: str,
) -> list[dict]:
    """Per frame in the order Meta yields them: (frame, obj ids, probs, masks).
    ``box_xywh``: normalised (x, y, w, h) of the one exemplar box, as Meta takes it."""
    with cpu_patches(), torch.inference_mode():
        state = _initial_state(model, pixels, height, width)
        model.add_prompt(
            state,
            frame_idx=frame_idx,
            text_str=phrase,
            boxes_xywh=None if box_xywh is None else [box_xywh],
            box_labels=None if box_xywh is None else [int(positive)],
        )
        frames = []
        passes = {"forward": [False], "backward": [True], "both": [False, True]}[direction]
        for reverse in passes:
            for t, out in model.propagate_in_video(
                state, start_frame_idx=frame_idx, reverse=reverse
            ):
                frames.append(_frame(t, out))
    return frames
