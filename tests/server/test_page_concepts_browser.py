"""The annotation page's concept prompts in a real browser (Debian's chromium, headless,
driven by Playwright) against a real ``sam2serve serve --concepts`` subprocess (tiny SAM
2.1 and tiny SAM 3, both random weights) on loopback with an API key and an image folder.

One person's session: the Concepts panel appears (the server's /readyz says concepts are
on), an image is opened and encoded, a threshold the server refuses shows the server's own
message, "cat, dog" at threshold 0 shows every instance (the canvas is exactly the union
of the answer's masks), two instances are accepted (Enter, the list's ✓), one rejected
(Del), an undo brings one back to the review, the review is closed; the accepted cat is
refined with a click through /v1/segment by SAM 3 (``"model": "sam3"``; its box is the box
prompt, the click is added);
the COCO export has the phrases as categories, the refined mask as the page drew it and
the dog exactly as the server found it. Exemplar boxes: `b`, a drag (positive) and a
Shift-drag (negative) drawn green and red, a third refused by the server's
``--max-concept-boxes 2`` (read from /readyz), one removed and drawn again, then sent with
"cat" and alone (the server's phrase "visual"). A server without concepts never shows the
panel.

``SAM2SERVE_CONCEPTS_SCREENSHOT=PATH`` saves a screenshot of the review there,
``SAM2SERVE_EXEMPLARS_SCREENSHOT=PATH`` one of the review of "cat" with exemplar boxes.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import test_page_browser as browser
from PIL import Image
from server_support import photo
from test_page_browser import (
    API_KEY,
    STEP_TIMEOUT_S,
    click_image,
    drawn,
    object_pixels,
    serve,
    wait_for_clicks,
    wait_until,
)

pytestmark = [pytest.mark.slow, pytest.mark.extended]

# The image page's browser fixtures: chromium (installed if missing), Playwright, a page.
chromium = browser.chromium
playwright_module = browser.playwright_module
page = browser.page

TINY_QUERIES = 20  # SAM 3 tiny: one instance per query at threshold 0


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("concept-images")
    Image.fromarray(photo("chelsea", 451)).save(root / "chelsea.png")
    return root


@pytest.fixture(scope="module")
def concepts_server(folder) -> Any:
    with serve(
        "--model", "tiny", "--random-weights", "--no-warmup", "--concepts",
        "--sam3-size", "tiny", "--images", str(folder), "--max-concept-boxes", "2",
        env={"SAM2SERVE_API_KEY": API_KEY},
    ) as url:  # fmt: skip
        yield url


def open_page(tab: Any, url: str) -> None:
    tab.goto(f"{url}/")
    tab.evaluate(f"sessionStorage.setItem('sam2serve.apiKey', {json.dumps(API_KEY)})")
    tab.reload()


def rle_mask(segmentation: dict[str, Any]) -> np.ndarray:
    """The server's uncompressed RLE (column-major runs, zeros first) as a bool array."""
    height, width = segmentation["size"]
    flat = np.zeros(height * width, bool)
    position = 0
    for index, run in enumerate(segmentation["counts"]):
        if index % 2:
            flat[position : position + run] = True
        position += run
    assert position == height * width
    return flat.reshape(width, height).T


def answer_of(tab: Any, path: str) -> Any:
    """Playwright's wait for the next answer from ``path`` (its ``.value``)."""
    return tab.expect_response(
        lambda answer: answer.url.endswith(path), timeout=STEP_TIMEOUT_S * 1000
    )


def message(tab: Any) -> str:
    return tab.text_content("#message")


def instance_rows(tab: Any, phrase: str) -> Any:
    return tab.locator(f"#concept-list li:has(.phrase:text-is('{phrase}'))")


def test_concepts_in_the_page_end_to_end(page, concepts_server, tmp_path, monkeypatch):
    tab = page
    # The refused threshold below is a 422 the browser logs: asked for on purpose.
    monkeypatch.setattr(browser, "EXPECTED_STATUSES", (*browser.EXPECTED_STATUSES, "status of 422"))
    requests: list[dict[str, Any]] = []
    tab.on(
        "request",
        lambda request: (
            request.url.endswith(("/v1/concepts", "/v1/segment"))
            and requests.append({"url": request.url, **json.loads(request.post_data)})
        ),
    )
    open_page(tab, concepts_server)
    wait_until(tab, "!document.querySelector('#concepts').hidden")
    wait_until(tab, "document.querySelectorAll('#folder-list li').length === 1")
    with answer_of(tab, "/v1/embeddings") as encoded:
        tab.click("#folder-list li:has-text('chelsea.png')")
    wait_until(tab, "document.body.dataset.image === 'ready'")

    # A threshold the server refuses: its own message (field and bounds), no review.
    tab.fill("#concept-text", "cat")
    tab.fill("#concept-thresh", "2")
    tab.press("#concept-text", "Enter")
    wait_until(tab, "document.querySelector('#message').dataset.level === 'error'")
    refused = message(tab)
    assert "Finding concepts: the server refused it: 422" in refused, refused
    assert "score_thresh" in refused, refused
    assert tab.evaluate("document.querySelector('#concept-review').hidden")

    # "cat, dog" at threshold 0: every instance of both phrases. The image goes once, its
    # answer's image_id is SAM 2.1's id of the same image.
    tab.fill("#concept-thresh", "0")
    tab.fill("#concept-text", " cat, dog ,")
    with answer_of(tab, "/v1/concepts") as concepts:
        tab.click("#concept-find")
    wait_until(tab, "document.body.dataset.concepts === 'review'")
    sent = [r for r in requests if r["url"].endswith("/v1/concepts")][-1]
    assert sent["phrases"] == ["cat", "dog"] and sent["score_thresh"] == 0
    assert sent["image"] and "image_id" not in sent
    answer = concepts.value.json()
    image_id = encoded.value.json()["image_id"]
    assert answer["image_id"] == image_id
    assert [c["phrase"] for c in answer["concepts"]] == ["cat", "dog"]
    found = {c["phrase"]: c["instances"] for c in answer["concepts"]}
    assert len(found["cat"]) == len(found["dog"]) == TINY_QUERIES
    rows = tab.locator("#concept-list li")
    assert rows.count() == 2 * TINY_QUERIES
    assert instance_rows(tab, "cat").count() == TINY_QUERIES
    first_score = f"{found['cat'][0]['score']:.2f}"
    assert tab.locator("#concept-list li.current .phrase").text_content() == "cat"
    assert tab.locator("#concept-list li.current .meta").text_content().startswith(first_score)
    masks = {p: [rle_mask(i["segmentation"]) for i in found[p]] for p in found}
    union = np.logical_or.reduce([m for p in masks for m in masks[p]])
    assert np.array_equal(drawn(tab)[..., 3] > 0, union), "the page drew other masks"
    swatches = tab.evaluate(
        "[...document.querySelectorAll('#concept-list li')].map((li) => "
        "[li.querySelector('.phrase').textContent, li.querySelector('.swatch').style.background])"
    )
    colour_of = {phrase: {c for p, c in swatches if p == phrase} for phrase in found}
    assert len(colour_of["cat"]) == len(colour_of["dog"]) == 1  # a colour per phrase
    assert colour_of["cat"] != colour_of["dog"]

    # ↓ and ↑ move the current instance through the list.
    current = (
        "[...document.querySelectorAll('#concept-list li')]"
        ".findIndex((li) => li.classList.contains('current'))"
    )
    assert tab.evaluate(current) == 0
    tab.keyboard.press("ArrowDown")
    tab.keyboard.press("ArrowDown")
    assert tab.evaluate(current) == 2
    tab.keyboard.press("ArrowUp")
    tab.keyboard.press("ArrowUp")
    assert tab.evaluate(current) == 0

    # Accept the current cat (Enter), reject the next (Del), accept a dog (its ✓ button).
    tab.keyboard.press("Enter")
    wait_until(tab, "document.querySelectorAll('#object-list li').length === 1")
    tab.keyboard.press("Delete")
    dog = found["dog"][3]  # no dog is decided yet: the fourth dog row is the fourth dog
    dog_row = instance_rows(tab, "dog").nth(3)
    assert dog_row.locator(".meta").text_content().startswith(f"{dog['score']:.2f}")
    dog_row.locator("button.accept").click()
    wait_until(tab, "document.querySelectorAll('#object-list li').length === 2")
    assert (
        tab.text_content("#concept-count")
        == f"{2 * TINY_QUERIES - 3} left · 2 accepted · 1 rejected"
    )
    # Undo takes the dog back into the review; accept it again.
    tab.keyboard.press("z")
    wait_until(tab, "document.querySelectorAll('#object-list li').length === 1")
    assert tab.text_content("#concept-count").startswith(f"{2 * TINY_QUERIES - 2} left")
    instance_rows(tab, "dog").nth(3).locator("button.accept").click()
    wait_until(tab, "document.querySelectorAll('#object-list li').length === 2")
    if os.environ.get("SAM2SERVE_CONCEPTS_SCREENSHOT"):
        tab.evaluate("document.querySelector('#side').scrollTop = 0")
        tab.screenshot(path=os.environ["SAM2SERVE_CONCEPTS_SCREENSHOT"])
    tab.click("#concept-done")
    assert tab.evaluate("document.querySelector('#concept-review').hidden")
    names = [tab.locator("#object-list li input.name").nth(i).input_value() for i in range(2)]
    assert names == ["cat", "dog"]
    cat = found["cat"][0]
    assert np.array_equal(object_pixels(tab, 0), masks["cat"][0])
    assert np.array_equal(object_pixels(tab, 1), rle_mask(dog["segmentation"]))

    # Refine the cat with one click inside its box: /v1/segment with its box and the click.
    tab.keyboard.press("1")
    x, y, w, h = cat["bbox"]
    fx, fy = (x + w / 2) / 451, (y + h / 2) / 300
    click_image(tab, fx, fy)
    wait_for_clicks(tab, 1)
    segment = [r for r in requests if r["url"].endswith("/v1/segment")][-1]
    prompt = segment["objects"][0]
    assert prompt["box"] == pytest.approx([x, y, x + w, y + h])
    assert [p["label"] for p in prompt["points"]] == [1]
    assert prompt["points"][0]["x"] == pytest.approx(x + w / 2, abs=1.5)
    assert segment["image_id"] == image_id and segment["multimask_output"] is False
    assert segment["model"] == "sam3"  # SAM 3 found it: SAM 3 refines it
    refined = object_pixels(tab, 0)
    assert refined.any() and not np.array_equal(refined, masks["cat"][0])

    # Another search names the image by its id; nothing scores over 0.99 (random weights).
    tab.fill("#concept-thresh", "0.99")
    tab.fill("#concept-text", "cat")
    with answer_of(tab, "/v1/concepts") as again:
        tab.press("#concept-text", "Enter")
    assert again.value.json()["concepts"] == [{"phrase": "cat", "instances": []}]
    wait_until(tab, "document.querySelector('#message').textContent.includes('No instance')")
    resent = [r for r in requests if r["url"].endswith("/v1/concepts")][-1]
    assert resent["image_id"] == image_id and "image" not in resent
    assert tab.locator("#object-list li").count() == 2
    tab.keyboard.press("Escape")  # out of the text box: keys are shortcuts again

    # COCO export: the phrases are the categories, the masks are the objects'.
    with tab.expect_download() as download:
        tab.keyboard.press("e")
    coco_path = tmp_path / "concepts_coco.json"
    download.value.save_as(coco_path)
    from pycocotools.coco import COCO

    coco = COCO(str(coco_path))
    annotations = coco.loadAnns(coco.getAnnIds())
    categories = [coco.loadCats(a["category_id"])[0]["name"] for a in annotations]
    assert categories == ["cat", "dog"]
    assert sorted(c["name"] for c in coco.loadCats(coco.getCatIds())) == ["cat", "dog"]
    assert np.array_equal(coco.annToMask(annotations[0]).astype(bool), refined)
    assert np.array_equal(
        coco.annToMask(annotations[1]).astype(bool), rle_mask(dog["segmentation"])
    )
    assert annotations[1]["score"] == pytest.approx(dog["score"])


def test_a_server_without_concepts_never_shows_the_panel(page):
    tab = page
    with serve("--model", "tiny", "--random-weights", "--no-warmup") as url:
        open_page(tab, url)
        wait_until(tab, "document.querySelector('#model').textContent.includes('tiny')")
        assert tab.evaluate("document.querySelector('#concepts').hidden")
        tab.keyboard.press("t")
        assert "does not run concepts" in message(tab)


def drag(tab: Any, start: tuple[float, float], end: tuple[float, float], shift: bool = False):
    """A drag on the image from one fraction of it to another (Shift held: negative)."""
    box = tab.locator("#prompts").bounding_box()

    def at(f: tuple[float, float]) -> tuple[float, float]:
        return box["x"] + box["width"] * f[0], box["y"] + box["height"] * f[1]

    if shift:
        tab.keyboard.down("Shift")
    tab.mouse.move(*at(start))
    tab.mouse.down()
    tab.mouse.move(*at(end), steps=5)
    tab.mouse.up()
    if shift:
        tab.keyboard.up("Shift")


def prompt_colours(tab: Any) -> set[str]:
    """Which of the exemplars' colours the prompt layer shows (green, red)."""
    return set(
        tab.evaluate(
            """() => {
                const canvas = document.querySelector("#prompts");
                const data = canvas.getContext("2d").getImageData(0, 0, canvas.width, canvas.height).data;
                const seen = new Set();
                for (let i = 0; i < data.length; i += 4) {
                    const [r, g, b, a] = [data[i], data[i + 1], data[i + 2], data[i + 3]];
                    if (a < 128) continue;  // antialiased edges: their colour, less alpha
                    if (Math.abs(r - 0x22) + Math.abs(g - 0xc5) + Math.abs(b - 0x5e) < 24) seen.add("green");
                    if (Math.abs(r - 0xef) + Math.abs(g - 0x44) + Math.abs(b - 0x44) < 24) seen.add("red");
                }
                return [...seen];
            }"""
        )
    )


def test_exemplar_boxes_in_the_page(page, concepts_server):
    tab = page
    requests: list[dict[str, Any]] = []
    tab.on(
        "request",
        lambda request: (
            request.url.endswith("/v1/concepts") and requests.append(json.loads(request.post_data))
        ),
    )
    open_page(tab, concepts_server)
    wait_until(tab, "!document.querySelector('#concepts').hidden")
    wait_until(tab, "document.querySelectorAll('#folder-list li').length === 1")
    tab.click("#folder-list li:has-text('chelsea.png')")
    wait_until(tab, "document.body.dataset.image === 'ready'")

    # b: exemplar mode; a drag is a positive exemplar, a Shift-drag a negative one.
    tab.keyboard.press("b")
    assert tab.evaluate("document.body.dataset.exemplar") == "on"
    assert prompt_colours(tab) == set()
    drag(tab, (0.1, 0.2), (0.4, 0.7))
    drag(tab, (0.9, 0.9), (0.6, 0.5), shift=True)  # dragged backwards: corners ordered
    rows = tab.locator("#exemplar-list li")
    assert rows.count() == 2
    assert tab.evaluate(
        "[...document.querySelectorAll('#exemplar-list li')].map((li) => li.className)"
    ) == ["positive", "negative"]
    assert prompt_colours(tab) == {"green", "red"}
    assert tab.evaluate("document.querySelectorAll('#object-list li').length") == 0  # no prompt

    # A third is refused: the server takes 2 (its /readyz says so).
    drag(tab, (0.45, 0.1), (0.55, 0.3))
    assert rows.count() == 2
    refused = message(tab)
    assert "at most 2 exemplar boxes" in refused and "max_concept_boxes" in refused, refused
    assert tab.evaluate("document.querySelector('#message').dataset.level") == "error"
    # Remove the negative one (its ✕), draw it again.
    rows.nth(1).locator("button.remove").click()
    assert rows.count() == 1 and prompt_colours(tab) == {"green"}
    drag(tab, (0.9, 0.9), (0.6, 0.5), shift=True)
    assert rows.count() == 2

    # "cat" with both boxes, in image pixels (the image is 451 x 300).
    tab.fill("#concept-thresh", "0")
    tab.fill("#concept-text", "cat")
    with answer_of(tab, "/v1/concepts") as concepts:
        tab.click("#concept-find")
    wait_until(tab, "document.body.dataset.concepts === 'review'")
    sent = requests[-1]
    assert sent["phrases"] == ["cat"]
    assert [b["positive"] for b in sent["boxes"]] == [True, False]
    (positive, negative) = (b["box"] for b in sent["boxes"])
    assert positive == pytest.approx([0.1 * 451, 0.2 * 300, 0.4 * 451, 0.7 * 300], abs=2)
    assert negative == pytest.approx([0.6 * 451, 0.5 * 300, 0.9 * 451, 0.9 * 300], abs=2)
    answer = concepts.value.json()
    assert [c["phrase"] for c in answer["concepts"]] == ["cat"]
    assert tab.locator("#concept-list li").count() == len(answer["concepts"][0]["instances"])
    if os.environ.get("SAM2SERVE_EXEMPLARS_SCREENSHOT"):
        tab.screenshot(path=os.environ["SAM2SERVE_EXEMPLARS_SCREENSHOT"])
    tab.click("#concept-done")

    # The boxes alone: a search too, answered under Meta's stand-in phrase.
    tab.fill("#concept-text", "")
    with answer_of(tab, "/v1/concepts") as alone:
        tab.click("#concept-find")
    wait_until(tab, "document.body.dataset.concepts === 'review'")
    assert requests[-1]["phrases"] == [] and len(requests[-1]["boxes"]) == 2
    assert "image_id" in requests[-1]  # the image went once
    assert [c["phrase"] for c in alone.value.json()["concepts"]] == ["visual"]
    assert tab.locator("#concept-list li .phrase").first.text_content() == "visual"
    tab.click("#concept-done")

    # Esc leaves exemplar mode: a drag is a box prompt again (an object), the exemplars stay.
    tab.keyboard.press("Escape")
    assert tab.evaluate("document.body.dataset.exemplar") == "off"
    drag(tab, (0.2, 0.2), (0.3, 0.3))
    wait_until(tab, "document.querySelectorAll('#object-list li').length === 1")
    assert rows.count() == 2
