"""SAM 3's video predictor pushed one frame at a time: for frames that arrive as they are
made (a live session), where :meth:`Sam3VideoPredictor.run` pulls them from a clip.

A :class:`Sam3Stream` holds one prompt's :class:`~sam2serve.concepts.video_predictor.VideoState`
and the frames processed but not yet let out. :meth:`Sam3Stream.push` runs the predictor's
own steps on a frame (encode, then Meta's ``_det_track_one_frame``; on the first frame
``add_prompt`` first) and returns the answers hot start lets out now; :meth:`Sam3Stream.flush`
lets out the rest at the end of the stream. Pushed frames answer exactly as ``run`` on the
same frames with a state whose clip has :data:`OPEN_ENDED` frames (a clip of 16 frames or
more answers the same: the frame count only caps memory reach at 16). What the state holds
stays bounded on an endless stream as on a clip (the predictor's ``bounded`` trimming), and
hot start's per-frame counts of objects it can no longer remove are dropped.

A :class:`PhrasesStream` is several phrases' streams over one ViT pass per frame
(:mod:`sam2serve.concepts.video_phrases`' rules: each phrase its own state, ids
``i * n + k``, each object carrying its phrase): its pushes answer exactly as
:func:`~sam2serve.concepts.video_phrases.run_phrases` on the same frames.

Hot start holds each answer ``hotstart_delay`` frames (Meta's 15): a young object that is
unmatched or duplicated too often in that window is removed before any answer shows it.
Live, that is 15 frames of lag (half a second at 30 fps, more when tracking is slower than
the camera). :func:`stream_thresholds` gives a shorter delay; with it the answers depart
from Meta's: an object is judged on fewer frames (the unmatched/duplicate counts that
remove a young object scale with the window: Meta's 8 of 15 frames), so a spurious one is
shown that Meta's longer look would have removed, or a real one removed sooner.
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np
import torch

from sam2serve.concepts.engine import ConceptEncoding
from sam2serve.concepts.video_association import VideoThresholds
from sam2serve.concepts.video_phrases import PhrasesFrame, PhrasesState, merge
from sam2serve.concepts.video_predictor import (
    FrameResult,
    Sam3VideoPredictor,
    VideoState,
    _Pending,
    hotstart_release,
)
from sam2serve.concepts.video_tracker import TrackerFrame

# One frame's encodings: the detector's and the tracker's features (``encode``'s answer).
Encoded = tuple[ConceptEncoding, TrackerFrame]

# The frame count of an open-ended stream's state: past any frame index a session reaches
# (the predictor reads it only to cap memory reach at 16 frames and for backward passes).
OPEN_ENDED = 2**31 - 1
# Meta's hot-start delay, the most a stream may hold answers back.
META_HOTSTART_DELAY = VideoThresholds().hotstart_delay


def stream_thresholds(thresholds: VideoThresholds, hotstart_delay: int) -> VideoThresholds:
    """``thresholds`` with answers held ``hotstart_delay`` frames (0..15; Meta's 15 keeps
    them as they are): the unmatched/duplicate counts that remove a young object scaled
    with the window (Meta's 8 of 15 frames), at most the delay - 1 frames an object is
    young after its first. ValueError names a bad delay."""
    if not 0 <= hotstart_delay <= META_HOTSTART_DELAY:
        raise ValueError(
            f"hotstart_delay {hotstart_delay}: 0 to {META_HOTSTART_DELAY} frames "
            f"(Meta's {META_HOTSTART_DELAY})"
        )
    if hotstart_delay == thresholds.hotstart_delay:
        return thresholds
    if hotstart_delay == 0:  # no object is young: the counts are never read
        return dataclasses.replace(thresholds, hotstart_delay=0)
    base = thresholds.hotstart_delay

    def scaled(count: int) -> int:
        # Meta's count over its window (8 of 15 frames), rounded up, reachable in the
        # delay - 1 frames after an object's first that it is young
        return max(1, min(hotstart_delay - 1, -(-count * hotstart_delay // base)))

    return dataclasses.replace(
        thresholds,
        hotstart_delay=hotstart_delay,
        hotstart_unmatch=scaled(thresholds.hotstart_unmatch),
        hotstart_dup=scaled(thresholds.hotstart_dup),
    )


class Sam3Stream:
    """One prompt's SAM 3 run over frames pushed in order (see the module's text)."""

    def __init__(self, predictor: Sam3VideoPredictor, state: VideoState) -> None:
        self.predictor = predictor
        self.state = state
        self.pending: list[_Pending] = []  # processed frames' outputs not let out yet
        self.next_frame: int | None = None  # the index the next push must carry
        self.pushed = 0

    @property
    def delay(self) -> int:
        return self.predictor.th.hotstart_delay

    @property
    def held(self) -> int:
        """Frames processed whose answers hot start still holds."""
        return len(self.pending)

    @torch.inference_mode()
    def push(
        self, frame_idx: int, frame: np.ndarray, encoded: Encoded | None = None
    ) -> list[FrameResult]:
        """Process frame ``frame_idx`` (uint8 HWC; the first push is the prompt frame, each
        later one the next index): the answers hot start lets out now, in frame order.
        ``encoded``: the frame's encodings when another stream has made them (their
        seconds are not this state's)."""
        self.check_next(frame_idx)
        predictor, state = self.predictor, self.state
        if encoded is None:
            tick = time.perf_counter()
            encoded = predictor.encode(frame)
            state.clock("detector", tick)
        encoding, tracker_frame = encoded
        if self.next_frame is None:  # Meta's add_prompt on the prompt frame
            state.prompt_frame = frame_idx
            predictor.step(state, frame_idx, encoding, tracker_frame)
        self.next_frame = frame_idx + 1
        self.pushed += 1
        self.pending.append(predictor.step(state, frame_idx, encoding, tracker_frame))
        self._forget_settled(frame_idx)
        ready, self.pending = hotstart_release(self.pending, self.delay, last=False)
        return [self._finish(item) for item in ready]

    def check_next(self, frame_idx: int) -> None:
        """ValueError unless ``frame_idx`` is the frame the next push must carry."""
        if self.next_frame is not None and frame_idx != self.next_frame:
            raise ValueError(f"frame {frame_idx}: the stream's next frame is {self.next_frame}")

    @torch.inference_mode()
    def flush(self) -> list[FrameResult]:
        """The end of the stream: every answer still held, in frame order."""
        ready, self.pending = self.pending, []
        return [self._finish(item) for item in ready]

    def _forget_settled(self, frame_idx: int) -> None:
        """Drop hot start's per-frame counts of objects it can no longer remove: past
        their first ``hotstart_delay`` frames (forward, never young again) or removed;
        and what the state keeps of removed objects. Meta keeps them for the clip; a
        stream would add one per frame an object is unmatched or duplicated, and one per
        spurious object, without end. The rules only read a young, present object's, so
        the answers are the same."""
        hot, horizon = self.state.hot, frame_idx - self.delay
        settled = {obj for obj, first in hot.first_frame.items() if first <= horizon}
        settled |= hot.removed
        for obj in settled & hot.unmatched_frames.keys():
            del hot.unmatched_frames[obj]
        for pair in [pair for pair in hot.overlap_frames if pair[1] in settled]:
            del hot.overlap_frames[pair]
        # a removed object is no track any more: its score, first frame and keep-alive are
        # never read again (the answers still held carry their own scores); its id stays in
        # ``removed``, which hides it in those answers
        for table in (self.state.scores, hot.first_frame, hot.keep_alive):
            for obj in hot.removed & table.keys():
                del table[obj]

    def _finish(self, item: _Pending) -> FrameResult:
        tick = time.perf_counter()
        result = self.predictor.finish(self.state, item)
        self.state.clock("association", tick)
        return result


class PhrasesStream:
    """Several phrases' :class:`Sam3Stream` over one encoding per pushed frame (see the
    module's text); ``state`` holds each phrase's :class:`VideoState` (for an open-ended
    stream, made with :data:`OPEN_ENDED` frames)."""

    def __init__(self, predictor: Sam3VideoPredictor, state: PhrasesState) -> None:
        self.predictor = predictor
        self.state = state
        self.streams = [Sam3Stream(predictor, phrase_state) for phrase_state in state.states]

    @property
    def phrases(self) -> list[str]:
        return self.state.phrases

    @property
    def held(self) -> int:
        """Frames processed whose answers hot start still holds (the same for every
        phrase: one delay)."""
        return self.streams[0].held

    @torch.inference_mode()
    def push(self, frame_idx: int, frame: np.ndarray) -> list[PhrasesFrame]:
        """:meth:`Sam3Stream.push` for every phrase: the frame encoded once, then each
        phrase's steps; the frames hot start lets out now, merged."""
        self.streams[0].check_next(frame_idx)
        tick = time.perf_counter()
        encoded = self.predictor.encode(frame)
        self.state.encode_seconds += time.perf_counter() - tick
        answers = [stream.push(frame_idx, frame, encoded) for stream in self.streams]
        return [merge(self.state, results) for results in zip(*answers, strict=True)]

    @torch.inference_mode()
    def flush(self) -> list[PhrasesFrame]:
        """The end of the stream: every frame still held, merged, in frame order."""
        answers = [stream.flush() for stream in self.streams]
        return [merge(self.state, results) for results in zip(*answers, strict=True)]


__all__ = [
    "META_HOTSTART_DELAY",
    "OPEN_ENDED",
    "Encoded",
    "PhrasesStream",
    "Sam3Stream",
    "stream_thresholds",
]
