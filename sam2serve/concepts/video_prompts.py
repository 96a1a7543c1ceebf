"""What SAM 3's video predictor accepts as a prompt, and the order it visits frames in:
Meta's ``Sam3VideoInference.add_prompt`` and ``propagate_in_video`` rules, as plain values.

A prompt is a phrase, one exemplar box, or both, on one frame. Meta's ``add_prompt`` takes
the first box on a frame that has no output yet as its *visual prompt* and refuses more
than one there (``_get_visual_prompt``); since a text or box prompt resets the session,
that is every box prompt: one box. Without a phrase the detector reads the stand-in text
``"visual"`` and only the prompt frame may add objects (``allow_new_detections``); the
phrase ``"visual"`` itself counts as no phrase, as in Meta's ``add_prompt``.

Directions are those of Meta's ``Sam3VideoPredictor.propagate_in_video``: ``forward``
(the prompt frame to the end), ``backward`` (the frame before the prompt frame down to 0;
the prompt frame's own answer is ``add_prompt``'s, not propagation's) and ``both``
(forward, then backward). Meta's instance-interactive model decides the second pass of
``both`` from its action history: after a forward pass from frame 0 or from the last
frame it *fetches* cached outputs instead of running, and a backward pass from the last
frame has none, so those frames come out empty (:func:`passes` names this ``fetch``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from sam2serve.concepts.engine import ExemplarBox
from sam2serve.concepts.phrases import VISUAL_PHRASE, check_box

Direction = Literal["forward", "backward", "both"]
DIRECTIONS: tuple[Direction, ...] = ("forward", "backward", "both")


def check_direction(value: str) -> Direction:
    """``value`` as a direction, or ValueError naming it."""
    if value not in DIRECTIONS:
        raise ValueError(f"direction must be one of {', '.join(DIRECTIONS)}; got {value!r}")
    return value  # narrowed by the membership test


def check_video_prompt(
    phrase: str | None, boxes: Sequence[ExemplarBox], width: int, height: int
) -> tuple[str | None, ExemplarBox | None]:
    """(phrase or None, the exemplar box or None) of a video prompt on a ``width`` x
    ``height`` video, or ValueError naming what is wrong: neither given, more than one
    box (Meta's limit), a box not inside the frame or with no area. The phrase
    ``"visual"`` is no phrase."""
    # Meta's add_prompt reads the phrase "visual" as no phrase (its stand-in text)
    text = phrase if phrase and phrase != VISUAL_PHRASE else None
    if len(boxes) > 1:
        raise ValueError(
            f"SAM 3's video predictor takes one exemplar box per prompt (Meta's visual "
            f"prompt); got {len(boxes)}"
        )
    if text is None and not boxes:
        raise ValueError("give a phrase or one exemplar box")
    if not boxes:
        return text, None
    box = boxes[0]
    check_box(box.xyxy, (height, width))  # the image path's rule and message
    return text, box


@dataclass(frozen=True)
class Pass:
    """One ``propagate_in_video`` call: the frames in the order visited, whether it runs
    in reverse, and whether it only fetches cached outputs (Meta's
    ``propagation_fetch``: nothing runs; frames never processed come out empty)."""

    frames: range
    reverse: bool
    fetch: bool = False


def passes(num_frames: int, start: int, direction: Direction) -> list[Pass]:
    """The propagation passes after a prompt on frame ``start`` (Meta's
    ``_get_processing_order`` and ``parse_action_history_for_propagation``)."""
    if not 0 <= start < num_frames:
        raise ValueError(f"prompt frame {start} is outside the clip's 0..{num_frames - 1}")
    forward = Pass(range(start, num_frames), False)
    backward = range(start - 1, -1, -1)
    if direction == "forward":
        return [forward]
    if direction == "backward":
        return [Pass(backward, True)]
    fetch = start in (0, num_frames - 1)
    return [forward, Pass(backward, True, fetch)]


__all__ = [
    "DIRECTIONS",
    "Direction",
    "Pass",
    "check_direction",
    "check_video_prompt",
    "passes",
]
