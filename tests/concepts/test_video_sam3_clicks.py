"""Clicks on SAM 3 video objects, equal to Meta's ``sam3`` 0.1.4
(``Sam3VideoInferenceWithInstanceInteractivity.add_prompt(points, point_labels, obj_id)``
and the partial ``propagate_in_video`` after it): first tier - the click's SAM heads (no
memory, the previous mask as mask prompt) against Meta's ``track_step``, the action
history's next pass against Meta's parser, the click rules; second tier - whole sessions
(a phrase, propagation, clicks, propagation again) against Meta's video model on seeded
random reduced weights."""

from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from sam2serve.concepts.video_clicks import (
    FETCH,
    FULL,
    PARTIAL,
    add_points,
    check_click,
    next_pass,
    propagate,
)
from sam2serve.concepts.video_predictor import VideoState

needs_sam3 = pytest.mark.skipif(
    importlib.util.find_spec("sam3") is None, reason="Meta's sam3 is not installed"
)

if importlib.util.find_spec("sam3") is not None:
    from test_video_sam3 import trackers  # noqa: F401  (the fixture: Meta's tracker and ours)


# -- rules (no model) -------------------------------------------------------------------------


def test_click_rules():
    state = VideoState(5, 120, 160, interactive=True)
    state.cached[2] = {}
    check_click(state, 2, 0, [(10.0, 20.0), (160.0, 120.0)], [1, 0])  # edges are inside
    for args, message in [
        ((5, 0, [(1.0, 1.0)], [1]), "click frame 5 is outside the clip's 0..4"),
        ((-1, 0, [(1.0, 1.0)], [1]), "click frame -1 is outside"),
        ((2, -3, [(1.0, 1.0)], [1]), "object id must be an integer >= 0; got -3"),
        ((2, 1.5, [(1.0, 1.0)], [1]), "object id must be an integer >= 0; got 1.5"),
        ((2, 0, [], []), "at least one point"),
        ((2, 0, [(1.0, 1.0)] * 17, [1] * 17), "at most 16 points per click; got 17"),
        ((2, 0, [(1.0, 1.0)], [1, 0]), "one label per point: 1 points, 2 labels"),
        ((2, 0, [(161.0, 5.0)], [1]), r"point \(161, 5\) is outside the 160x120 video"),
        ((2, 0, [(5.0, -0.5)], [1]), r"point \(5, -0.5\) is outside"),
        ((2, 0, [(float("nan"), 5.0)], [1]), "two finite numbers"),
        ((2, 0, [(1.0, 1.0)], [2]), "label is 1 .object. or 0 .background.; got 2"),
        ((3, 0, [(1.0, 1.0)], [1]), "frame 3 has no answers yet: propagate over it first"),
    ]:
        with pytest.raises(ValueError, match=message):
            check_click(state, *args)  # type: ignore[arg-type]  # bad values on purpose
    with pytest.raises(ValueError, match="start it with interactive=True"):
        check_click(VideoState(5, 120, 160), 2, 0, [(1.0, 1.0)], [1])


def test_propagation_after_a_pass_refuses_what_meta_would_redo():
    """A state that has propagated: a second call with no click where Meta would run the
    detector again, and a partial pass over frames no pass answered, are refused before
    anything runs; a call after a pass from frame 0 only fetches the cached answers."""
    from sam2serve.concepts.video_predictor import Sam3VideoPredictor

    predictor = Sam3VideoPredictor(None, None, None, None)  # type: ignore[arg-type]  # no model runs

    def frame_at(t: int) -> np.ndarray:
        raise AssertionError("nothing should run")

    state = VideoState(5, 8, 8, interactive=True)
    state.actions = [(FULL, 2, None)]  # forward from a middle frame: Meta's next is full
    with pytest.raises(ValueError, match="run the detector over the clip again"):
        next(propagate(predictor, state, frame_at, 2, "forward"))
    state.actions.append(("refine", 2, (0,)))
    state.cached = {t: {} for t in range(2, 5)}
    with pytest.raises(ValueError, match="frame 1 has no answers of an earlier pass"):
        next(propagate(predictor, state, frame_at, 2, "both"))
    assert state.actions[-1] == ("refine", 2, (0,))  # nothing recorded by a refused call
    fetched = VideoState(3, 8, 8, interactive=True)
    fetched.actions = [(FULL, 0, None)]
    fetched.cached = {0: {}, 1: {}, 2: {}}
    results = list(propagate(predictor, fetched, frame_at, 0, "forward"))
    assert [r.frame for r in results] == [0, 1, 2] and not any(r.obj_ids for r in results)
    assert fetched.actions[-1] == (FETCH, 0, None)


@needs_sam3
def test_next_pass_equals_meta():
    """Random action histories (propagations from random frames, clicks on random ids):
    the next pass's kind and objects are Meta's ``parse_action_history_for_propagation``."""
    from meta_sam3 import import_sam3

    import_sam3()
    from sam3.model.sam3_video_inference import (
        Sam3VideoInferenceWithInstanceInteractivity as Interactive,
    )

    rng = np.random.default_rng(7)
    kinds = [FULL, PARTIAL, FETCH, "add", "refine", "remove"]
    seen = set()
    for _ in range(300):
        num_frames = int(rng.integers(1, 6))
        history = []
        for _ in range(int(rng.integers(0, 5))):
            kind = kinds[int(rng.integers(0, len(kinds)))]
            frame = int(rng.integers(0, num_frames))
            objs = None
            if kind in ("add", "refine", "remove"):
                objs = [int(rng.integers(0, 4))]
            elif kind == PARTIAL:
                objs = sorted({int(o) for o in rng.integers(0, 4, 2)})
            history.append({"type": kind, "frame_idx": frame, "obj_ids": objs})
        state = {"action_history": history, "num_frames": num_frames}
        kind, objs = Interactive.parse_action_history_for_propagation(
            types.SimpleNamespace(), state
        )
        ours = [(a["type"], a["frame_idx"], a["obj_ids"] and tuple(a["obj_ids"])) for a in history]
        got_kind, got_objs = next_pass(ours, num_frames)
        assert got_kind == kind
        assert (sorted(got_objs) if got_objs else None) == (sorted(objs) if objs else None)
        seen.add(kind)
    assert seen == {FULL, PARTIAL, FETCH}


@needs_sam3
@torch.inference_mode()
@pytest.mark.parametrize("points", [1, 2])
def test_click_heads_equal_meta(trackers, points):
    """A click on a tracked frame: Meta's ``track_step`` with point inputs, the previous
    mask logits as mask prompt, no memory (``use_prev_mem_frame=False``), no memory
    encoder - the SAM heads our click runs (one point: multimask, two: the single mask)."""
    from meta_sam3_video import cpu_patches
    from test_video_sam3 import _frame, _meta_feats

    meta, ours = trackers
    levels, pos = _frame(ours, 11)
    frame = ours.frame(levels, pos)
    feats, pos_embeds, sizes = _meta_feats(meta, levels, pos)
    g = torch.Generator().manual_seed(12)
    size = float(ours.image_size)
    coords = torch.rand(1, points, 2, generator=g) * size
    labels = torch.tensor([[1, 0][:points]], dtype=torch.int32)
    prev = (torch.randn(1, 1, ours.low_res_size, ours.low_res_size, generator=g) * 40).clamp(
        -32, 32
    )
    inputs = {"point_coords": coords, "point_labels": labels}
    with cpu_patches():
        expected = meta.track_step(
            3, False, feats, pos_embeds, sizes, None, inputs, None,
            {"cond_frame_outputs": {}, "non_cond_frame_outputs": {}}, 8,
            run_mem_encoder=False, prev_sam_mask_logits=prev, use_prev_mem_frame=False,
        )  # fmt: skip
    features = frame.feats + ours.no_mem_embed.reshape(1, -1, 1, 1)
    got = ours.heads(features, frame, prev, points == 1, (coords, labels))
    torch.testing.assert_close(got.low_res, expected["pred_masks"], atol=1e-4, rtol=0)
    torch.testing.assert_close(got.obj_ptr, expected["obj_ptr"], atol=1e-4, rtol=0)
    torch.testing.assert_close(got.object_score, expected["object_score_logits"], atol=1e-4, rtol=0)
    torch.testing.assert_close(got.iou[:, 0], expected["iou_score"], atol=1e-4, rtol=0)


# -- whole sessions (second tier: Meta's video model and ours) --------------------------------

FRAMES, HEIGHT, WIDTH = 5, 120, 160


@pytest.fixture(scope="module")
def models():
    from meta_sam3_video import meta_video_pair

    return meta_video_pair()


def _inside_and_outside(mask: np.ndarray) -> tuple[tuple[float, float], tuple[float, float]]:
    """A pixel of the mask (its middle one in raster order) and one outside it."""
    ys, xs = np.nonzero(mask)
    ys0, xs0 = np.nonzero(~mask)
    return (
        (float(xs[len(xs) // 2]), float(ys[len(ys) // 2])),
        (float(xs0[len(xs0) // 3]), float(ys0[len(ys0) // 3])),
    )


def _same(got, want, what: str) -> int:
    """Asserts the same frames in the same order, ids, scores within 1e-6; returns the
    mask pixels that differ (asserted 0 by the callers)."""
    assert [r.frame for r in got] == [w["frame"] for w in want], what
    differ = 0
    for result, expected in zip(got, want, strict=True):
        assert result.obj_ids == expected["obj_ids"], (what, result.frame)
        np.testing.assert_allclose(result.scores, expected["probs"], atol=1e-6)
        differ += int((result.masks != expected["masks"]).sum())
    return differ


CASES = {
    # name: (prompt frame, direction, what is clicked)
    "refine an object": (0, "forward", "refine"),
    "a new object": (0, "forward", "new"),
    "refine, both ways from frame 2": (2, "both", "refine"),
}


@needs_sam3
@pytest.mark.extended
@pytest.mark.parametrize("case", list(CASES))
def test_click_session_equals_meta(models, case):
    """A phrase on a frame of 5, Meta's passes; then a click - on an object the pass found
    (on the last frame answered that has one; a positive point inside its mask, a negative
    one outside), or on a new id on frame 2 (one point) - then the same passes again:
    Meta's partial passes. From frame 0 forward, objects appear on frames 3 and 4: the click
    on frame 4 is on object 5, whose detector conditioning frame 3 is within Meta's
    16-frame window and stops conditioning, and the partial pass answers the clicked
    object on frames before its conditioning frames too. Frames, ids, scores and masks as
    Meta's, the click's answer too."""
    from meta_video_clicks import meta_click_session

    from sam2serve.concepts.engine import model_pixels
    from sam2serve.samples import sample_clip

    meta, ours = models
    start, direction, kind = CASES[case]
    frames, _ = sample_clip(num_frames=FRAMES, size=(HEIGHT, WIDTH))
    state = ours.start(FRAMES, HEIGHT, WIDTH, "red disc", interactive=True)
    first = list(propagate(ours, state, frames.__getitem__, start, direction))
    found = [r for r in first if r.obj_ids]
    assert found, "the scenario needs an object"
    target = found[-1]
    # the oldest object (lowest id), unless overlaps emptied its mask
    largest = 0 if target.masks[0].any() else int(target.masks.sum(axis=(1, 2)).argmax())
    inside, outside = _inside_and_outside(target.masks[largest])
    if kind == "refine":
        clicks = [(target.frame, target.obj_ids[largest], [inside, outside], [1, 0])]
    else:
        clicks = [(2, state.max_obj_id + 3, [outside], [1])]
    answers = [add_points(ours, state, t, frames[t], o, p, lab) for t, o, p, lab in clicks]
    second = list(propagate(ours, state, frames.__getitem__, start, direction))

    pixels = torch.cat([model_pixels(ours.detector, [f]) for f in frames])
    relative = [(t, o, [[x / WIDTH, y / HEIGHT] for x, y in p], lab) for t, o, p, lab in clicks]
    want_first, want_answers, want_second = meta_click_session(
        meta, pixels, HEIGHT, WIDTH, start, "red disc", direction, relative
    )
    assert _same(first, want_first, "first pass") == 0
    assert _same(answers, want_answers, "click") == 0
    assert _same(second, want_second, "after the click") == 0
    assert [r.frame for r in second] == [r.frame for r in first]
    clicked = clicks[0][1]
    assert answers[0].scores[answers[0].obj_ids.index(clicked)] == 1.0
    if start == 0:
        # the partial pass answers the clicked object where the full pass had none
        before = {r.frame: set(r.obj_ids) for r in first}
        assert any(clicked in r.obj_ids and clicked not in before[r.frame] for r in second)
