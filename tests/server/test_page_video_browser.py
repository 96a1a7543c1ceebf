"""The annotation page's video mode in a real browser (Debian's chromium, headless, driven
by Playwright) against a real ``sam2serve serve --video`` subprocess (tiny, random
weights) on loopback with an API key and a folder holding a short clip.

One person's session: the clip is opened from the folder (an MP4, decoded by the server,
whose frames the page shows), a click on frame 0 draws a mask, propagation forwards
streams every frame (the view follows it: a later frame's canvas is the object's colour
where its mask is), a box on frame 2 corrects it and a second propagation changes the
later frame, a third propagation is stopped after its first frame (the server's job is
cancelled: its metric counts it and the session is free), and the exports are decoded
with pycocotools: COCO's annotation of a frame and YouTube-VIS's segmentation of it equal
the pixels the page drew there. A tiny model with random weights takes seconds a frame
on a busy 2-core machine, so the clip has 4 frames and the session is in the second tier.

A quicker test opens frame images from the file picker (no model work) and scrubs them.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import test_page_browser as browser
from PIL import Image
from server_support import png_bytes
from test_page_browser import API_KEY, drawn, serve, wait_until

from sam2serve.samples import sample_clip

pytestmark = pytest.mark.slow

# The image page's browser fixtures: chromium (installed if missing), Playwright, a page.
chromium = browser.chromium
playwright_module = browser.playwright_module
page = browser.page
pytest.importorskip("av")

NUM_FRAMES, SIZE = 4, (64, 96)  # (height, width)
FRAMES, TRUTH = sample_clip(NUM_FRAMES, SIZE)
OBJECT_COLOUR = (0xE6, 0x19, 0x4B)  # the first object's colour (objects.js PALETTE)
PROPAGATION_TIMEOUT_S = 600.0  # 4 frames of tracking on a busy machine
VIDEO_CLICKS = "window.sam2serveTimings.filter((t) => t.kind === 'video-click').length"


@pytest.fixture(scope="module")
def video_folder(tmp_path_factory) -> Path:
    from sam2serve.engine.video_io import write_video

    root = tmp_path_factory.mktemp("page-videos")
    write_video(root / "clip.mp4", FRAMES)
    Image.fromarray(FRAMES[0]).save(root / "still.png")
    (root / "shots").mkdir()  # the same clip as frames, numbered without padding
    for i, frame in enumerate(FRAMES):
        Image.fromarray(frame).save(root / "shots" / f"{i * 5}.png")
    return root


@pytest.fixture(scope="module")
def video_server(video_folder) -> Any:
    with serve(
        "--model", "tiny", "--random-weights", "--no-warmup", "--video", "--images",
        str(video_folder), env={"SAM2SERVE_API_KEY": API_KEY},
    ) as url:  # fmt: skip
        yield url


def open_page(tab: Any, url: str) -> None:
    tab.goto(f"{url}/")
    tab.evaluate(f"sessionStorage.setItem('sam2serve.apiKey', {json.dumps(API_KEY)})")
    tab.reload()


def wait_for_frame(tab: Any, index: int) -> None:
    """Until frame ``index``'s picture is drawn (its masks are drawn with it)."""
    wait_until(tab, f"document.body.dataset.frame === '{index}'")


def mask_pixels(tab: Any) -> np.ndarray:
    """Where the page drew a mask on the frame shown, checking it drew the object's colour."""
    pixels = drawn(tab)
    mask = pixels[..., 3] > 0
    # Half-transparent pixels come back from the canvas within a unit or two (its alpha is
    # premultiplied).
    colours = pixels[mask][:, :3].astype(np.int16)
    assert (np.abs(colours - OBJECT_COLOUR) <= 2).all(), np.unique(colours, axis=0)[:5]
    return mask


def propagate(tab: Any, key: str, frames: int) -> None:
    tab.keyboard.press(key)
    wait_until(tab, "document.body.dataset.video === 'propagating'", timeout=10)
    wait_until(tab, "document.body.dataset.video === 'ready'", timeout=PROPAGATION_TIMEOUT_S)
    assert tab.evaluate("document.body.dataset.propagated") == str(frames), tab.text_content(
        "#message"
    )


def streamed_masks(stream: str) -> dict[int, np.ndarray]:
    """The first object's mask of every frame of a propagation's event stream."""
    masks = {}
    for block in stream.split("\n\n"):
        if block.startswith("event: frame\ndata: "):
            frame = json.loads(block.split("data: ", 1)[1])
            rle = frame["objects"][0]["segmentation"]
            (height, width), counts = rle["size"], rle["counts"]
            values = np.arange(len(counts)) % 2 == 1
            masks[frame["frame_idx"]] = np.repeat(values, counts).reshape(width, height).T
    return masks


# What the network brought, beside what the page read: every propagation's (and concept
# track's) stream is teed before the page gets it (the browser keeps no body of a streamed
# answer).
RECORD_STREAMS = """
window.testStreams = [];
const originalFetch = window.fetch;
window.fetch = async (...args) => {
  const answer = await originalFetch(...args);
  const url = typeof args[0] === "string" ? args[0] : args[0].url;
  const streamed = url.endsWith("/propagate") || url.endsWith("/concepts/track");
  if (!streamed || !answer.body) return answer;
  const [mine, theirs] = answer.body.tee();
  const record = { text: "" };
  window.testStreams.push(record);
  (async () => {
    const reader = mine.pipeThrough(new TextDecoderStream()).getReader();
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      record.text += value;
    }
  })().catch(() => {});
  return new Response(theirs, { status: answer.status, headers: answer.headers });
};
"""


def propagate_and_read(tab: Any, key: str, frames: int) -> dict[int, np.ndarray]:
    """Propagate with ``key``; the masks the server streamed, by frame."""
    count = tab.evaluate("window.testStreams.length")
    propagate(tab, key, frames)
    last = f"window.testStreams[{count}].text"
    wait_until(tab, f"{last}.includes('event: done')", timeout=10)
    return streamed_masks(tab.evaluate(last))


def cancelled_propagations(url: str) -> float:
    text = httpx.get(f"{url}/metrics", headers={"Authorization": f"Bearer {API_KEY}"}).text
    for line in text.splitlines():
        if line.startswith("sam2serve_jobs_cancelled_total") and "video_propagate" in line:
            return float(line.split()[-1])
    return 0.0


@pytest.mark.extended
def test_a_person_tracks_corrects_stops_and_exports_a_video(page, video_server, tmp_path):
    tab = page
    sessions: list[str] = []
    tab.on(
        "response",
        lambda answer: (
            answer.url.endswith("/v1/videos")
            and answer.status == 201
            and sessions.append(answer.json()["session_id"])
        ),
    )
    tab.add_init_script(RECORD_STREAMS)
    open_page(tab, video_server)
    wait_until(tab, "document.querySelectorAll('#folder-list li').length === 3")
    assert tab.locator("#folder-list li.video").all_text_contents() == ["clip.mp4"]

    # The clip from the folder: the server's frames, under a slider.
    tab.click("#folder-list li:has-text('clip.mp4')")
    wait_until(tab, "document.body.dataset.video === 'ready'")
    wait_for_frame(tab, 0)
    assert tab.evaluate("document.body.dataset.mode") == "video"
    assert tab.evaluate("[document.querySelector('#image').width, document.querySelector('#image').height]") == [96, 64]  # fmt: skip
    assert tab.evaluate("document.querySelector('#video-slider').max") == str(NUM_FRAMES - 1)
    assert "frame 0 / 3" in tab.text_content("#video-frame")
    assert tab.locator("#amg").is_hidden()  # the image mode's tools are not offered

    # A click on the disc, frame 0.
    canvas = tab.locator("#prompts")
    box = canvas.bounding_box()
    canvas.click(position={"x": box["width"] * 0.2, "y": box["height"] * 0.5})
    wait_until(tab, f"{VIDEO_CLICKS} >= 1")
    assert mask_pixels(tab).any(), "the click drew no mask"
    assert tab.locator("#object-list li").count() == 1

    # Propagate forwards: every frame streamed; the view follows to the last one, drawn
    # as the server sent it.
    streamed = propagate_and_read(tab, "f", NUM_FRAMES)
    assert sorted(streamed) == list(range(NUM_FRAMES))
    wait_for_frame(tab, NUM_FRAMES - 1)
    tracked_last = mask_pixels(tab)
    assert tracked_last.any(), "frame 3 has no mask after the propagation"
    assert np.array_equal(tracked_last, streamed[NUM_FRAMES - 1])
    assert "Propagated forwards over 4 frames" in tab.text_content("#message")

    # Correct on frame 2 with a box, then propagate again from there.
    tab.keyboard.press("ArrowLeft")
    wait_for_frame(tab, 2)
    before = mask_pixels(tab)
    tab.mouse.move(box["x"] + box["width"] * 0.45, box["y"] + box["height"] * 0.15)
    tab.mouse.down()
    tab.mouse.move(box["x"] + box["width"] * 0.95, box["y"] + box["height"] * 0.9, steps=5)
    tab.mouse.up()
    wait_until(tab, f"{VIDEO_CLICKS} >= 2")
    corrected = mask_pixels(tab)
    assert not np.array_equal(corrected, before), "the box did not change frame 2's mask"
    assert np.array_equal(before, streamed[2])
    # Propagate again: a correction on a tracked frame is SAM 2's memory, not a frame to
    # track again (that would replace it), so the page tracks from frame 3, drawn anew
    # from the stream, and frame 2 keeps the correction. (A random model's later frames
    # barely depend on its memory: frame 3 may come back the same.)
    streamed = propagate_and_read(tab, "f", 1)
    assert sorted(streamed) == [3]
    assert "from frame 3 (after the correction on 2)" in tab.text_content("#message")
    wait_for_frame(tab, NUM_FRAMES - 1)
    assert np.array_equal(mask_pixels(tab), streamed[3])
    tab.keyboard.press("ArrowLeft")
    wait_for_frame(tab, 2)
    assert np.array_equal(mask_pixels(tab), corrected)

    # Stop: backwards from frame 3, stopped once the first frame has come; the server's
    # propagation is cancelled (counted) and the session is free again.
    assert cancelled_propagations(video_server) == 0
    tab.keyboard.press("End")
    wait_for_frame(tab, NUM_FRAMES - 1)
    tab.keyboard.press("b")
    wait_until(tab, "document.querySelector('#propagate-progress').value >= 1")
    tab.click("#propagate-stop")
    wait_until(tab, "document.body.dataset.video === 'ready'", timeout=30)
    assert "Propagation stopped after" in tab.text_content("#message")
    session = f"{video_server}/v1/videos/{sessions[-1]}"
    deadline = time.monotonic() + PROPAGATION_TIMEOUT_S
    while (
        cancelled_propagations(video_server) < 1
        or httpx.get(session, headers={"Authorization": f"Bearer {API_KEY}"}).json()["busy"]
    ):
        assert time.monotonic() < deadline, "the stopped propagation never ended on the server"
        time.sleep(0.2)
    assert int(tab.evaluate("document.body.dataset.propagated")) < NUM_FRAMES

    # Export: COCO and YouTube-VIS, decoded by pycocotools, equal what was drawn.
    tab.keyboard.press("End")
    wait_for_frame(tab, NUM_FRAMES - 1)
    shown_last = mask_pixels(tab)
    tab.locator("#object-list li").nth(0).locator("input.name").fill("disc")
    tab.keyboard.press("Escape")
    # The name is the session's: sent as a rename (PATCH .../objects/1), listed by GET.
    deadline = time.monotonic() + 30
    key = {"Authorization": f"Bearer {API_KEY}"}
    while httpx.get(session, headers=key).json()["objects"] != [{"obj_id": 1, "name": "disc"}]:
        assert time.monotonic() < deadline, "the page never sent the object's name"
        time.sleep(0.2)
    from pycocotools import mask as mask_utils
    from pycocotools.coco import COCO

    with tab.expect_download() as download:
        tab.keyboard.press("e")
    assert download.value.suggested_filename == "clip_coco.json"
    download.value.save_as(tmp_path / "coco.json")
    coco = COCO(str(tmp_path / "coco.json"))
    images = coco.loadImgs(sorted(coco.getImgIds()))
    assert [(i["video"], i["frame_index"]) for i in images] == [("clip.mp4", f) for f in range(4)]
    (last,) = coco.loadAnns(coco.getAnnIds(imgIds=[images[-1]["id"]]))
    assert coco.loadCats(last["category_id"])[0]["name"] == "disc" and last["track_id"] == 1
    assert np.array_equal(coco.annToMask(last).astype(bool), shown_last)
    (second,) = coco.loadAnns(coco.getAnnIds(imgIds=[images[2]["id"]]))
    assert np.array_equal(coco.annToMask(second).astype(bool), corrected)

    with tab.expect_download() as download:
        tab.keyboard.press("y")
    assert download.value.suggested_filename == "clip_ytvis.json"
    ytvis = json.loads(Path(download.value.path()).read_text())
    (track,) = ytvis["annotations"]
    assert len(track["segmentations"]) == NUM_FRAMES == ytvis["videos"][0]["length"]
    decoded = mask_utils.decode(track["segmentations"][-1]).astype(bool)
    assert np.array_equal(decoded, shown_last)


def test_frames_from_the_file_picker_open_as_a_video_and_scrub(page, video_server):
    """Frame images chosen together are one video's frames (by name); the slider and the
    keys show each frame as the server has it; an image brings the image mode back."""
    tab = page
    open_page(tab, video_server)
    files = [
        {"name": f"{i:03d}.png", "mimeType": "image/png", "buffer": png_bytes(frame)}
        for i, frame in reversed(list(enumerate(FRAMES)))  # the page orders them by name
    ]
    tab.set_input_files("#video-file", files)
    wait_until(tab, "document.body.dataset.video === 'ready'")
    wait_for_frame(tab, 0)
    tab.keyboard.press("End")
    wait_for_frame(tab, NUM_FRAMES - 1)
    picture = tab.evaluate(
        """() => {
            const c = document.querySelector("#image");
            return Array.from(c.getContext("2d").getImageData(0, 0, c.width, c.height).data);
        }"""
    )
    shown = np.asarray(picture, np.int16).reshape(SIZE[0], SIZE[1], 4)[..., :3]
    assert np.abs(shown - FRAMES[-1]).mean() < 8  # the last frame (JPEG: close, not equal)
    assert np.abs(shown - FRAMES[0]).mean() > 2 * np.abs(shown - FRAMES[-1]).mean()
    tab.keyboard.press("ArrowLeft")
    wait_for_frame(tab, NUM_FRAMES - 2)
    tab.evaluate(
        """() => {
            const slider = document.querySelector("#video-slider");
            slider.value = "1";
            slider.dispatchEvent(new Event("input"));
        }"""
    )
    wait_for_frame(tab, 1)
    assert "frame 1 / 3" in tab.text_content("#video-frame")

    # Nothing to propagate yet: said, not sent.
    tab.keyboard.press("f")
    assert "Click an object first" in tab.text_content("#message")

    # An image: back to the image mode, the video bar gone.
    image = {"name": "still.png", "mimeType": "image/png", "buffer": png_bytes(FRAMES[0])}
    tab.set_input_files("#file", image)
    wait_until(tab, "document.body.dataset.mode === 'image'")
    assert tab.locator("#video-bar").is_hidden()


def test_a_subfolder_of_the_servers_folder_opens_as_a_video(page, video_server):
    """A subfolder (its frames 0, 5, 10, 15 by number, not by name) is one video."""
    tab = page
    open_page(tab, video_server)
    wait_until(tab, "document.querySelectorAll('#folder-list li.frames').length === 1")
    tab.click("#folder-list li.frames:has-text('shots')")
    wait_until(tab, "document.body.dataset.video === 'ready'")
    assert tab.evaluate("document.querySelector('#video-slider').max") == str(NUM_FRAMES - 1)
    tab.keyboard.press("End")
    wait_for_frame(tab, NUM_FRAMES - 1)
    picture = tab.evaluate(
        """() => {
            const c = document.querySelector("#image");
            return Array.from(c.getContext("2d").getImageData(0, 0, c.width, c.height).data);
        }"""
    )
    shown = np.asarray(picture, np.int16).reshape(SIZE[0], SIZE[1], 4)[..., :3]
    assert np.abs(shown - FRAMES[-1]).mean() < 8  # 15.png, after 10.png
    assert "shots: 4 frames" in tab.text_content("#image-state")


def test_a_video_the_server_refuses_is_said_in_the_page(page, video_server, monkeypatch):
    """Frames of two sizes: the server's own message (422 invalid_video), not a blank page."""
    monkeypatch.setattr(browser, "EXPECTED_STATUSES", (*browser.EXPECTED_STATUSES, "status of 422"))
    tab = page
    open_page(tab, video_server)
    files = [
        {"name": "0.png", "mimeType": "image/png", "buffer": png_bytes(FRAMES[0])},
        {"name": "1.png", "mimeType": "image/png", "buffer": png_bytes(FRAMES[1][:32])},
    ]
    tab.set_input_files("#video-file", files)
    wait_until(tab, "document.body.dataset.video === 'error'")
    message = tab.text_content("#message")
    assert "422 invalid_video" in message and "Opening" in message, message
    assert tab.evaluate("document.querySelector('#message').dataset.level") == "error"
    assert tab.locator("#drop-hint").is_visible()


@pytest.mark.skipif(
    not os.environ.get("SAM2SERVE_VIDEO_PAGE_SCREENSHOT"),
    reason="set SAM2SERVE_VIDEO_PAGE_SCREENSHOT=PATH",
)
def test_screenshot_for_the_docs(page, tmp_path):
    """docs/video_page.png: a 3-frame clip of the sample's size, an object clicked on
    frame 0 and tracked to the last frame (random weights: the mask is not the disc)."""
    tab = page
    frames, _ = sample_clip(3, (240, 320))
    from sam2serve.engine.video_io import write_video

    folder = tmp_path / "clips"
    folder.mkdir()
    write_video(folder / "sample.mp4", frames)
    with serve(
        "--model", "tiny", "--random-weights", "--no-warmup", "--video", "--images",
        str(folder), env={"SAM2SERVE_API_KEY": API_KEY},
    ) as url:  # fmt: skip
        open_page(tab, url)
        wait_until(tab, "document.querySelectorAll('#folder-list li').length === 1")
        tab.click("#folder-list li:has-text('sample.mp4')")
        wait_until(tab, "document.body.dataset.video === 'ready'")
        wait_for_frame(tab, 0)
        canvas = tab.locator("#prompts")
        box = canvas.bounding_box()
        canvas.click(position={"x": box["width"] * 0.2, "y": box["height"] * 0.5})
        wait_until(tab, f"{VIDEO_CLICKS} >= 1")
        tab.locator("#object-list li").nth(0).locator("input.name").fill("disc")
        tab.keyboard.press("Escape")
        propagate(tab, "f", 3)
        wait_for_frame(tab, 2)
        tab.screenshot(path=os.environ["SAM2SERVE_VIDEO_PAGE_SCREENSHOT"])
