"""The video page's server side, on a real server (uvicorn on loopback) with ``--video`` and
an image folder: video files in the folder's listing (only when the server tracks video)
and sent a chunk at a time within the video upload limit; a session's frames as JPEGs
(GET /v1/videos/{id}/frames/{i}); and POST /v1/video-export against pycocotools, with its
refusals (sizes, frames, objects, hostile runs) before any work. The page itself, in a
browser, is test_page_video_browser.py's."""

from __future__ import annotations

import io
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from pycocotools import mask as mask_utils
from server_support import error_of, png_bytes, start_server, wait_ready

from sam2serve.engine.video_io import VIDEO_EXTENSIONS, write_video
from sam2serve.samples import sample_clip
from sam2serve.server.image_folder import VIDEO_MEDIA_TYPES
from sam2serve.server.settings import MiB, ServerSettings

pytest.importorskip("av")

FRAMES, TRUTH = sample_clip(4, (48, 64))
HEIGHT, WIDTH = 48, 64
MAX_FRAMES = 50


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("videos")
    (root / "a.png").write_bytes(png_bytes(FRAMES[0]))
    write_video(root / "clip.mp4", FRAMES)
    write_video(root / "moving.gif", FRAMES)
    (root / "huge.webm").write_bytes(b"\0" * (MiB + 1))
    (root / ".hidden.mp4").write_bytes(b"")
    (root / "notes.mp4.txt").write_text("no")
    shots = root / "shots"  # a video given as frames
    shots.mkdir()
    for i in (1, 2, 10):
        (shots / f"{i}.png").write_bytes(png_bytes(FRAMES[i % 4]))
    (shots / "notes.txt").write_text("no")
    (root / ".cache").mkdir()
    outside = root.parent / f"{root.name}-outside"
    outside.mkdir()
    (outside / "0.png").write_bytes(png_bytes(FRAMES[0]))
    (root / "out").symlink_to(outside)
    return root


@pytest.fixture(scope="module")
def video_server(predictor, folder):
    from sam2serve.engine.video.predictor import VideoPredictor

    settings = ServerSettings.from_flat(
        video=True,
        warmup=False,
        images_dir=str(folder),
        max_video_upload_bytes=MiB,
        max_video_frames=MAX_FRAMES,
    )
    from small_tracker import small_tiny_tracker

    # SAM 2.1 tiny at 256 x 256: the page's plumbing is the subject, not the network.
    video = VideoPredictor(small_tiny_tracker(seed=0))
    live = start_server(settings, predictor, video)
    wait_ready(live)
    yield live
    live.stop()


@pytest.fixture(scope="module")
def image_only_server(predictor, folder):
    live = start_server(ServerSettings.from_flat(warmup=False, images_dir=str(folder)), predictor)
    wait_ready(live)
    yield live
    live.stop()


# --------------------------------------------------------------------------- the folder


def test_the_folder_lists_videos_with_their_kind_when_the_server_tracks_video(
    video_server, image_only_server
):
    with video_server.client() as client:
        listing = client.get("/v1/images").json()
    kinds = {entry["name"]: entry["kind"] for entry in listing["images"]}
    assert kinds == {"a.png": "image", "clip.mp4": "video", "huge.webm": "video",
                     "moving.gif": "video", "shots": "frames"}  # fmt: skip
    assert listing["images"][-1] == {"name": "shots", "bytes": 0, "kind": "frames"}
    with image_only_server.client() as client:
        listing = client.get("/v1/images").json()
        assert [entry["name"] for entry in listing["images"]] == ["a.png"]
        refused = client.get("/v1/images/file", params={"name": "clip.mp4"})
        no_folders = client.get("/v1/images", params={"folder": "shots"})
    assert refused.status_code == 422 and "image" in error_of(refused)["message"]
    assert no_folders.status_code == 422 and "serve --video" in error_of(no_folders)["message"]


def test_a_subfolder_is_a_video_given_as_frames(video_server, folder):
    with video_server.client() as client:
        listing = client.get("/v1/images", params={"folder": "shots"}).json()
        assert listing["folder"] == "shots" and listing["total"] == 3
        assert [(e["name"], e["kind"]) for e in listing["images"]] == [
            ("1.png", "image"), ("10.png", "image"), ("2.png", "image")
        ]  # fmt: skip
        frame = client.get("/v1/images/file", params={"folder": "shots", "name": "10.png"})
        assert frame.status_code == 200 and frame.headers["content-type"] == "image/png"
        assert frame.content == (folder / "shots" / "10.png").read_bytes()
        for name, status, code in (
            ("..", 422, "invalid_request"),
            ("../shots", 422, "invalid_request"),
            ("shots/..", 422, "invalid_request"),
            (".cache", 422, "invalid_request"),
            ("missing", 404, "unknown_folder"),
            ("out", 404, "unknown_folder"),  # a link out of the folder
            ("a.png", 404, "unknown_folder"),
        ):
            answer = client.get("/v1/images", params={"folder": name})
            assert (answer.status_code, error_of(answer)["code"]) == (status, code), name
            answer = client.get("/v1/images/file", params={"folder": name, "name": "1.png"})
            assert answer.status_code == status, name
        for name in ("notes.txt", "../a.png", "clip.mp4"):
            answer = client.get("/v1/images/file", params={"folder": "shots", "name": name})
            assert answer.status_code == 422, name


def test_the_folder_offers_the_video_readers_extensions():
    assert set(VIDEO_MEDIA_TYPES) == set(VIDEO_EXTENSIONS)


def test_a_video_file_is_sent_as_stored_within_the_video_upload_limit(video_server, folder):
    with video_server.client() as client:
        answer = client.get("/v1/images/file", params={"name": "clip.mp4"})
        assert answer.status_code == 200
        assert answer.headers["content-type"] == "video/mp4"
        assert answer.content == (folder / "clip.mp4").read_bytes()
        assert int(answer.headers["content-length"]) == len(answer.content)
        too_big = client.get("/v1/images/file", params={"name": "huge.webm"})
        assert too_big.status_code == 413
        assert "--max-video-upload-mib" in error_of(too_big)["message"]
        for name in (".hidden.mp4", "../clip.mp4", "notes.mp4.txt"):
            assert client.get("/v1/images/file", params={"name": name}).status_code == 422


# --------------------------------------------------------------------------- frames


def test_a_sessions_frames_are_served_as_jpegs(video_server):
    with video_server.client() as client:
        files = [("frame", (f"{i}.png", png_bytes(f), "image/png")) for i, f in enumerate(FRAMES)]
        session = client.post("/v1/videos", files=files).json()
        path = f"/v1/videos/{session['session_id']}/frames"
        for index in (0, 3):
            answer = client.get(f"{path}/{index}")
            assert answer.status_code == 200 and answer.headers["content-type"] == "image/jpeg"
            shown = np.asarray(Image.open(io.BytesIO(answer.content)).convert("RGB"), np.int16)
            assert shown.shape == FRAMES[index].shape
            assert np.abs(shown - FRAMES[index]).mean() < 6  # JPEG: close, not equal
        for bad, status in (("4", 422), ("-1", 422), ("x", 422), (str(2**40), 422)):
            assert client.get(f"{path}/{bad}").status_code == status, bad
        unknown = client.get("/v1/videos/nosuchsession/frames/0")
        assert unknown.status_code == 404
        client.delete(f"/v1/videos/{session['session_id']}")


# --------------------------------------------------------------------------- export


def coco_rle(mask: np.ndarray) -> dict:
    rle = mask_utils.encode(np.asfortranarray(mask.astype(np.uint8)))
    return {"size": [int(v) for v in rle["size"]], "counts": rle["counts"].decode()}


def export_body(fmt: str, **video) -> dict:
    return {
        "format": fmt,
        "video": {"name": "clip.mp4", "width": WIDTH, "height": HEIGHT, "num_frames": 4, **video},
        "objects": [{"obj_id": 1, "name": "disc"}, {"obj_id": 2, "name": "square"}],
        "frames": [
            {
                "frame_idx": f,
                "objects": [
                    {"obj_id": obj, "segmentation": coco_rle(TRUTH[obj][f])}
                    for obj in (1, 2)
                    if not (obj == 2 and f == 0)  # the square is absent on frame 0
                ],
            }
            for f in range(4)
        ],
    }


def test_the_export_writes_coco_and_youtube_vis_that_pycocotools_decodes(video_server, tmp_path):
    from pycocotools.coco import COCO

    with video_server.client() as client:
        coco_answer = client.post("/v1/video-export", json=export_body("coco"))
        ytvis_answer = client.post("/v1/video-export", json=export_body("youtube_vis"))
    assert coco_answer.status_code == 200, coco_answer.text
    (tmp_path / "coco.json").write_bytes(coco_answer.content)
    coco = COCO(str(tmp_path / "coco.json"))
    assert len(coco.getImgIds()) == 4 and len(coco.getAnnIds()) == 7
    for annotation in coco.loadAnns(coco.getAnnIds()):
        image = coco.loadImgs(annotation["image_id"])[0]
        assert image["video"] == "clip.mp4" and image["frame_index"] == annotation["frame_index"]
        expected = TRUTH[annotation["track_id"]][annotation["frame_index"]]
        assert np.array_equal(coco.annToMask(annotation).astype(bool), expected)
    ytvis = ytvis_answer.json()
    assert ytvis["videos"][0]["file_names"] == [f"clip/{i:05d}.jpg" for i in range(4)]
    square = ytvis["annotations"][1]
    assert square["segmentations"][0] is None and square["areas"][0] is None
    for f in range(1, 4):
        decoded = mask_utils.decode(square["segmentations"][f]).astype(bool)
        assert np.array_equal(decoded, TRUTH[2][f])


@pytest.mark.parametrize(
    ("change", "words"),
    [
        (lambda b: b["video"].update(num_frames=MAX_FRAMES + 1), "max_video_frames"),
        (lambda b: b["video"].update(width=10**5, height=10**5), "max_pixels"),
        (lambda b: b["video"].update(frame_names=["a.png"]), "frame_names"),
        (lambda b: b["frames"][1].update(frame_idx=4), "frames 0 to 3"),
        (lambda b: b["frames"][1]["objects"][0].update(obj_id=9), "not one of the objects"),
        (lambda b: b["frames"][1]["objects"].append(b["frames"][1]["objects"][0]), "second mask"),
        (lambda b: b["frames"][1]["objects"][0]["segmentation"].update(size=[64, 48]), "size"),
        (lambda b: b["frames"][1]["objects"][0]["segmentation"].update(counts="0"), "counts"),
        (
            lambda b: b["frames"][1]["objects"][0]["segmentation"].update(counts="\x7f" * 9),
            "counts",
        ),
        (lambda b: b["frames"][1]["objects"][0]["segmentation"].update(counts=[1, -1]), "counts"),
        (lambda b: b.update(format="davis"), "format"),
        (lambda b: b.update(objects=[]), "objects"),
    ],
)
def test_the_export_refuses_what_does_not_fit_the_video(video_server, change, words):
    body = export_body("coco")
    change(body)
    with video_server.client() as client:
        answer = client.post("/v1/video-export", json=body)
    assert answer.status_code == 422, answer.text
    assert words in error_of(answer)["message"]


def test_the_export_bounds_youtube_vis_lists_before_the_work(video_server, monkeypatch):
    """objects x frames entries are what YouTube-VIS writes whatever the masks: bounded
    (here at 100 entries: 2 objects of 50 frames pass, a third is refused)."""
    from sam2serve.server.routes import video_export

    monkeypatch.setattr(video_export, "MAX_TRACK_CELLS", 2 * MAX_FRAMES)
    body = export_body("youtube_vis", num_frames=MAX_FRAMES)
    with video_server.client() as client:
        assert client.post("/v1/video-export", json=body).status_code == 200
        body["objects"].append({"obj_id": 3})
        answer = client.post("/v1/video-export", json=body)
    assert answer.status_code == 422 and "objects x frames" in error_of(answer)["message"]


def test_the_export_refuses_hostile_bodies_at_once(video_server):
    """A run string of megabytes is refused at its first piece, a body of too many JSON
    items before it is parsed."""
    body = export_body("coco")
    body["frames"][0]["objects"][0]["segmentation"]["counts"] = "1" * 4_000_000
    items = export_body("youtube_vis")
    items["frames"] = [{"frame_idx": 0, "objects": []}] * 60_000
    with video_server.client() as client:
        started = time.perf_counter()
        long_runs = client.post("/v1/video-export", json=body)
        elapsed = time.perf_counter() - started
        too_many = client.post("/v1/video-export", json=items)
    assert long_runs.status_code == 422 and "counts" in error_of(long_runs)["message"]
    assert elapsed < 30  # one piece read, not four million runs (a bound, not a timing)
    assert too_many.status_code == 413 and error_of(too_many)["code"] == "json_too_large"
