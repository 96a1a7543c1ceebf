"""The annotation page's concept prompts, without a browser (the first tier): every page
script parses as an ES module (Node's parser, when Node is installed), every element a
script looks up by id is in index.html, the concepts panel is hidden until /readyz says
the server runs concepts, concepts.js's review (phrases typed, instances decided,
objects made from them) runs under Node on a /v1/concepts-shaped answer, and so do
exemplars.js's exemplar boxes (drawn, bounded by /readyz's limits, sent as the request's
``boxes``). The whole session in Chromium against ``serve --concepts`` is
test_page_concepts_browser.py's."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from sam2serve.server.routes import page

NODE = shutil.which("node")
needs_node = pytest.mark.skipif(NODE is None, reason="node is not installed")
PAGE_DIR = Path(page.__file__).resolve().parents[1] / "page"


def scripts() -> dict[str, str]:
    return {
        name: asset.content.decode("utf-8")
        for name, asset in page.ASSETS.items()
        if name.endswith(".js")
    }


def index_html() -> str:
    return page.ASSETS[page.INDEX].content.decode("utf-8")


@pytest.fixture(scope="module")
def module_dir(tmp_path_factory) -> Path:
    """The page's scripts beside a package.json that makes Node read them as ES modules."""
    root = tmp_path_factory.mktemp("page-modules")
    for name, text in scripts().items():
        (root / name).write_text(text)
    (root / "package.json").write_text('{"type": "module"}')
    return root


def node(module_dir: Path, script: str) -> subprocess.CompletedProcess[str]:
    path = module_dir / "probe.js"
    path.write_text(script)
    return subprocess.run(
        [NODE, str(path)], capture_output=True, text=True, timeout=60, check=False
    )


def check_syntax(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [NODE, "--check", str(path)], capture_output=True, text=True, timeout=60, check=False
    )


@needs_node
def test_every_page_script_parses_as_a_module(module_dir):
    bad = {}
    for name in scripts():
        done = check_syntax(module_dir / name)
        if done.returncode:
            bad[name] = done.stderr[-800:]
    assert not bad, bad
    # The check itself catches a broken module.
    (module_dir / "broken.js").write_text("export const = 1;\n")
    assert check_syntax(module_dir / "broken.js").returncode != 0


def test_every_element_a_script_looks_up_is_in_the_page():
    ids = set(re.findall(r'\bid="([\w-]+)"', index_html()))
    lookup = re.compile(r"""(?:\$|querySelector(?:All)?)\(\s*["'`]#([\w-]+)""")
    missing = {
        name: sorted(set(lookup.findall(text)) - ids)
        for name, text in scripts().items()
        if set(lookup.findall(text)) - ids
    }
    assert not missing, missing
    concept_ids = set(lookup.findall(scripts()["concepts.js"]))
    assert {"concept-form", "concept-text", "concept-thresh", "concept-list"} <= concept_ids


def test_the_concepts_panel_is_hidden_until_the_server_says_it_runs_concepts():
    html = index_html()
    [tag] = re.findall(r'<section id="concepts"[^>]*>', html)
    assert " hidden" in tag and "image-only" in tag
    [form] = re.findall(r'<form id="concept-form".*?</form>', html, re.DOTALL)
    assert 'id="concept-text"' in form and 'type="submit"' in form  # Enter finds
    assert re.search(r'id="concept-thresh"[^>]*value="0.5"', form)  # Meta's default
    # app.js shows it from /readyz's field, and only for exactly true.
    assert "concepts.enable(ready.concepts === true)" in scripts()["app.js"]
    assert 'import { ConceptPanel, segmentBody } from "./concepts.js"' in scripts()["app.js"]


def test_the_fields_the_page_sends_are_the_concepts_requests():
    from sam2serve.server.concept_schemas import ConceptsRequest

    text = scripts()["concepts.js"]
    sent = {"image", "image_id", "phrases", "boxes", "score_thresh", "mask_format"}
    for field in sent:  # a key of an object literal, written out or shorthand
        assert re.search(rf"\b{field}\b\s*:", text) or re.search(
            rf"[{{,]\s*{field}\s*[,}}]", text
        ), field
    assert sent <= set(ConceptsRequest.model_fields)
    assert 'mask_format: "uncompressed_rle"' in text  # what rle.js reads
    ConceptsRequest.model_validate(
        {
            "image_id": "a" * 64,
            "phrases": ["cat"],
            "boxes": [],
            "score_thresh": 0,
            "mask_format": "uncompressed_rle",
        }
    )


REVIEW_PROBE = """
import { ConceptReview, boxOf, parsePhrases } from "./concepts.js";

const rle = (h, w, counts) => ({ size: [h, w], counts });
// A 4 x 4 image (runs column-major): a big "cat" (rows 0-2 of every column, 12 px), a
// small "cat" (1 px at x=3, y=3) and a "dog" (column 0, 4 px).
const answer = {
  concepts: [
    { phrase: "cat", instances: [
      { score: 0.9, bbox: [0, 0, 4, 3], area: 12, segmentation: rle(4, 4, [0, 3, 1, 3, 1, 3, 1, 3, 1]) },
      { score: 0.6, bbox: [3, 3, 1, 1], area: 1, segmentation: rle(4, 4, [15, 1]) },
    ] },
    { phrase: "dog", instances: [
      { score: 0.7, bbox: [0, 0, 1, 4], area: 4, segmentation: rle(4, 4, [0, 4, 12]) },
    ] },
    { phrase: "bird", instances: [] },
  ],
};
const out = {};
out.phrases = parsePhrases(" cat, dog ,, cat,  a red car ,");
out.box = boxOf([10, 20, 30, 40]);
const review = new ConceptReview(answer);
out.counts = review.counts();
out.colours = review.instances.map((i) => i.colour);
const objects = [];
out.first = review.current(objects).phrase + " " + review.current(objects).score;
// Accept the current (big cat): an object named "cat" with its box as the box prompt.
const big = review.current(objects);
const object = ConceptReview.objectOf(big);
objects.push(object);
review.advance(objects, big);
out.object = { name: object.name, box: object.box, score: object.score, points: object.points,
  area: object.mask.counts.filter((_, i) => i % 2).reduce((a, b) => a + b, 0) };
out.afterAccept = review.current(objects).score;
// Reject the small cat; the dog is left, and the click on (3.5, 3.5) finds nothing now.
const small = review.current(objects);
small.rejected = true;
review.advance(objects, small);
out.left = review.undecided(objects).map((i) => i.phrase);
out.atSmall = review.at(objects, 3.5, 3.5);
out.atDog = review.at(objects, 0.5, 3.5)?.phrase ?? null;
// Deleting the accepted object (or undoing it) makes its instance undecided again.
objects.pop();
out.afterUndo = review.undecided(objects).map((i) => `${i.phrase} ${i.score}`);
// Where the big cat and the dog overlap, a click picks the smaller one.
out.overlap = review.at(objects, 0.5, 0.5).phrase;
review.move(objects, -1);
out.moved = [review.current(objects).phrase];
review.move(objects, 5);
out.moved.push(review.current(objects).phrase);
console.log(JSON.stringify(out));
"""


@needs_node
def test_the_concept_review_decides_instances_and_makes_objects(module_dir):
    done = node(module_dir, REVIEW_PROBE)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["phrases"] == ["cat", "dog", "a red car"]
    assert out["box"] == [10, 20, 40, 60]
    assert out["counts"] == [
        {"phrase": "cat", "found": 2},
        {"phrase": "dog", "found": 1},
        {"phrase": "bird", "found": 0},
    ]
    cat, small_cat, dog = out["colours"]
    assert cat == small_cat != dog  # a colour per phrase
    assert out["first"] == "cat 0.9"
    assert out["object"] == {
        "name": "cat",
        "box": [0, 0, 4, 3],
        "score": 0.9,
        "points": [],
        "area": 12,
    }
    assert out["afterAccept"] == 0.6
    assert out["left"] == ["dog"]
    assert out["atSmall"] is None and out["atDog"] == "dog"
    assert out["afterUndo"] == ["cat 0.9", "dog 0.7"]
    assert out["overlap"] == "dog"
    assert out["moved"] == ["cat", "dog"]


def test_the_exemplar_controls_are_wired_in_the_page():
    from sam2serve.server.schemas import Ready

    html = index_html()
    [concepts] = re.findall(r'<section id="concepts".*?</section>', html, re.DOTALL)
    for element_id in ("exemplar-mode", "exemplar-clear", "exemplar-list"):
        assert f'id="{element_id}"' in concepts, element_id  # inside the Concepts box
    exemplars, app, panel = (scripts()[name] for name in ("exemplars.js", "app.js", "concepts.js"))
    assert {"exemplar-mode", "exemplar-clear", "exemplar-list"} <= set(
        re.findall(r"""\$\(\s*["'`]#([\w-]+)""", exemplars)
    )
    assert 'import { ExemplarPanel } from "./exemplars.js"' in panel
    assert "b: () => concepts.exemplars.toggle()" in app  # the key
    assert "concepts.exemplars.setLimits(ready)" in app  # /readyz's limits
    assert "concepts.exemplars.finish(drag)" in app  # a drag in exemplar mode
    # The limits the page reads are /readyz's fields.
    for field in ("max_concept_phrases", "max_concept_boxes"):
        assert field in Ready.model_fields and f"ready?.{field}" in exemplars, field


EXEMPLAR_PROBE = """
import { ExemplarSet, drawExemplars, NEGATIVE_COLOUR, POSITIVE_COLOUR } from "./exemplars.js";
import { describe } from "./concepts.js";

const out = {};
const set = new ExemplarSet();
set.setLimits({ concepts: true, max_concept_phrases: 2, max_concept_boxes: 2 });
out.limits = set.limits;
// Dragged up and to the left, past the 100 x 80 image: corners ordered, clamped, rounded.
out.added = [set.add([90.04, 70.06, 10.01, -5], true, 100, 80)];
out.added.push(set.add([20, 20, 40, 30], false, 100, 80));
out.thin = set.add([5, 5, 5.5, 50], true, 100, 80);
out.third = set.add([1, 1, 9, 9], true, 100, 80);
out.nan = set.add([1, Number.NaN, 9, 9], true, 100, 80);
out.request = set.request();
out.describe = [describe(["cat"], out.request), describe([], out.request), describe(["cat", "dog"], [])];
out.refusals = {
  ok: set.refusal(["cat"]),
  boxesOnly: set.refusal([]),
  phrases: set.refusal(["a", "b", "c"]),
};
set.remove(set.boxes[0].id);
out.afterRemove = set.request();
set.clear();
out.nothing = set.refusal([]);
// A server that did not say its limits (an older one): the page does not guess.
const open = new ExemplarSet();
open.setLimits({ concepts: true, max_concept_boxes: "many" });
for (let i = 0; i < 5; i++) open.add([i, i, i + 10, i + 10], true, 100, 80);
out.unbounded = [open.count, open.limits];
// What is drawn: each box dashed in its colour, a drag in progress too.
const calls = [];
const context = {
  save() {}, restore() {}, fillText() {},
  setLineDash(dash) { calls.push(["dash", dash.length > 0]); },
  strokeRect(x, y, w, h) { calls.push(["rect", this.strokeStyle, [x, y, w, h]]); },
};
drawExemplars(context, [{ box: [1, 2, 11, 22], positive: true }, { box: [0, 0, 5, 5], positive: false }], 1,
  { x0: 30, y0: 30, x1: 20, y1: 25, label: 0 });
out.drawn = calls;
console.log(JSON.stringify({ ...out, colours: [POSITIVE_COLOUR, NEGATIVE_COLOUR] }));
"""


@needs_node
def test_exemplar_boxes_are_drawn_bounded_and_sent(module_dir):
    from sam2serve.server.concept_schemas import ConceptsRequest

    done = node(module_dir, EXEMPLAR_PROBE)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["limits"] == {"phrases": 2, "boxes": 2}
    assert out["added"] == [None, None]
    assert "width and height" in out["thin"]
    assert "at most 2 exemplar boxes" in out["third"] and "max_concept_boxes" in out["third"]
    assert "four numbers" in out["nan"]
    assert out["request"] == [
        {"box": [10, 0, 90, 70.1], "positive": True},
        {"box": [20, 20, 40, 30], "positive": False},
    ]
    assert out["describe"] == [
        '"cat" with 2 exemplar boxes (1 negative)',
        "the concept of 2 exemplar boxes (1 negative)",
        '"cat", "dog"',
    ]
    assert out["refusals"]["ok"] is None and out["refusals"]["boxesOnly"] is None
    assert "3 phrases" in out["refusals"]["phrases"]
    assert "max_concept_phrases" in out["refusals"]["phrases"]
    assert out["afterRemove"] == [{"box": [20, 20, 40, 30], "positive": False}]
    assert "draw an exemplar box (b)" in out["nothing"]
    assert out["unbounded"] == [5, {"phrases": None, "boxes": None}]
    positive, negative = out["colours"]
    rects = [call[1:] for call in out["drawn"] if call[0] == "rect"]
    assert rects == [
        [positive, [1, 2, 10, 20]],
        [negative, [0, 0, 5, 5]],
        [negative, [20, 25, 10, 5]],  # a Shift-drag in progress: negative
    ]
    assert ["dash", True] in out["drawn"]
    # What the page sends is a request the server takes: boxes alone are a search.
    ConceptsRequest.model_validate(
        {"image_id": "a" * 64, "phrases": [], "boxes": out["request"], "score_thresh": 0.5}
    )


SEGMENT_PROBE = """
import { ConceptReview, segmentBody } from "./concepts.js";

// base64Of reads the blob with the browser's FileReader: a stand-in answers "QUJD".
globalThis.FileReader = class {
  readAsDataURL() { this.result = "data:image/png;base64,QUJD"; this.onload(); }
};
const instance = { id: 7, phrase: "cat", colour: "#fff", mask: null, score: 0.9, box: [1, 2, 3, 4] };
const object = ConceptReview.objectOf(instance);
const prompt = { points: [{ x: 2, y: 3, label: 1 }], box: object.box };
const image = { imageId: "a".repeat(64), conceptsId: "b".repeat(64), blob: null };
const out = {
  model: object.model,
  sam2: await segmentBody(image, prompt, true, undefined),
  sam3: await segmentBody(image, prompt, false, object.model),
  sam3Evicted: await segmentBody({ ...image, conceptsId: null }, prompt, false, object.model),
};
console.log(JSON.stringify(out));
"""


@needs_node
def test_an_object_sam3_found_is_refined_by_sam3(module_dir):
    """An accepted instance's clicks go to /v1/segment with model "sam3" and the id of the
    image's SAM 3 encoding (the image itself once the server has none); any other object's
    to SAM 2.1 by its embedding's id. Every body is a valid SegmentRequest."""
    from sam2serve.server.schemas import SegmentRequest

    done = node(module_dir, SEGMENT_PROBE)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["model"] == "sam3"
    assert out["sam2"]["image_id"] == "a" * 64 and "model" not in out["sam2"]
    assert out["sam3"]["image_id"] == "b" * 64 and out["sam3"]["model"] == "sam3"
    assert out["sam3Evicted"]["image"] == "QUJD" and "image_id" not in out["sam3Evicted"]
    for body in (out["sam2"], out["sam3"], out["sam3Evicted"]):
        SegmentRequest.model_validate(body)
    assert out["sam3"]["multimask_output"] is False
    app = scripts()["app.js"]
    assert "segment(prompt, multimask, object.model)" in app
