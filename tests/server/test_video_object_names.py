"""Names of a video session's objects (their class or label): a prompt's ``name``, PATCH
/v1/videos/{session_id}/objects/{obj_id}, concept seeding's phrases; the session keeps
them, GET lists them, every frame answer (prompts, the propagation's stream, live frames)
carries them, and POST /v1/video-export with the session's id takes them as categories.

In process (TestClient) on two small frames, with the tiny random SAM 2.1 image model and
SAM 3 (``concepts_tiny``); the tracker's network is stubbed (a frame's logits come from its
pixels, as in test_video_live.py): names do not depend on what the masks are, and every
step of the predictor's bookkeeping, the routes, the worker and the protocols stay real
while a frame costs microseconds (tests/video/ check the network). The hostile half: overlong names,
control characters, bidirectional overrides, empty names, wrong types, unknown objects and
sessions, another session's object, a closed session, no API key, and a cross-origin
PATCH - each a 4xx naming the field or the id, before any change; the object a refused
prompt names is never created."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch
from fastapi.testclient import TestClient
from pycocotools import mask as mask_utils
from server_support import png_bytes
from user_text_cases import ACCEPTED_NAMES, REFUSED_NAMES

from sam2serve.checkpoint import load_video_model
from sam2serve.concepts.phrases import MAX_PHRASE_CHARS
from sam2serve.engine.video.predictor import VideoPredictor
from sam2serve.engine.video.state import FrameOutput
from sam2serve.samples import sample_clip
from sam2serve.server.app import create_app
from sam2serve.server.object_names import MAX_OBJECT_NAME_CHARS, check_object_name
from sam2serve.server.settings import ServerSettings

SIZE = (64, 96)  # height, width
FRAMES, _ = sample_clip(2, SIZE)
MAX_OBJECTS = 3
API_KEY = "names-key"
ORIGIN = "http://annotator.test"
CLICK = {"frame_idx": 0, "points": [{"x": 30, "y": 28}]}


class PixelTracker(VideoPredictor):
    """The real predictor with the network replaced: an object's low-resolution logits on
    a frame are the frame's red channel pooled to 8x8 minus 128 (plus the object's index),
    its memory a placeholder, so each frame's masks are its own."""

    def frame_features(self, state, frame_idx):
        return state.source.frame(frame_idx)

    def _track_frame(self, state, tracks, frame_idx, **kwargs):
        red = torch.from_numpy(self.frame_features(state, frame_idx)[..., 0].astype(np.float32))
        pooled = torch.nn.functional.adaptive_avg_pool2d(red[None, None], 8) - 128.0
        low_res = pooled + torch.arange(len(tracks), dtype=torch.float32)[:, None, None, None]
        outputs = [
            FrameOutput(low_res[i : i + 1], torch.zeros(1, 8), torch.ones(1, 1), torch.zeros(1))
            for i in range(len(tracks))
        ]
        return outputs, low_res


@pytest.fixture(scope="module")
def video_predictor() -> VideoPredictor:
    return PixelTracker(load_video_model("tiny", random_weights=True, seed=0))


@pytest.fixture(scope="module")
def client(predictor, video_predictor, concepts_tiny) -> Iterator[TestClient]:
    settings = ServerSettings.from_flat(
        warmup=False,
        video=True,
        concepts=True,
        max_video_objects=MAX_OBJECTS,
        max_video_sessions_per_client=8,  # the module's sessions are one client's
    )
    app = create_app(settings, predictor, video_predictor, concepts=concepts_tiny)
    with TestClient(app) as client:
        yield client


def new_session(client: TestClient) -> str:
    files = [("frame", (f"{i}.png", png_bytes(f), "image/png")) for i, f in enumerate(FRAMES)]
    answer = client.post("/v1/videos", files=files)
    assert answer.status_code == 201, answer.text
    return answer.json()["session_id"]


def prompt(client: TestClient, sid: str, obj_id: int, **fields: Any):
    return client.post(f"/v1/videos/{sid}/prompts", json={**CLICK, "obj_id": obj_id, **fields})


def rename(client: TestClient, sid: str, obj_id: int, body: Any, **kwargs: Any):
    return client.patch(f"/v1/videos/{sid}/objects/{obj_id}", json=body, **kwargs)


def names_in(objects: list[dict]) -> dict[int, str | None]:
    return {o["obj_id"]: o["name"] for o in objects}


def session_names(client: TestClient, sid: str) -> dict[int, str | None]:
    described = client.get(f"/v1/videos/{sid}").json()
    assert described["obj_ids"] == [o["obj_id"] for o in described["objects"]]
    return names_in(described["objects"])


def error_of(answer) -> dict[str, Any]:
    return answer.json()["error"]


def propagated_frames(client: TestClient, sid: str) -> dict[int, list[dict]]:
    with client.stream("POST", f"/v1/videos/{sid}/propagate", json={}) as stream:
        lines = [line for line in stream.iter_lines() if line.startswith("data: ")]
    events = [json.loads(line[len("data: ") :]) for line in lines]
    assert "frames" in events[-1], events[-1]  # the stream ended with done
    return {e["frame_idx"]: e["objects"] for e in events if "frame_idx" in e}


@pytest.fixture(scope="module")
def named(client) -> dict[str, Any]:
    """A session through the flow: object 1 named by its prompt, object 2 unnamed, then
    object 2 named and object 1 renamed with PATCH, then a propagation."""
    sid = new_session(client)
    out: dict[str, Any] = {"sid": sid}
    out["first"] = prompt(client, sid, 1, name="  cat  ")
    out["second"] = prompt(client, sid, 2, points=[{"x": 70, "y": 20}])
    out["again"] = prompt(client, sid, 1, points=[{"x": 31, "y": 29}])  # no name: kept
    out["before_patch"] = session_names(client, sid)
    out["patch_2"] = rename(client, sid, 2, {"name": "chat noir 🐈"})
    out["patch_1"] = rename(client, sid, 1, {"name": "tabby"})
    out["frames"] = propagated_frames(client, sid)
    return out


# --------------------------------------------------------------------------- the flow


def test_a_prompt_names_its_object_and_the_session_keeps_the_name(named):
    for key in ("first", "second", "again"):
        assert named[key].status_code == 200, named[key].text
    assert names_in(named["first"].json()["objects"]) == {1: "cat"}  # stripped
    assert names_in(named["second"].json()["objects"]) == {1: "cat", 2: None}
    assert names_in(named["again"].json()["objects"]) == {1: "cat", 2: None}
    assert named["before_patch"] == {1: "cat", 2: None}


def test_patch_renames_and_answers_the_session(client, named):
    for key in ("patch_1", "patch_2"):
        assert named[key].status_code == 200, named[key].text
    described = named["patch_1"].json()
    assert described["session_id"] == named["sid"]
    assert names_in(described["objects"]) == {1: "tabby", 2: "chat noir 🐈"}
    assert session_names(client, named["sid"]) == {1: "tabby", 2: "chat noir 🐈"}


def test_every_propagated_frame_carries_the_names(named):
    frames = named["frames"]
    assert sorted(frames) == [0, 1]
    for objects in frames.values():
        assert names_in(objects) == {1: "tabby", 2: "chat noir 🐈"}


def test_null_unnames_and_a_removed_object_takes_its_name_with_it(client):
    sid = new_session(client)
    assert prompt(client, sid, 5, name="dog").status_code == 200
    assert names_in(rename(client, sid, 5, {"name": None}).json()["objects"]) == {5: None}
    assert rename(client, sid, 5, {"name": "dog"}).status_code == 200
    removed = client.delete(f"/v1/videos/{sid}/objects/5")
    assert removed.status_code == 200 and removed.json()["objects"] == []
    # The same id again is a new object: the old name does not come back.
    assert names_in(prompt(client, sid, 5).json()["objects"]) == {5: None}
    assert rename(client, sid, 5, {"name": "dog"}).status_code == 200
    reset = client.post(f"/v1/videos/{sid}/reset")
    assert reset.status_code == 200 and reset.json()["objects"] == []
    assert names_in(prompt(client, sid, 5).json()["objects"]) == {5: None}
    client.delete(f"/v1/videos/{sid}")


def test_names_at_the_limit_are_taken_and_the_session_bounds_their_bytes(client):
    """64 characters (4 bytes each at most) per object, max_video_objects objects: one more
    object is refused whatever its name, so a session's names are bounded."""
    sid = new_session(client)
    longest = "ü" * MAX_OBJECT_NAME_CHARS
    for obj_id in range(MAX_OBJECTS):
        answer = prompt(client, sid, obj_id, name=longest)
        assert answer.status_code == 200, answer.text
    assert set(session_names(client, sid).values()) == {longest}
    one_more = prompt(client, sid, MAX_OBJECTS, name="x")
    assert one_more.status_code == 413 and error_of(one_more)["code"] == "too_many_objects"
    assert MAX_OBJECTS not in session_names(client, sid)
    client.delete(f"/v1/videos/{sid}")


def export_frames(named: dict[str, Any], obj_ids: set[int] = frozenset({1, 2})) -> list[dict]:
    """POST /v1/video-export's frames: the propagation's masks of ``obj_ids``."""
    return [
        {
            "frame_idx": frame_idx,
            "objects": [
                {"obj_id": o["obj_id"], "segmentation": o["segmentation"]}
                for o in objects
                if o["obj_id"] in obj_ids
            ],
        }
        for frame_idx, objects in sorted(named["frames"].items())
    ]


def test_the_export_takes_the_sessions_names_as_categories(client, named):
    """Objects sent without a name take the session's; a name sent wins."""
    sid = named["sid"]
    video = {"name": "clip", "width": SIZE[1], "height": SIZE[0], "num_frames": len(FRAMES)}
    body = {"format": "coco", "video": video, "frames": export_frames(named), "session_id": sid}
    from_session = client.post(
        "/v1/video-export", json={**body, "objects": [{"obj_id": 1}, {"obj_id": 2}]}
    )
    assert from_session.status_code == 200, from_session.text
    dataset = from_session.json()
    categories = {c["id"]: c["name"] for c in dataset["categories"]}
    assert sorted(categories.values()) == ["chat noir 🐈", "tabby"]
    for annotation in dataset["annotations"]:
        name = categories[annotation["category_id"]]
        assert name == {1: "tabby", 2: "chat noir 🐈"}[annotation["track_id"]]
        rle = {"size": annotation["segmentation"]["size"]}
        rle["counts"] = annotation["segmentation"]["counts"].encode()
        assert int(mask_utils.area(rle)) == annotation["area"]
    overridden = client.post(
        "/v1/video-export",
        json={**body, "objects": [{"obj_id": 1, "name": "lion"}, {"obj_id": 2}]},
    )
    assert overridden.status_code == 200, overridden.text
    assert sorted(c["name"] for c in overridden.json()["categories"]) == ["chat noir 🐈", "lion"]
    # Without a session id the request's names (or the default) are the categories.
    stateless = {k: v for k, v in body.items() if k != "session_id"}
    stateless["frames"] = export_frames(named, {1})
    plain = client.post("/v1/video-export", json={**stateless, "objects": [{"obj_id": 1}]})
    assert plain.status_code == 200, plain.text
    assert [c["name"] for c in plain.json()["categories"]] == ["object"]


def test_the_youtube_vis_export_takes_them_too(client, named):
    video = {"name": "clip", "width": SIZE[1], "height": SIZE[0], "num_frames": len(FRAMES)}
    body = {
        "format": "youtube_vis",
        "video": video,
        "objects": [{"obj_id": 2}],
        "session_id": named["sid"],
    }
    answer = client.post("/v1/video-export", json=body)
    assert answer.status_code == 200, answer.text
    assert [c["name"] for c in answer.json()["categories"]] == ["chat noir 🐈"]


# --------------------------------------------------------------------------- concepts


def test_concept_seeding_names_the_objects_by_their_phrases(client):
    """(test_video_concepts.py checks the answer's names are the engine's seeds' phrases.)"""
    sid = new_session(client)
    phrases = ["disc", "square"]
    body = {"frame_idx": 1, "phrases": phrases, "score_thresh": 0, "max_instances": 2}
    answer = client.post(f"/v1/videos/{sid}/concepts", json=body)
    assert answer.status_code == 200, answer.text
    seeded = names_in(answer.json()["objects"])
    assert sorted(seeded) == [1, 2] and set(seeded.values()) <= set(phrases)
    assert session_names(client, sid) == seeded
    for objects in propagated_frames(client, sid).values():
        assert names_in(objects) == seeded
    assert rename(client, sid, 2, {"name": "wheel"}).status_code == 200
    assert session_names(client, sid) == {1: seeded[1], 2: "wheel"}
    client.delete(f"/v1/videos/{sid}")


def test_readable_names_of_any_script_and_emoji_are_kept_as_they_are(client):
    sid = new_session(client)
    assert prompt(client, sid, 1, name=ACCEPTED_NAMES[0]).status_code == 200
    for text in ACCEPTED_NAMES:
        renamed = rename(client, sid, 1, {"name": text})
        assert renamed.status_code == 200, (text, renamed.text)
        assert session_names(client, sid) == {1: text}
    client.delete(f"/v1/videos/{sid}")


@pytest.mark.parametrize("phrase", ["ca\x07t", "bus\u202e", "a\u2028b", "c\u200bat", "a\ufeff"])
def test_a_phrase_that_cannot_be_a_name_seeds_nothing(client, phrase):
    sid = new_session(client)
    body = {"frame_idx": 0, "phrases": [phrase], "score_thresh": 0}
    answer = client.post(f"/v1/videos/{sid}/concepts", json=body)
    assert answer.status_code == 422, answer.text
    assert "phrases[0]" in error_of(answer)["message"]
    assert session_names(client, sid) == {}
    client.delete(f"/v1/videos/{sid}")


def test_the_name_limit_is_the_phrase_limit():
    """Every phrase that may seed an object is a name it may keep."""
    assert MAX_OBJECT_NAME_CHARS == MAX_PHRASE_CHARS
    assert check_object_name("x" * MAX_PHRASE_CHARS) == "x" * MAX_PHRASE_CHARS


# --------------------------------------------------------------------------- hostile

BAD_NAMES = [
    # A third of tests/user_text_cases.py's (a real server: all of them), as JSON takes them.
    *(case for case in REFUSED_NAMES[::3] if case[1] != "U+D800"),
    ("x" * (MAX_OBJECT_NAME_CHARS + 1), "64"),
    (" " + "x" * MAX_OBJECT_NAME_CHARS, "64"),  # the raw string's bound
    ("", "name"),
    ("   ", "empty"),
    ("a\x00b", "U+0000"),
    ("line\nbreak", "U+000A"),
    ("tab\tbed", "U+0009"),
    ("\x1b[31mred", "U+001B"),
    ("del\x7f", "U+007F"),
    ("evil\u202egnp.exe", "U+202E"),
    ("iso\u2066late", "U+2066"),
    ("sep\u2028arator", "U+2028"),
    ("private\ue000", "U+E000"),
    ("unassigned\U000e0fff", "U+E0FFF"),
    (123, "name"),
    (["cat"], "name"),
    ({"name": "cat"}, "name"),
]


@pytest.fixture(scope="module")
def prompted(client) -> str:
    """A session whose object 1 is named "cat" (its frame encoded once)."""
    sid = new_session(client)
    assert prompt(client, sid, 1, name="cat").status_code == 200
    return sid


@pytest.mark.parametrize("name, words", BAD_NAMES)
def test_a_bad_name_is_refused_and_changes_nothing(client, prompted, name, words):
    renamed = rename(client, prompted, 1, {"name": name})
    assert renamed.status_code == 422, renamed.text
    error = error_of(renamed)
    assert error["code"] == "invalid_request" and "name" in error["message"], error
    assert words in error["message"], error
    # A prompt with it is refused before any work: its object is not created.
    prompted_new = prompt(client, prompted, 9, name=name)
    assert prompted_new.status_code == 422, prompted_new.text
    assert words in error_of(prompted_new)["message"]
    assert session_names(client, prompted) == {1: "cat"}


@pytest.mark.parametrize(
    "content, media",
    [
        ("{}", "application/json"),  # no name: field required
        ('{"name": "cat", "colour": "red"}', "application/json"),
        ('{"label": "cat"}', "application/json"),
        ("null", "application/json"),
        ('["cat"]', "application/json"),
        ('{"name": "ca', "application/json"),
        ("", "application/json"),
        ("name=cat", "application/x-www-form-urlencoded"),
    ],
)
def test_a_malformed_rename_body_is_refused(client, prompted, content, media):
    answer = client.patch(
        f"/v1/videos/{prompted}/objects/1",
        content=content.encode(),
        headers={"content-type": media},
    )
    assert answer.status_code in (400, 415, 422), answer.text
    assert "error" in answer.json()
    assert session_names(client, prompted) == {1: "cat"}


def test_unknown_objects_and_sessions_are_404(client, prompted):
    unknown = rename(client, prompted, 2, {"name": "dog"})
    assert unknown.status_code == 404 and error_of(unknown)["code"] == "object_not_found"
    assert "obj_id 2" in error_of(unknown)["message"]
    for sid in ("vs-" + "0" * 32, "nope", "x" * 300):
        answer = rename(client, sid, 1, {"name": "dog"})
        assert answer.status_code == 404 and error_of(answer)["code"] == "session_not_found"
    for obj_id in ("-1", "x", str(2**70)):
        answer = client.patch(f"/v1/videos/{prompted}/objects/{obj_id}", json={"name": "dog"})
        assert answer.status_code in (404, 422), (obj_id, answer.text)
    # Object 1 of another session is not this one's.
    other = new_session(client)
    answer = rename(client, other, 1, {"name": "dog"})
    assert answer.status_code == 404 and error_of(answer)["code"] == "object_not_found"
    assert session_names(client, prompted) == {1: "cat"}
    # A closed session: its objects' names are gone with it.
    client.delete(f"/v1/videos/{other}")
    gone = rename(client, other, 1, {"name": "dog"})
    assert gone.status_code == 404 and error_of(gone)["code"] == "session_not_found"


def test_an_export_naming_a_closed_or_malformed_session_is_refused(client):
    sid = new_session(client)
    client.delete(f"/v1/videos/{sid}")
    video = {"name": "clip", "width": SIZE[1], "height": SIZE[0], "num_frames": len(FRAMES)}
    body = {"format": "coco", "video": video, "objects": [{"obj_id": 1}]}
    closed = client.post("/v1/video-export", json={**body, "session_id": sid})
    assert closed.status_code == 404 and error_of(closed)["code"] == "session_not_found"
    for bad in ("nope", "vs-" + "g" * 32, "vs-" + "0" * 33, 7):
        answer = client.post("/v1/video-export", json={**body, "session_id": bad})
        assert answer.status_code == 422, (bad, answer.text)
        assert "session_id" in error_of(answer)["message"]


def test_the_api_key_guards_renames(predictor, video_predictor):
    settings = ServerSettings.from_flat(warmup=False, video=True, api_key=API_KEY)
    with TestClient(create_app(settings, predictor, video_predictor)) as keyed:
        path = "/v1/videos/vs-" + "0" * 32 + "/objects/1"
        denied = keyed.patch(path, json={"name": "cat"})
        assert denied.status_code == 401 and error_of(denied)["code"] == "unauthorized"
        wrong = keyed.patch(path, json={"name": "cat"}, headers={"x-api-key": "wrong"})
        assert wrong.status_code == 401
        allowed = keyed.patch(
            path, json={"name": "cat"}, headers={"authorization": f"Bearer {API_KEY}"}
        )
        assert allowed.status_code == 404 and error_of(allowed)["code"] == "session_not_found"


def test_cross_origin_renames_only_from_configured_origins(predictor, video_predictor):
    settings = ServerSettings.from_flat(warmup=False, video=True, cors_origins=(ORIGIN,))
    preflight = {"access-control-request-method": "PATCH"}
    with TestClient(create_app(settings, predictor, video_predictor)) as cors:
        path = "/v1/videos/vs-" + "0" * 32 + "/objects/1"
        allowed = cors.options(path, headers={"origin": ORIGIN, **preflight})
        assert allowed.status_code == 200, allowed.text
        assert allowed.headers["access-control-allow-origin"] == ORIGIN
        assert "PATCH" in allowed.headers["access-control-allow-methods"]
        other = cors.options(path, headers={"origin": "http://evil.test", **preflight})
        assert "access-control-allow-origin" not in other.headers


# --------------------------------------------------------------------------- live


def test_live_prompts_name_objects_and_live_frames_carry_the_names(client):
    height, width = SIZE
    created = client.post("/v1/videos/live", json={"width": width, "height": height})
    assert created.status_code == 201, created.text
    sid = created.json()["session_id"]
    with client.websocket_connect(f"/v1/videos/{sid}/live") as ws:
        ws.send_bytes(np.ascontiguousarray(FRAMES[0]).tobytes())
        first = ws.receive_json()
        assert first["type"] == "frame" and first["objects"] == []
        ws.send_text(json.dumps({"type": "prompt", **CLICK, "obj_id": 1, "name": "runner"}))
        answered = ws.receive_json()
        assert answered["type"] == "prompt", answered
        assert names_in(answered["objects"]) == {1: "runner"}
        # A bad name on the connection: an error message, and the connection stays.
        bad = {"type": "prompt", **CLICK, "obj_id": 2, "name": "a\x00b"}
        ws.send_text(json.dumps(bad))
        refused = ws.receive_json()
        assert refused["type"] == "error" and refused["code"] == "invalid_request"
        assert "name" in refused["message"]
        # Renamed over HTTP while the connection holds the session: the next frame says so.
        renamed = rename(client, sid, 1, {"name": "sprinter"})
        assert renamed.status_code == 200, renamed.text
        ws.send_bytes(np.ascontiguousarray(FRAMES[1]).tobytes())
        second = ws.receive_json()
        assert second["type"] == "frame", second
        assert names_in(second["objects"]) == {1: "sprinter"}
        ws.send_text(json.dumps({"type": "end"}))
    assert session_names(client, sid) == {1: "sprinter"}
    client.delete(f"/v1/videos/{sid}")
