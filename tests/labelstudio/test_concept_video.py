"""A phrase typed on a video task (``labelstudio --concepts --video``) answered by SAM 3's
own video predictor: every object it outputs becomes a VideoRectangle whose keyframes are
the predictor's boxes on the frames it outputs the object, ``enabled: false`` on the first
frame of each absence, labelled with the phrase's label (several phrases:
test_concept_video_phrases.py); every hostile request is a 4xx
naming what is wrong, before the video is fetched or the model runs.

The clip is served by a loopback HTTP server. Most tests script the predictor's outputs
(known objects per frame, so the answer is worked out here); one runs the session's tiny
random SAM 3 through the backend and compares the answer with what that predictor's
``run`` yielded on the frames it was given (second tier: with a separate run of the same
model on a longer clip)."""

from __future__ import annotations

import io
import logging
import threading
import time
import types
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch
from fastapi.testclient import TestClient
from support import data_uri, keypoint, picture, png, predict_body
from test_video_api import Files, serve  # noqa: F401 - the loopback file server fixture
from video_support import CLIP_FPS, CLIP_SIZE, VIDEO_CONFIG, clip_bytes, video_region

from sam2serve.checkpoint import load_video_model
from sam2serve.concepts.video_association import NEW_OBJECT_MARGIN
from sam2serve.concepts.video_load import load_tracker
from sam2serve.concepts.video_predictor import FrameResult, Sam3VideoPredictor, VideoState
from sam2serve.engine.video.predictor import VideoPredictor
from sam2serve.engine.video_io import decode_video
from sam2serve.labelstudio.app import create_labelstudio_app
from sam2serve.labelstudio.concept_video import (
    Seen,
    object_tracks,
    phrase_label,
    video_thresholds,
)
from sam2serve.labelstudio.options import LabelStudioOptions
from sam2serve.server.settings import MiB, ServerSettings

pytest.importorskip("av")

H, W = CLIP_SIZE
SETTINGS = ServerSettings.from_flat(
    warmup=False,
    video=True,
    concepts=True,
    max_wait_ms=0,
    max_upload_bytes=1 * MiB,
    max_video_upload_bytes=1 * MiB,
    request_timeout_s=600,
)
IMAGE_CONFIG_PART = (
    '<Image name="image" value="$image"/>'
    '<BrushLabels name="mask" toName="image"><Label value="Object"/></BrushLabels>'
    '<KeyPointLabels name="click" toName="image" smart="true"><Label value="Object"/>'
    "</KeyPointLabels>"
)
TEXT_CONFIG = VIDEO_CONFIG.replace(
    "</View>", '  <TextArea name="concept" toName="video" smart="true" editable="true"/>\n</View>'
)


def textarea(*texts: str, to_name: str | None = "video") -> dict[str, Any]:
    region: dict[str, Any] = {
        "type": "textarea",
        "from_name": "concept",
        "value": {"text": list(texts)},
    }
    if to_name is not None:
        region["to_name"] = to_name
    return region


def body(video: str, *regions: dict, config: str = TEXT_CONFIG, tasks: int = 1) -> dict:
    return {
        "tasks": [{"id": 7 + i, "data": {"video": video}} for i in range(tasks)],
        "project": "1.1700000000",
        "label_config": config,
        "params": {"login": None, "password": None, "context": {"result": list(regions)}},
    }


# ---------------------------------------------------------------- predictors


Box = tuple[float, float, float, float]
# frame index -> {object id: (xyxy box in pixel indices, score)}
Script = dict[int, dict[int, tuple[Box, float]]]


class ScriptedSam3(Sam3VideoPredictor):
    """SAM 3's video predictor with the model's work replaced by a script: it records the
    phrase, sizes and frames it is given and yields the script's objects per frame. No
    model is built: only the settings the backend reads (thresholds, the tracker's sizes)."""

    def __init__(self, script: Script, max_objects: int = 16) -> None:  # no super(): no model
        self.th = video_thresholds(0.0, max_objects)
        self.tracker = types.SimpleNamespace(grid=24, low_res_size=96, image_size=336)
        self.script = script
        self.started: tuple[int, int, int, str] | None = None
        self.frames: list[np.ndarray] | None = None
        self.during: Any = None  # called on each frame (a test's hook)

    def start(self, num_frames: int, height: int, width: int, phrase: str) -> VideoState:
        self.started = (num_frames, height, width, phrase)
        return VideoState(num_frames, height, width)

    def run(self, state: VideoState, frames: Any, start: int = 0) -> Iterator[FrameResult]:
        self.frames = []
        for index, frame in enumerate(frames):
            self.frames.append(frame)
            if self.during is not None:
                self.during(index)
            objects = self.script.get(index, {})
            ids = sorted(objects)
            masks = np.zeros((len(ids), state.height, state.width), bool)
            yield FrameResult(
                index, ids, [objects[i][1] for i in ids], masks, [objects[i][0] for i in ids]
            )


class RecordingSam3(Sam3VideoPredictor):
    """The real predictor, recording the frames ``run`` is given and what it yields."""

    def run(self, state: VideoState, frames: Any, start: int = 0) -> Iterator[FrameResult]:
        self.frames: list[np.ndarray] = []
        self.results: list[FrameResult] = []

        def fed() -> Iterator[np.ndarray]:
            for frame in frames:
                self.frames.append(frame)
                yield frame

        for result in super().run(state, fed(), start):
            self.results.append(result)
            yield result


@pytest.fixture(scope="module")
def sam2_video() -> VideoPredictor:
    return VideoPredictor(load_video_model("tiny", random_weights=True, seed=0))


@pytest.fixture
def make_client(ls_predictor, concepts_tiny, sam2_video) -> Iterator[Any]:
    clients: list[TestClient] = []

    def make(
        predictor: Sam3VideoPredictor | None,
        base: str,
        settings: ServerSettings = SETTINGS,
        concepts: bool = True,
        **options: Any,
    ) -> TestClient:
        options.setdefault("allow_fetch_hosts", (base.removeprefix("http://"),))
        app = create_labelstudio_app(
            settings.replace(concepts=concepts),
            LabelStudioOptions(concepts=concepts, concept_score_thresh=0.0, **options),
            ls_predictor,
            video_predictor=sam2_video if settings.video.enabled else None,
            concepts=concepts_tiny if concepts else None,
            concept_video=predictor,
        )
        client = TestClient(app, raise_server_exceptions=False)
        client.__enter__()
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.__exit__(None, None, None)


def decoded(num_frames: int) -> list[np.ndarray]:
    """The clip's frames as the engine's own decoder reads them."""
    return decode_video(io.BytesIO(clip_bytes(num_frames)), "clip").frames


def expected_keyframes(boxes: list[Box | None]) -> list[dict[str, Any]]:
    """Label Studio's keyframes of one object's boxes per frame (xyxy pixel indices, None:
    not output), worked out here: a keyframe where it is output (its box in percent, a
    column count of x1 - x0 + 1), a disabled one at its last box where it stops being."""
    keyframes: list[dict[str, Any]] = []
    last: dict[str, Any] | None = None
    for index, box in enumerate(boxes):
        frame = index + 1  # the clip's rate is the Video tag's
        if box is not None:
            x0, y0, x1, y1 = box
            last = {
                "x": pytest.approx(x0 / W * 100, abs=1e-3),
                "y": pytest.approx(y0 / H * 100, abs=1e-3),
                "width": pytest.approx((x1 - x0 + 1) / W * 100, abs=1e-3),
                "height": pytest.approx((y1 - y0 + 1) / H * 100, abs=1e-3),
            }
            enabled = True
        elif last is not None and keyframes[-1]["enabled"]:
            enabled = False
        else:
            continue
        keyframes.append(
            {
                "frame": frame,
                **last,
                "rotation": 0,
                "enabled": enabled,
                "time": pytest.approx(frame / CLIP_FPS),
            }
        )
    return keyframes


# ---------------------------------------------------------------- the answer

SCRIPT: Script = {
    0: {0: ((12, 16, 35, 47), 0.9)},
    1: {0: ((20, 16, 43, 47), 0.9), 3: ((48, 6, 77, 31), 0.75)},
    2: {3: ((50, 8, 79, 33), 0.75)},  # 0 not output: hidden or ended
    3: {0: ((30, 10, 59, 39), 0.9), 3: ((52, 8, 81, 33), 0.75)},  # 0 back
}


def test_each_object_of_the_phrase_is_a_video_rectangle(serve, make_client, caplog):  # noqa: F811
    base, files = serve()
    files.files["/clip.mp4"] = clip_bytes(4)
    predictor = ScriptedSam3(SCRIPT)
    client = make_client(predictor, base)
    with caplog.at_level(logging.INFO, logger="sam2serve.labelstudio"):
        response = client.post("/predict", json=body(f"{base}/clip.mp4", textarea("disc")))
    assert response.status_code == 200, response.text
    answer = response.json()
    [prediction] = answer["results"]
    assert answer["model_version"].endswith("+sam3-tiny-random-seed0")
    # The phrase, from the first frame, on the engine's own decoder's frames.
    assert predictor.started == (4, H, W, "disc")
    assert predictor.frames is not None and len(predictor.frames) == 4
    for got, expected in zip(predictor.frames, decoded(4), strict=True):
        np.testing.assert_array_equal(got, expected)
    first, second = prediction["result"]  # in object id order
    for region, obj_id, score in ((first, 0, 0.9), (second, 3, 0.75)):
        assert region["type"] == "videorectangle"
        assert (region["from_name"], region["to_name"]) == ("box", "video")
        assert region["value"]["labels"] == ["Disc"]  # the phrase's label, ignoring case
        assert region["meta"] == {"text": [f"disc (SAM 3 object {obj_id})"]}
        assert region["score"] == pytest.approx(score)
        boxes = [SCRIPT[i].get(obj_id, (None, 0))[0] for i in range(4)]
        assert region["value"]["sequence"] == expected_keyframes(boxes)
    assert [(k["frame"], k["enabled"]) for k in first["value"]["sequence"]] == [
        (1, True),
        (2, True),
        (3, False),
        (4, True),
    ]
    assert [k["frame"] for k in second["value"]["sequence"]] == [2, 3, 4]
    assert prediction["score"] == pytest.approx((0.9 + 0.75) / 2)
    assert first["id"] != second["id"]
    assert [path for path, _ in files.seen] == ["/clip.mp4"]
    lines = [r.getMessage() for r in caplog.records if "SAM 3 video" in r.getMessage()]
    assert lines[0].startswith("SAM 3 video: 'disc'") and "4 frames of 96x64" in lines[0]
    assert "2 objects answered" in lines[-1]


def test_the_frames_followed_are_bounded(serve, make_client):  # noqa: F811
    base, files = serve()
    files.files["/clip.mp4"] = clip_bytes(4)
    predictor = ScriptedSam3(SCRIPT)
    client = make_client(predictor, base, video_max_frames=2)
    response = client.post("/predict", json=body(f"{base}/clip.mp4", textarea("disc")))
    assert response.status_code == 200, response.text
    assert predictor.started == (2, H, W, "disc") and len(predictor.frames or []) == 2
    first, second = response.json()["results"][0]["result"]
    assert [k["frame"] for k in first["value"]["sequence"]] == [1, 2]
    assert [k["frame"] for k in second["value"]["sequence"]] == [2]


def test_labels_follow_the_config(serve, make_client):  # noqa: F811
    assert phrase_label("Square", ("Disc", "Square")) == "Square"
    assert phrase_label("square", ("Disc", "Square")) == "Square"
    assert phrase_label("red ball", ("Disc", "Square")) == "Disc"  # the tag's first
    assert phrase_label("disc", ()) is None
    base, files = serve()
    files.files["/clip.mp4"] = clip_bytes(4)
    # No Labels tag on the video (and the TextArea names no tag): no labels, the phrase
    # in the meta text.
    config = (
        '<View><Video name="video" value="$video" frameRate="10"/>'
        '<VideoRectangle name="box" toName="video"/><TextArea name="concept"/></View>'
    )
    client = make_client(ScriptedSam3(SCRIPT), base)
    request = body(f"{base}/clip.mp4", textarea("red ball", to_name=None), config=config)
    response = client.post("/predict", json=request)
    assert response.status_code == 200, response.text
    for region in response.json()["results"][0]["result"]:
        assert "labels" not in region["value"]
        assert region["meta"]["text"][0].startswith("red ball (SAM 3 object ")


def test_object_tracks_and_thresholds():
    frames = [{}, {5: Seen((0, 0, 9, 4), 0.5)}, {}, {5: Seen((1, 1, 1, 1), 0.4)}]
    [(obj_id, track)] = object_tracks(frames).items()
    assert obj_id == 5 and track.score == 0.5  # its score on its first frame
    assert track.boxes == [None, [0, 0, 10, 5], None, [1, 1, 1, 1]]
    th = video_thresholds(0.5, 3)
    assert (th.score, th.new_det, th.max_objects) == (0.5, 0.5 + NEW_OBJECT_MARGIN, 3)
    assert video_thresholds(0.9, 3).new_det == 1.0


def test_the_model_job_lets_clicks_run_between_its_operations(serve, make_client):  # noqa: F811
    """A click on an image of the same project is answered while the video job runs: the
    job's torch operations are checkpoints where waiting interactive jobs run."""
    base, files = serve()
    files.files["/clip.mp4"] = clip_bytes(2)
    predictor = ScriptedSam3(SCRIPT)
    clicked = threading.Event()
    waited: list[bool] = []

    def during(index: int) -> None:
        if index != 1:
            return
        deadline = time.monotonic() + 60
        while not clicked.is_set() and time.monotonic() < deadline:
            torch.ones(1).add_(1)  # a torch operation: a checkpoint
            time.sleep(0.01)
        waited.append(clicked.is_set())

    predictor.during = during
    client = make_client(predictor, base, concept_clicks="sam2")  # SAM 2.1's click: cheap
    answers: dict[str, Any] = {}
    request = body(f"{base}/clip.mp4", textarea("disc"))
    video = threading.Thread(
        target=lambda: answers.update(video=client.post("/predict", json=request))
    )
    video.start()
    while predictor.frames is None or len(predictor.frames) < 2:
        time.sleep(0.01)
    config = f"<View>{IMAGE_CONFIG_PART}</View>"
    image = data_uri(png(picture()))
    click = client.post("/predict", json=predict_body([image], [keypoint(50, 50)], config=config))
    clicked.set()
    video.join(60)
    assert click.status_code == 200, click.text
    assert waited == [True]  # the click was answered while the video job waited for it
    assert answers["video"].status_code == 200, answers["video"].text


# ---------------------------------------------------------------- hostile requests


@pytest.mark.parametrize(
    ("regions", "code", "message"),
    [
        ((textarea("disc", "disc"),), 200, None),  # one phrase typed twice: asked once
        ((textarea("x" * 1_000_000),), 422, "characters"),
        ((textarea("y" * 65),), 422, "at most 64"),
        ((textarea("disc\x00"),), 422, "context.result[0].value.text[0]"),
        ((textarea("disc"), keypoint(10, 10)), 422, "next to a text prompt on a video"),
        (
            (textarea("disc"), video_region("r", [(1, 10, 10, 20, 20)])),
            422,
            "'textarea' next to VideoRectangle regions",
        ),
        ((textarea("disc"), textarea("disc", to_name="other")), 422, "one prediction is on one"),
        ((textarea(""),), 200, None),  # no phrase: nothing to follow, nothing fetched
    ],
)
def test_bad_text_prompts_are_named_before_the_video_is_read(
    serve,  # noqa: F811
    make_client,
    regions,
    code,
    message,
):
    base, files = serve()
    files.files["/clip.mp4"] = clip_bytes(2)
    predictor = ScriptedSam3({})
    client = make_client(predictor, base)
    response = client.post("/predict", json=body(f"{base}/clip.mp4", *regions))
    assert response.status_code == code, response.text
    if message is None:
        assert response.json()["results"][0]["result"] == []
        return
    assert message in response.json()["error"]["message"]
    assert files.seen == [] and predictor.started is None


def test_requests_the_backend_cannot_answer_are_4xx(serve, make_client):  # noqa: F811
    base, files = serve()
    files.files["/clip.mp4"] = clip_bytes(2)
    files.files["/noise.mp4"] = bytes(range(256)) * 64
    url = f"{base}/clip.mp4"
    predictor = ScriptedSam3({})
    cases: list[tuple[TestClient, dict, int, str]] = [
        # without --concepts a text prompt on a video is refused, not ignored
        (make_client(None, base, concepts=False), body(url, textarea("disc")), 422, "--concepts"),
        # --concepts without --video
        (
            make_client(None, base, settings=SETTINGS.replace(video=False)),
            body(url, textarea("disc")),
            422,
            "--video",
        ),
        (make_client(predictor, base), body(url, textarea("disc"), tasks=2), 422, "2 tasks"),
        (
            make_client(predictor, base),
            body(url, textarea("disc")) | {"tasks": [{"id": 1, "data": {"image": url}}]},
            422,
            "no field 'video'",
        ),
        (
            make_client(predictor, base),
            body(f"{base}/noise.mp4", textarea("disc")),
            422,
            "a video FFmpeg can decode",
        ),
        # the loopback server is not fetched from without the operator's allowance
        (
            make_client(predictor, base, allow_fetch_hosts=()),
            body(url, textarea("disc")),
            422,
            "is not fetched",
        ),
    ]
    for client, request, code, message in cases:
        response = client.post("/predict", json=request)
        assert response.status_code == code, response.text
        assert message in response.json()["error"]["message"]
    assert predictor.started is None
    assert [path for path, _ in files.seen] == ["/noise.mp4"]


def test_sam3s_memory_is_bounded_before_the_frames_are_decoded(serve, make_client):  # noqa: F811
    base, files = serve()
    files.files["/clip.mp4"] = clip_bytes(2)
    predictor = ScriptedSam3({}, max_objects=16)
    small = SETTINGS.replace(max_video_session_bytes=1 * MiB)
    client = make_client(predictor, base, settings=small)
    response = client.post("/predict", json=body(f"{base}/clip.mp4", textarea("disc")))
    assert response.status_code == 413, response.text
    error = response.json()["error"]
    assert error["code"] == "session_too_large"
    assert "for SAM 3 to track up to 16 objects" in error["message"]
    assert "max_video_session_bytes" in error["message"]
    assert predictor.started is None


# ---------------------------------------------------------------- SAM 3 itself


def recording_predictor(concepts: Any, max_objects: int) -> RecordingSam3:
    neck, tracker = load_tracker(concepts)
    return RecordingSam3(
        concepts.model, concepts.tokenize, neck, tracker, video_thresholds(0.0, max_objects)
    )


def assert_answer_is(regions: list[dict], results: list[FrameResult], phrase: str) -> None:
    """The regions are the results' objects, one each in id order, with their keyframes."""
    ids = sorted({obj for result in results for obj in result.obj_ids})
    assert len(regions) == len(ids) > 0
    for region, obj_id in zip(regions, ids, strict=True):
        assert region["meta"] == {"text": [f"{phrase} (SAM 3 object {obj_id})"]}
        boxes: list[Box | None] = []
        score = None
        for result in results:
            if obj_id in result.obj_ids:
                row = result.obj_ids.index(obj_id)
                boxes.append(result.boxes[row])
                score = result.scores[row] if score is None else score
            else:
                boxes.append(None)
        assert region["value"]["sequence"] == expected_keyframes(boxes)
        assert region["score"] == pytest.approx(score)
        assert region["value"]["labels"] == ["Disc"]


def test_the_answer_is_sam3s_own_video_predictor(serve, make_client, concepts_tiny):  # noqa: F811
    """The tiny random SAM 3 through the backend: the answer is what the predictor's run
    yielded on the frames it was given, and those are the clip's decoded frames."""
    base, files = serve()
    files.files["/clip.mp4"] = clip_bytes(2)
    predictor = recording_predictor(concepts_tiny, max_objects=4)
    client = make_client(predictor, base)
    response = client.post("/predict", json=body(f"{base}/clip.mp4", textarea("disc")))
    assert response.status_code == 200, response.text
    for got, expected in zip(predictor.frames, decoded(2), strict=True):
        np.testing.assert_array_equal(got, expected)
    assert [result.frame for result in predictor.results] == [0, 1]
    assert_answer_is(response.json()["results"][0]["result"], predictor.results, "disc")


@pytest.mark.extended
def test_a_longer_clip_equals_a_separate_run_of_the_predictor(serve, make_client, concepts_tiny):  # noqa: F811
    """Four frames through the backend (up to 16 objects at once) equal the same predictor
    run here on the decoded frames: objects appear after the first frame and end before
    the last."""
    base, files = serve()
    files.files["/clip.mp4"] = clip_bytes(4)
    client = make_client(recording_predictor(concepts_tiny, max_objects=16), base)
    response = client.post("/predict", json=body(f"{base}/clip.mp4", textarea("disc")))
    assert response.status_code == 200, response.text
    oracle = recording_predictor(concepts_tiny, max_objects=16)
    frames = decoded(4)
    state = oracle.start(len(frames), H, W, "disc")
    results = list(oracle.run(state, iter(frames)))
    regions = response.json()["results"][0]["result"]
    assert_answer_is(regions, results, "disc")
    firsts = [region["value"]["sequence"][0]["frame"] for region in regions]
    assert max(firsts) > 1  # a new object picked up after the first frame
    assert any(not k["enabled"] for region in regions for k in region["value"]["sequence"])
