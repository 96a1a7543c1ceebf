"""Video tracking sessions against a real server (uvicorn on 127.0.0.1): upload, prompts,
a propagation streamed as Server-Sent Events, a correction and a reverse propagation,
all equal to the engine's own answers on the same frames; the limits (count, frames,
bytes, objects, idle time), busy sessions, a client that leaves mid-stream, and errors.

One tiny video model with random weights serves every server here; its propagation can
be held after the first frame (``gate``) so "streamed as computed" and "busy while
propagating" are checked without timing anything."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest
from server_support import png_bytes, start_server
from small_tracker import small_tiny_tracker

from sam2serve.engine.rle import coco_to_rle, rle_to_mask
from sam2serve.engine.video.predictor import VideoPredictor
from sam2serve.engine.video.state import object_frame_bytes
from sam2serve.engine.video_io import write_video
from sam2serve.samples import sample_clip
from sam2serve.server.session_ids import SESSION_HEADER, is_session_id
from sam2serve.server.settings import ServerSettings

pytest.importorskip("av")

FRAMES, TRUTH = sample_clip(3, (64, 96))
WAIT_S = 120  # upper bound on waiting for a server-side state; never asserted as a time


class GatedVideoPredictor(VideoPredictor):
    """The real predictor; its propagation can wait after the first frame until ``gate``
    opens (it is open unless a test closes it)."""

    def __init__(self, model: Any) -> None:
        # Every frame's features stay cached (3 frames): each is encoded once per session.
        super().__init__(model, feature_cache_frames=len(FRAMES))
        self.gate = threading.Event()
        self.gate.set()
        self.first_frame = threading.Event()

    def propagate(self, state, *args, **kwargs) -> Iterator:  # type: ignore[override]
        for i, frame in enumerate(super().propagate(state, *args, **kwargs)):
            yield frame
            if i == 0:
                self.first_frame.set()
                if not self.gate.wait(timeout=WAIT_S):
                    raise RuntimeError("test gate never opened")


@pytest.fixture(scope="module")
def video_predictor() -> GatedVideoPredictor:
    # SAM 2.1 tiny at 256 x 256 (tests/small_tracker.py): the session's plumbing is the
    # subject, compared with the engine on the same model; 16x less encoder work than 1024.
    return GatedVideoPredictor(small_tiny_tracker(seed=0))


@pytest.fixture(scope="module")
def video_server(predictor, video_predictor):
    settings = ServerSettings.from_flat(video=True, warmup=False, max_video_sessions=3)
    live = start_server(settings, predictor, video_predictor)
    yield live
    video_predictor.gate.set()
    live.stop()


def frame_files(frames=FRAMES) -> list[tuple[str, tuple[str, bytes, str]]]:
    return [("frame", (f"{i:05d}.png", png_bytes(f), "image/png")) for i, f in enumerate(frames)]


def create(client: httpx.Client, files=None) -> dict:
    answer = client.post("/v1/videos", files=files or frame_files())
    assert answer.status_code == 201, answer.text
    assert answer.headers[SESSION_HEADER] == answer.json()["session_id"]
    return answer.json()


def masks_of(objects: list[dict]) -> dict[int, np.ndarray]:
    return {o["obj_id"]: rle_to_mask(coco_to_rle(o["segmentation"])) for o in objects}


def read_events(lines: Iterator[str]) -> Iterator[tuple[str, dict]]:
    """(event, data) pairs of a Server-Sent Events stream."""
    event = None
    for line in lines:
        if line.startswith("event: "):
            event = line[len("event: ") :]
        elif line.startswith("data: "):
            yield event or "message", json.loads(line[len("data: ") :])


def error_code(answer: httpx.Response) -> str:
    return answer.json()["error"]["code"]


def engine_masks(frame) -> dict[int, np.ndarray]:
    return {int(i): m.numpy() for i, m in zip(frame.obj_ids, frame.masks, strict=True)}


# --------------------------------------------------------------------------- the flow


@pytest.fixture(scope="module")
def tracked(video_server, video_predictor) -> dict[str, Any]:
    """One session through the whole flow, with the engine doing the same on its own state."""
    reference = VideoPredictor(video_predictor.model, feature_cache_frames=len(FRAMES))
    state = reference.init_state(FRAMES)
    out: dict[str, Any] = {"engine": {}, "server": {}}
    with video_server.client() as client:
        session = create(client)
        sid = session["session_id"]
        out["created"] = session
        click = {"frame_idx": 0, "obj_id": 1, "points": [{"x": 30, "y": 28}]}
        box = {"frame_idx": 0, "obj_id": 7, "box": [50, 10, 80, 40]}
        out["server"]["click"] = client.post(f"/v1/videos/{sid}/prompts", json=click).json()
        out["server"]["box"] = client.post(f"/v1/videos/{sid}/prompts", json=box).json()
        out["engine"]["click"] = engine_masks(reference.add_points(state, 0, 1, [[30, 28]], [1]))
        out["engine"]["box"] = engine_masks(reference.add_points(state, 0, 7, box=[50, 10, 80, 40]))

        # Forward, held after the first frame: streamed before the rest is computed.
        video_predictor.gate.clear()
        video_predictor.first_frame.clear()
        events = []
        try:
            with client.stream("POST", f"/v1/videos/{sid}/propagate", json={}) as stream:
                out["content_type"] = stream.headers["content-type"]
                lines = stream.iter_lines()
                for event in read_events(lines):
                    events.append(event)
                    if len(events) == 1:
                        assert video_predictor.first_frame.is_set()
                        out["while_running"] = client.get(f"/v1/videos/{sid}").json()
                        out["prompt_while_running"] = client.post(
                            f"/v1/videos/{sid}/prompts", json=click
                        )
                        video_predictor.gate.set()
        finally:
            video_predictor.gate.set()
        out["server"]["forward"] = events
        out["engine"]["forward"] = [engine_masks(f) for f in reference.propagate(state)]

        # A correction on the last frame, then back to the start from there.
        fix = {"frame_idx": 2, "obj_id": 1, "points": [{"x": 70, "y": 40, "label": 0}]}
        fix["clear_old_points"] = False
        out["server"]["fix"] = client.post(f"/v1/videos/{sid}/prompts", json=fix).json()
        out["engine"]["fix"] = engine_masks(
            reference.add_points(state, 2, 1, [[70, 40]], [0], clear_old_points=False)
        )
        with client.stream(
            "POST", f"/v1/videos/{sid}/propagate", json={"start_frame_idx": 2, "reverse": True}
        ) as stream:
            out["server"]["reverse"] = list(read_events(stream.iter_lines()))
        out["engine"]["reverse"] = [
            engine_masks(f) for f in reference.propagate(state, start_frame_idx=2, reverse=True)
        ]
        out["after"] = client.get(f"/v1/videos/{sid}").json()
        out["metrics"] = client.get("/metrics").text
        out["closed"] = client.delete(f"/v1/videos/{sid}")
        out["after_close"] = client.get(f"/v1/videos/{sid}")
    return out


def test_a_session_is_created_from_frame_files(tracked):
    created = tracked["created"]
    assert is_session_id(created["session_id"])
    assert (created["num_frames"], created["width"], created["height"]) == (3, 96, 64)
    assert created["obj_ids"] == [] and created["frames_bytes"] == 3 * 64 * 96 * 3
    assert created["fps"] is None and not created["busy"]


def test_prompts_answer_that_frames_masks_as_the_engine_does(tracked):
    for step in ("click", "box", "fix"):
        answer = tracked["server"][step]
        got, want = masks_of(answer["objects"]), tracked["engine"][step]
        assert sorted(got) == sorted(want), step
        for obj_id in want:
            assert np.array_equal(got[obj_id], want[obj_id]), (step, obj_id)
    assert [o["obj_id"] for o in tracked["server"]["box"]["objects"]] == [1, 7]


def test_propagation_streams_every_frame_as_the_engine_computes_it(tracked):
    assert tracked["content_type"].startswith("text/event-stream")
    for direction, order in (("forward", [0, 1, 2]), ("reverse", [2, 1, 0])):
        events = tracked["server"][direction]
        frames = [data for name, data in events if name == "frame"]
        assert [f["frame_idx"] for f in frames] == order
        assert events[-1][0] == "done" and events[-1][1]["frames"] == 3
        for data, want in zip(frames, tracked["engine"][direction], strict=True):
            got = masks_of(data["objects"])
            assert sorted(got) == sorted(want) == [1, 7]
            for obj_id in want:
                assert np.array_equal(got[obj_id], want[obj_id]), (direction, data["frame_idx"])


def test_a_session_is_busy_while_it_propagates(tracked):
    """The first frame reached the client while the rest waited: streamed as computed."""
    assert tracked["while_running"]["busy"] is True
    busy = tracked["prompt_while_running"]
    assert busy.status_code == 409 and error_code(busy) == "session_busy"
    assert busy.headers["Retry-After"] == "1"
    assert tracked["after"]["busy"] is False and tracked["after"]["obj_ids"] == [1, 7]
    assert tracked["after"]["tracking_bytes"] > 0


def test_closing_a_session_frees_it(tracked):
    assert tracked["closed"].status_code == 200
    gone = tracked["after_close"]
    assert gone.status_code == 404 and error_code(gone) == "session_not_found"
    assert 'endpoint="/v1/videos/{session_id}/propagate"' in tracked["metrics"]
    assert "sam2serve_video_sessions 1.0" in tracked["metrics"]


# --------------------------------------------------------------------------- other inputs


def test_a_session_from_a_video_file_and_a_mask_prompt(video_server, tmp_path):
    path = write_video(tmp_path / "clip.mp4", FRAMES, fps=6)
    with video_server.client() as client:
        session = create(client, files={"video": ("clip.mp4", path.read_bytes(), "video/mp4")})
        assert (session["num_frames"], session["fps"], session["source"]) == (3, 6.0, "clip.mp4")
        sid = session["session_id"]
        mask = TRUTH[1][1]
        counts = [int(c) for c in _runs(mask)]
        answer = client.post(
            f"/v1/videos/{sid}/prompts",
            json={"frame_idx": 1, "obj_id": 3, "mask": {"size": [64, 96], "counts": counts}},
        )
        assert answer.status_code == 200, answer.text
        assert [o["obj_id"] for o in answer.json()["objects"]] == [3]
        body = {"start_frame_idx": 1, "max_frames": 2, "mask_format": "polygon"}
        with client.stream("POST", f"/v1/videos/{sid}/propagate", json=body) as stream:
            events = list(read_events(stream.iter_lines()))
        assert [data["frame_idx"] for name, data in events if name == "frame"] == [1, 2]
        assert isinstance(events[0][1]["objects"][0]["segmentation"], list)  # polygons
        assert events[-1] == ("done", events[-1][1]) and events[-1][1]["frames"] == 2
        removed = client.delete(f"/v1/videos/{sid}/objects/3")
        assert removed.status_code == 200 and removed.json()["obj_ids"] == []
        missing = client.delete(f"/v1/videos/{sid}/objects/3")
        assert missing.status_code == 404 and error_code(missing) == "object_not_found"
        client.delete(f"/v1/videos/{sid}")


def _runs(mask: np.ndarray) -> list[int]:
    """Uncompressed COCO run lengths (column-major, zeros first)."""
    flat = mask.T.reshape(-1).astype(np.int8)
    changes = np.flatnonzero(np.diff(np.concatenate([[0], flat, [1 - flat[-1]]])))
    runs = np.diff(np.concatenate([[0], changes]))
    return runs.tolist()


def test_a_client_that_leaves_mid_stream_stops_the_propagation(video_server, video_predictor):
    with video_server.client() as client:
        sid = create(client)["session_id"]
        prompt = {"frame_idx": 0, "obj_id": 1, "points": [{"x": 30, "y": 28}]}
        assert client.post(f"/v1/videos/{sid}/prompts", json=prompt).status_code == 200
        video_predictor.gate.clear()
        try:
            with client.stream("POST", f"/v1/videos/{sid}/propagate", json={}) as stream:
                for _event in read_events(stream.iter_lines()):
                    break  # the first frame, then hang up
        finally:
            video_predictor.gate.set()
        session = video_server.service.videos.get(sid)
        deadline = time.monotonic() + WAIT_S
        while session.busy_with is not None:
            assert time.monotonic() < deadline, "the propagation never ended"
            time.sleep(0.05)
        tracked = session.state.objects[1].non_cond_outputs
        assert len(tracked) < 2, "the job went on after its client left"
        again = client.post(f"/v1/videos/{sid}/prompts", json=prompt)
        assert again.status_code == 200  # the session is usable again
        client.delete(f"/v1/videos/{sid}")


# --------------------------------------------------------------------------- limits


def test_the_session_count_limit_is_429_with_retry_after(
    server_factory, predictor, video_predictor
):
    live = server_factory(predictor, video_predictor, video=True, max_video_sessions=1)
    with live.client() as client:
        first = create(client)
        refused = client.post("/v1/videos", files=frame_files())
        assert refused.status_code == 429 and error_code(refused) == "too_many_sessions"
        assert int(refused.headers["Retry-After"]) >= 1
        assert "max_video_sessions 1" in refused.json()["error"]["message"]
        assert client.delete(f"/v1/videos/{first['session_id']}").status_code == 200
        create(client)


def test_frame_byte_and_object_limits_are_413(server_factory, predictor, video_predictor, tmp_path):
    live = server_factory(
        predictor,
        video_predictor,
        video=True,
        max_video_frames=2,
        max_video_objects=1,
        max_video_upload_bytes=200_000,
    )
    with live.client() as client:
        too_long = client.post("/v1/videos", files=frame_files())
        assert too_long.status_code == 413 and error_code(too_long) == "too_many_frames"
        path = write_video(tmp_path / "clip.mp4", FRAMES, fps=6)
        video = client.post(
            "/v1/videos", files={"video": ("c.mp4", path.read_bytes(), "video/mp4")}
        )
        assert video.status_code == 413 and "more than 2 frames" in video.json()["error"]["message"]
        huge = client.post("/v1/videos", files={"video": ("big.mp4", b"0" * 300_000, "video/mp4")})
        assert (
            huge.status_code == 413 and "max_video_upload_bytes" in huge.json()["error"]["message"]
        )

        sid = create(client, frame_files(FRAMES[:2]))["session_id"]
        one = {"frame_idx": 0, "obj_id": 1, "points": [{"x": 30, "y": 28}]}
        assert client.post(f"/v1/videos/{sid}/prompts", json=one).status_code == 200
        second = client.post(f"/v1/videos/{sid}/prompts", json={**one, "obj_id": 2})
        assert second.status_code == 413 and error_code(second) == "too_many_objects"

    # 3 frames of 64x96 are 55 KB; tracking one object through them needs 3 frames of
    # this model's memories and masks more: a byte short of both is refused.
    frames_bytes = len(FRAMES) * FRAMES[0].nbytes
    need = frames_bytes + len(FRAMES) * object_frame_bytes(video_predictor.model)
    small = server_factory(predictor, video_predictor, video=True, max_video_session_bytes=need - 1)
    with small.client() as client:
        refused = client.post("/v1/videos", files=frame_files())
        assert refused.status_code == 413 and error_code(refused) == "session_too_large"
        assert "max_video_session_bytes" in refused.json()["error"]["message"]


def test_an_idle_session_expires(server_factory, predictor, video_predictor):
    live = server_factory(predictor, video_predictor, video=True, video_idle_s=0.2)
    with live.client() as client:
        sid = create(client)["session_id"]
        deadline = time.monotonic() + WAIT_S
        while len(live.service.videos):  # the reaper closes it without any request
            assert time.monotonic() < deadline, "the idle session was never closed"
            time.sleep(0.05)
        gone = client.get(f"/v1/videos/{sid}")
        assert gone.status_code == 404 and "video_idle_s" in gone.json()["error"]["message"]
        assert "sam2serve_video_sessions_expired 1.0" in client.get("/metrics").text


# --------------------------------------------------------------------------- errors


def test_bad_requests_are_4xx_naming_the_value(video_server):
    with video_server.client() as client:
        sid = create(client)["session_id"]
        cases = [
            ({"frame_idx": 3, "obj_id": 1, "points": [{"x": 1, "y": 1}]}, 422, "frame_idx: 3"),
            (
                {"frame_idx": 0, "obj_id": 1, "points": [{"x": 500, "y": 1}]},
                422,
                "[500, 1] lies outside",
            ),
            ({"frame_idx": 0, "obj_id": 1}, 422, "at least one point"),
            ({"frame_idx": 0, "obj_id": -1, "points": [{"x": 1, "y": 1}]}, 422, "obj_id"),
            (
                {"frame_idx": 0, "obj_id": 1, "mask": {"size": [10, 10], "counts": [100]}},
                422,
                "[10, 10]",
            ),
        ]
        for body, status, words in cases:
            answer = client.post(f"/v1/videos/{sid}/prompts", json=body)
            assert answer.status_code == status and words in answer.json()["error"]["message"], (
                body,
                answer.text,
            )
        empty = client.post(f"/v1/videos/{sid}/propagate", json={})
        assert empty.status_code == 422 and error_code(empty) == "no_prompts"
        past = client.post(f"/v1/videos/{sid}/propagate", json={"start_frame_idx": 9})
        assert past.status_code == 422 and "start_frame_idx: 9" in past.text
        unknown = client.get("/v1/videos/vs-" + "0" * 32)
        assert unknown.status_code == 404 and error_code(unknown) == "session_not_found"
        garbage = client.post("/v1/videos", files={"video": ("x.mp4", b"not a video", "video/mp4")})
        assert garbage.status_code == 400 and error_code(garbage) == "invalid_video"
        both = client.post(
            "/v1/videos",
            files=[*frame_files(), ("video", ("x.mp4", b"0", "video/mp4"))],
        )
        assert both.status_code == 400 and "not both" in both.text
        json_body = client.post("/v1/videos", json={"frames": []})
        assert json_body.status_code == 415
        sizes = [("frame", ("a.png", png_bytes(FRAMES[0]), "image/png"))]
        sizes.append(("frame", ("b.png", png_bytes(FRAMES[0][:40]), "image/png")))
        mixed = client.post("/v1/videos", files=sizes)
        assert mixed.status_code == 422 and "one size" in mixed.text
        client.delete(f"/v1/videos/{sid}")


def test_video_endpoints_say_how_to_enable_them(server_factory, predictor):
    live = server_factory(predictor)
    with live.client() as client:
        answer = client.post("/v1/videos", files=frame_files())
    assert answer.status_code == 404 and error_code(answer) == "video_disabled"
    assert "--video" in answer.json()["error"]["message"]
