"""Several phrases in one SAM 3 video run (:mod:`sam2serve.concepts.video_phrases`), reduced
sizes with seeded random weights: each phrase's objects are exactly what a run of that
phrase alone answers (masks, scores, boxes, frames; ids as ``id * n + k``), the ViT runs
once per frame for all phrases, and a repeated or missing phrase is refused."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np
import pytest
import torch

from sam2serve.concepts.runtime import Concepts
from sam2serve.concepts.video_association import VideoThresholds
from sam2serve.concepts.video_load import video_predictor
from sam2serve.concepts.video_phrases import (
    PhrasesFrame,
    check_phrases,
    merged_id,
    propagate_phrases,
    run_phrases,
    start_phrases,
)
from sam2serve.concepts.video_predictor import FrameResult, Sam3VideoPredictor
from sam2serve.samples import sample_clip

# Random weights score every query about 0.26; thresholds between the scores of this clip's
# objects with a short hot start (test_video_sam3_modes.py's), so objects appear and end.
THRESHOLDS = VideoThresholds(
    score=0.262, new_det=0.262, hotstart_delay=3, hotstart_unmatch=2, hotstart_dup=2
)
FRAMES, HEIGHT, WIDTH = 4, 64, 96
PHRASES = ["red disc", "square", "blue thing"]


@pytest.fixture(scope="module")
def concepts(concepts_tiny: Concepts) -> Concepts:
    torch.set_num_threads(1)  # one core: the first tier shares the machine
    return concepts_tiny


@pytest.fixture(scope="module")
def clip() -> list[np.ndarray]:
    frames, _ = sample_clip(num_frames=FRAMES, size=(HEIGHT, WIDTH))
    return list(frames)


def _counting(predictor: Sam3VideoPredictor) -> list[int]:
    """Count the predictor's frame encodings (one ViT pass each)."""
    calls: list[int] = []
    encode = predictor.encode

    def counted(frame: np.ndarray):  # type: ignore[no-untyped-def]  # the method's own type
        calls.append(1)
        return encode(frame)

    predictor.encode = counted  # type: ignore[method-assign]  # an instance's counter
    return calls


def _assert_phrase_is_its_own_run(
    merged: list[PhrasesFrame], k: int, alone: list[FrameResult]
) -> int:
    """Phrase ``k``'s objects in the merged run equal the run of phrase ``k`` alone; the
    number of objects compared."""
    compared = 0
    assert [f.frame for f in merged] == [r.frame for r in alone]
    for frame, result in zip(merged, alone, strict=True):
        rows = [i for i, p in enumerate(frame.phrases) if p == PHRASES[k]]
        ids = [merged_id(obj, k, len(PHRASES)) for obj in result.obj_ids]
        assert [frame.obj_ids[i] for i in rows] == ids
        assert [frame.scores[i] for i in rows] == result.scores
        assert [frame.boxes[i] for i in rows] == result.boxes
        np.testing.assert_array_equal(frame.masks[rows], result.masks)
        compared += len(rows)
    return compared


def _alone(
    concepts: Concepts, phrase: str, run: Callable[[Sam3VideoPredictor, object], Iterator]
) -> list:
    predictor = video_predictor(concepts, THRESHOLDS)
    state = predictor.start(FRAMES, HEIGHT, WIDTH, phrase)
    return list(run(predictor, state))


def test_each_phrase_is_its_own_run_with_one_encoding_per_frame(concepts, clip):
    predictor = video_predictor(concepts, THRESHOLDS)
    calls = _counting(predictor)
    state = start_phrases(predictor, FRAMES, HEIGHT, WIDTH, PHRASES)
    merged = list(run_phrases(predictor, state, iter(clip)))
    assert len(calls) == FRAMES  # one ViT pass per frame for the three phrases
    assert [f.frame for f in merged] == list(range(FRAMES))
    compared = []
    for k, phrase in enumerate(PHRASES):
        alone = _alone(concepts, phrase, lambda p, s: p.run(s, iter(clip)))
        compared.append(_assert_phrase_is_its_own_run(merged, k, alone))
    assert sum(1 for c in compared if c) >= 2, compared  # two phrases found something
    for frame in merged:  # ascending, disjoint ids; every object named by its phrase
        assert frame.obj_ids == sorted(set(frame.obj_ids))
        assert all(state.phrase_of(o) == p for o, p in zip(frame.obj_ids, frame.phrases))
        assert frame.masks.shape == (len(frame.obj_ids), HEIGHT, WIDTH)
    seen = {o for f in merged for o in f.obj_ids}
    assert all(state.score_of(o) > 0 or state.score_of(o) < -1 for o in seen)
    stages = state.stage_seconds
    assert set(stages) == {"detector", "tracker", "association"}
    assert stages["detector"] >= state.encode_seconds > 0


def test_both_directions_per_phrase_equal_their_own_runs(concepts, clip):
    """From frame 1 both ways (Meta's passes), two phrases."""
    phrases = PHRASES[:2]
    predictor = video_predictor(concepts, THRESHOLDS)
    calls = _counting(predictor)
    state = start_phrases(predictor, FRAMES, HEIGHT, WIDTH, phrases)
    merged = list(propagate_phrases(predictor, state, clip.__getitem__, 1, "both"))
    assert len(calls) == FRAMES  # 1..3 forward, 0 backward
    compared = 0
    for k, phrase in enumerate(phrases):
        alone = _alone(
            concepts, phrase, lambda p, s: p.propagate_clip(s, clip.__getitem__, 1, "both")
        )
        for frame, result in zip(merged, alone, strict=True):
            rows = [i for i, p in enumerate(frame.phrases) if p == phrase]
            assert frame.frame == result.frame
            assert [frame.obj_ids[i] for i in rows] == [o * 2 + k for o in result.obj_ids]
            np.testing.assert_array_equal(frame.masks[rows], result.masks)
            compared += len(rows)
    assert compared > 0


def test_one_phrase_keeps_metas_ids():
    assert [merged_id(i, 0, 1) for i in range(4)] == [0, 1, 2, 3]
    assert [merged_id(i, k, 3) for i in range(2) for k in range(3)] == [0, 1, 2, 3, 4, 5]


def test_phrases_are_checked():
    assert check_phrases(["cat", "dog"]) == ["cat", "dog"]
    with pytest.raises(ValueError, match="at least one phrase"):
        check_phrases([])
    with pytest.raises(ValueError, match="phrase 'cat' is given twice"):
        check_phrases(["cat", "dog", "cat"])
