"""The video page's "Find in video", without a browser (the first tier): the form is in the
page (hidden until /readyz says concepts, shown in video mode only, its key in the key
table), and under Node the page's own modules read a concept track's event stream as the
server sends it (POST /v1/videos/{id}/concepts/track): every frame's objects kept beside
the other objects' masks, an object the stream leaves out (ended) without a mask there,
found objects listed under the server's ids and names (an unprompted object of the page's
under such an id moved aside), their names in the export's body, the route's error event
thrown with its code and message, a stream cut short said, the typed phrase and threshold
checked. Propagation shares the stream reader and the run's progress and Stop: its frames
still replace the objects it answers for. The session in Chromium against a real server is
test_page_video_concepts_browser.py's."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
import test_page_concepts as concept_page
from test_page_concepts import index_html, needs_node, node, scripts

# The page's scripts as Node modules: the image page's concept tests' fixture.
module_dir = concept_page.module_dir

H, W = 2, 3  # frames of 2 x 3 pixels: a mask is 6 pixels, column-major runs


def rle(*pixels: int) -> dict[str, Any]:
    """The uncompressed RLE of the mask holding the given column-major pixel indices."""
    bits = [i in pixels for i in range(H * W)]
    counts, value, run = [], False, 0
    for bit in bits:
        if bit != value:
            counts.append(run)
            value, run = bit, 0
        run += 1
    counts.append(run)
    return {"size": [H, W], "counts": counts}


def found(
    obj_id: int, *pixels: int, name: str | None = "cat", phrase: str | None = None
) -> dict[str, Any]:
    """An object of a frame event, in the server's own shape (its schema's dump)."""
    from sam2serve.server.video_schemas import ConceptTrackObjectOut

    return ConceptTrackObjectOut(
        obj_id=obj_id,
        name=name,
        phrase=phrase,
        score=0.9,
        area=len(pixels),
        bbox=[0, 0, 1, 1],
        segmentation=rle(*pixels),
    ).model_dump()


def events(*blocks: tuple[str, Any]) -> str:
    return "".join(f"event: {event}\ndata: {json.dumps(data)}\n\n" for event, data in blocks)


def done(frames: int) -> dict[str, Any]:
    """A concept track's done event, in the server's shape."""
    from sam2serve.server.video_schemas import ConceptTrackDone

    return ConceptTrackDone(
        frames=frames,
        elapsed_ms=1500.0,
        frames_per_s=2.0,
        stage_seconds={"detector": 1.0, "tracker": 0.4, "association": 0.1},
        objects=[],
        dropped_objects=0,
        score_thresh=0.0,
        new_object_thresh=0.2,
        max_objects=8,
    ).model_dump()


DONE = done(3)
# From frame 1: objects 2 and 3 on frame 1, 3 lost on frame 2, a new 4 on frame 3.
TRACK = events(
    ("frame", {"frame_idx": 1, "objects": [found(2, 0), found(3, 5)]}),
    ("frame", {"frame_idx": 2, "objects": [found(2, 0, 1)]}),
    ("frame", {"frame_idx": 3, "objects": [found(2, 1), found(4, 4)]}),
    ("done", DONE),
)
# A propagation of object 1 (SAM 2.1's) before the search: frames 0-3.
PROPAGATION = events(
    *(("frame", {"frame_idx": f, "objects": [found(1, 2, name=None)]}) for f in range(4)),
    ("done", {"frames": 4, "elapsed_ms": 2000.0, "frames_per_s": 2.0}),
)
# Two phrases: each object says which found it.
MULTI = events(
    (
        "frame",
        {
            "frame_idx": 0,
            "objects": [found(8, 0, phrase="cat"), found(9, 1, name="dog", phrase="dog")],
        },
    ),
    ("done", DONE),
)
FAILED = events(
    ("frame", {"frame_idx": 0, "objects": [found(7, 3)]}),
    ("error", {"error": {"code": "concepts_failed", "message": "SAM 3 ran out of room"}}),
)

PROBE = """
import { VideoSession } from "./video.js";
import { adopt, foundBefore, objectOf } from "./video_objects.js";
import { StreamRun, summary } from "./stream_run.js";
import { checkPhrases, checkThreshold, quoted } from "./video_concepts.js";
import { area } from "./rle.js";

const streams = %(streams)s;
const sent = [];
const called = [];
const api = {
  retrying: (attempt) => attempt(),
  stream: async (method, path, { json }) => {
    sent.push({ method, path, json });
    return new Response(streams.shift());
  },
  // DELETE .../objects/{id}, and SAM 2.1's answer to a mask prompt (object 3's mask).
  call: async (method, path, { json } = {}) => {
    called.push({ method, path, json });
    if (method === "DELETE") return { objects: [] };
    return { frame_idx: json.frame_idx, objects: [
      { obj_id: json.obj_id, name: json.name ?? null, area: 2, bbox: [0, 0, 1, 2],
        segmentation: { size: [2, 3], counts: [0, 2, 4] } },
    ] };
  },
};
const session = new VideoSession(api, { session_id: "s 1", num_frames: 4, width: 3, height: 2 }, "clip.mp4");
const pixels = (frame) =>
  Object.fromEntries([...session.masks[frame]].map(([id, mask]) => [id, area(mask)]));
const out = { frames: [] };

await session.propagate({ start: 0, reverse: false, onFrame: () => {} });
// The page's player: object 1 (clicked, tracked), and an object made with n, never
// prompted, under an id the server gives the search.
const player = {
  objects: [objectOf(1, { onServer: true }), objectOf(3)],
  nextId: 4,
  activeId: 3,
};
const adopted = [];
out.done = await session.trackConcept({
  text: "cat",
  start: 1,
  scoreThresh: 0,
  onAccepted: () => out.frames.push("accepted"),
  onFrame: (frameIdx, count, objects) => {
    out.frames.push([frameIdx, count]);
    adopted.push(...adopt(player, objects, "cat").map((o) => o.id));
  },
});
out.sent = sent;
out.pixels = [0, 1, 2, 3].map(pixels);
out.tracked = session.tracked.map((ids) => [...ids].sort());
out.adopted = adopted;
out.player = {
  objects: player.objects.map((o) => [o.id, o.name, o.onServer, o.tracker, o.phrase]),
  nextId: player.nextId,
  activeId: player.activeId,
};
const exported = player.objects.filter((o) => session.framesWith(o.id) > 0);
out.exported = session.exportBody("coco", exported);
out.framesWith = Object.fromEntries(player.objects.map((o) => [o.id, session.framesWith(o.id)]));
out.foundBefore = foundBefore(player.objects, "cat").map((o) => o.id);

// A click on object 3 on frame 1: SAM 3's object is dropped on the server, its mask there
// becomes SAM 2.1's mask prompt; on frame 2 (no mask of 3 there) nothing is sent but the
// drop.
out.handedOver = await session.handOver(1, 3, "cat");
out.handOverCalls = called.splice(0);
out.afterHandOver = pixels(1);
out.noMask = await session.handOver(2, 3, "cat");
out.noMaskCalls = called.splice(0);

try {
  await session.trackConcept({ text: "dog", start: 0, onFrame: () => {} });
} catch (error) {
  out.error = { name: error.constructor.name, code: error.code, message: error.message,
    described: error.describe() };
}
out.afterError = pixels(0);
try {
  await session.trackConcept({ text: "dog", start: 0, onFrame: () => {} });
} catch (error) {
  out.cut = error.describe();
}

out.multiAdopted = [];
await session.trackConcept({
  phrases: ["cat", "dog"],
  start: 0,
  onFrame: (frameIdx, count, objects) => {
    out.multiAdopted.push(...adopt(player, objects, "cat").map((o) => [o.id, o.name, o.phrase]));
  },
});
out.quoted = [quoted(["cat"]), quoted(["cat", "red car"])];

const run = new StreamRun({ doing: 'Finding "cat"', noun: 'Search for "cat"', state: "finding", expected: 3 });
run.received = 2;
run.detail = " · 3 found";
out.run = { progress: run.progress(), stopped: run.stopped(), the: run.the(), state: run.state };
run.stop();
out.run.aborted = run.signal.aborted;
out.summary = summary({ frames: 3, elapsed_ms: 1500, frames_per_s: 2 });

out.phrases = ["cat", "  red car ", "cat, dog", "", "   ", "x".repeat(65), "a\\u0007b", "\\u202Ecat",
  " cat,, dog ,cat", "cat, a\\u0007b"]
  .map(checkPhrases);
out.thresholds = ["", " 0 ", "0.25", "1.5", "-0.1", "abc"].map(checkThreshold);
console.log(JSON.stringify(out));
"""


@pytest.fixture(scope="module")
def probed(module_dir) -> dict[str, Any]:
    cut = events(("frame", {"frame_idx": 0, "objects": []}))
    streams = [PROPAGATION, TRACK, FAILED, cut, MULTI]
    done = node(module_dir, PROBE % {"streams": json.dumps(streams)})
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@needs_node
def test_a_concept_track_is_asked_for_from_the_frame_shown(probed):
    propagate, track, *_ = probed["sent"]
    assert propagate["path"] == "/v1/videos/s%201/propagate"
    assert track == {
        "method": "POST",
        "path": "/v1/videos/s%201/concepts/track",
        "json": {
            "text": "cat",
            "frame_idx": 1,
            "mask_format": "uncompressed_rle",
            "score_thresh": 0,
        },
    }
    assert "max_frames" not in track["json"]  # the server's default: to the last frame
    # The search for "dog" names no threshold: the server's default.
    assert probed["sent"][2]["json"] == {
        "text": "dog",
        "frame_idx": 0,
        "mask_format": "uncompressed_rle",
    }
    assert probed["frames"] == ["accepted", [1, 1], [2, 2], [3, 3]]
    assert probed["done"] == DONE
    from sam2serve.server.video_schemas import ConceptTrackRequest, PropagateRequest

    ConceptTrackRequest.model_validate(track["json"])
    ConceptTrackRequest.model_validate(probed["sent"][2]["json"])
    PropagateRequest.model_validate(propagate["json"])


@needs_node
def test_each_frames_objects_are_kept_beside_the_others_and_ended_ones_have_no_mask(probed):
    # Object 1 (the propagation's) keeps its mask on every frame; 3 ends after frame 1;
    # 4 appears on frame 3.
    assert probed["pixels"] == [
        {"1": 1},  # before the search's first frame
        {"1": 1, "2": 1, "3": 1},
        {"1": 1, "2": 2},
        {"1": 1, "2": 1, "4": 1},
    ]
    assert probed["tracked"][1:] == [[1, 2, 3], [1, 2], [1, 2, 4]]


@needs_node
def test_found_objects_are_listed_under_the_servers_ids_and_names(probed):
    assert probed["adopted"] == [2, 3, 4]
    # The page's unprompted object 3 moved to a free id (the active one still), after 4.
    assert probed["player"] == {
        "objects": [
            [1, None, True, "sam2.1", None],
            [5, None, False, "sam2.1", None],
            [2, "cat", True, "sam3", "cat"],
            [3, "cat", True, "sam3", "cat"],
            [4, "cat", True, "sam3", "cat"],
        ],
        "nextId": 6,
        "activeId": 5,
    }
    assert probed["framesWith"] == {"1": 4, "5": 0, "2": 3, "3": 1, "4": 1}
    # A new search for "cat" replaces these three on the server: the page drops them.
    assert probed["foundBefore"] == [2, 3, 4]


@needs_node
def test_a_found_object_is_handed_to_sam2_with_its_mask_on_the_clicked_frame(probed):
    """SAM 2.1 does not prompt an object SAM 3 reported (409 concept_track_id): the first
    click drops SAM 3's object, then its mask on the frame is SAM 2.1's mask prompt."""
    from sam2serve.server.video_schemas import VideoPromptRequest

    drop, seed = probed["handOverCalls"]
    assert drop == {"method": "DELETE", "path": "/v1/videos/s%201/objects/3"}
    assert seed["method"] == "POST" and seed["path"] == "/v1/videos/s%201/prompts"
    assert seed["json"] == {
        "frame_idx": 1,
        "obj_id": 3,
        "mask": rle(5),  # SAM 3's mask of object 3 on frame 1
        "mask_format": "uncompressed_rle",
        "name": "cat",
    }
    VideoPromptRequest.model_validate(seed["json"])
    assert probed["handedOver"]["objects"][0]["obj_id"] == 3
    assert probed["afterHandOver"] == {"1": 1, "2": 1, "3": 2}  # SAM 2.1's answer kept
    # No mask of object 3 on frame 2 (it ended): only the drop; the click makes it.
    assert probed["noMask"] is None
    assert [c["method"] for c in probed["noMaskCalls"]] == ["DELETE"]


@needs_node
def test_the_export_carries_the_phrase_as_the_found_objects_name(probed):
    body = probed["exported"]
    assert body["objects"] == [
        {"obj_id": 1, "name": "object 1"},
        {"obj_id": 2, "name": "cat"},
        {"obj_id": 3, "name": "cat"},
        {"obj_id": 4, "name": "cat"},
    ]
    by_frame = {f["frame_idx"]: [o["obj_id"] for o in f["objects"]] for f in body["frames"]}
    assert by_frame == {0: [1], 1: [1, 2, 3], 2: [1, 2], 3: [1, 2, 4]}


@needs_node
def test_the_routes_error_event_is_thrown_with_its_code_and_message(probed):
    assert probed["error"] == {
        "name": "ApiError",
        "code": "concepts_failed",
        "message": "SAM 3 ran out of room",
        "described": "500 concepts_failed: SAM 3 ran out of room",
    }
    # The frame that came before the error is kept (as a stopped run's are).
    assert probed["afterError"] == {"1": 1, "7": 1}
    assert probed["cut"] == "the search's stream ended before it was done"


@needs_node
def test_a_run_says_its_progress_and_its_stop(probed):
    run = probed["run"]
    assert run["progress"].startswith('Finding "cat": 2 / 3 frames · ')
    assert run["progress"].endswith(" frames/s · 3 found (Esc: stop)")
    assert run["stopped"] == 'Search for "cat" stopped after 2 of 3 frames.'
    assert run["the"] == 'the search for "cat"'
    assert run["aborted"] is True
    assert probed["summary"] == "3 frames in 1.5 s (2.0 frames/s)"


@needs_node
def test_the_phrase_and_threshold_are_checked_before_sending(probed):
    ok, padded, two, empty, blank, long, control, direction, repeated, bad = probed["phrases"]
    assert ok == {"phrases": ["cat"]} and padded == {"phrases": ["red car"]}
    assert two == {"phrases": ["cat", "dog"]}
    assert repeated == {"phrases": ["cat", "dog"]}  # empty ones and repeats dropped
    assert "type a phrase" in empty["error"] and "type a phrase" in blank["error"]
    assert long["error"] == f'the phrase "{"x" * 65}" has 65 characters; at most 64'
    assert bad["error"].startswith('the phrase "a') and "control or invisible" in bad["error"]
    assert "control or invisible" in control["error"]
    assert "control or invisible" in direction["error"]
    none, zero, quarter, over, under, word = probed["thresholds"]
    assert none == {"thresh": None} and zero == {"thresh": 0} and quarter == {"thresh": 0.25}
    for refused, text in ((over, "1.5"), (under, "-0.1"), (word, "abc")):
        assert refused["error"] == f"the score threshold is a number from 0 to 1, not {text}"


def test_the_find_in_video_form_is_in_the_page_for_video_with_concepts():
    html = index_html()
    [tag] = re.findall(r'<section id="video-concepts"[^>]*>', html)
    assert " hidden" in tag and "video-only" in tag
    [form] = re.findall(r'<form id="video-concept-form".*?</form>', html, re.DOTALL)
    assert 'id="video-concept-text"' in form and 'type="submit"' in form  # Enter finds
    assert ">Find in video<" in form
    [section] = re.findall(r'<section id="video-concepts".*?</section>', html, re.DOTALL)
    assert "SAM 2.1's video prompts" in section  # what a click on a found object does
    # The key is in the video mode's key table, and the player's.
    [keys] = re.findall(r'<table id="video-shortcuts".*?</table>', html, re.DOTALL)
    assert re.search(r"<kbd>t</kbd></td><td>find a phrase in the video", keys)
    assert "t: () => this.finder.focus()" in scripts()["player.js"]
    assert "player.finder.enable(ready.concepts === true)" in scripts()["app.js"]
    # Propagation, the search and the refinement share one run: propagate's progress and Stop.
    player = scripts()["player.js"]
    assert player.count("new StreamRun(") == 3 and player.count("await this.streamed(") == 3


@needs_node
def test_several_phrases_go_as_phrases_and_each_object_keeps_its_own(probed):
    """Two phrases: the body's `phrases` (one phrase stays `text`); each found object is
    listed under the phrase the server says found it."""
    from sam2serve.server.video_schemas import ConceptTrackRequest

    multi = probed["sent"][4]
    assert multi["json"] == {
        "phrases": ["cat", "dog"],
        "frame_idx": 0,
        "mask_format": "uncompressed_rle",
    }
    ConceptTrackRequest.model_validate(multi["json"])
    assert probed["multiAdopted"] == [[8, "cat", "cat"], [9, "dog", "dog"]]
    assert probed["quoted"] == ['"cat"', '"cat", "red car"']
