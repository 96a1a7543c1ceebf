"""Several phrases in one SAM 3 video run: Meta's video predictor once per phrase, one ViT
pass per frame for all of them.

Meta's ``Sam3VideoPredictor`` takes one text prompt per session. Here each phrase keeps its
own :class:`~sam2serve.concepts.video_predictor.VideoState` - its detections, tracks, hot
start, ids and limits exactly as a run of that phrase alone - and every frame is encoded
once (:meth:`Sam3VideoPredictor.encode`: the detector's encoding and the tracker's
features) and then stepped by each phrase in turn. The answers are merged per frame:

- ids: phrase ``k`` of ``n``'s object ``i`` (Meta's id in that phrase's run) is
  ``i * n + k`` (:func:`merged_id`), so ids never collide, the phrase of an id is
  ``id % n``, and with one phrase the ids are Meta's;
- each object carries its phrase and its own run's score, mask and box, unchanged;
- a phrase's objects never overlap each other (Meta's per-pixel resolution by tracker
  score), but objects of different phrases may ("dog" and "animal" may both claim a pixel):
  the phrases are independent sessions, as Meta's would be.

The object limit (``VideoThresholds.max_objects``) and the bounded state are per phrase:
n phrases hold at most n times one phrase's objects.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from sam2serve.concepts.engine import ConceptEncoding, ExemplarBox
from sam2serve.concepts.video_predictor import (
    FrameResult,
    Sam3VideoPredictor,
    VideoState,
    hotstart_release,
)
from sam2serve.concepts.video_prompts import Direction, passes
from sam2serve.concepts.video_tracker import TrackerFrame

if TYPE_CHECKING:
    from sam2serve.concepts.video_predictor import _Pending

STAGES = ("detector", "tracker", "association")


def merged_id(meta_id: int, phrase: int, count: int) -> int:
    """The run's id of object ``meta_id`` of phrase ``phrase`` (of ``count``)."""
    return meta_id * count + phrase


def check_phrases(phrases: Sequence[str]) -> list[str]:
    """At least one phrase, none twice (ValueError naming the repeated one); each phrase's
    own rule is :func:`~sam2serve.concepts.video_prompts.check_video_prompt`'s."""
    if not phrases:
        raise ValueError("give at least one phrase")
    for i, phrase in enumerate(phrases):
        if phrase in phrases[:i]:
            raise ValueError(f"phrase {phrase!r} is given twice")
    return list(phrases)


@dataclass(frozen=True)
class PhrasesFrame:
    """One frame's objects of every phrase, ascending ids: each object's phrase, detection
    score, binary mask at the video's size and xyxy box (pixels)."""

    frame: int
    obj_ids: list[int]
    phrases: list[str]
    scores: list[float]
    masks: np.ndarray  # bool (K, H, W)
    boxes: list[tuple[float, float, float, float]]


@dataclass
class PhrasesState:
    """One :class:`VideoState` per phrase, in the phrases' order."""

    phrases: list[str]
    states: list[VideoState]
    encode_seconds: float = 0.0  # the shared ViT passes (counted under "detector")

    def phrase_of(self, obj_id: int) -> str:
        return self.phrases[obj_id % len(self.phrases)]

    def score_of(self, obj_id: int) -> float:
        """The detection score the object appeared with (Meta's, of its phrase's run)."""
        count = len(self.phrases)
        return self.states[obj_id % count].scores[obj_id // count]

    @property
    def stage_seconds(self) -> dict[str, float]:
        """Wall seconds per stage over every phrase (the shared encoding once)."""
        total = {stage: sum(s.stage_seconds[stage] for s in self.states) for stage in STAGES}
        total["detector"] += self.encode_seconds
        return total


def start_phrases(
    predictor: Sam3VideoPredictor,
    num_frames: int,
    height: int,
    width: int,
    phrases: Sequence[str],
    boxes: Sequence[ExemplarBox] = (),
) -> PhrasesState:
    """A clip's state for several phrases (each with ``boxes``, as
    :meth:`Sam3VideoPredictor.start`; ValueError names a bad or repeated phrase)."""
    checked = check_phrases(phrases)
    states = [predictor.start(num_frames, height, width, p, boxes) for p in checked]
    return PhrasesState(checked, states)


def merge(state: PhrasesState, results: Sequence[FrameResult]) -> PhrasesFrame:
    """One frame's answers (one per phrase, in order) as one, ascending merged ids."""
    count = len(state.phrases)
    rows = [
        (merged_id(obj, k, count), k, row)
        for k, result in enumerate(results)
        for row, obj in enumerate(result.obj_ids)
    ]
    rows.sort()
    frame = results[0].frame
    height, width = state.states[0].height, state.states[0].width
    masks = [results[k].masks[row] for _, k, row in rows]
    return PhrasesFrame(
        frame,
        [obj for obj, _, _ in rows],
        [state.phrases[k] for _, k, _ in rows],
        [results[k].scores[row] for _, k, row in rows],
        np.stack(masks) if masks else np.zeros((0, height, width), bool),
        [results[k].boxes[row] for _, k, row in rows],
    )


def run_phrases(
    predictor: Sam3VideoPredictor,
    state: PhrasesState,
    frames: Iterable[np.ndarray],
    start: int = 0,
) -> Iterator[PhrasesFrame]:
    """:meth:`Sam3VideoPredictor.run` for every phrase at once: the prompt on frame
    ``start`` (not yielded), then forward to the end; ``frames`` yields frame ``start``
    first."""
    numbered = ((start + index, frame) for index, frame in enumerate(frames))
    return _propagate(predictor, state, numbered, False, prompt=True)


@torch.inference_mode()
def propagate_phrases(
    predictor: Sam3VideoPredictor,
    state: PhrasesState,
    frame_at: Callable[[int], np.ndarray],
    start: int,
    direction: Direction = "forward",
) -> Iterator[PhrasesFrame]:
    """:meth:`Sam3VideoPredictor.propagate_clip` for every phrase at once (Meta's passes,
    in its order of frames)."""
    first = state.states[0]
    plan = passes(first.num_frames, start, direction)
    if direction == "both" and not plan[1].fetch:
        for phrase_state in state.states:
            phrase_state.keep_start = True
    for index, step in enumerate(plan):
        if step.fetch:  # frames no pass has processed: no cached output (Meta's fetch)
            for frame_idx in step.frames:
                yield _empty(state, frame_idx)
            continue
        if index == 0 and step.reverse:  # backward only: add_prompt first
            encoding, tracker_frame = _encode(predictor, state, frame_at(start))
            for phrase_state in state.states:
                phrase_state.prompt_frame = start
                predictor.step(phrase_state, start, encoding, tracker_frame)
        frames = ((t, frame_at(t)) for t in step.frames)
        yield from _propagate(
            predictor, state, frames, step.reverse, prompt=index == 0 and not step.reverse
        )


def _encode(
    predictor: Sam3VideoPredictor, state: PhrasesState, frame: np.ndarray
) -> tuple[ConceptEncoding, TrackerFrame]:
    tick = time.perf_counter()
    encoded = predictor.encode(frame)
    state.encode_seconds += time.perf_counter() - tick
    return encoded


def _empty(state: PhrasesState, frame_idx: int) -> PhrasesFrame:
    first = state.states[0]
    return PhrasesFrame(frame_idx, [], [], [], np.zeros((0, first.height, first.width), bool), [])


@torch.inference_mode()
def _propagate(
    predictor: Sam3VideoPredictor,
    state: PhrasesState,
    frames: Iterable[tuple[int, np.ndarray]],
    reverse: bool,
    prompt: bool,
) -> Iterator[PhrasesFrame]:
    """``Sam3VideoPredictor._propagate`` over every phrase: one encoding per frame, then
    each phrase's step; answers held back ``hotstart_delay`` frames (the same for every
    phrase, so their frames come out together), each finished by its phrase as soon as
    its own run would finish it."""
    delay = predictor.th.hotstart_delay
    pending: list[list[_Pending]] = []  # per held frame, each phrase's pending answer
    end = 0 if reverse else state.states[0].num_frames - 1
    for frame_idx, frame in frames:
        encoding, tracker_frame = _encode(predictor, state, frame)
        held: list[_Pending] = []
        for phrase_state in state.states:
            if prompt:
                phrase_state.prompt_frame = frame_idx
                predictor.step(phrase_state, frame_idx, encoding, tracker_frame)  # add_prompt
            held.append(predictor.step(phrase_state, frame_idx, encoding, tracker_frame, reverse))
        prompt = False
        pending.append(held)
        ready, pending = hotstart_release(pending, delay, frame_idx == end)
        for items in ready:
            yield _finish(predictor, state, items)
    for items in pending:  # a source shorter than announced
        yield _finish(predictor, state, items)


def _finish(
    predictor: Sam3VideoPredictor, state: PhrasesState, items: Sequence[_Pending]
) -> PhrasesFrame:
    results = []
    for phrase_state, item in zip(state.states, items, strict=True):
        tick = time.perf_counter()
        results.append(predictor.finish(phrase_state, item))
        phrase_state.clock("association", tick)
    return merge(state, results)


__all__ = [
    "PhrasesFrame",
    "PhrasesState",
    "check_phrases",
    "merge",
    "merged_id",
    "propagate_phrases",
    "run_phrases",
    "start_phrases",
]
