"""POST /v1/videos/{session_id}/concepts/track with ``clicks``: clicks on SAM 3's objects,
stateless per request (the phrase's pass again on an interactive state, the clicks, Meta's
partial pass). The stream is ``track --click``'s run (:func:`clicked_run`) on the same
frames and weights (an independent predictor), the session's ids mapped back to SAM 3's
(an earlier object keeps its id; an unused id adds an object), a frame answered again
streamed again; ``done`` says the clicks were applied and the session keeps the final
spans. The hostile half: bad click shapes, another phrase's or a SAM 2.1 object, points
outside the video, frames the pass does not answer, too many clicks or points, clicks with
several phrases or a pass short of the end, and the interactive state past the byte
limits - each a 4xx naming it before any model work. In process (TestClient), the tiny
random SAM 3 on two small frames, as test_video_concept_tracks.py."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient
from test_video_concept_tracks import (
    CLICK,
    FRAMES,
    SIZE,
    error_of,
    make_app,
    mask_of,
    new_session,
    sam2_video,  # noqa: F401  # the module's fixture
    track,
)

from sam2serve.commands.track_clicks import ClickSpec, clicked_run
from sam2serve.concepts.video_association import VideoThresholds
from sam2serve.concepts.video_load import video_predictor
from sam2serve.samples import sample_clip
from sam2serve.server.concept_tracks import RunBytes
from sam2serve.server.video_schemas import MAX_CONCEPT_CLICKS

# Room for three of SAM 3's objects beside one SAM 2.1 object.
LIMITS = {
    "max_video_objects": 4,
    "max_concept_instances": 3,
    "max_video_sessions": 32,
    "max_video_sessions_per_client": 32,
}
NEW_ID = 9  # an id the session does not use: a new object


@pytest.fixture(scope="module")
def client(predictor, sam2_video, concepts_tiny) -> Iterator[TestClient]:  # noqa: F811
    with TestClient(make_app(predictor, sam2_video, concepts_tiny, **LIMITS)) as client:
        yield client


def url(sid: str) -> str:
    return f"/v1/videos/{sid}/concepts/track"


def earlier_objects(first: list[tuple[str, dict]]) -> list[int]:
    objects = [o["obj_id"] for o in first[-1][1]["objects"]]
    assert objects, "SAM 3 found nothing: no object to click"
    return objects


SCENARIOS = {
    # clicks on two objects 'disc' found (Meta's refine), the later frame first
    "refine": (
        None,
        lambda objects: [
            {"frame_idx": 1, "obj_id": objects[0], "points": [[40, 30], [10, 5]], "labels": [1, 0]},
            {"frame_idx": 0, "obj_id": objects[-1], "points": [[70.5, 20]], "labels": [1]},
        ],
    ),
    # nothing passes score_thresh 0.9 (random weights score about 0.25): a click adds an object (Meta's add), an unused id
    "add": (
        0.9,
        lambda objects: [{"frame_idx": 0, "obj_id": NEW_ID, "points": [[70.5, 20]], "labels": [1]}],
    ),
}


@pytest.fixture(scope="module", params=sorted(SCENARIOS))
def clicked(client, request) -> dict[str, Any]:
    """A session with SAM 2.1 object 1 and 'disc' tracked; then 'disc' again with the
    scenario's clicks."""
    score_thresh, make_clicks = SCENARIOS[request.param]
    sid = new_session(client)
    assert client.post(f"/v1/videos/{sid}/prompts", json={**CLICK, "obj_id": 1}).status_code == 200
    body = {"text": "disc", "score_thresh": score_thresh}
    first = track(client, sid, body)
    objects = [] if score_thresh is not None else earlier_objects(first)
    clicks = make_clicks(objects)
    events = track(client, sid, {**body, "clicks": clicks})
    return {"sid": sid, "first": first, "clicks": clicks, "events": events}


def test_the_stream_is_the_clicked_run_with_the_sessions_ids(clicked, concepts_tiny):
    first, events = clicked["first"], clicked["events"]
    done = events[-1][1]
    assert events[-1][0] == "done", done
    assert done["clicks_applied"] == len(clicked["clicks"])
    thresholds = VideoThresholds(
        score=done["score_thresh"],
        new_det=done["new_object_thresh"],
        max_objects=done["max_objects"],
    )
    # SAM 3's ids -> the session's, as the first run gave them (the pass is the same)
    ids: dict[int, int] = {}
    predictor = video_predictor(concepts_tiny, thresholds)
    state = predictor.start(len(FRAMES), *SIZE, "disc")
    for result, (_, frame) in zip(predictor.run(state, iter(FRAMES)), first, strict=False):
        session_ids = [o["obj_id"] for o in frame["objects"]]
        for sam3, obj in zip(result.obj_ids, session_ids, strict=True):
            ids.setdefault(sam3, obj)
    sam3_of = {obj: sam3 for sam3, obj in ids.items()}
    for click in clicked["clicks"]:  # a new object: the next of SAM 3's ids
        if click["obj_id"] not in sam3_of:
            sam3_of[click["obj_id"]] = max([state.max_obj_id, *ids]) + 1
    specs = [
        ClickSpec(
            "",
            c["frame_idx"],
            sam3_of[c["obj_id"]],
            tuple((float(x), float(y)) for x, y in c["points"]),
            tuple(c["labels"]),
        )
        for c in clicked["clicks"]
    ]
    predictor = video_predictor(concepts_tiny, thresholds)
    _, answers = clicked_run(
        predictor, ["disc"], (), specs, FRAMES.__getitem__, len(FRAMES), *SIZE, 0, "forward"
    )
    expected = list(answers)
    frames = [frame for _, frame in events[:-1]]
    assert len(frames) == len(expected) == 2 * len(FRAMES) + len(specs)
    session_of = {sam3: obj for obj, sam3 in sam3_of.items()}
    for frame, result in zip(frames, expected, strict=True):
        assert frame["frame_idx"] == result.frame
        assert [o["obj_id"] for o in frame["objects"]] == [session_of[o] for o in result.obj_ids]
        for obj, mask in zip(frame["objects"], result.masks, strict=True):
            np.testing.assert_array_equal(mask_of(obj), mask)
            assert obj["name"] == obj["phrase"] == "disc"


def test_a_new_object_past_sam3s_limit_ends_the_stream_with_an_error_naming_it(client):
    sid = new_session(client)
    objects = earlier_objects(track(client, sid, {"text": "disc"}))
    assert objects  # SAM 3 tracks as many as it may (random weights fill its limit)
    events = track(client, sid, {"text": "disc", "clicks": [one(obj_id=NEW_ID)]})
    name, error = events[-1]
    assert name == "error" and error["error"]["code"] == "invalid_request"
    assert f"obj_id {NEW_ID}" in error["error"]["message"] and "limit" in error["error"]["message"]


def test_the_session_keeps_the_final_spans(client, clicked):
    events = clicked["events"]
    final: dict[int, list[int]] = {}
    for _, frame in events[-1 - len(FRAMES) : -1]:  # the partial pass: the final answers
        for obj in frame["objects"]:
            final.setdefault(obj["obj_id"], []).append(frame["frame_idx"])
    spans = {o["obj_id"]: (o["first_frame"], o["last_frame"]) for o in events[-1][1]["objects"]}
    assert spans == {obj: (seen[0], seen[-1]) for obj, seen in final.items()}
    listed = client.get(f"/v1/videos/{clicked['sid']}").json()["objects"]
    assert {o["obj_id"] for o in listed} == {1} | set(final)


# --------------------------------------------------------------------------- refused


def one(**changes: Any) -> dict[str, Any]:
    return {"frame_idx": 0, "obj_id": NEW_ID, "points": [[5, 5]], "labels": [1], **changes}


@pytest.mark.parametrize(
    "click, words",
    [
        (one(points=[]), ("points",)),
        (one(points=[[5]]), ("points",)),
        (one(points=[[5, 5, 5]]), ("points",)),
        (one(points=[["5", 5]]), ("points",)),
        (one(points=[[-1, 5]]), ("points",)),
        (one(labels=[2]), ("labels",)),
        (one(labels=[True]), ("labels",)),
        (one(labels=[1, 0]), ("one label per point", "1 points, 2 labels")),
        (one(points=[[1, 1]] * 17, labels=[1] * 17), ("points", "16")),
        (one(obj_id=0), ("obj_id",)),
        (one(obj_id="2"), ("obj_id",)),
        (one(extra=1), ("extra",)),
        (one(points=[[SIZE[1] + 1, 5]]), ("clicks[0]", "outside the 96x64 video")),
        (one(points=[[5, SIZE[0] + 0.5]]), ("clicks[0]", "outside")),
        (one(frame_idx=2), ("clicks[0]", "frame 2", "0..1")),
    ],
)
def test_a_bad_click_is_422_before_any_work(client, click, words):
    sid = new_session(client)
    answer = client.post(url(sid), json={"text": "disc", "clicks": [click]})
    assert answer.status_code == 422, answer.text
    error = error_of(answer)
    assert error["code"] == "invalid_request" and all(w in error["message"] for w in words), error
    assert client.get(f"/v1/videos/{sid}").json()["objects"] == []
    client.delete(f"/v1/videos/{sid}")


def test_a_click_on_a_frame_the_pass_does_not_answer_is_422(client):
    sid = new_session(client)
    body = {"text": "disc", "frame_idx": 1, "clicks": [one(frame_idx=0)]}
    answer = client.post(url(sid), json=body)
    assert answer.status_code == 422, answer.text
    message = error_of(answer)["message"]
    assert "clicks[0]" in message and "frame 0" in message and "1..1" in message


@pytest.mark.parametrize(
    "body, words",
    [
        ({"phrases": ["disc", "square"], "clicks": [one()]}, ("one phrase", "'square'")),
        ({"text": "disc", "max_frames": 1, "clicks": [one()]}, ("max_frames", "last frame")),
        ({"text": "disc", "clicks": []}, ("clicks",)),
        ({"text": "disc", "clicks": [one()] * (MAX_CONCEPT_CLICKS + 1)}, ("clicks", "16")),
        ({"text": "disc", "clicks": one()}, ("clicks",)),
    ],
)
def test_clicks_the_run_cannot_take_are_422(client, body, words):
    sid = new_session(client)
    answer = client.post(url(sid), json=body)
    assert answer.status_code == 422, answer.text
    error = error_of(answer)
    assert error["code"] == "invalid_request" and all(w in error["message"] for w in words), error


def test_a_sam2_object_or_another_phrases_is_409_naming_it(client):
    sid = new_session(client)
    assert client.post(f"/v1/videos/{sid}/prompts", json={**CLICK, "obj_id": 1}).status_code == 200
    square = track(client, sid, {"text": "square"})[-1][1]["objects"]
    assert square, "SAM 3 found nothing for 'square'"
    for obj, words in ((1, ("obj_id 1", "SAM 2.1")), (square[0]["obj_id"], ("'square'",))):
        answer = client.post(url(sid), json={"text": "disc", "clicks": [one(obj_id=obj)]})
        assert answer.status_code == 409, answer.text
        error = error_of(answer)
        assert error["code"] == "click_object" and all(w in error["message"] for w in words)
    # nothing ran: the objects are as they were
    objects = client.get(f"/v1/videos/{sid}").json()["objects"]
    assert {o["obj_id"] for o in objects} == {1} | {o["obj_id"] for o in square}


def test_the_interactive_state_past_the_byte_limits_is_413_or_429(
    predictor,
    sam2_video,  # noqa: F811
    concepts_tiny,
):
    """Room for the bounded run's state of one object, not for the interactive one's
    (every frame's record kept: more than the bounded run's on a clip of 20 frames)."""
    clip, _ = sample_clip(20, SIZE)
    image_size = concepts_tiny.size.image_size
    bounded = RunBytes(image_size, *SIZE, len(clip)).per_object
    kept = RunBytes(image_size, *SIZE, len(clip), clicks=1).per_object
    assert kept > bounded
    frames_bytes = len(clip) * SIZE[0] * SIZE[1] * 3
    for limit, status, code in (
        ("max_video_session_bytes", 413, "session_too_large"),
        ("max_video_total_bytes", 429, "video_memory_full"),
    ):
        app = make_app(predictor, sam2_video, concepts_tiny, **{limit: frames_bytes + kept - 1})
        with TestClient(app) as client:
            sid = new_session(client, clip)
            answer = client.post(url(sid), json={"text": "disc", "clicks": [one()]})
            assert answer.status_code == status, answer.text
            assert error_of(answer)["code"] == code and limit in error_of(answer)["message"]
            assert client.get(f"/v1/videos/{sid}").json()["objects"] == []


def test_the_interactive_estimate_by_hand():
    """Per object: every frame's record (the bounded estimate's record), packed answer
    and scores, the clicks' conditioning records, the hot start's held-back masks."""
    run = RunBytes(1008, 1080, 1920, 100, clicks=2)
    per_frame = run.record + 1080 * 1920 // 8 + 128
    assert run.per_object == 102 * per_frame + 16 * 1080 * 1920 + 128
