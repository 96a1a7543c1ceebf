"""Several phrases typed on a video task (``labelstudio --concepts --video``): one run of
SAM 3's video predictor per phrase over one ViT pass per frame
(:mod:`sam2serve.concepts.video_phrases`), every object a VideoRectangle labelled by its
phrase; the memory of every phrase's objects and the phrase count bounded before the
video is decoded (test_concept_video.py holds the one-phrase tests and the helpers)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from test_concept_video import (
    SETTINGS,
    H,
    ScriptedSam3,
    W,
    body,
    decoded,
    expected_keyframes,
    make_client,  # noqa: F401 - a fixture
    recording_predictor,
    sam2_video,  # noqa: F401 - a fixture
    textarea,
)
from test_video_api import serve  # noqa: F401 - the loopback file server fixture
from video_support import clip_bytes

from sam2serve.concepts.video_phrases import PhrasesFrame, run_phrases, start_phrases
from sam2serve.labelstudio.concept_video import ConceptVideoTracker
from sam2serve.labelstudio.options import LabelStudioOptions

pytest.importorskip("av")

PHRASES = ["disc", "Square"]


def counting(predictor: Any) -> list[int]:
    """Count the predictor's frame encodings (one ViT pass each)."""
    calls: list[int] = []
    encode = predictor.encode

    def counted(frame: np.ndarray) -> Any:
        calls.append(1)
        return encode(frame)

    predictor.encode = counted
    return calls


def test_several_phrases_are_one_run_each_over_one_encoding_a_frame(
    serve,  # noqa: F811
    make_client,  # noqa: F811
    concepts_tiny,
):
    """The tiny random SAM 3 through the backend: the answer is ``run_phrases``' on the
    clip's decoded frames, each object labelled by its phrase (ids ``i * n + k``)."""
    base, files = serve()
    files.files["/clip.mp4"] = clip_bytes(2)
    predictor = recording_predictor(concepts_tiny, max_objects=4)
    calls = counting(predictor)
    client = make_client(predictor, base)
    request = body(f"{base}/clip.mp4", textarea("disc, Square", "disc"))
    response = client.post("/predict", json=request)
    assert response.status_code == 200, response.text
    assert len(calls) == 2  # one ViT pass a frame for both phrases
    oracle = recording_predictor(concepts_tiny, max_objects=4)
    state = start_phrases(oracle, 2, H, W, PHRASES)
    results = list(run_phrases(oracle, state, iter(decoded(2))))
    regions = response.json()["results"][0]["result"]
    ids = sorted({obj for result in results for obj in result.obj_ids})
    assert {obj % 2 for obj in ids} == {0, 1}, "a phrase found nothing: the test would be thin"
    assert len(regions) == len(ids)
    for region, obj_id in zip(regions, ids, strict=True):
        phrase = PHRASES[obj_id % 2]
        assert region["meta"] == {"text": [f"{phrase} (SAM 3 object {obj_id})"]}
        assert region["value"]["labels"] == [phrase.capitalize()]  # Disc, Square
        boxes, score = track_of(results, obj_id)
        assert region["value"]["sequence"] == expected_keyframes(boxes)
        assert region["score"] == pytest.approx(score)


def track_of(results: list[PhrasesFrame], obj_id: int) -> tuple[list, float | None]:
    """An object's box on each frame (None where not output) and its first score."""
    boxes: list = []
    score = None
    for result in results:
        if obj_id in result.obj_ids:
            row = result.obj_ids.index(obj_id)
            boxes.append(result.boxes[row])
            score = result.scores[row] if score is None else score
        else:
            boxes.append(None)
    return boxes, score


MANY = ", ".join(f"p{i}" for i in range(20))
MORE = ", ".join(f"q{i}" for i in range(13))


@pytest.mark.parametrize(
    ("regions", "where"),
    [
        ((textarea(f"{MANY}, {MORE}"),), "context.result[0].value.text[0]: 33"),
        ((textarea(MANY), textarea(MORE)), "context.result[1].value.text[0]: 33"),
        ((textarea(MANY, MORE),), "context.result[0].value.text[1]: 33"),
    ],
)
def test_more_phrases_than_concept_max_labels_are_refused_before_the_video_is_read(
    serve,  # noqa: F811
    make_client,  # noqa: F811
    regions,
    where,
):
    base, files = serve()
    files.files["/clip.mp4"] = clip_bytes(2)
    predictor = ScriptedSam3({})
    client = make_client(predictor, base)  # --concept-max-labels 32
    response = client.post("/predict", json=body(f"{base}/clip.mp4", *regions))
    assert response.status_code == 422, response.text
    message = response.json()["error"]["message"]
    assert message.startswith(where) and "at most 32" in message, message
    assert "--concept-max-labels" in message
    assert files.seen == [] and predictor.started is None


def test_every_phrases_objects_are_bounded_before_the_frames_are_decoded(
    serve,  # noqa: F811
    make_client,  # noqa: F811
):
    """Room in the session's bytes for one phrase's 16 objects, not two phrases' 32: one
    phrase runs, two are refused (413 naming both counts), nothing started."""
    base, files = serve()
    files.files["/clip.mp4"] = clip_bytes(2)
    predictor = ScriptedSam3({}, max_objects=16)
    one = ConceptVideoTracker(predictor, LabelStudioOptions()).tracking_cost(2, H, W).nbytes
    small = SETTINGS.replace(max_video_session_bytes=2 * H * W * 3 + one * 3 // 2)
    client = make_client(predictor, base, settings=small, video_max_frames=2)
    response = client.post("/predict", json=body(f"{base}/clip.mp4", textarea("disc")))
    assert response.status_code == 200, response.text
    assert predictor.started is not None
    predictor.started = None
    response = client.post("/predict", json=body(f"{base}/clip.mp4", textarea("disc, square")))
    assert response.status_code == 413, response.text
    error = response.json()["error"]
    assert error["code"] == "session_too_large"
    assert "up to 32 objects (16 for each of 2 phrases)" in error["message"]
    assert "track fewer phrases" in error["message"]
    assert predictor.started is None
