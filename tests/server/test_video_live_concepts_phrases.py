"""Several phrases in one SAM 3 run on a live connection (``concepts_track`` with
``phrases: [..]``), against a real server (uvicorn on 127.0.0.1, a WebSocket client).

SAM 3's networks are the frames' pixels (tests/sam3_pixel_steps.py), SAM 2.1's the stub of
test_video_live.py. The behaviour: the ``concepts_frame`` answers are
:func:`~sam2serve.concepts.video_phrases.run_phrases`' on the same frames (merged ids mapped
to the session's smallest free ones, each object named by and carrying its phrase, scores,
masks), one encoding per frame for every phrase, the room shared out evenly. The hostile
half: an empty list, a repeated phrase, both text and phrases, bad types, more phrases than
the schema or the server allows, more phrases than the room - each refused with one line
naming the value or limit, the connection usable after."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from sam3_pixel_steps import PixelSteps
from test_video_live import HEIGHT, WIDTH, clean, masks_of
from test_video_live_concepts import (
    clip,
    close_sessions,  # noqa: F401  # the autouse fixture closes this module's sessions too
    new_live,
    receive,
    send,
    serve,
    session_ids,
    stub,  # noqa: F401  # a fixture
    wait_free,
    ws_url,
)
from websockets.sync.client import connect

from sam2serve.concepts.video_phrases import PhrasesFrame, run_phrases, start_phrases
from sam2serve.concepts.video_stream import OPEN_ENDED, stream_thresholds
from sam2serve.server.concept_schemas import MAX_CONCEPT_PHRASES
from sam2serve.server.concept_tracks import run_thresholds

PHRASES = ["disc", "cup", "red block"]


class Counted(PixelSteps):
    """The pixel predictor, counting frame encodings over every instance the server makes."""

    encoded = 0

    def encode(self, frame):  # type: ignore[no-untyped-def]  # the stub's own signature
        Counted.encoded += 1
        return super().encode(frame)


@pytest.fixture(scope="module")
def server(predictor, stub, concepts_tiny):  # noqa: F811  # stub: the imported fixture
    """Room for 6 SAM 3 objects (2 each for three phrases), at most 3 phrases a run."""
    live = serve(
        predictor,
        stub,
        concepts_tiny,
        max_video_objects=8,
        max_concept_instances=6,
        max_concept_phrases=3,
    )
    live.app.state.service.concepts.video.predictor = Counted
    yield live
    stub.gate.set()
    live.stop()


def expected(sent: list[np.ndarray], delay: int, per_phrase: int, phrases: list[str]) -> list:
    """The engine's several-phrase run on the same frames (random weights' thresholds)."""
    thresholds = stream_thresholds(run_thresholds(None, True, per_phrase), delay)
    predictor = PixelSteps(thresholds)
    state = start_phrases(predictor, OPEN_ENDED, HEIGHT, WIDTH, phrases)
    return list(run_phrases(predictor, state, iter(sent)))


def check_frames(got: list[dict], results: list[PhrasesFrame], ids: dict[int, int]) -> None:
    assert [f["frame_idx"] for f in got] == [r.frame for r in results]
    for frame, result in zip(got, results, strict=True):
        wanted = sorted((ids[o], row) for row, o in enumerate(result.obj_ids) if o in ids)
        assert [o["obj_id"] for o in frame["objects"]] == [obj for obj, _ in wanted]
        masks = masks_of(frame["objects"])
        for obj, (session_id, row) in zip(frame["objects"], wanted, strict=True):
            np.testing.assert_array_equal(masks[session_id], result.masks[row])
            assert obj["name"] == obj["phrase"] == result.phrases[row]
            assert obj["score"] == pytest.approx(result.scores[row])


@pytest.mark.parametrize("delay", [3, 0])
def test_several_phrases_answer_as_run_phrases_with_one_encoding_a_frame(server, delay, server_log):
    sid = new_live(server)
    sent = clip(12, seed=4)
    log: list[dict] = []
    with connect(ws_url(server, sid), max_size=None) as ws:
        message = {"type": "concepts_track", "phrases": [" disc", *PHRASES[1:]]}
        send(ws, {**message, "hotstart_delay": delay})
        started = receive(ws)
        assert started["type"] == "concepts_track" and "text" not in started, started
        assert started["phrases"] == PHRASES and started["max_objects"] == 6
        encoded = Counted.encoded
        for seq, frame in enumerate(sent):
            ws.send(frame.tobytes())
            assert receive(ws)["type"] == "frame"
            if seq + 1 >= max(delay, 1):
                log.append(receive(ws))
                assert log[-1]["type"] == "concepts_frame", log[-1]
        assert Counted.encoded - encoded == len(sent)  # one ViT pass a frame, not one a phrase
        send(ws, {"type": "concepts_stop"})
        while (message := receive(ws))["type"] == "concepts_frame":
            log.append(message)
        done = message
        send(ws, {"type": "end"})
    results = expected(sent, delay, 2, PHRASES)
    ids = session_ids(results, set(), 6)
    phrases = {result.phrases[row] for result in results for row in range(len(result.obj_ids))}
    assert phrases == set(PHRASES), "a phrase found nothing: the comparison would be thin"
    check_frames(log, results, ids)
    assert done["type"] == "concepts_done" and done["phrases"] == PHRASES
    assert "text" not in done and done["frames"] == len(sent) and done["max_objects"] == 6
    named = {o["obj_id"]: o["name"] for frame in log for o in frame["objects"]}
    assert {o["obj_id"]: o["name"] for o in done["objects"]} == named
    session = wait_free(server, sid)
    assert session.concept_run_bytes == 0 and server.app.state.service.decoding.held == 0
    with server.client() as client:
        body = client.get(f"/v1/videos/{sid}").json()
    assert {o["obj_id"]: o["name"] for o in body["objects"]} == named
    clean(server_log.text())


def test_one_phrase_in_phrases_is_a_text_run(server, server_log):
    """``phrases: ["disc"]``: Meta's ids, the whole room, no ``text`` in the answers."""
    sid = new_live(server)
    sent = clip(4, seed=6)
    with connect(ws_url(server, sid), max_size=None) as ws:
        send(ws, {"type": "concepts_track", "phrases": ["disc"], "hotstart_delay": 0})
        started = receive(ws)
        assert started["phrases"] == ["disc"] and started["max_objects"] == 6
        got = []
        for frame in sent:
            ws.send(frame.tobytes())
            assert receive(ws)["type"] == "frame"
            got.append(receive(ws))
        send(ws, {"type": "end"})
    results = expected(sent, 0, 6, ["disc"])
    check_frames(got, results, session_ids(results, set(), 6))
    wait_free(server, sid)
    clean(server_log.text())


# --------------------------------------------------------------------------- refused

TOO_MANY = [f"p{i}" for i in range(MAX_CONCEPT_PHRASES + 1)]


@pytest.mark.parametrize(
    "message, code, words",
    [
        ({"phrases": []}, "invalid_request", ("phrases", "at least 1")),
        ({"phrases": ["cat", " cat"]}, "invalid_request", ("phrases", "'cat'", "twice")),
        ({"phrases": ["cat", " "]}, "invalid_request", ("phrases[1]", "empty")),
        ({"phrases": ["cat", "x" * 65]}, "invalid_request", ("phrases[1]", "64")),
        ({"phrases": "cat"}, "invalid_request", ("phrases", "list")),
        ({"phrases": [1]}, "invalid_request", ("phrases.0",)),
        ({"phrases": {"a": 1}}, "invalid_request", ("phrases",)),
        ({"phrases": None}, "invalid_request", ("text", "phrases")),
        ({"text": "cat", "phrases": ["dog"]}, "invalid_request", ("not both",)),
        ({"phrases": TOO_MANY}, "invalid_request", ("phrases", str(MAX_CONCEPT_PHRASES))),
        ({"phrases": ["a", "b", "c", "d"]}, "too_many_prompts", ("4", "max_concept_phrases")),
    ],
)
def test_bad_phrases_are_refused_and_the_connection_stays(server, message, code, words, server_log):
    sid = new_live(server)
    with connect(ws_url(server, sid), max_size=None) as ws:
        send(ws, {"type": "concepts_track", **message})
        error = receive(ws)
        assert error["type"] == "error" and error["code"] == code, error
        assert all(w in error["message"] for w in words), error
        ws.send(clip(1)[0].tobytes())
        assert receive(ws)["type"] == "frame"  # no run started: no SAM 3 answer follows
        send(ws, {"type": "end"})
    session = wait_free(server, sid)
    assert session.concept_tracks == {} and session.concept_run_bytes == 0
    assert server.app.state.service.decoding.held == 0
    clean(server_log.text())


def test_more_phrases_than_the_room_and_a_second_run_are_refused(server, server_log):
    """Six SAM 2.1 objects of 8: room for 2, fewer than 3 phrases (413, nothing held); two
    phrases get one each, and a second run while it lasts names both."""
    sid = new_live(server)
    with connect(ws_url(server, sid), max_size=None) as ws:
        ws.send(clip(1)[0].tobytes())
        assert receive(ws)["type"] == "frame"
        for obj_id in range(1, 7):
            click = {"type": "prompt", "seq": 0, "obj_id": obj_id, "points": [{"x": 9, "y": 9}]}
            send(ws, click)
            assert receive(ws)["type"] == "prompt"
        send(ws, {"type": "concepts_track", "phrases": PHRASES})
        error = receive(ws)
        assert error["code"] == "too_many_objects", error
        assert "room for 2 object(s)" in error["message"] and "3 phrases" in error["message"]
        assert session_of_bytes(server, sid) == (0, 0)
        send(ws, {"type": "concepts_track", "phrases": PHRASES[:2]})
        started = receive(ws)
        assert started["type"] == "concepts_track" and started["max_objects"] == 2
        send(ws, {"type": "concepts_track", "text": "bowl"})
        error = receive(ws)
        assert error["code"] == "concepts_running" and "'disc', 'cup'" in error["message"]
        send(ws, {"type": "concepts_stop"})
        done = receive(ws)
        assert done["type"] == "concepts_done" and done["phrases"] == PHRASES[:2]
        send(ws, {"type": "end"})
    wait_free(server, sid)
    clean(server_log.text())


def session_of_bytes(server: Any, sid: str) -> tuple[int, int]:
    """The session's SAM 3 run bytes and the decode budget held."""
    session = server.app.state.service.videos.get(sid, touch=False)
    return session.concept_run_bytes, server.app.state.service.decoding.held
