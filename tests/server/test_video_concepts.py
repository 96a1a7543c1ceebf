"""POST /v1/videos/{session_id}/concepts: SAM 3 on one frame seeds new objects of a
tracking session, which the existing propagation then tracks.

In process (TestClient) with the session's tiny random SAM 3 (``concepts_tiny``), the tiny
random SAM 2.1 image model and a tiny random video model: a real run adds the engine's
seeds (same names and scores as :func:`concept_seeds` on the frame) and a propagation
gives every frame a mask of every new object; every hostile request is a 4xx naming its
field or limit, refused before any model work, and a failure half way adds nothing."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient
from server_support import png_bytes
from small_tracker import small_tiny_tracker

from sam2serve.concepts.video_seed import concept_seeds
from sam2serve.engine.rle import coco_to_rle, rle_to_mask
from sam2serve.engine.video.predictor import VideoPredictor, VideoPromptError
from sam2serve.samples import sample_clip
from sam2serve.server.app import create_app
from sam2serve.server.settings import ServerSettings

SIZE = (64, 96)
FRAMES, _ = sample_clip(2, SIZE)
PHRASES = ["disc", "square"]
LIMITS = {
    "max_video_objects": 3,
    "max_concept_phrases": 2,
    "max_concept_boxes": 1,
    "max_concept_instances": 3,
}


@pytest.fixture(scope="module")
def video_predictor() -> VideoPredictor:
    # SAM 2.1 tiny at 256 x 256 (tests/small_tracker.py): seeding and tracking are the
    # subject, not the network's input size.
    return VideoPredictor(small_tiny_tracker(seed=0))


@pytest.fixture(scope="module")
def client(predictor, video_predictor, concepts_tiny) -> Iterator[TestClient]:
    settings = ServerSettings.from_flat(warmup=False, video=True, concepts=True, **LIMITS)
    app = create_app(settings, predictor, video_predictor, concepts=concepts_tiny)
    with TestClient(app) as client:
        yield client


def new_session(client: TestClient) -> str:
    files = [("frame", (f"{i}.png", png_bytes(f), "image/png")) for i, f in enumerate(FRAMES)]
    answer = client.post("/v1/videos", files=files)
    assert answer.status_code == 201, answer.text
    return answer.json()["session_id"]


def obj_ids(client: TestClient, sid: str) -> list[int]:
    return client.get(f"/v1/videos/{sid}").json()["obj_ids"]


def error_of(answer) -> dict[str, Any]:
    return answer.json()["error"]


def masks_of(objects: list[dict]) -> dict[int, np.ndarray]:
    return {o["obj_id"]: rle_to_mask(coco_to_rle(o["segmentation"])) for o in objects}


@pytest.fixture(scope="module")
def seeded(client) -> tuple[str, dict[str, Any]]:
    """A session with the 2 best instances of both phrases on frame 1 as objects."""
    sid = new_session(client)
    body = {"frame_idx": 1, "phrases": PHRASES, "score_thresh": 0, "max_instances": 2}
    answer = client.post(f"/v1/videos/{sid}/concepts", json=body)
    assert answer.status_code == 200, answer.text
    return sid, answer.json()


def test_the_seeds_are_the_engines_and_become_objects(client, seeded, concepts_tiny):
    sid, answer = seeded
    expected = concept_seeds(concepts_tiny, FRAMES[1], PHRASES, score_thresh=0.0, max_instances=2)
    objects = answer["objects"]
    assert answer["frame_idx"] == 1 and answer["session_id"] == sid
    assert [o["obj_id"] for o in objects] == [1, 2]
    assert [o["name"] for o in objects] == [s.phrase for s in expected]
    assert [o["score"] for o in objects] == pytest.approx([s.score for s in expected], abs=1e-6)
    for obj, mask in masks_of(objects).items():
        assert mask.shape == SIZE and objects[obj - 1]["area"] == int(mask.sum())
    assert obj_ids(client, sid) == [1, 2]


def test_random_weights_seed_without_a_threshold(client, concepts_tiny):
    """Random weights score about 0.25: a request without score_thresh seeds at 0 (as
    /v1/concepts and the command line do), not at Meta's 0.5 that would find nothing."""
    sid = new_session(client)
    body = {"frame_idx": 1, "phrases": ["cat"], "max_instances": 1}
    answer = client.post(f"/v1/videos/{sid}/concepts", json=body)
    assert answer.status_code == 200, answer.text
    expected = concept_seeds(concepts_tiny, FRAMES[1], ["cat"], score_thresh=0.0, max_instances=1)
    assert [o["score"] for o in answer.json()["objects"]] == pytest.approx(
        [s.score for s in expected], abs=1e-6
    )
    assert len(expected) == 1
    client.delete(f"/v1/videos/{sid}")


def test_the_propagation_tracks_every_seeded_object(client, seeded):
    sid, answer = seeded
    body = {"start_frame_idx": 1, "reverse": True}
    with client.stream("POST", f"/v1/videos/{sid}/propagate", json=body) as stream:
        lines = [line for line in stream.iter_lines() if line.startswith("data: ")]
    events = [json.loads(line[len("data: ") :]) for line in lines]
    frames = {e["frame_idx"]: e["objects"] for e in events if "frame_idx" in e}
    assert sorted(frames) == [0, 1] and events[-1]["frames"] == 2
    for objects in frames.values():
        assert [o["obj_id"] for o in objects] == [1, 2]
        assert all(m.shape == SIZE for m in masks_of(objects).values())
    # the seeded frame's masks are the ones the concepts request answered
    seeded_masks, propagated = masks_of(answer["objects"]), masks_of(frames[1])
    for obj_id, mask in seeded_masks.items():
        np.testing.assert_array_equal(propagated[obj_id], mask)


@pytest.mark.parametrize(
    "body, status, code, words",
    [
        ({"frame_idx": 2, "phrases": ["cat"]}, 422, "invalid_request", ("frame_idx: 2", "0 to 1")),
        ({"frame_idx": -1, "phrases": ["cat"]}, 422, "invalid_request", ("frame_idx",)),
        (
            {"frame_idx": 0, "phrases": ["a", "b", "c"]},
            422,
            "too_many_prompts",
            ("phrases: 3", "max_concept_phrases"),
        ),
        (
            {"frame_idx": 0, "phrases": ["cat"], "max_instances": 4},
            422,
            "too_many_prompts",
            ("max_instances: 4", "max_concept_instances"),
        ),
        (
            {"frame_idx": 0, "boxes": [{"box": [0, 0, 5, 5]}] * 2},
            422,
            "too_many_prompts",
            ("boxes: 2", "max_concept_boxes"),
        ),
        (
            {"frame_idx": 0, "boxes": [{"box": [0, 0, 97, 10]}]},
            422,
            "invalid_request",
            ("boxes[0].box", "96x64"),
        ),
        ({"frame_idx": 0, "phrases": [" "]}, 422, "invalid_request", ("phrases[0]", "empty")),
        ({"frame_idx": 0}, 422, "invalid_request", ("phrase", "box")),
        (
            {"frame_idx": 0, "phrases": ["cat"], "dedupe_iou": 2},
            422,
            "invalid_request",
            ("dedupe",),
        ),
        ({"frame": 0, "phrases": ["cat"]}, 422, "invalid_request", ("frame",)),
    ],
)
def test_a_bad_request_is_refused_before_any_work(client, body, status, code, words):
    sid = new_session(client)
    answer = client.post(f"/v1/videos/{sid}/concepts", json=body)
    assert answer.status_code == status, answer.text
    error = error_of(answer)
    assert error["code"] == code and all(w in error["message"] for w in words), error
    assert obj_ids(client, sid) == []
    client.delete(f"/v1/videos/{sid}")


def test_the_object_limit_names_the_room_left(client, seeded):
    sid, _ = seeded  # 2 objects of max_video_objects 3
    answer = client.post(
        f"/v1/videos/{sid}/concepts", json={"frame_idx": 0, "phrases": ["cat"], "max_instances": 2}
    )
    assert answer.status_code == 413, answer.text
    error = error_of(answer)
    assert error["code"] == "too_many_objects"
    assert "2 new object(s) beside the 2" in error["message"]
    assert "max_video_objects 3" in error["message"] and "at most 1 more" in error["message"]
    assert obj_ids(client, sid) == [1, 2]
    unknown = client.post("/v1/videos/nope/concepts", json={"frame_idx": 0, "phrases": ["cat"]})
    assert unknown.status_code == 404 and error_of(unknown)["code"] == "session_not_found"


def test_a_failure_half_way_adds_no_object(client, seeded, video_predictor, monkeypatch):
    """The object is added, then its prompt fails: it is removed again, the session's
    other objects stay (on the seeded session: its frame's features are already held)."""
    sid, _ = seeded
    real = video_predictor.add_mask
    calls = []

    def fails_after_adding(state, frame_idx, obj_id, mask):
        calls.append(obj_id)
        real(state, frame_idx, obj_id, mask)
        raise VideoPromptError("injected failure")

    monkeypatch.setattr(video_predictor, "add_mask", fails_after_adding)
    body = {"frame_idx": 1, "phrases": ["cat"], "score_thresh": 0, "max_instances": 1}
    answer = client.post(f"/v1/videos/{sid}/concepts", json=body)
    assert answer.status_code == 422 and "injected failure" in error_of(answer)["message"]
    assert calls == [3] and obj_ids(client, sid) == [1, 2]


def test_concepts_or_video_disabled_say_how_to_enable_them(
    predictor, video_predictor, concepts_tiny
):
    body = {"frame_idx": 0, "phrases": ["cat"]}
    video_only = ServerSettings.from_flat(warmup=False, video=True)
    with TestClient(create_app(video_only, predictor, video_predictor)) as client:
        sid = new_session(client)
        answer = client.post(f"/v1/videos/{sid}/concepts", json=body)
        assert answer.status_code == 404, answer.text
        error = error_of(answer)
        assert error["code"] == "concepts_disabled" and "--concepts" in error["message"]
    concepts_only = ServerSettings.from_flat(warmup=False, concepts=True)
    with TestClient(create_app(concepts_only, predictor, concepts=concepts_tiny)) as client:
        answer = client.post("/v1/videos/x/concepts", json=body)
        assert answer.status_code == 404 and error_of(answer)["code"] == "video_disabled"
