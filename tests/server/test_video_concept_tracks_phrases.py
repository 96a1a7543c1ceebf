"""POST /v1/videos/{session_id}/concepts/track with several phrases (``phrases``): the
stream is :func:`sam2serve.concepts.video_phrases.run_phrases`'s on the same frames and
weights (an independent predictor), SAM 3's merged ids mapped to the session's in order of
appearance, each object named by its phrase, the objects SAM 3 may track at once shared
out evenly among the phrases; and every bad or over-limit request (too many phrases, none,
one twice, text and phrases together, bad types, no room for one object per phrase) a 4xx
naming the field or limit before any model work. In process (TestClient), the tiny random
SAM 3 (``concepts_tiny``) on two small frames, as test_video_concept_tracks.py."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient
from test_video_concept_tracks import (
    FRAMES,
    SIZE,
    error_of,
    make_app,
    mask_of,
    new_session,
    sam2_video,  # noqa: F401  # the module's fixture
    track,
)

from sam2serve.concepts.video_association import VideoThresholds
from sam2serve.concepts.video_load import video_predictor
from sam2serve.concepts.video_phrases import run_phrases, start_phrases

PHRASES = ["disc", "square"]
# Room for four of SAM 3's objects: two per phrase.
LIMITS = {"max_video_objects": 4, "max_concept_instances": 4, "max_concept_phrases": 3}


@pytest.fixture(scope="module")
def client(predictor, sam2_video, concepts_tiny) -> Iterator[TestClient]:  # noqa: F811
    with TestClient(make_app(predictor, sam2_video, concepts_tiny, **LIMITS)) as client:
        yield client


@pytest.fixture(scope="module")
def tracked(client) -> tuple[str, list[tuple[str, dict]]]:
    sid = new_session(client)
    return sid, track(client, sid, {"phrases": [" disc", "square "]})


def test_the_stream_is_the_multi_phrase_run_with_the_sessions_ids(client, tracked, concepts_tiny):
    sid, events = tracked
    assert [name for name, _ in events] == ["frame"] * len(FRAMES) + ["done"]
    done = events[-1][1]
    assert done["max_objects"] == 4  # two per phrase
    thresholds = VideoThresholds(
        score=done["score_thresh"], new_det=done["new_object_thresh"], max_objects=2
    )
    predictor = video_predictor(concepts_tiny, thresholds)
    state = start_phrases(predictor, len(FRAMES), *SIZE, PHRASES)
    expected = list(run_phrases(predictor, state, iter(FRAMES)))
    ids: dict[int, int] = {}  # the run's -> the session's: from 1, in order of appearance
    for result in expected:
        for obj in result.obj_ids:
            if obj not in ids and len(ids) < done["max_objects"]:
                ids[obj] = 1 + len(ids)
    assert {state.phrase_of(o) for o in ids} == set(PHRASES), "both phrases found objects"
    for (_, frame), result in zip(events, expected, strict=False):
        assert frame["frame_idx"] == result.frame
        wanted = [(ids[o], i) for i, o in enumerate(result.obj_ids) if o in ids]
        objects = frame["objects"]
        assert [o["obj_id"] for o in objects] == [session_id for session_id, _ in wanted]
        for obj, (_, row) in zip(objects, wanted, strict=True):
            np.testing.assert_array_equal(mask_of(obj), result.masks[row])
            assert obj["name"] == obj["phrase"] == result.phrases[row]
            assert obj["score"] == pytest.approx(result.scores[row], abs=1e-6)
    spans = {o["obj_id"]: o["name"] for o in done["objects"]}
    assert spans == {ids[o]: state.phrase_of(o) for o in ids}
    session = client.get(f"/v1/videos/{sid}").json()
    assert {o["obj_id"]: o["name"] for o in session["objects"]} == spans


def test_running_a_phrase_again_replaces_only_its_objects(client, tracked):
    """(Last on the tracked session.) 'disc' alone again: the 'square' objects stay."""
    sid, events = tracked
    before = {o["obj_id"]: o["name"] for o in events[-1][1]["objects"]}
    again = track(client, sid, {"text": "disc"})
    after = {o["obj_id"]: o["name"] for o in client.get(f"/v1/videos/{sid}").json()["objects"]}
    squares = {k: v for k, v in before.items() if v == "square"}
    assert squares and squares.items() <= after.items()
    discs = {o["obj_id"] for o in again[-1][1]["objects"]}
    assert {k for k, v in after.items() if v == "disc"} == discs


@pytest.mark.parametrize(
    "body, words",
    [
        ({"phrases": []}, ("phrases", "at least 1")),
        ({"phrases": ["cat", " cat "]}, ("phrases[1]", "given twice")),
        ({"phrases": ["cat", ""]}, ("phrases[1]",)),
        ({"phrases": "cat"}, ("phrases",)),
        ({"phrases": ["cat", 3]}, ("phrases",)),
        ({"phrases": [["cat"]]}, ("phrases",)),
        ({"phrases": ["cat"] * 65}, ("phrases", "64")),
        ({"text": "cat", "phrases": ["dog"]}, ("not both",)),
        ({"text": None, "phrases": None}, ("text", "phrases")),
    ],
)
def test_bad_phrases_are_refused_before_any_work(client, body: dict[str, Any], words):
    sid = new_session(client)
    answer = client.post(f"/v1/videos/{sid}/concepts/track", json=body)
    assert answer.status_code == 422, answer.text
    error = error_of(answer)
    assert error["code"] == "invalid_request" and all(w in error["message"] for w in words), error
    assert client.get(f"/v1/videos/{sid}").json()["objects"] == []
    client.delete(f"/v1/videos/{sid}")


def test_more_phrases_than_the_server_takes_is_422(client):
    sid = new_session(client)
    answer = client.post(f"/v1/videos/{sid}/concepts/track", json={"phrases": ["a", "b", "c", "d"]})
    assert answer.status_code == 422, answer.text
    error = error_of(answer)
    assert error["code"] == "too_many_prompts" and "max_concept_phrases" in error["message"]
    assert "phrases: 4; at most 3" in error["message"]
    client.delete(f"/v1/videos/{sid}")


def test_no_room_for_one_object_per_phrase_is_413(client):
    """Two SAM 2.1 objects leave room for two of SAM 3's: three phrases do not fit."""
    sid = new_session(client)
    for obj_id in (1, 2):
        prompt = {"frame_idx": 0, "points": [{"x": 30, "y": 28}], "obj_id": obj_id}
        assert client.post(f"/v1/videos/{sid}/prompts", json=prompt).status_code == 200
    answer = client.post(f"/v1/videos/{sid}/concepts/track", json={"phrases": ["a", "b", "c"]})
    assert answer.status_code == 413, answer.text
    error = error_of(answer)
    assert error["code"] == "too_many_objects" and "fewer than the 3 phrases" in error["message"]
    assert not client.get(f"/v1/videos/{sid}").json()["busy"]
    client.delete(f"/v1/videos/{sid}")
