"""Against real Label Studio: a project with a BrushLabels + KeyPointLabels + RectangleLabels
config, the backend registered as its ML backend, an uploaded image, and predictions
obtained through Label Studio itself (interactive annotation and "retrieve predictions"),
decoded with Label Studio's own converter and compared with the engine's masks; and a video
project (Video + VideoRectangle + Labels) with an uploaded clip, whose keyframes of two
objects Label Studio sends to the backend (started with --video) and whose tracked boxes
are compared with the engine's tracking of the same clip.

Label Studio pins Django and many packages of its own, so it lives in a separate virtual
environment: $SAM2SERVE_LABELSTUDIO_VENV, default ~/.cache/sam2serve/labelstudio-venv,
created (python -m venv + pip install label-studio 1.23.x) when missing. Both servers run
on 127.0.0.1 with free ports; Label Studio with its SQLite default in a temporary data
folder. Marked ``labelstudio`` (not in the default run: ``pytest -m labelstudio``); the
round trip of many masks through Label Studio's decoder is here too, since it needs that
environment.
"""

from __future__ import annotations

import io
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
from support import CONFIG, engine_mask, picture, png
from video_support import (
    CLIP_FPS,
    VIDEO_CONFIG,
    clip_bytes,
    clip_truth,
    truth_box_percent,
    video_region,
)

from sam2serve.engine.video_io import decode_video
from sam2serve.labelstudio.brush import mask_to_brush_rle

pytestmark = [pytest.mark.labelstudio, pytest.mark.slow]

LABEL_STUDIO = "label-studio>=1.23,<1.24"
VENV = Path(
    os.environ.get(
        "SAM2SERVE_LABELSTUDIO_VENV", Path.home() / ".cache" / "sam2serve" / "labelstudio-venv"
    )
)
TOKEN = "sam2serve-test-token-0123456789"
START_TIMEOUT_S = 240.0
DECODE = """\
import json, sys
import numpy as np
from label_studio_sdk.converter.brush import decode_rle
for line in sys.stdin:
    item = json.loads(line)
    alpha = np.reshape(decode_rle(bytes(item["rle"])), [item["h"], item["w"], 4])[:, :, 3]
    print(json.dumps((alpha > 127).astype(int).ravel().tolist()))
"""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="module")
def venv_python() -> Path:
    python = VENV / "bin" / "python"
    if not (VENV / "bin" / "label-studio").exists():
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
        subprocess.run(
            [str(python), "-m", "pip", "install", "--quiet", LABEL_STUDIO], check=True, timeout=1500
        )
    return python


def ls_decode(venv_python: Path, rles: list[tuple[list[int], int, int]]) -> list[np.ndarray]:
    """Masks decoded by Label Studio's own converter (in its environment)."""
    lines = "".join(json.dumps({"rle": r, "h": h, "w": w}) + "\n" for r, h, w in rles)
    done = subprocess.run(
        [str(venv_python), "-c", DECODE], input=lines, capture_output=True, text=True, check=True
    )
    return [
        np.array(json.loads(line), dtype=bool).reshape(h, w)
        for line, (_, h, w) in zip(done.stdout.splitlines(), rles, strict=True)
    ]


def wait_for(url: str, process: subprocess.Popen, log: Path, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"{url}: the process exited:\n{log.read_text()[-3000:]}")
        try:
            if httpx.get(url, timeout=2).status_code < 500:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1)
    raise AssertionError(f"{url} did not answer within {timeout_s} s:\n{log.read_text()[-3000:]}")


def start(command: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    with open(log, "wb") as out:
        return subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT)


def stop(process: subprocess.Popen) -> None:
    process.terminate()
    try:
        process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


@pytest.fixture(scope="module")
def label_studio(venv_python, tmp_path_factory) -> Iterator[str]:
    data = tmp_path_factory.mktemp("label-studio")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {
        **os.environ,
        "LABEL_STUDIO_BASE_DATA_DIR": str(data),
        "ML_BLOCK_LOCAL_IP": "false",  # the backend is on loopback, like Label Studio
        "SSRF_PROTECTION_ENABLED": "false",
        "ML_TIMEOUT_PREDICT": "600",  # tracking a clip on a busy CPU takes its time
        "LABEL_STUDIO_DISABLE_SIGNUP_WITHOUT_LINK": "true",
    }
    command = [
        str(VENV / "bin" / "label-studio"),
        "start",
        "--no-browser",
        "--internal-host",
        "127.0.0.1",
        "--port",
        str(port),
        "--host",
        url,
        "--data-dir",
        str(data),
        "--username",
        "test@example.com",
        "--password",
        "sam2serve-pass",
        "--user-token",
        TOKEN,
        "--enable-legacy-api-token",
    ]
    log = data / "label-studio.log"
    process = start(command, env, log)
    try:
        wait_for(f"{url}/health", process, log, START_TIMEOUT_S)
        yield url
    finally:
        stop(process)


@pytest.fixture(scope="module")
def backend(label_studio, tmp_path_factory) -> Iterator[str]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {
        **os.environ,
        "LABEL_STUDIO_URL": label_studio,
        "LABEL_STUDIO_API_KEY": TOKEN,
    }
    command = [
        sys.executable,
        "-m",
        "sam2serve",
        "labelstudio",
        "--random-weights",
        "--seed",
        "0",
        "--port",
        str(port),
        "--no-warmup",
        "--video",  # video tasks: the video model tracks their keyframes
        "--request-timeout",
        "600",
    ]
    log = tmp_path_factory.mktemp("backend") / "backend.log"
    process = start(command, env, log)
    try:
        wait_for(f"{url}/health", process, log, START_TIMEOUT_S)
        yield url
    finally:
        stop(process)


@pytest.fixture(scope="module")
def api(label_studio) -> Iterator[httpx.Client]:
    headers = {"Authorization": f"Token {TOKEN}"}
    with httpx.Client(base_url=label_studio, headers=headers, timeout=300) as client:
        yield client


@pytest.fixture(scope="module")
def project(api, backend) -> dict:
    """A project with the image uploaded (a /data/upload/ path: read with the token) and the
    backend connected as an interactive ML backend."""
    created = api.post("/api/projects", json={"title": "sam2serve", "label_config": CONFIG})
    assert created.status_code == 201, created.text
    project_id = created.json()["id"]
    pixels = picture(160, 120, seed=5)
    image = png(pixels)
    imported = api.post(
        f"/api/projects/{project_id}/import", files={"file": ("photo.png", image, "image/png")}
    )
    assert imported.status_code == 201, imported.text
    tasks = api.get("/api/tasks", params={"project": project_id}).json()
    tasks = tasks["tasks"] if isinstance(tasks, dict) else tasks
    [task] = tasks
    assert task["data"]["image"].startswith("/data/upload/")
    ml = api.post("/api/ml", json={"url": backend, "project": project_id, "is_interactive": True})
    assert ml.status_code == 201, ml.text
    return {"id": project_id, "task": task["id"], "ml": ml.json()["id"], "pixels": pixels}


@pytest.fixture(scope="module")
def engine():
    from sam2serve.runtime.build import build_predictor
    from sam2serve.runtime.spec import RuntimeSpec, WeightsSource

    return build_predictor(RuntimeSpec("tiny", "fast"), WeightsSource(random_weights=True, seed=0))


def test_our_encoder_against_label_studios_decoder(venv_python):
    rng = np.random.default_rng(11)
    masks = [
        rng.random((37, 53)) > 0.5,
        np.pad(np.ones((90, 200), bool), ((5, 300), (0, 0))),  # runs past 65536 values
        np.zeros((7, 3), bool),
        np.ones((1, 1), bool),
    ]
    rles = [(mask_to_brush_rle(m), *m.shape) for m in masks]
    for decoded, mask in zip(ls_decode(venv_python, rles), masks, strict=True):
        np.testing.assert_array_equal(decoded, mask)


def test_interactive_click_through_label_studio(api, project, engine, venv_python):
    context = {
        "result": [
            {
                "type": "keypointlabels",
                "from_name": "click",
                "to_name": "image",
                "original_width": 160,
                "original_height": 120,
                "image_rotation": 0,
                "is_positive": True,
                "value": {"x": 30.0, "y": 50.0, "width": 0.6, "keypointlabels": ["Cat"]},
            }
        ]
    }
    response = api.post(
        f"/api/ml/{project['ml']}/interactive-annotating",
        json={"task": project["task"], "context": context},
    )
    assert response.status_code == 200, response.text
    answer = response.json()
    assert "errors" not in answer, answer
    [region] = answer["data"]["result"]
    assert region["type"] == "brushlabels" and region["value"]["brushlabels"] == ["Cat"]
    assert answer["data"]["model_version"].startswith("sam2serve-tiny-fast")
    [mask] = ls_decode(venv_python, [(region["value"]["rle"], 120, 160)])
    expected, score = engine_mask(engine, project["pixels"], [[48.0, 60.0]], [1], multimask=True)
    assert (mask != expected).mean() <= 1e-3
    assert region["score"] == pytest.approx(score, abs=1e-3)


def test_retrieve_predictions_through_label_studio(api, project, engine, venv_python):
    action = api.post(
        "/api/dm/actions",
        params={"id": "retrieve_tasks_predictions", "project": project["id"]},
        json={"selectedItems": {"all": True, "excluded": []}},
    )
    assert action.status_code == 200, action.text
    predictions = api.get("/api/predictions", params={"task": project["task"]}).json()
    ours = [p for p in predictions if str(p.get("model_version", "")).startswith("sam2serve-")]
    assert ours, predictions
    [region] = ours[-1]["result"]
    [mask] = ls_decode(venv_python, [(region["value"]["rle"], 120, 160)])
    expected, _ = engine_mask(engine, project["pixels"], [[80.0, 60.0]], [1], multimask=True)
    assert (mask != expected).mean() <= 1e-3


# ---------------------------------------------------------------- video tasks


@pytest.fixture(scope="module")
def video_project(api, backend) -> dict:
    """A video project (Video + VideoRectangle + Labels) with the test clip uploaded (a
    /data/upload/ path) and the backend connected as an interactive ML backend."""
    created = api.post(
        "/api/projects", json={"title": "sam2serve video", "label_config": VIDEO_CONFIG}
    )
    assert created.status_code == 201, created.text
    project_id = created.json()["id"]
    imported = api.post(
        f"/api/projects/{project_id}/import",
        files={"file": ("clip.mp4", clip_bytes(2), "video/mp4")},
    )
    assert imported.status_code == 201, imported.text
    tasks = api.get("/api/tasks", params={"project": project_id}).json()
    tasks = tasks["tasks"] if isinstance(tasks, dict) else tasks
    [task] = tasks
    assert task["data"]["video"].startswith("/data/upload/")
    ml = api.post("/api/ml", json={"url": backend, "project": project_id, "is_interactive": True})
    assert ml.status_code == 201, ml.text
    return {"id": project_id, "task": task["id"], "ml": ml.json()["id"]}


def engine_track_boxes(boxes: list[list[float]], num_frames: int) -> list[list[list[float]]]:
    """Each object's bounding box [x, y, w, h] (pixels; None: empty) on each frame of the
    test clip, tracked by the engine as the backend builds it, from ``boxes`` (pixels,
    x0 y0 x1 y1) on frame 0."""
    from sam2serve.engine.prompts import Prompt
    from sam2serve.engine.video.outputs import object_masks
    from sam2serve.runtime.build import build_predictor
    from sam2serve.server.app import load_video_predictor
    from sam2serve.server.settings import ServerSettings

    settings = ServerSettings.from_flat(random_weights=True, seed=0, video=True, warmup=False)
    image = build_predictor(settings.runtime.spec(), settings.runtime.weights_source())
    tracker = load_video_predictor(settings.runtime, image)
    frames = decode_video(io.BytesIO(clip_bytes(num_frames)), "clip").frames
    state = tracker.init_state(frames)
    for obj_id, box in enumerate(boxes):
        tracker.add_prompt(state, 0, obj_id, Prompt((), (), box))
    out: list[list[list[float]]] = [[] for _ in boxes]
    for frame in tracker.propagate(state, start_frame_idx=0):
        for record in object_masks(frame):
            out[record.obj_id].append(list(record.bbox) if record.area else None)
    return out


def test_video_keyframes_tracked_through_label_studio(api, video_project):
    truth = clip_truth(2)
    height, width = truth[1][0].shape
    percents = [truth_box_percent(truth[1][0]), truth_box_percent(truth[2][0])]
    context = {
        "result": [
            video_region("disc", [(1, *percents[0])], labels=["Disc"]),
            video_region("square", [(1, *percents[1])], labels=["Square"]),
        ]
    }
    response = api.post(
        f"/api/ml/{video_project['ml']}/interactive-annotating",
        json={"task": video_project["task"], "context": context},
    )
    assert response.status_code == 200, response.text
    answer = response.json()
    assert "errors" not in answer, answer
    regions = answer["data"]["result"]
    assert [r["id"] for r in regions] == ["disc", "square"]
    pixels = [
        [x / 100 * width, y / 100 * height, (x + w) / 100 * width, (y + h) / 100 * height]
        for x, y, w, h in percents
    ]
    expected = engine_track_boxes(pixels, 2)
    for region, label, own, boxes in zip(
        regions, ["Disc", "Square"], percents, expected, strict=True
    ):
        assert region["type"] == "videorectangle" and region["value"]["labels"] == [label]
        sequence = region["value"]["sequence"]
        assert [k["frame"] for k in sequence] == [1, 2]
        assert sequence[0]["x"] == pytest.approx(own[0])  # the annotator's keyframe
        tracked = sequence[1]
        if boxes[1] is None:
            assert tracked["enabled"] is False
            continue
        x, y, w, h = boxes[1]
        assert tracked["enabled"] is True
        assert tracked["time"] == pytest.approx(2 / CLIP_FPS)
        # The same model and frames: only float reassociation may move an edge a pixel.
        for key, value, size in (("x", x, width), ("y", y, height), ("width", w, width)):
            assert tracked[key] == pytest.approx(value / size * 100, abs=100 / size + 1e-6)
        assert tracked["height"] == pytest.approx(h / height * 100, abs=100 / height + 1e-6)
