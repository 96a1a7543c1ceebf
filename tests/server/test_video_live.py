"""Live video sessions against a real server (uvicorn on 127.0.0.1, a WebSocket client):
a client pushing frames at a fixed rate gets every frame answered once, in order, with its
latency, and the masks are the engine's for the same frames; prompts on the newest frame;
and the hostile cases - a message over the limit, a frame of the wrong size, bytes that
are no image, frames sent faster than they are answered, a client that leaves mid-stream,
a foreign page, a session that is not live - are refused cleanly: no 5xx, no traceback in
the server's log, and the session usable afterwards.

The tracker's network is stubbed (its answer for a frame is computed from the frame's
pixels): every step of the predictor's bookkeeping, the server, the worker and the
protocol are real, while a frame costs microseconds instead of the network's seconds on
this CPU (tests/video/ check the network's answers against Meta's)."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import numpy as np
import pytest
import torch
from server_support import png_bytes, start_server
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from sam2serve.checkpoint import load_video_model
from sam2serve.engine.rle import coco_to_rle, rle_to_mask
from sam2serve.engine.video.outputs import object_masks
from sam2serve.engine.video.predictor import VideoPredictor
from sam2serve.engine.video.sources import LiveFrames
from sam2serve.engine.video.state import FrameOutput
from sam2serve.server.settings import MiB, ServerSettings

HEIGHT, WIDTH = 48, 64
WAIT_S = 60  # an upper bound on waiting for an answer; never asserted as a time


class PixelStubPredictor(VideoPredictor):
    """The real predictor with the network replaced: a frame's logits are its red channel
    at 8x8 minus 128 (so each frame's mask is its own), and a gate that can hold a step."""

    def __init__(self, model: Any) -> None:
        super().__init__(model)
        self.gate = threading.Event()
        self.gate.set()
        self.waiting = threading.Event()

    def frame_features(self, state, frame_idx):
        return state.source.frame(frame_idx)

    def _track_frame(self, state, tracks, frame_idx, **kwargs):
        pixels = self.frame_features(state, frame_idx)
        red = torch.from_numpy(pixels[..., 0].astype(np.float32))[None, None]
        low_res = torch.nn.functional.adaptive_avg_pool2d(red, 8) - 128.0
        low_res = low_res + torch.arange(len(tracks), dtype=torch.float32)[:, None, None, None]
        outputs = [
            FrameOutput(low_res[i : i + 1], torch.zeros(1, 8), torch.ones(1, 1), torch.zeros(1))
            for i in range(len(tracks))
        ]
        return outputs, low_res

    def track_next(self, state, frame_idx):
        self.waiting.set()
        if not self.gate.wait(timeout=WAIT_S):
            raise RuntimeError("test gate never opened")
        return super().track_next(state, frame_idx)


def frames(count: int, start: int = 0) -> list[np.ndarray]:
    out = []
    for i in range(start, start + count):
        frame = np.full((HEIGHT, WIDTH, 3), 30, np.uint8)
        x = (5 * i) % (WIDTH - 16)
        frame[8:40, x : x + 16, 0] = 220  # a red block that moves: each frame's mask differs
        out.append(frame)
    return out


@pytest.fixture(scope="module")
def stub() -> PixelStubPredictor:
    return PixelStubPredictor(load_video_model("tiny", random_weights=True, seed=0))


@pytest.fixture(scope="module")
def server(predictor, stub):
    settings = ServerSettings.from_flat(
        video=True,
        warmup=False,
        max_video_sessions=4,
        max_video_sessions_per_client=4,
        max_live_frame_bytes=1 * MiB,
        max_live_pending=3,
        live_frames_kept=4,
        max_live_prompted_frames=2,
        cors_origins=("http://allowed.example",),
    )
    live = start_server(settings, predictor, stub)
    yield live
    stub.gate.set()
    live.stop()


def clean(log: str) -> None:
    for text in ("Traceback", "Exception in ASGI", "Task exception", "never retrieved"):
        assert text not in log, log


CREATED: list[str] = []


@pytest.fixture(autouse=True)
def close_sessions(server):
    """Each test's sessions are closed after it (the per-client limit stays free)."""
    yield
    while CREATED:
        session_id = CREATED.pop()
        wait_idle(server, session_id)
        with server.client() as client:
            client.delete(f"/v1/videos/{session_id}")


def new_live(server) -> str:
    with server.client() as client:
        answer = client.post("/v1/videos/live", json={"width": WIDTH, "height": HEIGHT})
    assert answer.status_code == 201, answer.text
    assert answer.json()["live"] is True and answer.json()["num_frames"] == 0
    CREATED.append(answer.json()["session_id"])
    return answer.json()["session_id"]


def ws_url(server, session_id: str) -> str:
    return server.url.replace("http://", "ws://") + f"/v1/videos/{session_id}/live"


def receive(ws) -> dict:
    return json.loads(ws.recv(timeout=WAIT_S))


def wait_idle(server, session_id: str) -> dict:
    deadline = time.monotonic() + WAIT_S
    while True:
        with server.client() as client:
            body = client.get(f"/v1/videos/{session_id}").json()
        if not body["busy"] or time.monotonic() > deadline:
            return body
        time.sleep(0.05)


def masks_of(objects: list[dict]) -> dict[int, np.ndarray]:
    return {o["obj_id"]: rle_to_mask(coco_to_rle(o["segmentation"])) for o in objects}


def engine_answers(stub, sent: list[np.ndarray], prompt_at: int, prompt: dict) -> list[dict]:
    """What the engine answers for the same frames and prompt, on a state of its own."""
    source = LiveFrames(HEIGHT, WIDTH, keep=4)
    state = stub.init_state(source, retention="bounded")
    out = []
    for i, frame in enumerate(sent):
        index = source.append(frame)
        out.append({r.obj_id: r for r in object_masks(stub.track_next(state, index))})
        if i == prompt_at:
            points = [[p["x"], p["y"]] for p in prompt["points"]]
            stub.add_points(state, index, prompt["obj_id"], points, [1] * len(points))
            stub.commit_prompts(state)
    return out


def test_frames_at_a_fixed_rate_are_all_answered_in_order_with_latency(server, stub, server_log):
    session_id = new_live(server)
    sent = frames(24)
    prompt = {"type": "prompt", "frame_idx": 2, "obj_id": 5, "points": [{"x": 30, "y": 20}]}
    answers, prompt_answer = [], None
    period = 1 / 20  # 20 frames/s
    with connect(ws_url(server, session_id), max_size=None) as ws:
        start = time.perf_counter()
        for i, frame in enumerate(sent):
            time.sleep(max(0.0, start + i * period - time.perf_counter()))
            ws.send(frame.tobytes() if i % 2 else png_bytes(frame))  # raw RGB and PNG
            answers.append(receive(ws))
            if i == 2:
                ws.send(json.dumps(prompt))
                prompt_answer = receive(ws)
        ws.send(json.dumps({"type": "end"}))
        with pytest.raises(ConnectionClosed):
            ws.recv(timeout=WAIT_S)
    assert [a["type"] for a in answers] == ["frame"] * 24
    assert [a["seq"] for a in answers] == list(range(24))  # none lost, none reordered
    assert [a["frame_idx"] for a in answers] == list(range(24))
    assert all(a["latency_ms"] > 0 and a["track_ms"] >= 0 for a in answers)
    assert all(a["latency_ms"] >= a["track_ms"] for a in answers)
    latency = np.array([a["latency_ms"] for a in answers])
    print(
        f"\nlive, 24 frames at 20/s (stub network): latency p50 {np.percentile(latency, 50):.1f}"
        f" ms, p90 {np.percentile(latency, 90):.1f} ms, max {latency.max():.1f} ms"
    )
    assert prompt_answer["type"] == "prompt", prompt_answer
    assert prompt_answer["frame_idx"] == 2
    expected = engine_answers(stub, sent, 2, prompt)
    for i, answer in enumerate(answers):
        got = masks_of(answer["objects"])
        assert sorted(got) == sorted(expected[i]), f"frame {i}"
        for obj_id, record in expected[i].items():
            np.testing.assert_array_equal(got[obj_id], rle_to_mask(record.rle), f"frame {i}")
    assert answers[1]["objects"] == [] and len(answers[3]["objects"]) == 1
    assert answers[3]["objects"][0]["area"] > 0
    body = wait_idle(server, session_id)
    assert body["num_frames"] == 24 and body["obj_ids"] == [5] and not body["busy"]
    clean(server_log.text())


def test_bad_frames_are_refused_and_the_stream_goes_on(server, server_log):
    session_id = new_live(server)
    good = frames(2)
    with connect(ws_url(server, session_id), max_size=None) as ws:
        ws.send(good[0].tobytes())
        assert receive(ws)["frame_idx"] == 0
        ws.send(b"\x00" * 100)  # no image, not W*H*3 bytes
        garbage = receive(ws)
        ws.send(png_bytes(np.zeros((HEIGHT + 2, WIDTH, 3), np.uint8)))  # an image, wrong size
        wrong = receive(ws)
        ws.send(b"\x89PNG\r\n\x1a\n" + b"\xff" * 5000)  # a PNG header, garbage after it
        broken = receive(ws)
        ws.send("{not json")
        not_json = receive(ws)
        ws.send(
            json.dumps(
                {"type": "prompt", "frame_idx": 0, "obj_id": 1, "points": [{"x": 999, "y": 1}]}
            )
        )
        outside = receive(ws)
        ws.send(good[1].tobytes())
        after = receive(ws)
    assert garbage["type"] == "error" and garbage["seq"] == 1, garbage
    assert wrong["type"] == "error" and wrong["code"] == "wrong_size", wrong
    assert f"{WIDTH}x{HEIGHT}" in wrong["message"]
    assert broken["type"] == "error" and broken["seq"] == 3, broken
    assert not_json["code"] == "invalid_json"  # the HTTP parser's code
    assert outside["type"] == "error", outside
    assert after["type"] == "frame" and after["frame_idx"] == 1 and after["seq"] == 4
    assert not wait_idle(server, session_id)["busy"]
    clean(server_log.text())


def test_a_message_over_the_limit_closes_the_connection(server, server_log):
    session_id = new_live(server)
    with connect(ws_url(server, session_id), max_size=None) as ws:
        ws.send(b"\x00" * (2 * MiB))
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=WAIT_S)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1009
    assert not wait_idle(server, session_id)["busy"]
    with connect(ws_url(server, session_id), max_size=None) as ws:  # usable again
        ws.send(frames(1)[0].tobytes())
        assert receive(ws)["frame_idx"] == 0
    clean(server_log.text())


def test_frames_faster_than_answered_are_refused_not_queued(server, stub, server_log):
    session_id = new_live(server)
    sent = frames(8)
    stub.gate.clear()
    stub.waiting.clear()
    try:
        with connect(ws_url(server, session_id), max_size=None) as ws:
            ws.send(sent[0].tobytes())
            assert stub.waiting.wait(WAIT_S)  # frame 0 is being tracked, held at the gate
            for frame in sent[1:]:
                ws.send(frame.tobytes())
            refused = [receive(ws) for _ in range(5)]  # 3 pending at most: 5 refused
            stub.gate.set()
            answered = [receive(ws) for _ in range(3)]
    finally:
        stub.gate.set()
    assert [(r["type"], r["code"]) for r in refused] == [("error", "too_fast")] * 5
    assert [r["seq"] for r in refused] == [3, 4, 5, 6, 7]
    assert [(a["type"], a["seq"], a["frame_idx"]) for a in answered] == [
        ("frame", 0, 0),
        ("frame", 1, 1),
        ("frame", 2, 2),
    ]
    clean(server_log.text())


def test_a_client_that_leaves_mid_stream_frees_the_session(server, stub, server_log):
    session_id = new_live(server)
    stub.gate.clear()
    stub.waiting.clear()
    try:
        with connect(ws_url(server, session_id), max_size=None) as ws:
            for frame in frames(3):
                ws.send(frame.tobytes())
            assert stub.waiting.wait(WAIT_S)
        time.sleep(0.2)  # the client has left; its frames wait at the gate
    finally:
        stub.gate.set()
    body = wait_idle(server, session_id)
    assert not body["busy"] and body["num_frames"] == 3  # what it had sent was tracked
    with connect(ws_url(server, session_id), max_size=None) as ws:
        ws.send(frames(1, start=3)[0].tobytes())
        assert receive(ws)["frame_idx"] == 3
    clean(server_log.text())


def test_one_connection_per_session_and_only_live_sessions(server, server_log):
    session_id = new_live(server)
    with connect(ws_url(server, session_id), max_size=None) as first:
        first.send(frames(1)[0].tobytes())
        assert receive(first)["frame_idx"] == 0
        with connect(ws_url(server, session_id), max_size=None) as second:
            busy = receive(second)
            with pytest.raises(ConnectionClosed) as closed:
                second.recv(timeout=WAIT_S)
    assert busy["code"] == "session_busy" and closed.value.rcvd.code == 1013
    with connect(ws_url(server, "v_nonexistent"), max_size=None) as ws:
        assert receive(ws)["code"] == "session_not_found"
    clean(server_log.text())


def test_a_foreign_page_cannot_open_a_live_connection(server):
    session_id = new_live(server)
    with pytest.raises(Exception, match="403"):
        connect(ws_url(server, session_id), origin="http://evil.example", open_timeout=WAIT_S)
    with connect(ws_url(server, session_id), origin="http://allowed.example") as ws:
        ws.send(frames(1)[0].tobytes())
        assert receive(ws)["type"] == "frame"


def test_live_sessions_http_limits(server, server_log):
    with server.client() as client:
        big = client.post("/v1/videos/live", json={"width": 100_000, "height": 100_000})
        assert big.status_code == 422, big.text  # past the schema's bound
        huge = client.post("/v1/videos/live", json={"width": 16_000, "height": 16_000})
        assert huge.status_code == 413 and huge.json()["error"]["code"] == "image_too_large"
        bad = client.post("/v1/videos/live", json={"width": 64})
        assert bad.status_code == 422
    session_id = new_live(server)
    with connect(ws_url(server, session_id), max_size=None) as ws:
        for frame in frames(6):
            ws.send(frame.tobytes())
            receive(ws)
        for frame_idx in (4, 5, 3):  # a third prompted frame passes the limit of 2
            ws.send(
                json.dumps(
                    {
                        "type": "prompt",
                        "frame_idx": frame_idx,
                        "obj_id": 1,
                        "points": [{"x": 5, "y": 5}],
                    }
                )
            )
            last = receive(ws)
    assert last["code"] == "too_many_prompted_frames", last
    with server.client() as client:
        old = client.post(
            f"/v1/videos/{session_id}/prompts",
            json={"frame_idx": 0, "obj_id": 2, "points": [{"x": 5, "y": 5}]},
        )
        assert old.status_code == 422 and old.json()["error"]["code"] == "frame_not_held"
        propagate = client.post(f"/v1/videos/{session_id}/propagate", json={})
        assert propagate.status_code == 409
        assert propagate.json()["error"]["code"] == "live_session"
    clean(server_log.text())
