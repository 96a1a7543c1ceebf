"""Meta's video session with clicks: ``add_prompt`` (a phrase) on a frame, its
``propagate_in_video`` passes, then ``add_prompt(points, point_labels, obj_id)`` clicks and
the passes again (partial: only the clicked objects run), on Meta's reduced video model
(``meta_sam3_video.build_meta_video_model``).

Imports nothing of sam2serve (the real-stack oracle can run it too).

One more CPU patch: a frame tracked with no object pointer (its group's conditioning
frames all later than it - a partial pass from frame 0 after a click on a later frame,
which drops the detector's conditioning frame nearby) hands Meta's memory attention its
bfloat16 memories alone, which a CPU refuses in float32 layers (CUDA's autocast takes
them); with pointers, ``torch.cat`` promotes them to float32. The oracle promotes them in
that case too (what we compute in every case)."""

from __future__ import annotations

import contextlib
from unittest import mock

import torch
from meta_sam3_video import cpu_patches
from meta_video_prompts import _empty_fill_holes, _frame, _initial_state

DIRECTIONS = {"forward": [False], "backward": [True], "both": [False, True]}


@contextlib.contextmanager
def _float_memories():
    from sam3.model.decoder import TransformerEncoderCrossAttention

    original = TransformerEncoderCrossAttention.forward

    def forward(self, *args, **kwargs):
        if kwargs.get("prompt") is not None and kwargs["prompt"].dtype == torch.bfloat16:
            kwargs["prompt"] = kwargs["prompt"].float()
        return original(self, *args, **kwargs)

    with mock.patch.object(TransformerEncoderCrossAttention, "forward", forward):
        yield


def meta_click_session(
    model,
    pixels: torch.Tensor,
    height: int,
    width: int,
    frame_idx: int,
    phrase: str,
    direction: str,
    clicks: list[tuple[int, int, list[list[float]], list[int]]],
) -> tuple[list[dict], list[dict], list[dict]]:
    """(the first passes' frames, each click's answer, the passes after the clicks), each
    frame as (frame, obj ids, probs, masks) in Meta's order. ``clicks``: (frame, obj id,
    points as [x, y] relative to the video's size, labels)."""
    with cpu_patches(), _empty_fill_holes(), _float_memories(), torch.inference_mode():
        state = _initial_state(model, pixels, height, width)
        model.add_prompt(state, frame_idx=frame_idx, text_str=phrase)
        first, answers, second = [], [], []
        for reverse in DIRECTIONS[direction]:
            for t, out in model.propagate_in_video(
                state, start_frame_idx=frame_idx, reverse=reverse
            ):
                first.append(_frame(t, out))
        for t, obj, points, labels in clicks:
            got, out = model.add_prompt(
                state, frame_idx=t, points=points, point_labels=labels, obj_id=obj
            )
            answers.append(_frame(got, out))
        for reverse in DIRECTIONS[direction]:
            for t, out in model.propagate_in_video(
                state, start_frame_idx=frame_idx, reverse=reverse
            ):
                second.append(_frame(t, out))
    return first, answers, second
