"""The one rule for names and the one for dataset file names through a real server (a
subprocess, loopback only): every hostile name of tests/user_text_cases.py as a video
object's name (prompt and rename) and as an export's category, every hostile file name as
/v1/coco's ``file_name`` and as /v1/video-export's video and frame names - each a 422
naming the field and the code point or the problem, before any work - and the legitimate
ones taken as they are; the server's log stays free of tracebacks.

(Concept phrases take the same rule: tests/server/test_concepts.py and
test_video_concepts.py, in process with the tiny SAM 3, and the command line's
tests/commands/test_run_concepts.py.)"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import PurePosixPath
from typing import Any

import numpy as np
import pytest
from hostile import SpawnedServer, spawn_server
from pycocotools import mask as mask_utils
from server_logs import assert_no_traceback, log_mark
from server_support import png_bytes
from user_text_cases import (
    ACCEPTED_FILE_NAMES,
    ACCEPTED_NAMES,
    REFUSED_FILE_NAMES,
    REFUSED_NAMES,
)

from sam2serve.samples import sample_clip

HEIGHT, WIDTH = 32, 48
FRAMES, _ = sample_clip(2, (HEIGHT, WIDTH))
MASK = np.zeros((HEIGHT, WIDTH), np.uint8)
MASK[4:12, 6:20] = 1
RLE = mask_utils.encode(np.asfortranarray(MASK))
SEGMENTATION = {"size": [HEIGHT, WIDTH], "counts": RLE["counts"].decode()}


@pytest.fixture(scope="module")
def server() -> Iterator[SpawnedServer]:
    live = spawn_server({"video": True, "max_video_sessions_per_client": 4})
    mark = log_mark(live)
    yield live
    assert_no_traceback(live, mark)
    live.stop()


@pytest.fixture(scope="module")
def session(server) -> str:
    files = [("frame", (f"{i}.png", png_bytes(f), "image/png")) for i, f in enumerate(FRAMES)]
    with server.client() as client:
        answer = client.post("/v1/videos", files=files)
    assert answer.status_code == 201, answer.text
    return answer.json()["session_id"]


def post(live: SpawnedServer, path: str, body: Any, method: str = "POST"):
    """``body`` as JSON text with every non-ASCII character escaped (a lone surrogate too)."""
    with live.client() as client:
        return client.request(
            method, path, content=json.dumps(body), headers={"content-type": "application/json"}
        )


def refused(answer, field: str, named: str) -> str:
    assert answer.status_code == 422, answer.text
    error = answer.json()["error"]
    assert error["code"] == "invalid_request", error
    message = error["message"]
    assert field in message and named in message, message
    assert message.isprintable(), message  # the refusal itself forges nothing
    return message


def coco_body(file_name: str = "photo.png", name: str = "cat") -> dict:
    objects = [{"name": name, "segmentation": SEGMENTATION}]
    return {
        "images": [{"file_name": file_name, "width": WIDTH, "height": HEIGHT, "objects": objects}]
    }


def export_body(fmt: str = "coco", object_name: str = "dog", **video: Any) -> dict:
    return {
        "format": fmt,
        "video": {"name": "clip.mp4", "width": WIDTH, "height": HEIGHT, "num_frames": 2, **video},
        "objects": [{"obj_id": 1, "name": object_name}],
        "frames": [{"frame_idx": 0, "objects": [{"obj_id": 1, "segmentation": SEGMENTATION}]}],
    }


# --------------------------------------------------------------------------- names


def test_hostile_object_names_are_refused_by_every_name_field(server, session):
    click = {"frame_idx": 0, "obj_id": 7, "points": [{"x": 10, "y": 8}]}
    for text, named in REFUSED_NAMES:
        if named == "U+D800":  # JSON's parser refuses a lone surrogate first, its own way
            named = "valid string"
        prompted = post(server, f"/v1/videos/{session}/prompts", {**click, "name": text})
        refused(prompted, "name", named)
        refused(post(server, "/v1/coco", coco_body(name=text)), "objects[0].name", named)
        exported = post(server, "/v1/video-export", export_body(object_name=text))
        refused(exported, "objects[0].name", named)
    with server.client() as client:
        described = client.get(f"/v1/videos/{session}").json()
    assert described["objects"] == []  # no refused prompt made an object


def test_readable_names_are_exported_as_they_are(server):
    """(Renames with them: tests/server/test_video_object_names.py, in process.)"""
    body = coco_body()
    body["images"][0]["objects"] = [
        {"name": text, "segmentation": SEGMENTATION} for text in ACCEPTED_NAMES
    ]
    answer = post(server, "/v1/coco", body)
    assert answer.status_code == 200, answer.text
    assert [c["name"] for c in answer.json()["categories"]] == ACCEPTED_NAMES
    body = export_body()
    body["objects"] = [{"obj_id": i, "name": text} for i, text in enumerate(ACCEPTED_NAMES)]
    exported = post(server, "/v1/video-export", body)
    assert exported.status_code == 200, exported.text
    assert [c["name"] for c in exported.json()["categories"]] == ACCEPTED_NAMES


# --------------------------------------------------------------------------- file names

# What the schema (and the OpenAPI document) bounds before the rule reads the name.
SCHEMA_BOUNDS = {"": "at least 1 character", "x" * 300: "at most 255 characters"}


@pytest.mark.parametrize(("text", "problem"), REFUSED_FILE_NAMES)
def test_a_file_name_that_could_leave_the_dataset_is_refused(server, text, problem):
    problem = SCHEMA_BOUNDS.get(text, problem)
    refused(post(server, "/v1/coco", coco_body(file_name=text)), "images[0].file_name", problem)
    for fmt in ("coco", "youtube_vis"):
        named = post(server, "/v1/video-export", export_body(fmt, name=text))
        refused(named, "video.name", problem)
        frames = post(server, "/v1/video-export", export_body(fmt, frame_names=["0.png", text]))
        refused(frames, "video.frame_names[1]", problem)


def test_safe_file_names_are_written_as_given(server):
    for text in ACCEPTED_FILE_NAMES:
        answer = post(server, "/v1/coco", coco_body(file_name=text))
        assert answer.status_code == 200, (text, answer.text)
        assert answer.json()["images"][0]["file_name"] == text
        body = export_body("youtube_vis", name=text, frame_names=[text, "1.png"])
        exported = post(server, "/v1/video-export", body)
        assert exported.status_code == 200, (text, exported.text)
        stem = PurePosixPath(text).stem
        assert exported.json()["videos"][0]["file_names"] == [f"{stem}/{text}", f"{stem}/1.png"]
