"""Meta's video session with any prompt and direction: ``add_prompt`` (text and/or one box)
on a frame, then ``Sam3VideoPredictor.propagate_in_video``'s passes (forward, backward or
both), on Meta's reduced video model (``meta_sam3_video.build_meta_video_model``).

Imports nothing of sam2serve (the real-stack oracle can run it too).

One more CPU patch than ``meta_sam3_video.cpu_patches``: Meta's ``build_outputs`` hole-fills
the masks of the frame's new detections even when there are none, and its CPU connected
components (``torch.stack`` of an empty list) refuse an empty batch; that happens on every
frame after the prompt frame of a box-only prompt. An empty batch is answered with itself
(what filling holes in no mask gives), any other batch by Meta's function."""

from __future__ import annotations

import contextlib
from unittest import mock

import numpy as np
import torch
from meta_sam3_video import cpu_patches


@contextlib.contextmanager
def _empty_fill_holes():
    from sam3.model import sam3_video_base

    original = sam3_video_base.fill_holes_in_mask_scores

    def fill(mask, *args, **kwargs):
        return mask if mask.shape[0] == 0 else original(mask, *args, **kwargs)

    with mock.patch.object(sam3_video_base, "fill_holes_in_mask_scores", fill):
        yield


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
    with cpu_patches(), _empty_fill_holes(), torch.inference_mode():
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
