"""Live video's latest-frame-wins mode against a real server (uvicorn on 127.0.0.1, a
WebSocket client): frames sent faster than they are tracked are skipped, never refused
and never queued; every seq is answered (skipped ones at once); the tracked ones come in
order, the newest sent is tracked; skipped frames never enter the session, so the
tracked frames' masks are the engine's for exactly those frames; prompts are never
skipped and stay in order; the hostile cases (a bad mode, a prompt naming a skipped or
unsent frame, the end in a flood) are refused cleanly.

The network is test_video_live's pixel stub, with its gate holding a frame's tracking so
that "faster than tracked" is made by the test, not by timing (nothing asserts a time)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from server_support import start_server
from test_video_live import (
    HEIGHT,
    WAIT_S,
    WIDTH,
    PixelStubPredictor,
    clean,
    frames,
    masks_of,
    wait_idle,
    ws_url,
)
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from sam2serve.checkpoint import load_video_model
from sam2serve.engine.rle import rle_to_mask
from sam2serve.engine.video.outputs import object_masks
from sam2serve.engine.video.sources import LiveFrames
from sam2serve.server.live_modes import SeqLog
from sam2serve.server.settings import MiB, ServerSettings

MAX_PENDING = 3


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
        max_live_pending=MAX_PENDING,
        live_frames_kept=4,
        max_live_prompted_frames=2,
    )
    live = start_server(settings, predictor, stub)
    yield live
    stub.gate.set()
    live.stop()


@pytest.fixture
def gate(stub):
    """Hold the next tracked frame at the gate; always opened after the test."""
    stub.gate.clear()
    stub.waiting.clear()
    yield stub
    stub.gate.set()


CREATED: list[str] = []


@pytest.fixture(autouse=True)
def close_sessions(server):
    yield
    while CREATED:
        session_id = CREATED.pop()
        wait_idle(server, session_id)
        with server.client() as client:
            client.delete(f"/v1/videos/{session_id}")


def new_live(server, mode: str | None = "latest") -> str:
    body = {"width": WIDTH, "height": HEIGHT} | ({} if mode is None else {"mode": mode})
    with server.client() as client:
        answer = client.post("/v1/videos/live", json=body)
    assert answer.status_code == 201, answer.text
    CREATED.append(answer.json()["session_id"])
    return answer.json()["session_id"]


def receive(ws) -> dict:
    return json.loads(ws.recv(timeout=WAIT_S))


def until_closed(ws) -> list[dict]:
    out = []
    while True:
        try:
            out.append(receive(ws))
        except ConnectionClosed:
            return out


def engine_answers(stub, sent: list[np.ndarray]) -> list[dict]:
    """The engine's masks for these frames alone, on a state of its own."""
    source = LiveFrames(HEIGHT, WIDTH, keep=4)
    state = stub.init_state(source, retention="bounded")
    out = []
    for i, frame in enumerate(sent):
        index = source.append(frame)
        out.append({r.obj_id: r for r in object_masks(stub.track_next(state, index))})
        if i == 0:
            stub.add_points(state, index, 5, [[30, 20]], [1])
            stub.commit_prompts(state)
    return out


def prompt(**where) -> str:
    return json.dumps({"type": "prompt", "obj_id": 5, "points": [{"x": 30, "y": 20}], **where})


def test_a_burst_faster_than_tracking_is_skipped_not_queued(server, gate, server_log):
    session_id = new_live(server)
    sent = frames(30)
    with connect(ws_url(server, session_id), max_size=None) as ws:
        ws.send(sent[0].tobytes())
        assert gate.waiting.wait(WAIT_S)  # frame 0 is being tracked, held at the gate
        for frame in sent[1:]:  # 29 frames while one is tracked: 10x max_live_pending
            ws.send(frame.tobytes())
        # Each frame replaced while waiting is answered at once, while frame 0 is held.
        skips = [receive(ws) for _ in range(28)]
        gate.gate.set()
        tracked = [receive(ws) for _ in range(2)]
        ws.send(json.dumps({"type": "end"}))
        rest = until_closed(ws)
    assert [(s["type"], s["seq"], s["skipped"]) for s in skips] == [
        ("frame", seq, True) for seq in range(1, 29)
    ]
    assert [s["replaced_by"] for s in skips] == list(range(2, 30))
    assert all(s["frame_idx"] is None and s["objects"] == [] for s in skips)
    assert [(t["seq"], t["frame_idx"], t["skipped"], t["skipped_count"]) for t in tracked] == [
        (0, 0, False, 0),
        (29, 1, False, 28),  # the last one sent is tracked, right after frame 0
    ]
    assert rest == []  # no backlog: nothing else was waiting
    # The skipped frames never entered the session: it is frames 0 and 29.
    body = wait_idle(server, session_id)
    assert body["num_frames"] == 2 and not body["busy"]
    clean(server_log.text())


def test_a_free_running_flood_answers_every_seq_and_tracks_the_newest(server, server_log):
    session_id = new_live(server, mode=None)  # an "every" session; the connection chooses
    sent = frames(60)
    with connect(ws_url(server, session_id) + "?mode=latest", max_size=None) as ws:
        for frame in sent:
            ws.send(frame.tobytes())
        ws.send(json.dumps({"type": "end"}))
        answers = until_closed(ws)
    assert all(a["type"] == "frame" for a in answers), [a for a in answers if a["type"] != "frame"]
    assert sorted(a["seq"] for a in answers) == list(range(60))  # each seq once, none refused
    tracked = [a for a in answers if not a["skipped"]]
    skipped = [a for a in answers if a["skipped"]]
    assert [t["seq"] for t in tracked] == sorted(t["seq"] for t in tracked)  # in order
    assert [t["frame_idx"] for t in tracked] == list(range(len(tracked)))
    assert tracked[-1]["seq"] == 59  # the newest frame sent is tracked
    assert sum(t["skipped_count"] for t in tracked) == len(skipped)
    assert all(s["replaced_by"] > s["seq"] for s in skipped)
    print(f"\nlatest mode, 60 frames sent at once (stub network): {len(tracked)} tracked")
    assert wait_idle(server, session_id)["num_frames"] == len(tracked)
    clean(server_log.text())


def test_tracked_frames_masks_are_the_engines_for_those_frames_alone(server, stub, gate):
    session_id = new_live(server)
    sent = frames(6)
    with connect(ws_url(server, session_id), max_size=None) as ws:
        ws.send(sent[0].tobytes())
        assert gate.waiting.wait(WAIT_S)
        ws.send(prompt(seq=0))  # on frame 0, by its seq: a barrier, frame 0 first
        for frame in sent[1:]:
            ws.send(frame.tobytes())
        skips = [receive(ws) for _ in range(4)]  # 1..4 replaced; 5 waits
        gate.gate.set()
        first, prompted, last = receive(ws), receive(ws), receive(ws)
    assert [s["seq"] for s in skips] == [1, 2, 3, 4]
    assert (first["seq"], prompted["type"], prompted["seq"], last["seq"]) == (0, "prompt", 0, 5)
    expected = engine_answers(stub, [sent[0], sent[5]])
    got = masks_of(last["objects"])
    assert sorted(got) == sorted(expected[1]) == [5]
    np.testing.assert_array_equal(got[5], rle_to_mask(expected[1][5].rle))


def test_prompts_in_a_flood_keep_their_order_and_a_skipped_frame_is_named(server, gate, server_log):
    session_id = new_live(server)
    sent = frames(8)
    with connect(ws_url(server, session_id), max_size=None) as ws:
        ws.send(sent[0].tobytes())
        assert gate.waiting.wait(WAIT_S)
        ws.send(sent[1].tobytes())
        ws.send(sent[2].tobytes())  # replaces 1
        ws.send(prompt(seq=2))  # names the frame just sent: it is tracked first
        ws.send(sent[3].tobytes())
        ws.send(sent[4].tobytes())  # replaces 3 (behind the prompt, not 2)
        ws.send(prompt(seq=4))
        ws.send(prompt(seq=1))  # skipped: refused, naming it
        ws.send(sent[5].tobytes())
        early = [receive(ws) for _ in range(2)]
        gate.gate.set()
        answers = [receive(ws) for _ in range(7)]
        ws.send(prompt(seq=40))  # never sent
        answers.append(receive(ws))
    assert [(e["seq"], e["replaced_by"]) for e in early] == [(1, 2), (3, 4)]
    kinds = [(a["type"], a.get("seq"), a.get("frame_idx")) for a in answers]
    assert kinds[:5] == [
        ("frame", 0, 0),
        ("frame", 2, 1),
        ("prompt", 2, 1),
        ("frame", 4, 2),
        ("prompt", 4, 2),
    ], answers
    skipped, unsent = answers[5], answers[7]
    assert (skipped["type"], skipped["code"]) == ("error", "frame_skipped")
    assert "seq 1" in skipped["message"] and "seq 2" in skipped["message"]
    assert (unsent["type"], unsent["code"]) == ("error", "frame_not_sent")
    assert "seq 40" in unsent["message"]
    assert kinds[6] == ("frame", 5, 3)
    clean(server_log.text())


def test_prompts_stay_bounded_in_latest_mode(server, gate, server_log):
    session_id = new_live(server)
    with connect(ws_url(server, session_id), max_size=None) as ws:
        ws.send(frames(1)[0].tobytes())
        assert gate.waiting.wait(WAIT_S)
        for _ in range(MAX_PENDING + 2):
            ws.send(prompt(frame_idx=0))
        refused = [receive(ws) for _ in range(2)]
        gate.gate.set()
        answered = [receive(ws) for _ in range(1 + MAX_PENDING)]
    assert [r["code"] for r in refused] == ["too_fast", "too_fast"]
    assert [a["type"] for a in answered] == ["frame"] + ["prompt"] * MAX_PENDING
    clean(server_log.text())


def test_a_bad_mode_is_refused_naming_it(server, server_log):
    with server.client() as client:
        bad = client.post(
            "/v1/videos/live", json={"width": WIDTH, "height": HEIGHT, "mode": "fastest"}
        )
    assert bad.status_code == 422, bad.text
    assert "mode" in bad.json()["error"]["message"]
    session_id = new_live(server, mode="every")
    with connect(ws_url(server, session_id) + "?mode=fastest", max_size=None) as ws:
        refused = receive(ws)
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=WAIT_S)
    assert refused["code"] == "invalid_mode" and "'fastest'" in refused["message"]
    assert closed.value.rcvd.code == 1008
    with connect(ws_url(server, session_id), max_size=None) as ws:  # usable, mode every
        ws.send(frames(1)[0].tobytes())
        answer = receive(ws)
    assert answer["frame_idx"] == 0 and "skipped" not in answer
    clean(server_log.text())


def test_a_prompt_needs_one_frame_name(server, server_log):
    session_id = new_live(server)
    with connect(ws_url(server, session_id), max_size=None) as ws:
        ws.send(frames(1)[0].tobytes())
        receive(ws)
        ws.send(prompt(seq=0, frame_idx=0))
        both = receive(ws)
        ws.send(prompt())
        neither = receive(ws)
    for refused in (both, neither):
        assert refused["type"] == "error" and refused["code"] == "invalid_request", refused
        assert "frame_idx or by seq" in refused["message"]
    clean(server_log.text())


def test_the_end_in_a_flood_tracks_the_waiting_frame_then_closes(server, gate, server_log):
    session_id = new_live(server)
    sent = frames(21)
    with connect(ws_url(server, session_id), max_size=None) as ws:
        ws.send(sent[0].tobytes())
        assert gate.waiting.wait(WAIT_S)
        for frame in sent[1:]:
            ws.send(frame.tobytes())
        ws.send(json.dumps({"type": "end"}))
        skips = [receive(ws) for _ in range(19)]
        gate.gate.set()
        rest = until_closed(ws)
        code = ws.close_code
    assert [s["seq"] for s in skips] == list(range(1, 20))
    assert [(a["type"], a["seq"], a["frame_idx"]) for a in rest] == [
        ("frame", 0, 0),
        ("frame", 20, 1),
    ]
    assert code == 1000
    assert wait_idle(server, session_id)["num_frames"] == 2
    clean(server_log.text())


def test_the_seq_log_is_bounded_and_names_each_outcome():
    log = SeqLog(size=4)
    log.tracked(0, 0)
    log.skipped(1, 2)
    log.tracked(2, 1)
    assert log.frame_idx(0, sent=3) == 0 and log.frame_idx(2, sent=3) == 1
    assert log.frame_idx(1, sent=3)[0] == "frame_skipped"
    assert log.frame_idx(3, sent=3)[0] == "frame_not_sent"
    for seq in range(4, 10):
        log.tracked(seq, seq)
    assert len(log._outcomes) == 4  # bounded, whatever the stream's length
    assert log.frame_idx(0, sent=10)[0] == "frame_not_held"
    assert log.frame_idx(9, sent=10) == 9
