"""Round 3 of the surfaces suite (issue 26, items 1, 2 and 6): the video surfaces tried
as a hostile client would, on loopback, against one real server (a subprocess under a
memory cap: the tiny model with random weights and its video model).

- video uploads (POST /v1/videos) of legal containers that show their streams only after
  probing (MPEG-TS, MPEG-PS), of files cut inside their index, of metadata that is not
  UTF-8: a 415 ``unsupported_video`` or 400 ``invalid_video`` naming the file;
- GET /v1/videos/{id}/frames/{i} of a frame a live session no longer holds: 410
  ``frame_gone``;
- live WebSocket text messages nested past the JSON depth limit, over the text limit,
  not JSON, or refused prompts: each answered with an error message (the HTTP error
  shape inside), the connection open afterwards and closed with 1000 on ``end``.

Every request is answered with a 4xx (never a 5xx, never a dropped socket) and leaves no
traceback in the server's log. The tallies (tried / 4xx / 5xx / no answer / worst /healthz
stall / worst peak RSS growth per surface) are printed at the end and appended to
``$SAM2SERVE_RELIABILITY_REPORT``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
from hostile import JSON, Answer, SpawnedServer, dumps
from round3_videos import hostile_videos
from server_logs import assert_no_traceback, log_mark
from server_support import png_bytes
from surfaces import MiB, SharedServer, Tally, measured, multipart_files, report, send
from websockets.exceptions import ConnectionClosed
from websockets.sync import client as websockets_sync

pytest.importorskip("av")

WIDTH, HEIGHT = 32, 24
KEPT = 2  # live_frames_kept: its least
SETTINGS: dict[str, Any] = {
    "video": True,
    "max_pixels": 4_000_000,
    "max_video_frames": 50,
    "max_video_upload_bytes": 8 * MiB,
    "max_video_session_bytes": 256 * MiB,
    "max_video_sessions": 8,
    "live_frames_kept": KEPT,
    "video_idle_s": 120.0,
    "request_timeout_s": 60,
    "cache_bytes": 64 * MiB,
    "mask_cache_bytes": 8 * MiB,
}
OPTIONAL: dict[str, Any] = {"max_video_sessions_per_client": 8}
TIMEOUT_S = 60.0
TALLIES = {
    name: Tally(name)
    for name in ("round3 video uploads", "round3 frames route", "round3 live WebSocket")
}


@pytest.fixture(scope="module")
def server() -> Iterator[SharedServer]:
    shared = SharedServer(SETTINGS, optional=OPTIONAL)
    yield shared
    shared.stop()
    print("\n" + report(TALLIES))


def refused(answer: Answer | None, status: int, statuses: set[int], codes: set[str]) -> dict:
    """A 4xx of ``statuses`` in the one error shape, its code one of ``codes``."""
    assert answer is not None, "no answer (dropped or timed out)"
    assert status in statuses, f"{status}: {answer.text[:400]}"
    error = answer.error()
    assert error["code"] in codes, error
    assert len(error["message"]) <= 1000, error["message"][:300]
    return error


# --------------------------------------------------------------------------- uploads


@pytest.mark.parametrize("name", sorted(hostile_videos()))
def test_an_unreadable_or_unsupported_video_upload_is_a_4xx_naming_it(name, server):
    live = server.ensure()
    data, codes = hostile_videos()[name]
    content_type, body = multipart_files([("video", name, data)])
    mark = log_mark(live)
    status, answer, _, _ = measured(
        live,
        TALLIES["round3 video uploads"],
        lambda: send(live, "POST", "/v1/videos", body, content_type),
    )
    error = refused(answer, status, {400, 415, 422}, set(codes))
    assert name in error["message"], error
    if codes == {"unsupported_video"}:
        assert status == 415 and "remux" in error["message"], error
    assert_no_traceback(live, mark)


# --------------------------------------------------------------------------- live sessions


def new_live(live: SpawnedServer) -> str:
    body = dumps({"width": WIDTH, "height": HEIGHT})
    answer = send(live, "POST", "/v1/videos/live", body, JSON)
    assert answer.status == 201, answer.text[:300]
    return json.loads(answer.body)["session_id"]


def ws_url(live: SpawnedServer, session_id: str) -> str:
    return live.url.replace("http://", "ws://") + f"/v1/videos/{session_id}/live"


def raw_frame(i: int) -> bytes:
    return np.full((HEIGHT, WIDTH, 3), 20 * i, np.uint8).tobytes()


def receive(ws: Any) -> dict:
    return json.loads(ws.recv(timeout=TIMEOUT_S))


@pytest.fixture(scope="module")
def streamed(server) -> str:
    """A live session that has been sent KEPT + 2 frames: frames 0 and 1 are gone."""
    live = server.ensure()
    session_id = new_live(live)
    with websockets_sync.connect(ws_url(live, session_id), max_size=None) as ws:
        for i in range(KEPT + 2):
            ws.send(raw_frame(i))
            answer = receive(ws)
            assert answer["type"] == "frame" and answer["frame_idx"] == i, answer
        ws.send(json.dumps({"type": "end"}))
        with pytest.raises(ConnectionClosed):
            ws.recv(timeout=TIMEOUT_S)
    return session_id


@pytest.mark.parametrize("frame_idx", [0, 1])
def test_a_frame_the_live_session_no_longer_holds_is_410(frame_idx, server, streamed):
    live = server.ensure()
    mark = log_mark(live)
    tally = TALLIES["round3 frames route"]
    # A client that keeps asking gets the same answer each time (and no log flood).
    path = f"/v1/videos/{streamed}/frames/{frame_idx}"
    answers = [measured(live, tally, lambda: send(live, "GET", path))[:2] for _ in range(5)]
    for status, answer in answers:
        error = refused(answer, status, {410}, {"frame_gone"})
        assert f"frame {frame_idx} is gone" in error["message"], error
        assert f"{KEPT}..{KEPT + 1}" in error["message"], error  # what it holds
    held = send(live, "GET", f"/v1/videos/{streamed}/frames/{KEPT + 1}")
    assert held.status == 200 and held.headers["content-type"] == "image/jpeg"
    assert_no_traceback(live, mark)


# --------------------------------------------------------------------------- WebSocket


@dataclass
class WsAnswer:
    """What one message on its own connection got: the answers, how the connection ended
    (``close``: the code the server sent; None: dropped without a close frame), and the
    request's status for the tally (400 for an error message, 500 for an internal error
    or a close 1011, 0 for no answer)."""

    messages: list[dict] = field(default_factory=list)
    close: int | None = None
    status: int = 0


def one_message(live: SpawnedServer, session_id: str, message: str | bytes) -> WsAnswer:
    """Send ``message`` on a new connection, read its answer, then end the connection."""
    out = WsAnswer()
    with websockets_sync.connect(ws_url(live, session_id), max_size=None) as ws:
        try:
            ws.send(message)
            out.messages.append(receive(ws))
            ws.send(json.dumps({"type": "end"}))
            while True:
                out.messages.append(receive(ws))
        except ConnectionClosed as closed:
            out.close = closed.rcvd.code if closed.rcvd is not None else None
        except TimeoutError:
            pass
    first = out.messages[0] if out.messages else None
    if first is not None and first.get("type") == "error":
        out.status = 500 if first.get("code") == "internal_error" else 400
    if out.close == 1011:
        out.status = 500
    return out


def _prompt(**fields: Any) -> str:
    return json.dumps({"type": "prompt", "frame_idx": 0, "obj_id": 1, **fields})


# (case, message, the error codes accepted)
WS_CASES: list[tuple[str, str | bytes, set[str]]] = [
    ("arrays_nested_32000_deep", "[" * 32_000 + "]" * 32_000, {"json_too_deep"}),
    ("objects_nested_10000_deep", '{"a":' * 10_000 + "1" + "}" * 10_000, {"json_too_deep"}),
    ("prompt_nested_40_deep", _prompt(points=json.loads("[" * 40 + "]" * 40)), {"json_too_deep"}),
    ("unclosed_nesting", "[" * 60_000, {"json_too_deep", "invalid_json"}),
    ("text_over_the_limit", "x" * 70_000, {"message_too_large", "invalid_message"}),
    ("not_json", "{not json", {"invalid_json", "invalid_message"}),
    ("number_of_5000_digits", "1" * 5000, {"invalid_json", "invalid_message"}),
    ("duplicate_keys", '{"type": "prompt", "type": "end"}', {"invalid_json"}),
    ("not_an_object", "[1, 2]", {"invalid_message"}),
    ("prompt_on_a_gone_frame", _prompt(points=[{"x": 1, "y": 1}]), {"frame_not_held"}),
    ("prompt_obj_id_huge", _prompt(obj_id=10**30, points=[{"x": 1, "y": 1}]), {"invalid_request"}),
    ("binary_not_an_image", b"\x00" * 100, {"invalid_image"}),
    ("png_of_another_size", png_bytes(np.zeros((HEIGHT + 2, WIDTH, 3), np.uint8)), {"wrong_size"}),
]


@pytest.mark.parametrize(("case", "message", "codes"), WS_CASES, ids=[c[0] for c in WS_CASES])
def test_a_refused_live_message_gets_an_error_message_and_a_clean_close(
    case, message, codes, server, streamed
):
    live = server.ensure()
    mark = log_mark(live)
    status, answer, _, _ = measured(
        live,
        TALLIES["round3 live WebSocket"],
        lambda: one_message(live, streamed, message),
    )
    assert answer is not None and answer.messages, f"no answer; closed with {answer.close}"
    error = answer.messages[0]
    assert error["type"] == "error" and error["code"] in codes, error
    assert error["error"] == {"code": error["code"], "message": error["message"]}, error
    assert len(error["message"]) <= 1000, error["message"][:300]
    # The connection stayed: "end" closed it normally (nothing else was answered).
    assert answer.close == 1000, (answer.close, answer.messages)
    assert len(answer.messages) == 1, answer.messages
    assert status == 400
    assert_no_traceback(live, mark)


def test_the_session_is_usable_after_the_hostile_messages(server, streamed):
    live = server.ensure()
    mark = log_mark(live)
    with websockets_sync.connect(ws_url(live, streamed), max_size=None) as ws:
        ws.send(raw_frame(9))
        answer = receive(ws)
    assert answer["type"] == "frame" and answer["frame_idx"] >= KEPT + 2, answer
    assert_no_traceback(live, mark)
