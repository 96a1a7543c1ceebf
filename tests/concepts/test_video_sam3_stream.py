"""SAM 3's video predictor pushed frame by frame (:mod:`sam2serve.concepts.video_stream`)
answers as :meth:`Sam3VideoPredictor.run` on the same frames: the same steps on the same
frames (the prompt frame's ``add_prompt`` first), the same answers (ids, scores, masks,
boxes) in the same order, each let out when hot start lets ``run``'s out.

First tier: the predictor with its networks replaced by a frame's pixels
(tests/sam3_pixel_steps.py: its objects are the frame's labelled blocks, a blue label
marks an object hot start removed), so Meta's 15-frame delay is cheap to reach; the
scheduling, ``finish`` and the state are the real ones. Second tier: the reduced random SAM 3 on three frames."""

from __future__ import annotations

import numpy as np
import pytest
from sam3_pixel_steps import PixelSteps
from sam3_pixel_steps import clip as pixel_clip

from sam2serve.concepts.video_association import VideoThresholds
from sam2serve.concepts.video_predictor import FrameResult, Sam3VideoPredictor, VideoState
from sam2serve.concepts.video_stream import (
    META_HOTSTART_DELAY,
    OPEN_ENDED,
    Sam3Stream,
    stream_thresholds,
)

HEIGHT, WIDTH = 12, 16


def clip(count: int, seed: int = 0) -> list[np.ndarray]:
    return pixel_clip(count, HEIGHT, WIDTH, seed)


def same(got: list[FrameResult], expected: list[FrameResult]) -> None:
    assert [r.frame for r in got] == [r.frame for r in expected]
    for a, b in zip(got, expected, strict=True):
        assert a.obj_ids == b.obj_ids and a.scores == b.scores and a.boxes == b.boxes
        np.testing.assert_array_equal(a.masks, b.masks)


def pushed(predictor: Sam3VideoPredictor, frames: list[np.ndarray], start: int) -> tuple:
    """Every answer of a stream, and how many each push let out."""
    stream = Sam3Stream(predictor, VideoState(OPEN_ENDED, HEIGHT, WIDTH))
    answers: list[FrameResult] = []
    counts = []
    for index, frame in enumerate(frames):
        out = stream.push(start + index, frame)
        counts.append(len(out))
        answers += out
    assert stream.held == min(len(frames), max(predictor.th.hotstart_delay - 1, 0))
    answers += stream.flush()
    assert stream.held == 0 and stream.flush() == []
    return answers, counts


@pytest.mark.parametrize("delay", [META_HOTSTART_DELAY, 3, 1, 0])
def test_pushed_frames_answer_as_run_with_the_same_delay(delay):
    frames, start = clip(20), 5
    thresholds = stream_thresholds(VideoThresholds(), delay)
    ours, theirs = PixelSteps(thresholds), PixelSteps(thresholds)
    answers, counts = pushed(ours, frames, start)
    expected = list(theirs.run(VideoState(OPEN_ENDED, HEIGHT, WIDTH), iter(frames), start=start))
    same(answers, expected)
    assert ours.steps == theirs.steps == [start] + list(range(start, start + len(frames)))
    assert any(r.obj_ids for r in answers), "no object: the comparison would be empty"
    # hot start: nothing for delay - 1 frames, then one answer per frame, oldest first
    assert counts == [int(n + 1 >= max(delay, 1)) for n in range(len(frames))]


def test_a_clip_of_16_frames_or_more_answers_as_an_open_ended_stream():
    """A stream's state never learns the clip's length: a clip of at least 16 frames (the
    memory's reach) answers the same; its last frame lets every answer out at once."""
    frames = clip(17, seed=1)
    thresholds = VideoThresholds()
    answers, _ = pushed(PixelSteps(thresholds), frames, 0)
    clip_run = PixelSteps(thresholds).run(VideoState(len(frames), HEIGHT, WIDTH), iter(frames))
    same(answers, list(clip_run))


def test_frames_come_in_order():
    stream = Sam3Stream(PixelSteps(VideoThresholds()), VideoState(OPEN_ENDED, HEIGHT, WIDTH))
    frames = clip(3)
    stream.push(7, frames[0])
    for bad in (7, 9, 0):
        with pytest.raises(ValueError, match=f"frame {bad}: the stream's next frame is 8"):
            stream.push(bad, frames[1])
    assert stream.push(8, frames[1]) == [] and stream.held == 2


def test_a_shorter_delay_scales_the_removal_counts_and_metas_is_unchanged():
    meta = VideoThresholds()
    assert stream_thresholds(meta, META_HOTSTART_DELAY) is meta
    # Meta's 8 of 15 frames scaled (rounded up), within the delay - 1 young frames
    short = stream_thresholds(meta, 4)
    assert (short.hotstart_delay, short.hotstart_unmatch, short.hotstart_dup) == (4, 3, 3)
    assert [stream_thresholds(meta, d).hotstart_unmatch for d in (1, 2, 3, 10, 14)] == [
        1,
        1,
        2,
        6,
        8,
    ]
    off = stream_thresholds(meta, 0)
    assert off.hotstart_delay == 0 and off.score == meta.score
    for bad in (-1, 16, 2**40):
        with pytest.raises(ValueError, match=f"hotstart_delay {bad}: 0 to 15"):
            stream_thresholds(meta, bad)


@pytest.mark.extended
def test_the_reduced_sam3_pushed_answers_as_its_run(concepts_tiny):
    """Real (reduced, random) networks: three frames pushed with a one-frame delay."""
    from sam2serve.concepts.video_load import video_predictor
    from sam2serve.samples import sample_clip

    frames, _ = sample_clip(3, (64, 96))
    thresholds = stream_thresholds(VideoThresholds.from_detection(0.0, 4), 1)
    predictor = video_predictor(concepts_tiny, thresholds)
    state = predictor.start(OPEN_ENDED, 64, 96, "disc")
    stream = Sam3Stream(predictor, state)
    answers = [r for i, f in enumerate(frames) for r in stream.push(i, f)] + stream.flush()
    expected = list(predictor.run(predictor.start(OPEN_ENDED, 64, 96, "disc"), iter(frames)))
    same(answers, expected)
    assert any(r.obj_ids for r in answers), "SAM 3 found nothing: the comparison is empty"


def test_hot_starts_counts_of_settled_objects_are_dropped_and_the_answers_stay():
    """A stream keeps hot start's unmatched/duplicate counts only for objects still young
    (first seen within the delay) and not removed; ``run`` keeps every one. The answers
    are the same (the test above), and here too with the counts' rules in play."""
    frames, delay = clip(30, seed=2), 4
    thresholds = stream_thresholds(VideoThresholds(), delay)
    stream = Sam3Stream(PixelSteps(thresholds), VideoState(OPEN_ENDED, HEIGHT, WIDTH))
    answers = [r for i, f in enumerate(frames) for r in stream.push(i, f)] + stream.flush()
    state = VideoState(OPEN_ENDED, HEIGHT, WIDTH)
    same(answers, list(PixelSteps(thresholds).run(state, iter(frames))))
    hot, kept = stream.state.hot, state.hot
    for ours, theirs in (
        (hot.unmatched_frames, kept.unmatched_frames),
        (hot.overlap_frames, kept.overlap_frames),
    ):  # run's grow with the clip; the stream's hold a few frames at most
        assert sum(map(len, theirs.values())) > 10 > sum(map(len, ours.values()))
    assert kept.removed - {1}, "no object removed: the rules were not in play"
    last = len(frames) - 1
    young = {obj for obj, first in hot.first_frame.items() if first > last - delay}
    assert set(hot.unmatched_frames) <= young - hot.removed
    assert {obj for _, obj in hot.overlap_frames} <= young - hot.removed


def test_a_young_duplicate_is_still_removed_on_the_last_frame_of_its_hot_start():
    """Object 2 shares object 1's detection on the 3 frames after its first (3-5), with a
    delay of 4 (3 such frames remove a young object): hot start removes it on frame 5, its
    last young frame, so no answer shows it. Dropping its counts too soon would let it
    through."""
    frames = []
    for t in range(10):
        frame = np.zeros((HEIGHT, WIDTH, 3), np.uint8)
        frame[0:5, 0:6, 1] = 1
        if 2 <= t <= 5:
            frame[6:11, 8:14, 1] = 2
        frames.append(frame)
    thresholds = stream_thresholds(VideoThresholds(), 4)
    stream = Sam3Stream(PixelSteps(thresholds), VideoState(OPEN_ENDED, HEIGHT, WIDTH))
    answers = [r for i, f in enumerate(frames) for r in stream.push(i, f)] + stream.flush()
    state = VideoState(OPEN_ENDED, HEIGHT, WIDTH)
    same(answers, list(PixelSteps(thresholds).run(state, iter(frames))))
    assert state.hot.removed == stream.state.hot.removed == {2}
    assert 2 in state.scores and 2 in state.hot.first_frame  # run keeps them
    kept = stream.state
    assert 2 not in kept.scores and 2 not in kept.hot.first_frame | kept.hot.keep_alive
    assert [r.obj_ids for r in answers] == [[1]] * len(frames)
