"""Issue 36: a closed video session is freed at once, not when the worker next runs.

- In process (a real server in a thread): with the garbage collector off, the session's
  state and frames are gone when DELETE (or the reaper) has closed it, after prompts and
  a propagation have run on the model worker: nothing (a job's closure, a failed job's
  traceback, a stream) keeps them, and reference counting alone frees them.
- In a subprocess: the server's resident memory has fallen by the frames' bytes when the
  DELETE's answer arrives (the allocator's free pages given back then, not when the model
  worker next falls idle).
"""

from __future__ import annotations

import gc
import time
import weakref
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import numpy as np
import pytest
from hostile import proc_status, spawn_server
from server_logs import assert_no_traceback, log_mark
from server_support import png_bytes, start_server
from small_tracker import small_tiny_tracker
from surfaces import MiB, mp4

from sam2serve.engine.video.predictor import VideoPredictor
from sam2serve.server.settings import ServerSettings

pytest.importorskip("av")

FRAMES = [np.full((48, 64, 3), 40 * i, np.uint8) for i in range(3)]
WAIT_S = 60  # an upper bound on waiting for the reaper; never asserted as a time


@pytest.fixture(scope="module")
def video_server(predictor):
    settings = ServerSettings.from_flat(video=True, warmup=False, video_idle_s=1.0)
    live = start_server(settings, predictor, VideoPredictor(small_tiny_tracker(seed=0)))
    yield live
    live.stop()


@contextmanager
def no_garbage_collection() -> Iterator[None]:
    enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def held(live, session_id: str) -> tuple[weakref.ref, weakref.ref]:
    """Weak references to the session's tracking state and to its first frame."""
    session = live.service.videos._sessions[session_id]
    return weakref.ref(session.state), weakref.ref(session.state.source.frame(0))


def used_session(client: httpx.Client) -> str:
    """A session that prompts, a refused prompt and a propagation have run on."""
    files = [("frame", (f"{i}.png", png_bytes(f), "image/png")) for i, f in enumerate(FRAMES)]
    created = client.post("/v1/videos", files=files)
    assert created.status_code == 201, created.text
    session_id = created.json()["session_id"]
    prompt = {"frame_idx": 0, "obj_id": 1, "points": [{"x": 20, "y": 20, "label": 1}]}
    assert client.post(f"/v1/videos/{session_id}/prompts", json=prompt).status_code == 200
    wrong = {"frame_idx": 0, "obj_id": 2, "mask": {"size": [48, 64], "counts": [1, 5]}}
    assert client.post(f"/v1/videos/{session_id}/prompts", json=wrong).status_code == 422
    with client.stream("POST", f"/v1/videos/{session_id}/propagate", json={}) as stream:
        text = "".join(stream.iter_text())
    assert "event: done" in text, text[-500:]
    return session_id


def test_a_deleted_session_is_freed_when_delete_answers(video_server):
    with video_server.client() as client, no_garbage_collection():
        session_id = used_session(client)
        state, frame = held(video_server, session_id)
        assert client.delete(f"/v1/videos/{session_id}").status_code == 200
        assert state() is None and frame() is None


def test_an_expired_session_is_freed_when_the_reaper_closes_it(video_server):
    with video_server.client() as client, no_garbage_collection():
        session_id = used_session(client)
        state, frame = held(video_server, session_id)
        deadline = time.monotonic() + WAIT_S
        while session_id in video_server.service.videos._sessions:
            assert time.monotonic() < deadline, "the reaper never closed the idle session"
            time.sleep(0.05)
        assert state() is None and frame() is None


def test_the_servers_memory_falls_by_the_frames_when_delete_answers():
    frames, width, height = 40, 640, 480
    frames_bytes = frames * width * height * 3  # 35 MiB decoded
    live = spawn_server(
        {
            "video": True,
            "max_video_frames": frames,
            "max_video_upload_bytes": 16 * MiB,
            "max_video_session_bytes": 512 * MiB,
        },
        memory_headroom=None,
    )
    try:
        mark = log_mark(live)
        with live.client(timeout=300) as client:
            created = client.post(
                "/v1/videos", files={"video": ("clip.mp4", mp4(frames, width, height), "video/mp4")}
            )
            assert created.status_code == 201, created.text
            session_id = created.json()["session_id"]
            prompt = {"frame_idx": 0, "obj_id": 1, "points": [{"x": 9, "y": 9, "label": 1}]}
            # A job, after which the worker gave the upload's own free pages back.
            assert client.post(f"/v1/videos/{session_id}/prompts", json=prompt).status_code == 200
            before = proc_status(live.pid)["VmRSS"]
            assert client.delete(f"/v1/videos/{session_id}").status_code == 200
            after = proc_status(live.pid)["VmRSS"]
        fallen = before - after
        print(f"\nRSS {before / MiB:.0f} -> {after / MiB:.0f} MiB at DELETE's answer")
        assert fallen >= 0.75 * frames_bytes, (
            f"RSS fell by {fallen / MiB:.1f} MiB; the frames held {frames_bytes / MiB:.1f} MiB"
        )
        assert_no_traceback(live, mark)
    finally:
        live.stop()
