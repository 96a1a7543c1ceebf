"""The video page's "Refine with SAM 3", without a browser (the first tier): clicks on
objects SAM 3 found are kept per object and frame (video_refine.js), and under Node the
page's own modules send them through POST /v1/videos/{id}/concepts/track as the route
takes them (one phrase as `text`, the search's first frame and threshold, clicks in the
video's pixels with their labels), read the stream where a frame comes more than once (its
last answer replaces the earlier ones), refuse clicks on several phrases before sending
("refine one phrase at a time"), and throw the route's 4xx with its code and message (the
page's error line says it). The button, the key and the help are in the page."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
import test_page_concepts as concept_page
from test_page_concepts import index_html, needs_node, node, scripts
from test_page_video_concepts import done, events, found, rle

module_dir = concept_page.module_dir

# From frame 1 (the search's): the pass over frames 1-3, the click's frame 1, then Meta's
# partial pass over frames 1-3 again (object 3 lost on frame 3 there).
PASS = [
    ("frame", {"frame_idx": 1, "objects": [found(2, 0), found(3, 5)]}),
    ("frame", {"frame_idx": 2, "objects": [found(2, 0), found(3, 5)]}),
    ("frame", {"frame_idx": 3, "objects": [found(2, 0), found(3, 5)]}),
]
CLICK = [("frame", {"frame_idx": 1, "objects": [found(2, 0, 1), found(3, 5)]})]
REPASS = [
    ("frame", {"frame_idx": 1, "objects": [found(2, 0, 1, 2), found(3, 4, 5)]}),
    ("frame", {"frame_idx": 2, "objects": [found(2, 1), found(3, 4)]}),
    ("frame", {"frame_idx": 3, "objects": [found(2, 1, 2)]}),
]
REFINED = events(*PASS, *CLICK, *REPASS, ("done", {**done(7), "clicks_applied": 2}))

PROBE = """
import { Api } from "./api.js";
import { VideoSession } from "./video.js";
import { adopt } from "./video_objects.js";
import { addClick, clicked, refinement, MAX_POINTS } from "./video_refine.js";
import { area } from "./rle.js";

const streams = %(streams)s;
const sent = [];
const api = {
  retrying: (attempt) => attempt(),
  stream: async (method, path, { json }) => {
    sent.push({ method, path, json });
    return new Response(streams.shift());
  },
};
const session = new VideoSession(api, { session_id: "s1", num_frames: 4, width: 3, height: 2 }, "clip.mp4");
const pixels = (frame) =>
  Object.fromEntries([...session.masks[frame]].map(([id, mask]) => [id, area(mask)]));
const out = {};

// A search for "cat" (from frame 1) found 2 and 3; one for "dog" found 5.
const player = { objects: [], nextId: 1, activeId: null };
adopt(player, %(cat)s, "cat");
adopt(player, %(dog)s, "dog");
const [two, three, dog] = player.objects;
const searches = new Map([["cat", { start: 1, thresh: 0 }], ["dog", { start: 0, thresh: null }]]);

out.none = refinement(player.objects, searches);
out.added = [
  addClick(player.objects, two, 1, { x: 1.5, y: 0.5, label: 1 }),
  addClick(player.objects, two, 1, { x: 2.25, y: 1, label: 0 }),
  addClick(player.objects, three, 2, { x: 0, y: 2, label: 1 }),
  // another phrase's object while "cat"'s clicks wait: refused before anything is sent
  addClick(player.objects, dog, 0, { x: 1, y: 1, label: 1 }),
];
out.dogClicks = dog.refine ?? null;
out.clicked = clicked(player.objects).map((object) => object.id);
const request = refinement(player.objects, searches);
out.request = request;

// Several phrases' clicks (as a page that kept them would have): refused before sending.
dog.refine = new Map([[0, [{ x: 1, y: 1, label: 1 }]]]);
out.several = refinement(player.objects, searches);
dog.refine = null;
out.unsearched = refinement(player.objects, new Map());
const full = { ...two, refine: new Map([[0, Array(MAX_POINTS).fill({ x: 0, y: 0, label: 1 })]]) };
out.early = addClick(player.objects, two, 0, { x: 1, y: 1, label: 1 }, 1);
out.tooMany = addClick([full], full, 0, { x: 0, y: 0, label: 1 });

// The refinement streamed: frames 1-3, the click's frame 1, frames 1-3 again.
const accepted = [];
const events = [];
out.done = await session.trackConcept({
  text: request.phrase,
  start: request.start,
  scoreThresh: request.thresh,
  clicks: request.clicks,
  onAccepted: () => accepted.push(true),
  onFrame: (frameIdx, count) => {
    events.push([frameIdx, count]);
    if (events.length === 4) out.afterClick = pixels(1);
  },
});
out.sent = sent;
out.events = events;
out.accepted = accepted.length;
out.pixels = [0, 1, 2, 3].map(pixels);
out.mask1 = Array.from(session.masks[1].get(2).counts);

// The route's 4xx (a real Api over a fetch that answers 409): thrown with its code and
// message, before anything is accepted.
globalThis.sessionStorage = { getItem: () => null };
globalThis.fetch = async () =>
  new Response(JSON.stringify({ error: { code: "click_object", message: "clicks[0].obj_id 5 is an object of phrase 'dog'" } }),
    { status: 409, headers: { "content-type": "application/json" } });
const refused = new VideoSession(new Api(), { session_id: "s2", num_frames: 4, width: 3, height: 2 }, "clip.mp4");
let acceptedRefused = false;
try {
  await refused.trackConcept({ text: "cat", start: 1, clicks: request.clicks,
    onAccepted: () => { acceptedRefused = true; }, onFrame: () => {} });
} catch (error) {
  out.error = { code: error.code, status: error.status, described: error.describe() };
}
out.acceptedRefused = acceptedRefused;
console.log(JSON.stringify(out));
"""


@pytest.fixture(scope="module")
def probed(module_dir) -> dict[str, Any]:
    script = PROBE % {
        "streams": json.dumps([REFINED]),
        "cat": json.dumps([found(2, 0), found(3, 5)]),
        "dog": json.dumps([found(5, 1, name="dog", phrase="dog")]),
    }
    ran = node(module_dir, script)
    assert ran.returncode == 0, ran.stderr
    return json.loads(ran.stdout)


@needs_node
def test_the_clicks_go_to_the_route_with_the_searchs_phrase_frame_and_threshold(probed):
    from sam2serve.server.video_schemas import ConceptTrackRequest

    assert probed["added"][:3] == [None, None, None]
    assert probed["clicked"] == [2, 3]
    assert probed["request"] == {
        "phrase": "cat",
        "start": 1,
        "thresh": 0,
        "clicks": [
            {"frame_idx": 1, "obj_id": 2, "points": [[1.5, 0.5], [2.25, 1]], "labels": [1, 0]},
            {"frame_idx": 2, "obj_id": 3, "points": [[0, 2]], "labels": [1]},
        ],
    }
    [body] = probed["sent"]
    assert body["path"] == "/v1/videos/s1/concepts/track"
    assert body["json"] == {
        "text": "cat",
        "frame_idx": 1,
        "mask_format": "uncompressed_rle",
        "score_thresh": 0,
        "clicks": probed["request"]["clicks"],
    }
    assert "max_frames" not in body["json"]  # the route's clicks need the pass to the end
    ConceptTrackRequest.model_validate(body["json"])
    assert probed["done"]["clicks_applied"] == 2


@needs_node
def test_a_frame_answered_again_replaces_its_earlier_masks(probed):
    assert probed["accepted"] == 1
    assert probed["events"] == [[f, n] for n, f in enumerate([1, 2, 3, 1, 1, 2, 3], 1)]
    assert probed["afterClick"] == {"2": 2, "3": 1}  # the click's answer replaced the pass's
    # The last answers: the partial pass's (3 ended on frame 3 there: no mask left).
    assert probed["pixels"] == [{}, {"2": 3, "3": 2}, {"2": 1, "3": 1}, {"2": 2}]
    assert probed["mask1"] == rle(0, 1, 2)["counts"]


@needs_node
def test_clicks_on_several_phrases_are_refused_before_sending(probed):
    refused = probed["added"][3]
    assert refused.startswith('refine one phrase at a time: clicks on "cat" wait')
    assert probed["dogClicks"] is None  # the refused click is not kept
    assert probed["several"] == {
        "error": 'refine one phrase at a time: clicks on objects of "cat", "dog"'
    }
    assert len(probed["sent"]) == 1  # only the one-phrase refinement went
    assert probed["none"]["error"].startswith("click an object SAM 3 found first")
    assert probed["unsearched"] == {"error": 'find "cat" again first'}
    assert probed["tooMany"] == "at most 16 clicks on one object on one frame"
    assert probed["early"] == 'click on frame 1 or later: the search for "cat" started there'
    # The player says the refusal in the error line and sends nothing.
    player = scripts()["player.js"]
    assert 'if (error) return this.say(`Not refined: ${error}.`, "error");' in player


@needs_node
def test_the_routes_refusal_is_thrown_with_its_code_and_message(probed):
    assert probed["error"] == {
        "code": "click_object",
        "status": 409,
        "described": "409 click_object: clicks[0].obj_id 5 is an object of phrase 'dog'",
    }
    assert probed["acceptedRefused"] is False  # the objects and their clicks stay


def test_the_refine_button_key_and_help_are_in_the_page():
    html = index_html()
    [section] = re.findall(r'<section id="video-concepts".*?</section>', html, re.DOTALL)
    assert re.search(
        r'<button id="video-concept-refine"[^>]*>Refine with SAM 3 <kbd>g</kbd>', section
    )
    assert "SAM 2.1's video prompts" in section and "Alt+click" in section
    [keys] = re.findall(r'<table id="video-shortcuts".*?</table>', html, re.DOTALL)
    assert re.search(r"<kbd>g</kbd></td><td>on an object SAM 3 found: a click for SAM 3", keys)
    assert "<td>Alt+click</td><td>on an object SAM 3 found: hand it to SAM 2.1" in keys
    player = scripts()["player.js"]
    assert "g: () => this.refine()," in player
    assert player.count("new StreamRun(") == 3  # the refinement is a streamed run too
    assert "sam2: drag.sam2" in scripts()["app.js"]  # Alt+click hands over


# The player over stand-ins: every element and the canvas absorb what is done to them.
PLAYER_PROBE = """
const stub = () => new Proxy(function () {}, {
  get: (t, k) => (k === Symbol.toPrimitive ? () => 0 : k === "then" ? undefined : k in t ? t[k] : stub()),
  apply: () => stub(),
  set: (t, k, v) => { t[k] = v; return true; },
});
const elements = new Map();
const el = (id) => {
  if (!elements.has(id)) { const e = stub(); e.dataset = {}; elements.set(id, e); }
  return elements.get(id);
};
globalThis.window = globalThis;
globalThis.document = { querySelector: el, body: { dataset: { mode: "video" } }, activeElement: null };
globalThis.createImageBitmap = async () => stub();
const { ApiError } = await import("./api.js");
const { Player } = await import("./player.js");
const { VideoSession } = await import("./video.js");

const streams = %(streams)s;
const said = [];
const sent = [];
const called = [];
const api = {
  retrying: (attempt) => attempt(),
  stream: async (method, path, { json }) => {
    sent.push(json);
    const next = streams.shift();
    if (next === null) throw new ApiError(409, "click_object", "clicks[0].obj_id 1 is not SAM 3's");
    return new Response(next);
  },
  call: async (method, path, { json } = {}) => {
    called.push([method, path]);
    if (method !== "POST") return {};
    const segmentation = { size: [2, 3], counts: [0, 2, 4] };
    const object = { obj_id: json.obj_id, name: json.name ?? null, area: 2, bbox: [0, 0, 1, 2], segmentation };
    return { frame_idx: json.frame_idx, objects: [object] };
  },
};
const stage = stub();
stage.width = 3;
stage.scale = 1;
const player = new Player({
  api, stage,
  say: (text, level) => said.push([text, level ?? null]),
  fail: (error, what) => said.push([`${what}: ${error.describe?.() ?? error}`, "error"]),
  busyNotice: () => () => {}, setState: () => {},
});
player.session = new VideoSession(api, { session_id: "s", num_frames: 3, width: 3, height: 2 }, "c.mp4");
const out = {};
const refineDisabled = () => el("#video-concept-refine").disabled;
const click = (id, frame, point, sam2 = false) => {
  player.activeId = id;
  player.current = frame;
  player.addPrompt({ point, sam2 });
  return said.at(-1);
};

player.current = 1;
await player.findInVideo("cat, dog", "0.1");
out.refineBefore = refineDisabled();
out.early = click(1, 0, { x: 1, y: 1, label: 1 });
click(1, 1, { x: 1, y: 1, label: 1 });
out.kept = click(1, 1, { x: 2.5, y: 0.5, label: 0 });
out.otherPhrase = click(2, 1, { x: 1, y: 1, label: 1 });
out.refineReady = refineDisabled();
out.sentBefore = sent.length;

// The route refuses (a 4xx): said in the error line, the clicks stay.
player.activeId = 1;
await player.refine();
out.refused = said.at(-1);
out.clicksAfterRefusal = player.objects[0].refine?.get(1)?.length ?? 0;

await player.refine();
out.sent = sent;
out.done = said.at(-1);
out.objects = player.objects.map((o) => [o.id, o.phrase, o.tracker, o.refine ?? null]);
out.active = player.activeId;
out.refineAfter = refineDisabled();
out.state = document.body.dataset.video;

// Clicks on both phrases' objects (as a page that kept them would have): said, not sent.
player.objects[0].refine = new Map([[1, [{ x: 1, y: 1, label: 1 }]]]);
player.objects[1].refine = new Map([[2, [{ x: 1, y: 1, label: 1 }]]]);
const before = sent.length;
await player.refine();
out.several = said.at(-1);
out.severalSent = sent.length - before;

// Alt+click on a found object: handed to SAM 2.1 (SAM 3's object dropped, then prompts).
click(1, 1, { x: 1, y: 1, label: 1 }, true);
await player.queue;
out.handOver = called.filter(([method]) => method !== "GET");
out.handedOver = [player.objects[0].tracker, player.objects[0].refine];
out.last = said.at(-1);
console.log(JSON.stringify(out));
"""


def frame_event(frame_idx: int, *objects: dict[str, Any]) -> tuple[str, Any]:
    return ("frame", {"frame_idx": frame_idx, "objects": list(objects)})


@pytest.fixture(scope="module")
def played(module_dir) -> dict[str, Any]:
    cat, dog = found(1, 0, phrase="cat"), found(2, 1, name="dog", phrase="dog")
    search = events(frame_event(1, cat, dog), frame_event(2, cat, dog), ("done", done(2)))
    refined = events(
        frame_event(1, cat),
        frame_event(2, cat),
        frame_event(1, found(1, 0, 1, phrase="cat")),
        frame_event(1, found(1, 0, 1, 3, phrase="cat")),
        frame_event(2, found(1, 2, phrase="cat")),
        # the server's objects after the refinement (the final answers'): cat is kept
        (
            "done",
            {
                **done(5),
                "clicks_applied": 2,
                "objects": [{"obj_id": 1, "name": "cat", "first_frame": 1, "last_frame": 2}],
            },
        ),
    )
    ran = node(module_dir, PLAYER_PROBE % {"streams": json.dumps([search, None, refined])})
    assert ran.returncode == 0, ran.stderr
    return json.loads(ran.stdout)


@needs_node
def test_the_player_keeps_clicks_on_a_found_object_and_refines_them(played):
    assert played["refineBefore"] is True and played["refineReady"] is False
    assert played["early"] == [
        'Click not kept: click on frame 1 or later: the search for "cat" started there.',
        "error",
    ]
    assert played["kept"][0].startswith("cat: clicks for SAM 3 on frame 1; g (Refine with SAM 3)")
    assert played["otherPhrase"] == [
        'Click not kept: refine one phrase at a time: clicks on "cat" wait (g: refine them first).',
        "error",
    ]
    assert played["sentBefore"] == 1  # the search only
    find, refused, refine = played["sent"]
    assert find["phrases"] == ["cat", "dog"] and find["score_thresh"] == 0.1
    clicks = [{"frame_idx": 1, "obj_id": 1, "points": [[1, 1], [2.5, 0.5]], "labels": [1, 0]}]
    assert (
        refused
        == refine
        == {
            "text": "cat",
            "frame_idx": 1,
            "mask_format": "uncompressed_rle",
            "score_thresh": 0.1,
            "clicks": clicks,
        }
    )
    assert played["refused"] == [
        'Refining "cat" with SAM 3: 409 click_object: clicks[0].obj_id 1 is not SAM 3\'s',
        "error",
    ]
    assert played["clicksAfterRefusal"] == 2
    assert played["done"][0].startswith(
        'Refined "cat" with SAM 3 (2 clicks applied, on 1 object) from frame 1: 5 frames in'
    )
    # The list keeps its order and the selected object; the clicks went with the run.
    assert played["objects"] == [[1, "cat", "sam3", None], [2, "dog", "sam3", None]]
    assert played["active"] == 1
    assert played["refineAfter"] is True and played["state"] == "ready"


@needs_node
def test_the_player_says_refine_one_phrase_at_a_time_before_sending(played):
    assert played["several"] == [
        'Not refined: refine one phrase at a time: clicks on objects of "cat", "dog".',
        "error",
    ]
    assert played["severalSent"] == 0


@needs_node
def test_alt_click_still_hands_a_found_object_to_sam2(played):
    drop, seed, prompt = played["handOver"]
    assert drop == ["DELETE", "/v1/videos/s/objects/1"]
    assert seed == prompt == ["POST", "/v1/videos/s/prompts"]
    assert played["handedOver"] == ["sam2.1", None]
    assert played["last"] == ["", None]  # the click's answer came: the status line cleared
