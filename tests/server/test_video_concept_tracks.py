"""POST /v1/videos/{session_id}/concepts/track: SAM 3's own video predictor on a session's
frames, streamed as Server-Sent Events.

In process (TestClient) with the tiny random SAM 3 (``concepts_tiny``), the tiny random
SAM 2.1 image model and a small SAM 2.1 tracker, on two small frames: the stream's frames
are :meth:`Sam3VideoPredictor.run`'s on the same frames and weights (an independent
predictor from :func:`video_predictor`), SAM 3's ids mapped to the smallest ids the
session does not use (it holds a SAM 2.1 object first); the session keeps them with the
phrase as name (GET, PATCH, DELETE, POST /v1/video-export with its id); ``done`` carries
the counts, SAM 3's seconds per stage and each object's first and last frame. The hostile
half: bad phrases, unknown fields, frame and frame-count bounds, no room for an object,
SAM 3's state past the byte limits, live and busy sessions, a server without concepts or
video - each a 4xx naming the field or limit before any model work; and (a real server on
127.0.0.1) a client that hangs up mid-run stops it at SAM 3's next operation."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch
from fastapi.testclient import TestClient
from server_support import png_bytes, start_app
from small_tracker import small_tiny_tracker

from sam2serve.concepts.video_association import VideoThresholds
from sam2serve.concepts.video_load import video_predictor
from sam2serve.concepts.video_predictor import Sam3VideoPredictor
from sam2serve.engine.rle import coco_to_rle, rle_to_mask
from sam2serve.engine.video.predictor import VideoPredictor
from sam2serve.engine.video.state import object_frame_bytes
from sam2serve.samples import sample_clip
from sam2serve.server.app import create_app
from sam2serve.server.concept_tracks import RunBytes, TrackIds, run_thresholds
from sam2serve.server.settings import ServerSettings

SIZE = (64, 96)
FRAMES, _ = sample_clip(2, SIZE)
# Room for two of SAM 3's objects beside one SAM 2.1 object: a short, bounded run.
LIMITS = {"max_video_objects": 3, "max_concept_instances": 2}
CLICK = {"frame_idx": 0, "points": [{"x": 30, "y": 28}]}
WAIT_S = 300  # upper bound on waiting for a server-side state; never asserted as a time


@pytest.fixture(scope="module")
def sam2_video() -> VideoPredictor:
    return VideoPredictor(small_tiny_tracker(seed=0))


def make_app(predictor, sam2_video, concepts_tiny, **changes: Any) -> Any:
    settings = ServerSettings.from_flat(
        warmup=False, video=True, concepts=True, **{**LIMITS, **changes}
    )
    return create_app(settings, predictor, sam2_video, concepts=concepts_tiny)


@pytest.fixture(scope="module")
def client(predictor, sam2_video, concepts_tiny) -> Iterator[TestClient]:
    with TestClient(make_app(predictor, sam2_video, concepts_tiny)) as client:
        yield client


def new_session(client: Any, frames: list[np.ndarray] = FRAMES) -> str:
    files = [("frame", (f"{i}.png", png_bytes(f), "image/png")) for i, f in enumerate(frames)]
    answer = client.post("/v1/videos", files=files)
    assert answer.status_code == 201, answer.text
    return answer.json()["session_id"]


def track(client: TestClient, sid: str, body: dict[str, Any]) -> list[tuple[str, dict]]:
    """The stream's (event, data) pairs."""
    events: list[tuple[str, dict]] = []
    with client.stream("POST", f"/v1/videos/{sid}/concepts/track", json=body) as stream:
        assert stream.status_code == 200, stream.read()
        name = "message"
        for line in stream.iter_lines():
            if line.startswith("event: "):
                name = line[len("event: ") :]
            elif line.startswith("data: "):
                events.append((name, json.loads(line[len("data: ") :])))
    return events


def error_of(answer: Any) -> dict[str, Any]:
    return answer.json()["error"]


def mask_of(obj: dict[str, Any]) -> np.ndarray:
    return rle_to_mask(coco_to_rle(obj["segmentation"]))


@pytest.fixture(scope="module")
def tracked(client) -> tuple[str, list[tuple[str, dict]]]:
    """A session with SAM 2.1 object 1, then 'disc' tracked by SAM 3 (max_frames far past
    the video's end: bounded by it)."""
    sid = new_session(client)
    answer = client.post(f"/v1/videos/{sid}/prompts", json={**CLICK, "obj_id": 1, "name": "cup"})
    assert answer.status_code == 200, answer.text
    return sid, track(client, sid, {"text": " disc ", "max_frames": 2**31 - 1})


def expected_run(concepts_tiny, done: dict[str, Any]) -> list:
    """The engine's answers on the same frames and weights, with the thresholds the run
    reports (random weights: 0, new objects from 0.2) and its object limit."""
    assert done["score_thresh"] == 0.0 and done["new_object_thresh"] == pytest.approx(0.2)
    thresholds = VideoThresholds(
        score=done["score_thresh"],
        new_det=done["new_object_thresh"],
        max_objects=done["max_objects"],
    )
    predictor = video_predictor(concepts_tiny, thresholds)
    state = predictor.start(len(FRAMES), *SIZE, "disc")
    return list(predictor.run(state, iter(FRAMES), start=0))


def test_the_stream_is_the_video_predictors_run_with_the_sessions_ids(tracked, concepts_tiny):
    _, events = tracked
    assert [name for name, _ in events] == ["frame"] * len(FRAMES) + ["done"]
    done = events[-1][1]
    assert done["max_objects"] == 2  # max_video_objects 3 minus the SAM 2.1 object
    expected = expected_run(concepts_tiny, done)
    ids: dict[int, int] = {}  # SAM 3's -> the session's: from 2 (1 is SAM 2.1's), in order
    for result in expected:
        for obj in result.obj_ids:
            if obj not in ids and len(ids) < done["max_objects"]:
                ids[obj] = 2 + len(ids)
    assert ids, "SAM 3 found nothing: the comparison would be empty"
    for (_, frame), result in zip(events, expected, strict=False):
        assert frame["frame_idx"] == result.frame
        wanted = [(ids[o], i) for i, o in enumerate(result.obj_ids) if o in ids]
        objects = frame["objects"]
        assert [o["obj_id"] for o in objects] == [session_id for session_id, _ in wanted]
        for obj, (_, row) in zip(objects, wanted, strict=True):
            mask = mask_of(obj)
            np.testing.assert_array_equal(mask, result.masks[row])
            assert obj["area"] == int(mask.sum()) and obj["name"] == "disc"
            assert obj["score"] == pytest.approx(result.scores[row], abs=1e-6)
    assert done["dropped_objects"] == len({o for r in expected for o in r.obj_ids} - set(ids))


def test_done_counts_frames_stages_and_each_objects_span(tracked):
    _, events = tracked
    done = events[-1][1]
    seen: dict[int, list[int]] = {}
    for name, frame in events[:-1]:
        for obj in frame["objects"]:
            seen.setdefault(obj["obj_id"], []).append(frame["frame_idx"])
    assert done["frames"] == len(FRAMES) and done["elapsed_ms"] > 0
    assert done["frames_per_s"] == pytest.approx(done["frames"] / done["elapsed_ms"] * 1000, 0.01)
    assert set(done["stage_seconds"]) == {"detector", "tracker", "association"}
    assert all(seconds > 0 for seconds in done["stage_seconds"].values())
    spans = {o["obj_id"]: (o["first_frame"], o["last_frame"], o["name"]) for o in done["objects"]}
    assert spans == {obj: (frames[0], frames[-1], "disc") for obj, frames in seen.items()}


def test_the_session_keeps_sam3s_objects_named_by_the_phrase(client, tracked):
    sid, events = tracked
    spans = {o["obj_id"]: o for o in events[-1][1]["objects"]}
    session = client.get(f"/v1/videos/{sid}").json()
    assert session["obj_ids"] == [1] and not session["busy"]
    assert session["objects"][0] == {"obj_id": 1, "name": "cup"}  # SAM 2.1's, as before
    assert session["objects"][1:] == [
        {"obj_id": obj, "name": "disc", "tracker": "sam3", **frames}
        for obj, span in sorted(spans.items())
        for frames in [{"first_frame": span["first_frame"], "last_frame": span["last_frame"]}]
    ]


def test_the_export_names_sam3s_objects_by_the_phrase(client, tracked):
    sid, events = tracked
    ids = sorted({o["obj_id"] for _, f in events[:-1] for o in f.get("objects", [])})
    frames = [
        {
            "frame_idx": f["frame_idx"],
            "objects": [
                {"obj_id": o["obj_id"], "segmentation": o["segmentation"]} for o in f["objects"]
            ],
        }
        for name, f in events
        if name == "frame"
    ]
    video = {"name": "clip", "width": SIZE[1], "height": SIZE[0], "num_frames": len(FRAMES)}
    body = {
        "format": "youtube_vis",
        "video": video,
        "objects": [{"obj_id": obj} for obj in ids],
        "frames": frames,
        "session_id": sid,
    }
    answer = client.post("/v1/video-export", json=body)
    assert answer.status_code == 200, answer.text
    assert [c["name"] for c in answer.json()["categories"]] == ["disc"]


def test_sam3s_ids_take_the_smallest_unused_ids_within_the_room():
    ids = TrackIds(used={1, 3}, room=3)
    assert ids.session_ids([0, 2]) == [2, 4]  # around SAM 2.1's 1 and 3, in order
    assert ids.session_ids([2, 7]) == [4, 5]  # a known id keeps its own
    assert ids.session_ids([7, 9, 11]) == [5, None, None]  # past the room: dropped
    assert ids.dropped == {9, 11} and ids.given == {0: 2, 2: 4, 7: 5}


def test_the_run_state_estimate_by_hand():
    """At SAM 3's 1008 px: G = 72; a record is a 64 x 72 x 72 bfloat16 memory, 288 x 288
    float32 logits, a 256-float pointer and two scores; 4 + 16 of them per object, plus
    16 frames of 1080p bool masks held back and 128 bytes a frame."""
    estimate = RunBytes(1008, 1080, 1920, frames=100)
    assert estimate.record == 663_552 + 331_776 + 1024 + 8
    assert estimate.per_object == 20 * 996_360 + 16 * 1080 * 1920 + 128
    short = RunBytes(1008, 1080, 1920, frames=3)  # 4 + 3 records: the clip is shorter
    assert short.per_object == 7 * 996_360 + 16 * 1080 * 1920 + 128
    assert estimate.total(3) == 3 * estimate.per_object


def test_the_thresholds_default_to_metas_or_zero_under_random_weights():
    metas = run_thresholds(None, random_weights=False, max_objects=4)
    assert (metas.score, metas.new_det, metas.max_objects) == (0.5, pytest.approx(0.7), 4)
    random = run_thresholds(None, random_weights=True, max_objects=4)
    assert (random.score, random.new_det) == (0.0, pytest.approx(0.2))
    given = run_thresholds(0.9, random_weights=True, max_objects=4)
    assert (given.score, given.new_det) == (0.9, 1.0)  # at most 1


# --------------------------------------------------------------------------- refused


@pytest.mark.parametrize(
    "body, words",
    [
        ({"text": " "}, ("text", "empty")),
        ({"text": "cat\u202e"}, ("text", "U+202E")),
        ({"text": "x" * 300}, ("text", "256 characters")),
        ({"text": "x" * 65}, ("text", "64")),
        ({"text": ["cat"]}, ("text",)),
        ({}, ("text",)),
        ({"text": "cat", "phrases": ["cat"]}, ("phrases",)),
        ({"text": "cat", "frame_idx": 2}, ("frame_idx: 2", "0 to 1")),
        ({"text": "cat", "frame_idx": -1}, ("frame_idx",)),
        ({"text": "cat", "max_frames": 0}, ("max_frames",)),
        ({"text": "cat", "max_frames": 2**40}, ("max_frames",)),
        ({"text": "cat", "score_thresh": 1.5}, ("score_thresh",)),
        ({"text": "cat", "mask_format": "bmp"}, ("mask_format",)),
    ],
)
def test_a_bad_request_is_refused_before_any_work(client, body, words):
    sid = new_session(client)
    answer = client.post(f"/v1/videos/{sid}/concepts/track", json=body)
    assert answer.status_code == 422, answer.text
    error = error_of(answer)
    assert error["code"] == "invalid_request" and all(w in error["message"] for w in words), error
    assert client.get(f"/v1/videos/{sid}").json()["objects"] == []
    client.delete(f"/v1/videos/{sid}")


def test_no_room_for_an_object_is_413(client):
    sid = new_session(client)
    for obj_id in (1, 2, 3):
        prompt = {**CLICK, "obj_id": obj_id}
        assert client.post(f"/v1/videos/{sid}/prompts", json=prompt).status_code == 200
    answer = client.post(f"/v1/videos/{sid}/concepts/track", json={"text": "cat"})
    assert answer.status_code == 413, answer.text
    error = error_of(answer)
    assert error["code"] == "too_many_objects" and "max_video_objects 3" in error["message"]
    client.delete(f"/v1/videos/{sid}")


def test_sam3s_state_past_the_byte_limits_is_413_or_429(predictor, sam2_video, concepts_tiny):
    """The session limit leaves room for the session but not for SAM 3's state of one
    object (413); the servers' total, likewise (429)."""
    per_object = RunBytes(concepts_tiny.size.image_size, *SIZE, len(FRAMES)).per_object
    # what the session counts: its frames and one SAM 2.1 object through every frame
    frames_bytes = len(FRAMES) * SIZE[0] * SIZE[1] * 3
    session_need = frames_bytes + len(FRAMES) * object_frame_bytes(sam2_video.model)
    for limit, status, code, words in (
        ("max_video_session_bytes", 413, "session_too_large", "max_video_session_bytes"),
        ("max_video_total_bytes", 429, "video_memory_full", "max_video_total_bytes"),
    ):
        app = make_app(
            predictor, sam2_video, concepts_tiny, **{limit: session_need + per_object - 1}
        )
        with TestClient(app) as client:
            sid = new_session(client)
            answer = client.post(f"/v1/videos/{sid}/concepts/track", json={"text": "cat"})
            assert answer.status_code == status, answer.text
            assert error_of(answer)["code"] == code and words in error_of(answer)["message"]


def test_a_live_or_busy_session_is_409(client):
    live = client.post("/v1/videos/live", json={"width": SIZE[1], "height": SIZE[0]})
    assert live.status_code == 201, live.text
    sid = live.json()["session_id"]
    answer = client.post(f"/v1/videos/{sid}/concepts/track", json={"text": "cat"})
    assert answer.status_code == 409 and error_of(answer)["code"] == "live_session"
    assert "POST /v1/videos" in error_of(answer)["message"]
    assert '"concepts_track"' in error_of(answer)["message"]  # what the live connection takes
    client.delete(f"/v1/videos/{sid}")
    sid = new_session(client)
    videos = client.app.state.service.videos
    with videos.using(videos.get(sid), "propagate"):
        answer = client.post(f"/v1/videos/{sid}/concepts/track", json={"text": "cat"})
    assert answer.status_code == 409 and error_of(answer)["code"] == "session_busy"
    client.delete(f"/v1/videos/{sid}")


def test_concepts_or_video_disabled_say_how_to_enable_them(predictor, sam2_video, concepts_tiny):
    body = {"text": "cat"}
    video_only = ServerSettings.from_flat(warmup=False, video=True)
    with TestClient(create_app(video_only, predictor, sam2_video)) as client:
        sid = new_session(client)
        answer = client.post(f"/v1/videos/{sid}/concepts/track", json=body)
        assert answer.status_code == 404 and error_of(answer)["code"] == "concepts_disabled"
        assert "--concepts" in error_of(answer)["message"]
    concepts_only = ServerSettings.from_flat(warmup=False, concepts=True)
    with TestClient(create_app(concepts_only, predictor, concepts=concepts_tiny)) as client:
        answer = client.post("/v1/videos/x/concepts/track", json=body)
        assert answer.status_code == 404 and error_of(answer)["code"] == "video_disabled"


# --------------------------------------------------------------------------- edits


def test_sam3s_objects_are_renamed_removed_and_never_prompted_by_sam2(client, tracked):
    """(Last: it edits the tracked session.)"""
    sid, events = tracked
    ids = sorted(o["obj_id"] for o in events[-1][1]["objects"])
    first = ids[0]
    prompted = client.post(f"/v1/videos/{sid}/prompts", json={**CLICK, "obj_id": first})
    assert prompted.status_code == 409 and error_of(prompted)["code"] == "concept_track_id"
    renamed = client.patch(f"/v1/videos/{sid}/objects/{first}", json={"name": "plate"})
    assert renamed.status_code == 200, renamed.text
    assert {o["obj_id"]: o["name"] for o in renamed.json()["objects"]}[first] == "plate"
    removed = client.delete(f"/v1/videos/{sid}/objects/{first}")
    assert removed.status_code == 200, removed.text
    assert first not in [o["obj_id"] for o in removed.json()["objects"]]
    # its id is free again: SAM 2.1 may use it now
    assert (
        client.post(f"/v1/videos/{sid}/prompts", json={**CLICK, "obj_id": first}).status_code == 200
    )
    reset = client.post(f"/v1/videos/{sid}/reset")
    assert reset.status_code == 200 and reset.json()["objects"] == []


# --------------------------------------------------------------------------- disconnect


class SpinsOnSecondFrame(Sam3VideoPredictor):
    """The real predictor; encoding the second frame it runs torch operations until its
    job is cancelled (each is a checkpoint of the job: the cancel raises there)."""

    spinning = threading.Event()
    encoded = 0
    ended_by = ""

    def encode(self, frame: np.ndarray) -> Any:
        type(self).encoded += 1
        if type(self).encoded == 2:
            type(self).spinning.set()
            deadline = time.monotonic() + WAIT_S
            try:
                while time.monotonic() < deadline:
                    torch.ones(1).add(1)
                    time.sleep(0.01)
            except BaseException as exc:
                type(self).ended_by = type(exc).__name__
                raise
            type(self).ended_by = "never cancelled"
        return super().encode(frame)


@pytest.fixture(scope="module")
def real_server(predictor, sam2_video, concepts_tiny) -> Iterator[Any]:
    """A real server on 127.0.0.1 (a disconnect and a WebSocket are the subject)."""
    settings = ServerSettings.from_flat(warmup=False, video=True, concepts=True, **LIMITS)
    app = create_app(settings, predictor, sam2_video, concepts=concepts_tiny)
    server = start_app(app, settings)
    yield server
    server.stop()


def test_a_client_that_leaves_mid_run_stops_it(real_server, monkeypatch):
    service = real_server.app.state.service
    video = service.concepts.video
    real = video.predictor

    def spinning(thresholds: VideoThresholds) -> Sam3VideoPredictor:
        base = real(thresholds)
        return SpinsOnSecondFrame(base.detector, base.tokenize, base.neck, base.tracker, thresholds)

    monkeypatch.setattr(video, "predictor", spinning)
    frames, _ = sample_clip(3, SIZE)
    with real_server.client() as client:
        sid = new_session(client, frames)
        url = f"/v1/videos/{sid}/concepts/track"
        with client.stream("POST", url, json={"text": "disc"}) as stream:
            assert stream.status_code == 200
            assert SpinsOnSecondFrame.spinning.wait(WAIT_S), "the run never reached frame 1"
        session = service.videos.get(sid, touch=False)
        deadline = time.monotonic() + WAIT_S
        while session.busy_with is not None:
            assert time.monotonic() < deadline, "the run never ended"
            time.sleep(0.05)
        assert SpinsOnSecondFrame.ended_by == "JobCancelled"
        assert SpinsOnSecondFrame.encoded == 2, "the run went on after its client left"
        assert session.concept_run_bytes == 0 and service.decoding.held == 0
        assert client.delete(f"/v1/videos/{sid}").status_code == 200
