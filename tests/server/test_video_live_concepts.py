"""SAM 3's own video predictor on a live connection (``concepts_track`` ..
``concepts_stop``), against a real server (uvicorn on 127.0.0.1, a WebSocket client).

SAM 3's networks are replaced by the frames' pixels (tests/sam3_pixel_steps.py) and SAM
2.1's as in test_video_live.py: the predictors' scheduling, hot start, the stream, the
protocol, the limits and the server are the real ones, at microseconds a frame. The
behaviour: the ``concepts_frame`` answers are :meth:`Sam3VideoPredictor.run`'s on the same
frames (ids mapped to the smallest the session does not use, names the phrase, scores,
masks), each let out ``hotstart_delay`` frames after its frame, the rest at the stop or
the end; in latest mode only the frames SAM 2.1 tracks reach SAM 3.
The hostile half: bad phrases, unknown fields, huge delays, no concept model, a second
phrase, a full session, SAM 3's state past the byte limit, frames of the wrong size and
too fast during a run, a client that leaves mid-run - each refused with one line naming
the value or limit, no traceback in the log, the connection (or session) usable after."""

from __future__ import annotations

import dataclasses
import json
import time
from typing import Any

import numpy as np
import pytest
from sam3_pixel_steps import PixelSteps, label
from server_support import png_bytes, start_app
from test_video_live import HEIGHT, WAIT_S, WIDTH, PixelStubPredictor, clean, frames, masks_of
from websockets.sync.client import connect

from sam2serve.checkpoint import load_video_model
from sam2serve.concepts.video_predictor import FrameResult, VideoState
from sam2serve.concepts.video_stream import OPEN_ENDED, stream_thresholds
from sam2serve.server.app import create_app
from sam2serve.server.concept_tracks import run_thresholds
from sam2serve.server.errors import ApiError
from sam2serve.server.settings import MiB, ServerSettings

LIMITS = {"max_video_objects": 4, "max_concept_instances": 3}
SETTINGS = {
    "video": True,
    "warmup": False,
    "max_video_sessions": 4,
    "max_video_sessions_per_client": 4,
    "max_live_frame_bytes": 1 * MiB,
    "max_live_pending": 3,
    "live_frames_kept": 4,
    **LIMITS,
}


@pytest.fixture(scope="module")
def stub() -> PixelStubPredictor:
    return PixelStubPredictor(load_video_model("tiny", random_weights=True, seed=0))


def serve(predictor, stub, concepts: Any = None, pixels: bool = True, **changes: Any) -> Any:
    settings = ServerSettings.from_flat(concepts=concepts is not None, **{**SETTINGS, **changes})
    live = start_app(create_app(settings, predictor, stub, concepts=concepts), settings)
    if concepts is not None and pixels:  # SAM 3's networks replaced by the frames' pixels
        live.app.state.service.concepts.video.predictor = PixelSteps
    return live


@pytest.fixture(scope="module")
def server(predictor, stub, concepts_tiny):
    live = serve(predictor, stub, concepts_tiny)
    yield live
    stub.gate.set()
    live.stop()


CREATED: list[tuple[Any, str]] = []


@pytest.fixture(autouse=True)
def close_sessions():
    """Each test's sessions are closed after it (the per-client limit stays free)."""
    yield
    while CREATED:
        live, sid = CREATED.pop()
        wait_free(live, sid)
        with live.client() as client:
            client.delete(f"/v1/videos/{sid}")


def new_live(server) -> str:
    with server.client() as client:
        answer = client.post("/v1/videos/live", json={"width": WIDTH, "height": HEIGHT})
    assert answer.status_code == 201, answer.text
    CREATED.append((server, answer.json()["session_id"]))
    return answer.json()["session_id"]


def session_of(server, sid: str) -> Any:
    return server.app.state.service.videos.get(sid, touch=False)


def wait_free(server, sid: str) -> Any:
    try:
        session = session_of(server, sid)
    except ApiError:  # deleted by its test
        return None
    deadline = time.monotonic() + WAIT_S
    while session.busy_with is not None:
        assert time.monotonic() < deadline, "the connection never ended"
        time.sleep(0.05)
    return session


def ws_url(server, sid: str) -> str:
    return server.url.replace("http://", "ws://") + f"/v1/videos/{sid}/live"


def receive(ws) -> dict:
    return json.loads(ws.recv(timeout=WAIT_S))


def send(ws, message: dict) -> None:
    ws.send(json.dumps(message))


def clip(count: int, seed: int = 0) -> list[np.ndarray]:
    """Frames SAM 2.1's stub tracks (a moving red block) with SAM 3's objects written in."""
    return label(frames(count), seed)


def expected(sent: list[np.ndarray], start: int, delay: int, max_objects: int) -> list:
    """The engine's answers on the same frames (random weights: thresholds 0 / 0.2)."""
    thresholds = stream_thresholds(run_thresholds(None, True, max_objects), delay)
    state = VideoState(OPEN_ENDED, HEIGHT, WIDTH)
    return list(PixelSteps(thresholds).run(state, iter(sent), start=start))


def session_ids(results: list[FrameResult], used: set[int], room: int) -> dict[int, int]:
    """SAM 3's ids -> the session's: the smallest unused from 1, in order, within room."""
    ids: dict[int, int] = {}
    free = (i for i in range(1, 1000) if i not in used)
    for result in results:
        for obj in result.obj_ids:
            if obj not in ids and len(ids) < room:
                ids[obj] = next(free)
    return ids


def check_frames(got: list[dict], results: list[FrameResult], ids: dict[int, int]) -> None:
    assert [f["frame_idx"] for f in got] == [r.frame for r in results]
    assert [f["seq"] for f in got] == [r.frame for r in results]  # one frame per seq here
    for frame, result in zip(got, results, strict=True):
        wanted = sorted((ids[o], row) for row, o in enumerate(result.obj_ids) if o in ids)
        assert [o["obj_id"] for o in frame["objects"]] == [obj for obj, _ in wanted]
        masks = masks_of(frame["objects"])
        for obj, (session_id, row) in zip(frame["objects"], wanted, strict=True):
            np.testing.assert_array_equal(masks[session_id], result.masks[row])
            assert obj["name"] == "disc" and obj["score"] == pytest.approx(result.scores[row])


# --------------------------------------------------------------------------- behaviour


@pytest.mark.parametrize("delay", [15, 3, 0])
def test_sam3s_answers_are_the_predictors_run_let_out_by_hot_start(server, delay, server_log):
    """Frame 0 and a SAM 2.1 object (id 1) first; SAM 3 from frame 1 on; every frame
    answered by SAM 2.1 at once and by SAM 3 ``delay`` frames later; the stop lets out
    the rest, then ``concepts_done``."""
    sid = new_live(server)
    sent = clip(18)
    log: list[dict] = []
    with connect(ws_url(server, sid), max_size=None) as ws:
        ws.send(sent[0].tobytes())
        assert receive(ws)["type"] == "frame"
        send(ws, {"type": "prompt", "seq": 0, "obj_id": 1, "points": [{"x": 30, "y": 20}]})
        assert receive(ws)["type"] == "prompt"
        send(ws, {"type": "concepts_track", "text": " disc ", "hotstart_delay": delay})
        started = receive(ws)
        assert started == {
            "type": "concepts_track",
            "text": "disc",
            "phrases": ["disc"],
            "from_frame": 1,
            "hotstart_delay": delay,
            "score_thresh": 0.0,
            "new_object_thresh": pytest.approx(0.2),
            "max_objects": 3,  # max_video_objects 4 minus SAM 2.1's object
        }
        for seq, frame in enumerate(sent[1:], start=1):
            ws.send(frame.tobytes())
            answer = receive(ws)
            assert answer["type"] == "frame" and answer["seq"] == seq
            assert [o["obj_id"] for o in answer["objects"]] == [1]  # SAM 2.1's goes on
            out = seq - max(delay, 1) + 1  # the frame hot start lets out now
            if out >= 1:
                log.append(receive(ws))
                assert log[-1]["type"] == "concepts_frame" and log[-1]["frame_idx"] == out
        send(ws, {"type": "concepts_stop"})
        while (message := receive(ws))["type"] == "concepts_frame":
            log.append(message)
        done = message
        send(ws, {"type": "end"})
    results = expected(sent[1:], 1, delay, 3)
    ids = session_ids(results, {1}, 3)
    assert ids, "SAM 3 found nothing: the comparison would be empty"
    check_frames(log, results, ids)
    assert done["type"] == "concepts_done" and done["frames"] == len(sent) - 1
    assert done["text"] == "disc" and done["hotstart_delay"] == delay
    seen: dict[int, list[int]] = {}
    for frame in log:
        for obj in frame["objects"]:
            seen.setdefault(obj["obj_id"], []).append(frame["frame_idx"])
    spans = {o["obj_id"]: (o["first_frame"], o["last_frame"]) for o in done["objects"]}
    assert spans == {obj: (f[0], f[-1]) for obj, f in seen.items()}
    assert done["dropped_objects"] == len({o for r in results for o in r.obj_ids} - set(ids))
    session = wait_free(server, sid)
    assert session.concept_run_bytes == 0 and server.app.state.service.decoding.held == 0
    with server.client() as client:
        body = client.get(f"/v1/videos/{sid}").json()
        assert [(o["obj_id"], o["name"]) for o in body["objects"][1:]] == [
            (obj, "disc") for obj in sorted(spans)
        ]
        client.delete(f"/v1/videos/{sid}")
    clean(server_log.text())


def test_the_end_of_the_connection_lets_out_what_hot_start_held(server, server_log):
    sid = new_live(server)
    sent = clip(5, seed=3)
    with connect(ws_url(server, sid), max_size=None) as ws:
        send(ws, {"type": "concepts_track", "text": "disc"})
        assert receive(ws)["from_frame"] == 0
        for frame in sent:
            ws.send(frame.tobytes())
            assert receive(ws)["type"] == "frame"  # Meta's 15 frames: nothing out yet
        send(ws, {"type": "end"})
        messages = [receive(ws) for _ in range(len(sent) + 1)]
    assert [m["type"] for m in messages] == ["concepts_frame"] * len(sent) + ["concepts_done"]
    assert messages[-1]["max_objects"] == 3  # max_concept_instances
    results = expected(sent, 0, 15, 3)
    check_frames(messages[:-1], results, session_ids(results, set(), 3))
    assert wait_free(server, sid).concept_run_bytes == 0
    clean(server_log.text())


# --------------------------------------------------------------------------- refused


@pytest.mark.parametrize(
    "message, words",
    [
        ({"text": " "}, ("text", "empty")),
        ({"text": "cat\u202e"}, ("text", "U+202E")),
        ({"text": "x" * 300}, ("text", "256 characters")),
        ({"text": "x" * 65}, ("text", "64")),
        ({"text": ["cat"]}, ("text",)),
        ({}, ("text",)),
        ({"text": "cat", "phrases": ["cat"]}, ("phrases",)),
        ({"text": "cat", "hotstart_delay": 16}, ("hotstart_delay", "15")),
        ({"text": "cat", "hotstart_delay": 2**40}, ("hotstart_delay",)),
        ({"text": "cat", "hotstart_delay": -1}, ("hotstart_delay",)),
        ({"text": "cat", "hotstart_delay": 1.5}, ("hotstart_delay",)),
        ({"text": "cat", "score_thresh": 1.5}, ("score_thresh",)),
        ({"text": "cat", "score_thresh": "NaN"}, ("score_thresh",)),
    ],
)
def test_a_bad_concepts_track_is_refused_and_the_connection_stays(
    server, message, words, server_log
):
    sid = new_live(server)
    with connect(ws_url(server, sid), max_size=None) as ws:
        send(ws, {"type": "concepts_track", **message})
        error = receive(ws)
        assert error["type"] == "error" and error["code"] == "invalid_request", error
        assert all(w in error["message"] for w in words), error
        ws.send(clip(1)[0].tobytes())
        answer = receive(ws)
        assert answer["type"] == "frame", answer  # no run started: no SAM 3 answer follows
        send(ws, {"type": "end"})
    assert wait_free(server, sid).concept_tracks == {}
    with server.client() as client:
        client.delete(f"/v1/videos/{sid}")
    clean(server_log.text())


def test_stop_without_a_run_a_second_phrase_and_unknown_fields(server, server_log):
    sid = new_live(server)
    with connect(ws_url(server, sid), max_size=None) as ws:
        send(ws, {"type": "concepts_stop"})
        assert receive(ws)["code"] == "concepts_not_running"
        send(ws, {"type": "concepts_track", "text": "disc", "hotstart_delay": 0})
        assert receive(ws)["type"] == "concepts_track"
        send(ws, {"type": "concepts_track", "text": "cup"})
        error = receive(ws)
        assert error["code"] == "concepts_running" and "'disc'" in error["message"]
        send(ws, {"type": "concepts_stop", "now": True})
        error = receive(ws)
        assert error["code"] == "invalid_request" and "now" in error["message"]
        send(ws, {"type": "concepts_stop"})
        done = receive(ws)
        assert done["type"] == "concepts_done" and done["text"] == "disc" and done["frames"] == 0
        send(ws, {"type": "end"})
    wait_free(server, sid)
    clean(server_log.text())


def test_without_the_concept_model_the_phrase_says_how_to_enable_it(predictor, stub, server_log):
    live = serve(predictor, stub)
    try:
        sid = new_live(live)
        with connect(ws_url(live, sid), max_size=None) as ws:
            send(ws, {"type": "concepts_track", "text": "disc"})
            error = receive(ws)
            assert error["code"] == "concepts_disabled" and "--concepts" in error["message"]
            ws.send(clip(1)[0].tobytes())
            assert receive(ws)["type"] == "frame"
            send(ws, {"type": "end"})
        CREATED.remove((live, sid))
        wait_free(live, sid)
        with live.client() as client:
            assert client.delete(f"/v1/videos/{sid}").status_code == 200
    finally:
        live.stop()
    clean(server_log.text())


def test_a_full_session_has_no_room_for_sam3(server, server_log):
    """Four SAM 2.1 objects: no room (413's code); three: a run with room for one, and a
    new SAM 2.1 object during it is refused (the room SAM 3 may still use)."""
    sid = new_live(server)
    with connect(ws_url(server, sid), max_size=None) as ws:
        ws.send(clip(1)[0].tobytes())
        assert receive(ws)["type"] == "frame"
        for obj_id in (1, 2, 3):
            click = {"type": "prompt", "seq": 0, "obj_id": obj_id, "points": [{"x": 9, "y": 9}]}
            send(ws, click)
            assert receive(ws)["type"] == "prompt"
        send(ws, {"type": "concepts_track", "text": "disc"})
        started = receive(ws)
        assert started["type"] == "concepts_track" and started["max_objects"] == 1
        send(ws, {"type": "prompt", "seq": 0, "obj_id": 9, "points": [{"x": 9, "y": 9}]})
        error = receive(ws)
        assert error["code"] == "too_many_objects" and "max_video_objects 4" in error["message"]
        send(ws, {"type": "concepts_stop"})
        assert receive(ws)["type"] == "concepts_done"
        send(ws, {"type": "prompt", "seq": 0, "obj_id": 4, "points": [{"x": 9, "y": 9}]})
        assert receive(ws)["type"] == "prompt"
        send(ws, {"type": "concepts_track", "text": "disc"})
        error = receive(ws)
        assert error["code"] == "too_many_objects" and "max_video_objects 4" in error["message"]
        send(ws, {"type": "end"})
    wait_free(server, sid)
    clean(server_log.text())


def test_sam3s_state_past_the_session_byte_limit_is_refused(server, server_log):
    sid = new_live(server)
    videos = server.app.state.service.videos
    session = session_of(server, sid)
    held = videos.counted_bytes(session)
    original = videos.limits
    videos.limits = dataclasses.replace(original, max_bytes=held + 1024)
    try:
        with connect(ws_url(server, sid), max_size=None) as ws:
            send(ws, {"type": "concepts_track", "text": "disc"})
            error = receive(ws)
            assert error["code"] == "session_too_large", error
            assert "max_video_session_bytes" in error["message"]
            send(ws, {"type": "end"})
    finally:
        videos.limits = original
    assert wait_free(server, sid).concept_run_bytes == 0
    assert server.app.state.service.decoding.held == 0
    clean(server_log.text())


def test_wrong_size_frames_during_a_run_are_refused_and_the_run_goes_on(server, server_log):
    sid = new_live(server)
    sent = clip(4, seed=5)
    with connect(ws_url(server, sid), max_size=None) as ws:
        send(ws, {"type": "concepts_track", "text": "disc", "hotstart_delay": 1})
        assert receive(ws)["type"] == "concepts_track"
        got: list[dict] = []
        for index, frame in enumerate(sent):
            if index == 2:
                ws.send(png_bytes(np.zeros((HEIGHT + 1, WIDTH, 3), np.uint8)))
                error = receive(ws)
                assert error["code"] == "wrong_size" and f"{WIDTH}x{HEIGHT}" in error["message"]
                ws.send(b"\x00" * 7)  # neither raw RGB of the size nor an image
                assert receive(ws)["type"] == "error"
            ws.send(frame.tobytes())
            assert receive(ws)["type"] == "frame"
            got.append(receive(ws))
        send(ws, {"type": "end"})
    results = expected(sent, 0, 1, 3)
    assert [frame["seq"] for frame in got] == [0, 1, 4, 5]  # the refused ones took 2 and 3
    for frame in got:
        frame["seq"] = frame["frame_idx"]  # (check_frames' rule: one seq per frame)
    check_frames(got, results, session_ids(results, set(), 3))
    wait_free(server, sid)
    clean(server_log.text())


def test_a_concepts_track_sent_too_fast_is_refused(server, stub, server_log):
    sid = new_live(server)
    with connect(ws_url(server, sid), max_size=None) as ws:
        stub.gate.clear()
        stub.waiting.clear()
        try:
            for frame in clip(3):
                ws.send(frame.tobytes())
            assert stub.waiting.wait(WAIT_S)
            send(ws, {"type": "concepts_track", "text": "disc"})
            error = receive(ws)
            assert error["code"] == "too_fast" and "max_live_pending 3" in error["message"]
        finally:
            stub.gate.set()
        assert [receive(ws)["type"] for _ in range(3)] == ["frame"] * 3
        send(ws, {"type": "end"})
    assert wait_free(server, sid).concept_tracks == {}
    clean(server_log.text())


def test_a_client_that_leaves_mid_run_frees_its_bytes(server, server_log):
    sid = new_live(server)
    service = server.app.state.service
    with connect(ws_url(server, sid), max_size=None) as ws:
        send(ws, {"type": "concepts_track", "text": "disc"})
        assert receive(ws)["type"] == "concepts_track"
        session = session_of(server, sid)
        assert session.concept_run_bytes > 0 and service.decoding.held > 0  # while it runs
        with server.client() as client:
            tracking = client.get(f"/v1/videos/{sid}").json()["tracking_bytes"]
            assert tracking >= session.concept_run_bytes
        for frame in clip(3):
            ws.send(frame.tobytes())
        assert receive(ws)["type"] == "frame"
        ws.close()  # mid-run, without "end"
    session = wait_free(server, sid)
    assert session.concept_run_bytes == 0 and service.decoding.held == 0
    with server.client() as client:
        assert client.delete(f"/v1/videos/{sid}").status_code == 200
    clean(server_log.text())


@pytest.mark.extended
def test_the_reduced_sam3_on_a_live_connection_answers_as_its_run(
    predictor, stub, concepts_tiny, server_log
):
    """The real (reduced, random) SAM 3 behind the WebSocket, no hot-start delay: each
    frame's SAM 3 answer follows its SAM 2.1 answer and is the engine's on the same frames."""
    from sam2serve.concepts.video_load import video_predictor
    from sam2serve.samples import sample_clip

    live = serve(predictor, stub, concepts_tiny, pixels=False)
    sent, _ = sample_clip(2, (HEIGHT, WIDTH))
    try:
        sid = new_live(live)
        with connect(ws_url(live, sid), max_size=None) as ws:
            send(ws, {"type": "concepts_track", "text": "disc", "hotstart_delay": 0})
            started = receive(ws)
            got = []
            for frame in sent:
                ws.send(frame.tobytes())
                assert receive(ws)["type"] == "frame"
                got.append(receive(ws))
            send(ws, {"type": "end"})
            assert receive(ws)["type"] == "concepts_done"
        CREATED.remove((live, sid))
    finally:
        live.stop()
    room = started["max_objects"]
    detection = run_thresholds(None, True, room)
    engine = video_predictor(concepts_tiny, stream_thresholds(detection, 0))
    results = list(engine.run(engine.start(OPEN_ENDED, HEIGHT, WIDTH, "disc"), iter(sent)))
    ids = session_ids(results, set(), room)
    assert ids, "SAM 3 found nothing: the comparison would be empty"
    check_frames(got, results, ids)
    clean(server_log.text())


def test_latest_mode_pushes_only_the_tracked_frames_to_sam3(server, stub, server_log):
    """A frame replaced while it waited is never tracked: SAM 3 gets the frames SAM 2.1
    tracks (consecutive indices), each answer naming its frame's seq."""
    sid = new_live(server)
    sent = clip(3, seed=7)
    url = ws_url(server, sid) + "?mode=latest"
    with connect(url, max_size=None) as ws:
        send(ws, {"type": "concepts_track", "text": "disc", "hotstart_delay": 0})
        assert receive(ws)["type"] == "concepts_track"
        stub.gate.clear()
        stub.waiting.clear()
        try:
            ws.send(sent[0].tobytes())
            assert stub.waiting.wait(WAIT_S)  # frame 0 is being tracked
            ws.send(sent[1].tobytes())  # waits...
            ws.send(sent[2].tobytes())  # ...and is replaced by this one
            skipped = receive(ws)
            assert skipped["skipped"] is True and skipped["seq"] == 1
        finally:
            stub.gate.set()
        messages = [receive(ws) for _ in range(4)]
        send(ws, {"type": "end"})
    assert [(m["type"], m["seq"], m["frame_idx"]) for m in messages] == [
        ("frame", 0, 0),
        ("concepts_frame", 0, 0),
        ("frame", 2, 1),
        ("concepts_frame", 2, 1),
    ]
    tracked = [sent[0], sent[2]]
    results = expected(tracked, 0, 0, 3)
    got = [m for m in messages if m["type"] == "concepts_frame"]
    for frame in got:
        frame["seq"] = frame["frame_idx"]  # (check_frames' rule: one seq per frame)
    check_frames(got, results, session_ids(results, set(), 3))
    clean(server_log.text())
