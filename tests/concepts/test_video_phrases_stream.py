"""Several phrases pushed frame by frame (:class:`~sam2serve.concepts.video_stream.PhrasesStream`)
answer as :func:`~sam2serve.concepts.video_phrases.run_phrases` on the same frames: the
same merged frames (ids ``i * n + k``, phrases, scores, masks, boxes) in the same order,
each let out when hot start lets the run's out, and one encoding per pushed frame for every
phrase. SAM 3's networks are the frames' pixels (tests/sam3_pixel_steps.py)."""

from __future__ import annotations

import numpy as np
import pytest
from sam3_pixel_steps import PixelSteps
from sam3_pixel_steps import clip as pixel_clip

from sam2serve.concepts.video_association import VideoThresholds
from sam2serve.concepts.video_phrases import PhrasesFrame, run_phrases, start_phrases
from sam2serve.concepts.video_stream import OPEN_ENDED, PhrasesStream, stream_thresholds

HEIGHT, WIDTH = 12, 16
PHRASES = ["disc", "cup", "red block"]


class Counted(PixelSteps):
    """The pixel predictor, counting its frame encodings (one ViT pass each)."""

    def __init__(self, thresholds: VideoThresholds) -> None:
        super().__init__(thresholds)
        self.encoded = 0

    def encode(self, frame):  # type: ignore[no-untyped-def]  # the stub's own signature
        self.encoded += 1
        return super().encode(frame)


def same(got: list[PhrasesFrame], expected: list[PhrasesFrame]) -> None:
    assert [f.frame for f in got] == [f.frame for f in expected]
    for a, b in zip(got, expected, strict=True):
        assert (a.obj_ids, a.phrases, a.scores, a.boxes) == (
            b.obj_ids,
            b.phrases,
            b.scores,
            b.boxes,
        )
        np.testing.assert_array_equal(a.masks, b.masks)


@pytest.mark.parametrize("delay", [15, 3, 0])
@pytest.mark.parametrize("count", [1, 3])
def test_pushed_phrases_answer_as_run_phrases_with_one_encoding_a_frame(delay, count):
    frames, start, phrases = pixel_clip(20, HEIGHT, WIDTH, seed=2), 4, PHRASES[:count]
    thresholds = stream_thresholds(VideoThresholds(), delay)
    ours, theirs = Counted(thresholds), Counted(thresholds)
    stream = PhrasesStream(ours, start_phrases(ours, OPEN_ENDED, HEIGHT, WIDTH, phrases))
    answers: list[PhrasesFrame] = []
    counts = []
    for index, frame in enumerate(frames):
        out = stream.push(start + index, frame)
        counts.append(len(out))
        answers += out
    assert stream.held == min(len(frames), max(delay - 1, 0))
    answers += stream.flush()
    assert stream.held == 0 and stream.flush() == []
    state = start_phrases(theirs, OPEN_ENDED, HEIGHT, WIDTH, phrases)
    same(answers, list(run_phrases(theirs, state, iter(frames), start=start)))
    assert ours.encoded == theirs.encoded == len(frames)  # the prompt frame's is shared too
    assert counts == [int(n + 1 >= max(delay, 1)) for n in range(len(frames))]
    found = {phrase for frame in answers for phrase in frame.phrases}
    assert found == set(phrases), "a phrase found nothing: the comparison would be thin"
    for frame in answers:  # ids i * n + k: the phrase of an id is its rest
        assert [phrases[obj % count] for obj in frame.obj_ids] == frame.phrases


def test_frames_come_in_order_before_any_encoding():
    predictor = Counted(VideoThresholds())
    stream = PhrasesStream(predictor, start_phrases(predictor, OPEN_ENDED, HEIGHT, WIDTH, PHRASES))
    frames = pixel_clip(2, HEIGHT, WIDTH)
    stream.push(3, frames[0])
    with pytest.raises(ValueError, match="frame 5: the stream's next frame is 4"):
        stream.push(5, frames[1])
    assert predictor.encoded == 1 and stream.held == 1


@pytest.mark.extended
def test_the_reduced_sam3_pushed_with_two_phrases_answers_as_run_phrases(concepts_tiny):
    """Real (reduced, random) networks: three frames pushed with a one-frame delay, two
    phrases."""
    from sam2serve.concepts.video_load import video_predictor
    from sam2serve.samples import sample_clip

    frames, _ = sample_clip(3, (64, 96))
    thresholds = stream_thresholds(VideoThresholds.from_detection(0.0, 4), 1)
    predictor = video_predictor(concepts_tiny, thresholds)
    phrases = PHRASES[:2]
    stream = PhrasesStream(predictor, start_phrases(predictor, OPEN_ENDED, 64, 96, phrases))
    answers = [r for i, f in enumerate(frames) for r in stream.push(i, f)] + stream.flush()
    state = start_phrases(predictor, OPEN_ENDED, 64, 96, phrases)
    same(answers, list(run_phrases(predictor, state, iter(frames))))
    found = {phrase for frame in answers for phrase in frame.phrases}
    assert found == set(phrases), "a phrase found nothing: the comparison would be thin"
