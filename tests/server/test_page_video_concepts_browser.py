"""The video page's "Find in video" in a real browser (Debian's chromium, headless, driven
by Playwright) against a real ``sam2serve serve --video --concepts`` subprocess (tiny SAM
2.1 and tiny SAM 3, random weights: a run's default threshold is 0) on loopback with an
API key, the video page's folder and ``--max-video-objects 1``.

One person's session: the clip is opened from the folder, `t` and a phrase start SAM 3's
video predictor from frame 0 (POST .../concepts/track, streamed as a propagation is), every
frame the stream brought is drawn as it sent it (an object the stream leaves out of a
frame has no mask there) with the phrase's name beside the mask, the object list names
each object by the phrase, and the COCO export has the phrase as the category and the
streamed masks; a second phrase the session has no room for shows the route's own error
(413 too_many_objects) in the status line; a click on the found object and `g` refine it
with SAM 3 (the phrase run again with the click: POST .../concepts/track `clicks`, the
frames answered again drawn as their last answer); an Alt+click on it hands it to SAM 2.1
(SAM 3's object dropped, its mask on the frame SAM 2.1's mask prompt, then the click) and
the page draws SAM 2.1's answer. SAM 3 takes seconds a frame on a busy 2-core
machine: the second tier.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import test_page_browser as browser
import test_page_video_browser as video_browser
from test_page_browser import API_KEY, drawn, serve, wait_until
from test_page_video_browser import (
    NUM_FRAMES,
    PROPAGATION_TIMEOUT_S,
    RECORD_STREAMS,
    SIZE,
    VIDEO_CLICKS,
    open_page,
    wait_for_frame,
)

pytestmark = [pytest.mark.slow, pytest.mark.extended]

# The video page's browser fixtures: chromium, Playwright, a page, the folder with the clip.
chromium = browser.chromium
playwright_module = browser.playwright_module
page = browser.page
video_folder = video_browser.video_folder
pytest.importorskip("av")

PHRASE = "disc"
KEY = {"Authorization": f"Bearer {API_KEY}"}


@pytest.fixture(scope="module")
def concepts_video_server(video_folder: Path) -> Any:
    with serve(
        "--model", "tiny", "--random-weights", "--no-warmup", "--video", "--concepts",
        "--sam3-size", "tiny", "--images", str(video_folder), "--max-video-objects", "1",
        env={"SAM2SERVE_API_KEY": API_KEY},
    ) as url:  # fmt: skip
        yield url


def rle_mask(segmentation: dict[str, Any]) -> np.ndarray:
    """The server's uncompressed RLE (column-major runs, zeros first) as a bool array."""
    (height, width), counts = segmentation["size"], segmentation["counts"]
    values = np.arange(len(counts)) % 2 == 1
    return np.repeat(values, counts).reshape(width, height).T


def streamed_objects(stream: str) -> dict[int, dict[int, dict[str, Any]]]:
    """Every frame's objects of a concept track's event stream: frame -> obj_id -> object."""
    frames: dict[int, dict[int, dict[str, Any]]] = {}
    for block in stream.split("\n\n"):
        if block.startswith("event: frame\ndata: "):
            frame = json.loads(block.split("data: ", 1)[1])
            frames[frame["frame_idx"]] = {o["obj_id"]: o for o in frame["objects"]}
    return frames


def names_drawn(tab: Any) -> bool:
    """Whether anything is drawn on the top canvas (the objects' names; no prompts here)."""
    encoded = tab.evaluate(
        """() => {
            const canvas = document.querySelector("#prompts");
            const data = canvas.getContext("2d").getImageData(0, 0, canvas.width, canvas.height).data;
            let text = "";
            for (let i = 0; i < data.length; i += 0x8000) {
                text += String.fromCharCode(...data.subarray(i, i + 0x8000));
            }
            return btoa(text);
        }"""
    )
    return bool(np.frombuffer(base64.b64decode(encoded), np.uint8)[3::4].any())


def clicked_prompt(answer: Any) -> bool:
    """The answer to a prompt of clicks (not the hand-over's mask prompt)."""
    return answer.url.endswith("/prompts") and '"points"' in (answer.request.post_data or "")


def find(tab: Any, phrase: str) -> None:
    """`t`, the phrase, Enter: what a person types."""
    tab.keyboard.press("t")
    assert tab.evaluate("document.activeElement.id") == "video-concept-text"
    tab.keyboard.press("Control+A")
    tab.keyboard.type(phrase)
    tab.keyboard.press("Enter")


def test_a_phrase_is_found_drawn_named_exported_refined_and_handed_to_sam2(
    page, concepts_video_server, tmp_path
):
    tab = page
    url = concepts_video_server
    sent: list[dict[str, Any]] = []
    tab.on(
        "request",
        lambda request: (
            "/v1/videos/" in request.url
            and request.method in ("POST", "DELETE")
            and sent.append(
                {
                    "method": request.method,
                    "session": request.url.split("/v1/videos/", 1)[1].split("/", 1)[0],
                    "path": request.url.split("/v1/videos/", 1)[1].split("/", 1)[-1],
                    "json": json.loads(request.post_data) if request.post_data else None,
                }
            )
        ),
    )
    tab.add_init_script(RECORD_STREAMS)
    open_page(tab, url)
    wait_until(tab, "!document.querySelector('#video-concepts').hidden")  # /readyz: concepts
    wait_until(tab, "document.querySelectorAll('#folder-list li.video').length === 1")
    tab.click("#folder-list li:has-text('clip.mp4')")
    wait_until(tab, "document.body.dataset.video === 'ready'")
    wait_for_frame(tab, 0)
    assert tab.locator("#video-concept-find").is_visible()
    assert tab.locator("#concepts").is_hidden()  # the image mode's concepts are not offered

    # The phrase, from frame 0: streamed as a propagation is (its bar and Stop), drawn
    # as it comes.
    find(tab, PHRASE)
    wait_until(tab, "document.body.dataset.video === 'finding'", timeout=10)
    assert tab.locator("#propagate-stop").is_visible()
    assert tab.evaluate("document.querySelector('#video-concept-find').disabled")
    wait_until(tab, "document.body.dataset.video === 'ready'", timeout=PROPAGATION_TIMEOUT_S)
    wait_until(tab, "window.testStreams[0].text.includes('event: done')", timeout=10)
    (track,) = [r for r in sent if r["path"].endswith("concepts/track")]
    assert track["json"] == {"text": PHRASE, "frame_idx": 0, "mask_format": "uncompressed_rle"}
    frames = streamed_objects(tab.evaluate("window.testStreams[0].text"))
    assert sorted(frames) == list(range(NUM_FRAMES))
    found = sorted({obj_id for objects in frames.values() for obj_id in objects})
    assert found, "SAM 3 found nothing (random weights at threshold 0 find something)"
    assert {o["name"] for objects in frames.values() for o in objects.values()} == {PHRASE}
    message = tab.text_content("#message")
    count = "1 instance" if len(found) == 1 else f"{len(found)} instances"
    assert f'Found {count} of "{PHRASE}" from frame 0 over {NUM_FRAMES} frames' in message
    assert tab.evaluate("document.body.dataset.propagated") == str(NUM_FRAMES)

    # The list names each object by the phrase; every frame is drawn as streamed, the name
    # beside each mask, nothing where the stream has no object.
    rows = tab.locator("#object-list li")
    assert rows.count() == len(found)
    assert [rows.nth(i).locator("input.name").input_value() for i in range(len(found))] == [
        PHRASE
    ] * len(found)
    assert f'found by SAM 3 ("{PHRASE}")' in rows.nth(0).locator(".meta").text_content()
    tab.keyboard.press("Home")
    for index in range(NUM_FRAMES):
        wait_for_frame(tab, index)
        objects = frames[index].values()
        expected = np.zeros(SIZE, bool)
        for obj in objects:
            expected |= rle_mask(obj["segmentation"])
        assert np.array_equal(drawn(tab)[..., 3] > 0, expected), f"frame {index}"
        assert names_drawn(tab) == any(o["area"] > 0 for o in objects), f"frame {index}"
        tab.keyboard.press("ArrowRight")

    # The COCO export: the phrase is the category of every annotation, each the streamed
    # mask of its object and frame.
    from pycocotools.coco import COCO

    with tab.expect_download() as download:
        tab.keyboard.press("e")
    download.value.save_as(tmp_path / "coco.json")
    coco = COCO(str(tmp_path / "coco.json"))
    assert [c["name"] for c in coco.loadCats(coco.getCatIds())] == [PHRASE]
    annotations = coco.loadAnns(coco.getAnnIds())
    expected_annotations = {
        (index, obj_id) for index in frames for obj_id, o in frames[index].items() if o["area"]
    }
    frame_of = {image["id"]: image["frame_index"] for image in coco.loadImgs(coco.getImgIds())}
    assert {(frame_of[a["image_id"]], a["track_id"]) for a in annotations} == expected_annotations
    for annotation in annotations:
        obj = frames[frame_of[annotation["image_id"]]][annotation["track_id"]]
        assert np.array_equal(
            coco.annToMask(annotation).astype(bool), rle_mask(obj["segmentation"])
        )

    # A second phrase: the session (max_video_objects 1) has no room; the route's own
    # error, in the status line.
    find(tab, "ball")
    wait_until(tab, "document.querySelector('#message').dataset.level === 'error'")
    refused = tab.text_content("#message")
    assert refused.startswith(
        'Finding "ball" in the video: the server refused it: 413 too_many_objects: '
    ), refused
    assert "max_video_objects 1" in refused and " at " not in refused  # the message, no stack
    assert tab.evaluate("document.body.dataset.video") == "ready"
    assert rows.count() == len(found)

    # A click on the found object, on a frame where it has a mask, then g: SAM 3 runs the
    # phrase again with the click (its frame and threshold: the search's), streamed; each
    # frame drawn as its last answer.
    index, obj_id = min(expected_annotations)
    tab.keyboard.press("Home")
    wait_for_frame(tab, 0)
    for _ in range(index):
        tab.keyboard.press("ArrowRight")
    wait_for_frame(tab, index)
    tab.locator("#object-list li").nth(found.index(obj_id)).locator(".swatch").click()
    ys, xs = np.nonzero(rle_mask(frames[index][obj_id]["segmentation"]))
    y, x = int(ys[len(ys) // 2]), int(xs[len(xs) // 2])
    canvas = tab.locator("#prompts")
    box = canvas.bounding_box()
    position = {"x": (x + 0.5) * box["width"] / SIZE[1], "y": (y + 0.5) * box["height"] / SIZE[0]}
    before = len(sent)
    canvas.click(position=position)
    assert len(sent) == before  # kept for the refinement, nothing sent yet
    assert "1 click to refine with SAM 3 (g)" in rows.nth(found.index(obj_id)).text_content()
    assert not tab.evaluate("document.querySelector('#video-concept-refine').disabled")
    tab.keyboard.press("g")
    wait_until(tab, "document.body.dataset.video === 'refining'", timeout=10)
    wait_until(tab, "document.body.dataset.video === 'ready'", timeout=PROPAGATION_TIMEOUT_S)
    wait_until(tab, "window.testStreams.at(-1).text.includes('event: done')", timeout=10)
    (refine,) = sent[before:]
    assert refine["path"] == "concepts/track"
    [clicked] = refine["json"].pop("clicks")
    assert refine["json"] == track["json"]  # the search's phrase and frame
    assert (clicked["frame_idx"], clicked["obj_id"], clicked["labels"]) == (index, obj_id, [1])
    ((px, py),) = clicked["points"]
    assert abs(px - (x + 0.5)) < 1 and abs(py - (y + 0.5)) < 1  # the video's pixels
    stream = tab.evaluate("window.testStreams.at(-1).text")
    assert stream.count("event: frame") > NUM_FRAMES  # frames answered again
    assert '"clicks_applied": 1' in stream or '"clicks_applied":1' in stream
    frames = streamed_objects(stream)  # each frame's last answer
    message = tab.text_content("#message")
    assert message.startswith(f'Refined "{PHRASE}" with SAM 3 (1 click applied'), message
    tab.keyboard.press("Home")
    wait_for_frame(tab, 0)
    expected = np.zeros(SIZE, bool)
    for obj in frames[0].values():
        expected |= rle_mask(obj["segmentation"])
    assert np.array_equal(drawn(tab)[..., 3] > 0, expected)

    # The list is the objects the final answers kept (the server's done.objects): one the
    # first pass found and the refinement left no mask on any frame is gone from both.
    final_ids = sorted({obj for frame in frames.values() for obj in frame})
    done = json.loads(stream.split("event: done\ndata: ")[1].split("\n")[0])
    assert [span["obj_id"] for span in done["objects"]] == final_ids
    assert rows.count() == len(final_ids)
    if not final_ids:  # the refinement left nothing (random weights): find the phrase again
        searches = tab.evaluate("window.testStreams.length")
        find(tab, PHRASE)
        wait_until(tab, "document.body.dataset.video === 'ready'", timeout=PROPAGATION_TIMEOUT_S)
        wait_until(
            tab,
            f"window.testStreams.length > {searches} && "
            "window.testStreams.at(-1).text.includes('event: done')",
            timeout=10,
        )
        frames = streamed_objects(tab.evaluate("window.testStreams.at(-1).text"))
        assert sorted({obj for frame in frames.values() for obj in frame}) == found
    # An Alt+click on a kept object (still SAM 3's), on a frame where the final answers
    # give it a mask: SAM 3's object is dropped, that mask is SAM 2.1's mask prompt (with
    # its name), then the click.
    index, obj_id = min((t, obj) for t, frame in frames.items() for obj in frame)
    ys, xs = np.nonzero(rle_mask(frames[index][obj_id]["segmentation"]))
    y, x = int(ys[len(ys) // 2]), int(xs[len(xs) // 2])
    position = {"x": (x + 0.5) * box["width"] / SIZE[1], "y": (y + 0.5) * box["height"] / SIZE[0]}
    tab.keyboard.press("Home")
    wait_for_frame(tab, 0)
    for _ in range(index):
        tab.keyboard.press("ArrowRight")
    wait_for_frame(tab, index)
    tab.locator(f'#object-list li[data-id="{obj_id}"]').locator(".swatch").click()
    refined = frames[index].get(obj_id)
    mask = rle_mask(refined["segmentation"]) if refined else np.zeros(SIZE, bool)
    before = len(sent)
    with tab.expect_response(clicked_prompt) as answer:
        canvas.click(position=position, modifiers=["Alt"])
    wait_until(tab, f"{VIDEO_CLICKS} >= 1")
    drop, *seeded, click = sent[before:]
    assert (drop["method"], drop["path"]) == ("DELETE", f"objects/{obj_id}")
    assert click["path"] == "prompts" and click["json"]["obj_id"] == obj_id
    assert click["json"]["frame_idx"] == index
    if mask.any():
        (seed,) = seeded
        assert seed["path"] == "prompts" and seed["json"]["obj_id"] == obj_id
        assert seed["json"]["frame_idx"] == index
        assert np.array_equal(rle_mask(seed["json"]["mask"]), mask)
        assert seed["json"]["name"] == PHRASE and "name" not in click["json"]
    else:  # no mask to hand over: the click makes SAM 2.1's object, named
        assert seeded == [] and click["json"]["name"] == PHRASE
    assert [p["label"] for p in click["json"]["points"]] == [1]
    objects = httpx.get(f"{url}/v1/videos/{track['session']}", headers=KEY).json()["objects"]
    # now SAM 2.1's object: the session lists it as {obj_id, name}, no SAM 3 fields
    assert objects == [{"obj_id": obj_id, "name": PHRASE}]
    (mine,) = [o for o in answer.value.json()["objects"] if o["obj_id"] == obj_id]
    assert np.array_equal(drawn(tab)[..., 3] > 0, rle_mask(mine["segmentation"]))
    assert "SAM 2.1's since a click" in tab.locator("#object-list li.active .meta").text_content()
