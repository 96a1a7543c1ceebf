"""/predict on video tasks, the clip served by a loopback HTTP server: the annotator's
VideoRectangle keyframes of several objects in, each object tracked through the clip and
answered as a VideoRectangle; every limit checked before the step it bounds.

Most tests run the video predictor's own flow with the model's work scripted (known masks
per frame, so the answer can be worked out here); the last one runs the tiny model's
layers (at tests/small_tracker.py's 256 x 256 input, every object present) and compares
the answer with the masks it produced."""

from __future__ import annotations

import io
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import numpy as np
import pytest
import torch
from fastapi.testclient import TestClient
from video_support import (
    CLIP_FPS,
    CLIP_SIZE,
    VIDEO_CONFIG,
    clip_bytes,
    clip_truth,
    truth_box_percent,
    video_region,
)

from sam2serve.checkpoint import load_video_model
from sam2serve.engine.video.predictor import FrameMasks, VideoPredictor
from sam2serve.engine.video_io import decode_video
from sam2serve.labelstudio.app import create_labelstudio_app
from sam2serve.labelstudio.options import LabelStudioOptions
from sam2serve.server.settings import MiB, ServerSettings

pytest.importorskip("av")

H, W = CLIP_SIZE
SETTINGS = ServerSettings.from_flat(
    warmup=False,
    video=True,
    max_wait_ms=0,
    max_upload_bytes=1 * MiB,
    max_video_upload_bytes=1 * MiB,
    request_timeout_s=600,
)


# ---------------------------------------------------------------- a loopback file server


class Files:
    """What a loopback server serves (path -> bytes) and the requests it saw."""

    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}
        self.seen: list[tuple[str, dict[str, str]]] = []
        self.release = threading.Event()  # ends a stalled answer


def _handler(files: Files) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # http.server's name
            files.seen.append((self.path, {k.lower(): v for k, v in self.headers.items()}))
            if self.path == "/huge.mp4":  # declares 10 GiB, sends 1 KiB, then stalls
                self.send_response(200)
                self.send_header("Content-Length", str(10 * 1024**3))
                self.end_headers()
                self.wfile.write(b"\0" * 1024)
                self.wfile.flush()
                files.release.wait(30)
                return
            data = files.files.get(self.path)
            if data is None:
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Type", "video/mp4")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: Any) -> None:
            pass

    return Handler


@pytest.fixture
def serve() -> Iterator[Callable[[], tuple[str, Files]]]:
    """Starts loopback file servers; each call: (its base URL, its Files)."""
    servers: list[tuple[ThreadingHTTPServer, Files]] = []

    def start() -> tuple[str, Files]:
        files = Files()
        server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(files))
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append((server, files))
        return f"http://127.0.0.1:{server.server_address[1]}", files

    yield start
    for server, files in servers:
        files.release.set()
        server.shutdown()
        server.server_close()


# ---------------------------------------------------------------- the tracker


@pytest.fixture(scope="session")
def video_model() -> Any:
    return load_video_model("tiny", random_weights=True, seed=0)


class ScriptedTracker(VideoPredictor):
    """The video predictor with the model's work replaced by a script: it records the
    frames and prompts it is given, and its propagation yields each object's box of the
    script ({obj_id: [(x0, y0, x1, y1) or None per frame]}) as its mask."""

    def __init__(self, model: Any, script: dict[int, list[tuple[int, int, int, int] | None]]):
        super().__init__(model)
        self.script = script
        self.frames: list[np.ndarray] | None = None
        self.prompts: list[tuple[int, int, tuple[float, ...]]] = []
        self.propagated_from: int | None = None

    def init_state(self, frames):  # type: ignore[override]
        self.frames = list(frames)
        return super().init_state(frames)

    def add_prompt(self, state, frame_idx, obj_id, prompt, **kwargs):  # type: ignore[override]
        self.prompts.append((frame_idx, obj_id, tuple(prompt.box)))

    def propagate(self, state, start_frame_idx=None, max_frame_num_to_track=None, reverse=False):  # type: ignore[override]
        self.propagated_from = start_frame_idx
        obj_ids = sorted({obj_id for _, obj_id, _ in self.prompts})
        for index in range(start_frame_idx, state.num_frames):
            logits = torch.full((len(obj_ids), 1, state.height, state.width), -5.0)
            for row, obj_id in enumerate(obj_ids):
                box = self.script[obj_id][index]
                if box is not None:
                    x0, y0, x1, y1 = box
                    logits[row, 0, y0:y1, x0:x1] = 5.0
            yield FrameMasks(index, obj_ids, logits)


def video_client(
    tracker: VideoPredictor | None,
    settings: ServerSettings = SETTINGS,
    **options: Any,
) -> TestClient:
    from sam2serve.engine.predictor import Predictor

    app = create_labelstudio_app(
        settings,
        LabelStudioOptions(**options),
        Predictor(_image_model()),
        video_predictor=tracker,
    )
    return TestClient(app, raise_server_exceptions=False)


_IMAGE_MODEL: list[Any] = []


def _image_model() -> Any:
    if not _IMAGE_MODEL:
        from sam2serve.checkpoint import load_model

        _IMAGE_MODEL.append(load_model("tiny", random_weights=True, seed=0))
    return _IMAGE_MODEL[0]


def body(video: str, *regions: dict, config: str = VIDEO_CONFIG) -> dict:
    request: dict = {
        "tasks": [{"id": 7, "data": {"video": video}}],
        "project": "1.1700000000",
        "label_config": config,
        "params": {"login": None, "password": None},
    }
    if regions:
        request["params"]["context"] = {"result": list(regions)}
    return request


def pct(box: tuple[int, int, int, int]) -> dict[str, float]:
    x0, y0, x1, y1 = box
    return {
        "x": pytest.approx(x0 / W * 100, abs=1e-3),
        "y": pytest.approx(y0 / H * 100, abs=1e-3),
        "width": pytest.approx((x1 - x0) / W * 100, abs=1e-3),
        "height": pytest.approx((y1 - y0) / H * 100, abs=1e-3),
    }


DISC = (1, 12.5, 25.0, 25.0, 50.0)  # frame 1: x, y, width, height in percent
SQUARE = (2, 50.0, 10.0, 30.0, 40.0)  # frame 2
SCRIPT = {
    0: [(12, 16, 36, 48), (20, 16, 44, 48), (30, 10, 60, 40)],
    1: [None, (48, 6, 78, 32), None],  # leaves after frame 2
}


def two_objects(video: str) -> dict:
    return body(
        video,
        video_region("disc", [DISC], labels=["Disc"]),
        video_region("square", [SQUARE], labels=["Square"]),
    )


# ---------------------------------------------------------------- the answer


def test_two_objects_are_tracked_into_video_rectangles(serve, video_model):
    base, files = serve()
    files.files["/clip.mp4"] = clip_bytes(3)
    tracker = ScriptedTracker(video_model, SCRIPT)
    with video_client(tracker, allow_fetch_hosts=(base.removeprefix("http://"),)) as client:
        response = client.post("/predict", json=two_objects(f"{base}/clip.mp4"))
    assert response.status_code == 200, response.text
    answer = response.json()
    [prediction] = answer["results"]
    assert prediction["model_version"] == answer["model_version"]
    # The engine's own decoder's frames, from the first keyframe on.
    reference = decode_video(io.BytesIO(clip_bytes(3)), "clip").frames
    assert tracker.frames is not None and len(tracker.frames) == 3
    for got, expected in zip(tracker.frames, reference, strict=True):
        np.testing.assert_array_equal(got, expected)
    # Each region's enabled keyframe is a box prompt, in pixels, on its frame.
    assert [(f, o) for f, o, _ in tracker.prompts] == [(0, 0), (1, 1)]
    assert tracker.prompts[0][2] == pytest.approx((12, 16, 36, 48))
    assert tracker.prompts[1][2] == pytest.approx((48, 6.4, 76.8, 32))
    assert tracker.propagated_from == 0
    disc, square = prediction["result"]
    for region, rid, label in ((disc, "disc", "Disc"), (square, "square", "Square")):
        assert region["id"] == rid and region["type"] == "videorectangle"
        assert (region["from_name"], region["to_name"]) == ("box", "video")
        assert region["value"]["labels"] == [label]
        assert region["value"]["framesCount"] == 3
    disc_frames = disc["value"]["sequence"]
    assert [k["frame"] for k in disc_frames] == [1, 2, 3]
    assert disc_frames[0]["x"] == DISC[1]  # the annotator's own keyframe, as sent
    for keyframe, box in zip(disc_frames[1:], SCRIPT[0][1:], strict=True):
        assert keyframe == {
            "frame": keyframe["frame"],
            **pct(box),
            "rotation": 0,
            "enabled": True,
            "time": pytest.approx(keyframe["frame"] / CLIP_FPS),
        }
    square_frames = square["value"]["sequence"]
    # Nothing before its first keyframe; gone on frame 3: disabled there, at its last box.
    assert [(k["frame"], k["enabled"]) for k in square_frames] == [(2, True), (3, False)]
    assert square_frames[0]["x"] == SQUARE[1]
    assert square_frames[1] | {} == square_frames[1] | pct(SCRIPT[1][1])
    # No credential went to the file server.
    assert [path for path, _ in files.seen] == ["/clip.mp4"]
    assert "authorization" not in files.seen[0][1]


def test_frames_tracked_per_request_are_bounded(serve, video_model):
    base, files = serve()
    files.files["/clip.mp4"] = clip_bytes(3)
    tracker = ScriptedTracker(video_model, SCRIPT)
    allowed = (base.removeprefix("http://"),)
    with video_client(tracker, allow_fetch_hosts=allowed, video_max_frames=2) as client:
        response = client.post("/predict", json=two_objects(f"{base}/clip.mp4"))
    assert response.status_code == 200, response.text
    assert tracker.frames is not None and len(tracker.frames) == 2
    disc, square = response.json()["results"][0]["result"]
    assert [k["frame"] for k in disc["value"]["sequence"]] == [1, 2]
    assert [k["frame"] for k in square["value"]["sequence"]] == [2]


def test_a_video_project_without_keyframes_gets_empty_predictions(serve, video_model):
    base, files = serve()
    tracker = ScriptedTracker(video_model, SCRIPT)
    with video_client(tracker, allow_fetch_hosts=(base.removeprefix("http://"),)) as client:
        response = client.post("/predict", json=body(f"{base}/clip.mp4"))
    assert response.status_code == 200, response.text
    assert [p["result"] for p in response.json()["results"]] == [[]]
    assert files.seen == [] and tracker.frames is None


# ---------------------------------------------------------------- hostile requests


def test_loopback_is_not_fetched_without_the_operators_allowance(serve, video_model):
    base, files = serve()
    files.files["/clip.mp4"] = clip_bytes(3)
    tracker = ScriptedTracker(video_model, SCRIPT)
    with video_client(tracker) as client:
        response = client.post("/predict", json=two_objects(f"{base}/clip.mp4"))
    assert response.status_code == 422, response.text
    assert "is not fetched" in response.json()["error"]["message"]
    assert files.seen == [] and tracker.frames is None


def test_a_huge_declared_video_is_refused_before_reading(serve, video_model):
    base, files = serve()
    tracker = ScriptedTracker(video_model, SCRIPT)
    started = time.monotonic()
    with video_client(tracker, allow_fetch_hosts=(base.removeprefix("http://"),)) as client:
        response = client.post("/predict", json=two_objects(f"{base}/huge.mp4"))
        elapsed = time.monotonic() - started
    files.release.set()
    assert response.status_code == 413, response.text
    error = response.json()["error"]
    assert error["code"] == "upload_too_large"
    assert "video" in error["message"] and "max_video_upload_bytes" in error["message"]
    assert elapsed < 20  # not waiting for the stalled body
    assert tracker.frames is None


@pytest.mark.parametrize(
    ("settings", "options", "code"),
    [
        # frames past max_pixels: refused from the stream's header
        (SETTINGS.replace(max_pixels=H * W - 1), {}, "video_too_large"),
        # frames + tracking memory past the session limit: refused before decoding
        (SETTINGS.replace(max_video_session_bytes=1 * MiB), {}, "session_too_large"),
        # more objects than a session may track: refused before fetching
        (SETTINGS.replace(max_video_objects=1), {}, "too_many_objects"),
    ],
)
def test_limits_are_checked_before_the_work_they_bound(serve, video_model, settings, options, code):
    base, files = serve()
    files.files["/clip.mp4"] = clip_bytes(3)
    tracker = ScriptedTracker(video_model, SCRIPT)
    allowed = (base.removeprefix("http://"),)
    with video_client(tracker, settings, allow_fetch_hosts=allowed, **options) as client:
        response = client.post("/predict", json=two_objects(f"{base}/clip.mp4"))
    assert response.status_code == 413, response.text
    assert response.json()["error"]["code"] == code
    assert tracker.frames is None and tracker.prompts == []
    if code == "too_many_objects":
        assert files.seen == []


def test_a_keyframe_far_into_the_video_is_bounded(serve, video_model):
    base, files = serve()
    files.files["/clip.mp4"] = clip_bytes(5)
    tracker = ScriptedTracker(video_model, SCRIPT)
    allowed = (base.removeprefix("http://"),)
    settings = SETTINGS.replace(max_video_frames=2)
    with video_client(tracker, settings, allow_fetch_hosts=allowed) as client:
        late = video_region("late", [(5, 10, 10, 10, 10)])
        response = client.post("/predict", json=body(f"{base}/clip.mp4", late))
    assert response.status_code == 413, response.text
    assert "before the first keyframe" in response.json()["error"]["message"]
    assert tracker.frames is None


def test_without_the_video_model_the_answer_says_how_to_start_it(video_model):
    with video_client(None, SETTINGS.replace(video=False)) as client:
        response = client.post("/predict", json=two_objects("http://127.0.0.1:9/clip.mp4"))
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["code"] == "video_disabled" and "--video" in error["message"]


def test_a_data_uri_is_not_a_video(video_model):
    tracker = ScriptedTracker(video_model, SCRIPT)
    with video_client(tracker) as client:
        response = client.post("/predict", json=two_objects("data:video/mp4;base64,AAAA"))
    assert response.status_code == 422, response.text
    assert "not a video reference" in response.json()["error"]["message"]


def test_the_token_goes_to_label_studio_only(serve, video_model):
    label_studio, ls_files = serve()
    other, other_files = serve()
    ls_files.files["/data/upload/1/clip.mp4"] = clip_bytes(3)
    other_files.files["/clip.mp4"] = clip_bytes(3)
    tracker = ScriptedTracker(video_model, SCRIPT)
    options = {
        "url": label_studio,
        "api_key": "ls-secret-token",
        "allow_fetch_hosts": (other.removeprefix("http://"),),
    }
    with video_client(tracker, **options) as client:
        ours = client.post("/predict", json=two_objects("/data/upload/1/clip.mp4"))
        theirs = client.post("/predict", json=two_objects(f"{other}/clip.mp4"))
    assert ours.status_code == 200, ours.text
    assert theirs.status_code == 200, theirs.text
    assert ls_files.seen[0][1].get("authorization") == "Token ls-secret-token"
    assert "authorization" not in other_files.seen[0][1]


# ---------------------------------------------------------------- the tiny model


@pytest.fixture(scope="module")
def small_video_model() -> Any:
    """SAM 2.1 tiny's layers at a 256 x 256 input (a sixteenth of the tokens of the 1024
    one: the same tracking, seconds cheaper), every object present."""
    from small_tracker import small_tiny_tracker

    return small_tiny_tracker(seed=0)


class RecordingTracker(VideoPredictor):
    """The real video predictor, keeping every mask its propagation yields."""

    def __init__(self, model: Any) -> None:
        super().__init__(model)
        self.masks: dict[int, dict[int, np.ndarray]] = {}

    def propagate(self, state, *args, **kwargs):  # type: ignore[override]
        for frame in super().propagate(state, *args, **kwargs):
            for obj_id, mask in zip(frame.obj_ids, frame.masks, strict=True):
                self.masks.setdefault(obj_id, {})[frame.frame_idx] = mask.cpu().numpy()
            yield frame


def test_the_tiny_model_tracks_both_objects(serve, small_video_model):
    base, files = serve()
    files.files["/clip.mp4"] = clip_bytes(2)
    truth = clip_truth(2)
    disc = video_region("disc", [(1, *truth_box_percent(truth[1][0]))], labels=["Disc"])
    square = video_region("square", [(1, *truth_box_percent(truth[2][0]))], labels=["Square"])
    tracker = RecordingTracker(small_video_model)
    with video_client(tracker, allow_fetch_hosts=(base.removeprefix("http://"),)) as client:
        response = client.post("/predict", json=body(f"{base}/clip.mp4", disc, square))
    assert response.status_code == 200, response.text
    regions = response.json()["results"][0]["result"]
    assert [r["id"] for r in regions] == ["disc", "square"]
    for obj_id, region in enumerate(regions):
        [tracked] = [k for k in region["value"]["sequence"] if k["frame"] == 2]
        mask = tracker.masks[obj_id][1]
        if not mask.any():
            assert tracked["enabled"] is False
            continue
        rows, cols = np.nonzero(mask)
        box = (cols.min(), rows.min(), cols.max() + 1, rows.max() + 1)
        assert tracked == {
            "frame": 2,
            **pct(box),
            "rotation": 0,
            "enabled": True,
            "time": pytest.approx(2 / CLIP_FPS),
        }


def test_many_keyframes_prompt_only_the_tracked_frames(serve, video_model):
    base, files = serve()
    files.files["/clip.mp4"] = clip_bytes(3)
    tracker = ScriptedTracker(video_model, SCRIPT)
    keyframes = [(frame, 10.0, 10.0, 20.0, 20.0) for frame in range(1, 10_001)]
    started = time.monotonic()
    with video_client(tracker, allow_fetch_hosts=(base.removeprefix("http://"),)) as client:
        response = client.post(
            "/predict", json=body(f"{base}/clip.mp4", video_region("a", keyframes))
        )
    elapsed = time.monotonic() - started
    assert response.status_code == 200, response.text
    assert [(frame, obj) for frame, obj, _ in tracker.prompts] == [(0, 0), (1, 0), (2, 0)]
    [region] = response.json()["results"][0]["result"]
    assert len(region["value"]["sequence"]) == 10_000  # the annotator's own, all kept
    assert elapsed < 60
