"""SAM 3 video beyond one phrase forward: an exemplar box on the prompt frame (with or
without a phrase) and backward / both-direction propagation, equal to Meta's ``sam3``
0.1.4: its order of passes and frames, its backward memory selection and tracked step
(first tier), and (second tier) whole sessions of Meta's
``Sam3VideoInferenceWithInstanceInteractivity`` on a few frames of the sample clip."""

from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from sam2serve.concepts.engine import ExemplarBox
from sam2serve.concepts.video_predictor import (
    Group,
    Record,
    Sam3VideoPredictor,
    VideoState,
    _frame_filter,
)
from sam2serve.concepts.video_prompts import check_direction, check_video_prompt, passes

# -- prompts and passes (no model) ------------------------------------------------------------


def test_video_prompt_rules():
    box = ExemplarBox((10.0, 20.0, 50.0, 60.0))
    assert check_video_prompt("cat", (), 160, 120) == ("cat", None)
    assert check_video_prompt(None, [box], 160, 120) == (None, box)
    assert check_video_prompt("", [box], 160, 120) == (None, box)
    assert check_video_prompt("visual", [box], 160, 120) == (None, box)  # Meta's stand-in
    with pytest.raises(ValueError, match="one exemplar box per prompt.*got 2"):
        check_video_prompt("cat", [box, box], 160, 120)
    for nothing in (None, "visual"):
        with pytest.raises(ValueError, match="a phrase or one exemplar box"):
            check_video_prompt(nothing, (), 160, 120)
    for bad, rule in [
        ((0, 0, 161, 10), "outside the 160x120 image"),
        ((-1, 0, 5, 5), "below 0"),
        ((5, 5, 5, 9), "is empty"),
        ((9, 2, 4, 8), "is empty"),
        ((0, 0, float("nan"), 4), "4 finite numbers"),
    ]:
        with pytest.raises(ValueError, match=rule):
            check_video_prompt("cat", [ExemplarBox(bad)], 160, 120)  # type: ignore[arg-type]  # ints
    assert check_direction("both") == "both"
    with pytest.raises(ValueError, match="forward, backward, both; got 'sideways'"):
        check_direction("sideways")
    with pytest.raises(ValueError, match="prompt frame 6 is outside the clip's 0..5"):
        passes(6, 6, "forward")


needs_sam3 = pytest.mark.skipif(
    importlib.util.find_spec("sam3") is None, reason="Meta's sam3 is not installed"
)


def _meta_passes(num_frames: int, start: int, direction: str) -> list[tuple[list[int], bool, str]]:
    """Meta's passes for a prompt on ``start``: the predictor's directions, each pass's
    processing order and what the instance-interactive model runs (full or fetch)."""
    from meta_sam3 import import_sam3

    import_sam3()
    from sam3.model.sam3_video_inference import (
        Sam3VideoInference,
    )
    from sam3.model.sam3_video_inference import (
        Sam3VideoInferenceWithInstanceInteractivity as Interactive,
    )

    meta_self = types.SimpleNamespace()
    state = {
        "num_frames": num_frames,
        "previous_stages_out": [None] * num_frames,
        "action_history": [],
    }
    state["previous_stages_out"][start] = "_THIS_FRAME_HAS_OUTPUTS_"  # add_prompt ran
    out = []
    for reverse in {"forward": [False], "backward": [True], "both": [False, True]}[direction]:
        kind, obj_ids = Interactive.parse_action_history_for_propagation(meta_self, state)
        Interactive.add_action_history(meta_self, state, kind, start, obj_ids)
        order, _ = Sam3VideoInference._get_processing_order(meta_self, state, start, None, reverse)
        out.append((list(order), reverse, kind))
    return out


@needs_sam3
@pytest.mark.parametrize("direction", ["forward", "backward", "both"])
def test_passes_equal_meta(direction):
    for num_frames in (1, 2, 5):
        for start in range(num_frames):
            expected = _meta_passes(num_frames, start, direction)
            got = passes(num_frames, start, direction)  # type: ignore[arg-type]  # a str
            assert [(list(p.frames), p.reverse) for p in got] == [e[:2] for e in expected]
            kinds = ["propagation_fetch" if p.fetch else "propagation_full" for p in got]
            assert kinds == [e[2] for e in expected]


@needs_sam3
def test_backward_memory_selection_equals_meta():
    from meta_sam3 import import_sam3

    import_sam3()
    from sam3.model.sam3_tracker_base import Sam3TrackerBase

    rng = np.random.default_rng(4)
    meta_self = types.SimpleNamespace(max_obj_ptrs_in_encoder=16, mf_threshold=0.01)
    for _ in range(40):
        frame = int(rng.integers(0, 40))
        eff = {
            t: float(rng.uniform(-0.02, 0.05)) for t in range(frame + 1, 40) if rng.random() < 0.8
        }
        records = {}
        for t, score in eff.items():
            record = Record(torch.zeros(1), torch.zeros(1), torch.zeros(1), torch.zeros(1))
            record.eff_iou = score
            records[t] = record
        output = {"non_cond_frame_outputs": {t: {"eff_iou_score": s} for t, s in eff.items()}}
        expected = Sam3TrackerBase.frame_filter(meta_self, output, True, frame, 40, 1)
        assert _frame_filter(records, frame, 40, reverse=True) == expected


@needs_sam3
@torch.inference_mode()
def test_backward_tracked_step_equals_meta(trackers):
    """A frame tracked backward: memories of later frames (a conditioning frame, selected
    past ones), pointers with backward distances: Meta's ``track_step(track_in_reverse)``,
    through the predictor's own choice of memories."""
    from meta_sam3_video import cpu_patches
    from test_video_sam3 import _frame, _meta_feats

    meta, ours = trackers
    levels, pos = _frame(ours, 9)
    frame = ours.frame(levels, pos)
    feats, pos_embeds, sizes = _meta_feats(meta, levels, pos)
    g = torch.Generator().manual_seed(10)
    grid = ours.grid

    def out(score: float) -> dict:
        return {
            "maskmem_features": torch.randn(1, 64, grid, grid, generator=g).to(torch.bfloat16),
            "maskmem_pos_enc": [ours.memory_pos(torch.device("cpu"))],
            "obj_ptr": torch.randn(1, 256, generator=g),
            "eff_iou_score": score,
        }

    output = {
        "cond_frame_outputs": {5: out(0.0)},
        "non_cond_frame_outputs": {3: out(0.5), 4: out(0.0), 6: out(0.3)},
    }
    with cpu_patches():
        expected = meta.track_step(
            2, False, feats, pos_embeds, sizes, None, None, None, output, 8,
            track_in_reverse=True, run_mem_encoder=False,
        )  # fmt: skip

    def record(o: dict) -> Record:
        r = Record(torch.zeros(1), o["obj_ptr"], torch.zeros(1), torch.zeros(1))
        r.maskmem, r.eff_iou = o["maskmem_features"], o["eff_iou_score"]
        return r

    group = Group([0])
    group.cond = {t: record(o) for t, o in output["cond_frame_outputs"].items()}
    group.non_cond = {t: record(o) for t, o in output["non_cond_frame_outputs"].items()}
    predictor = Sam3VideoPredictor(None, None, None, ours)  # type: ignore[arg-type]  # tracker only
    got = predictor.track(VideoState(8, 10, 10), group, 2, frame, reverse=True)
    forward = predictor.track(VideoState(8, 10, 10), group, 2, frame, reverse=False)
    torch.testing.assert_close(got.pred_masks, expected["pred_masks"], atol=1e-6, rtol=0)
    torch.testing.assert_close(got.obj_ptr, expected["obj_ptr"], atol=1e-6, rtol=0)
    # the same operations in the same order: equal to float32 rounding, while the forward
    # choice of memories and pointer distances answers measurably differently
    assert (forward.pred_masks - got.pred_masks).abs().max() > 1e-5


def test_bounded_memory_keeps_what_both_passes_read():
    """After a forward pass that a backward one follows, the trimmed state selects the
    same memories as the untrimmed one for the first backward frame and the next forward
    one (memory selection, closest conditioning frames)."""
    from sam2serve.concepts.video_predictor import _closest_cond

    rng = np.random.default_rng(5)
    predictor = Sam3VideoPredictor(None, None, None, None)  # type: ignore[arg-type]  # trim only
    num_frames, last = 60, 45
    for _ in range(30):
        start = int(rng.integers(1, 12))
        cond_frames = {start, *rng.choice(np.arange(start, last + 1), 6).tolist()}
        group = Group([0])
        for t in range(start, last + 1):
            record = Record(torch.zeros(1), torch.zeros(1), torch.zeros(1), torch.zeros(1))
            record.eff_iou = float(rng.uniform(-0.02, 0.05))
            (group.cond if t in cond_frames else group.non_cond)[t] = record
        full_cond, full_non_cond = dict(group.cond), dict(group.non_cond)
        state = VideoState(num_frames, 10, 10, keep_start=True)
        state.groups = [group]
        predictor.trim(state, last)
        assert len(group.non_cond) < len(full_non_cond)  # something was forgotten
        for frame, reverse in ((start - 1, True), (last + 1, False)):
            got = _frame_filter(group.non_cond, frame, num_frames, reverse)
            assert got == _frame_filter(full_non_cond, frame, num_frames, reverse)
            assert list(_closest_cond(frame, group.cond)[0]) == list(
                _closest_cond(frame, full_cond)[0]
            )


if importlib.util.find_spec("sam3") is not None:
    from test_video_sam3 import trackers  # noqa: F401  (the fixture: Meta's tracker and ours)


# -- whole sessions (second tier: Meta's video model and ours, a few minutes each) ------------

FRAMES, HEIGHT, WIDTH = 5, 120, 160
BOX = ExemplarBox((40.0, 30.0, 120.0, 90.0))  # x/160, y/120: exact in binary either way
SESSIONS = {
    # name: (prompt frame, phrase, box, direction)
    "text+box forward from frame 1": (1, "red disc", BOX, "forward"),
    # the box alone adds objects on its frame only; every later frame leaves them
    # unmatched, and the short hot start (2 frames) would end them on a longer pass
    "box alone forward from frame 3": (3, None, BOX, "forward"),
    "text both ways from frame 2": (2, "red disc", None, "both"),
    "text+box backward from frame 3": (3, "red disc", BOX, "backward"),
}


@pytest.fixture(scope="module")
def models():
    from meta_sam3_video import meta_video_pair

    return meta_video_pair()


@needs_sam3
@pytest.mark.extended
@pytest.mark.parametrize("name", list(SESSIONS))
def test_session_equals_meta(models, name):
    from meta_video_prompts import meta_session

    from sam2serve.concepts.engine import model_pixels
    from sam2serve.samples import sample_clip

    meta, ours = models
    start, phrase, box, direction = SESSIONS[name]
    frames, _ = sample_clip(num_frames=FRAMES, size=(HEIGHT, WIDTH))
    session = ours.start(FRAMES, HEIGHT, WIDTH, phrase, [box] if box else [])
    got = list(ours.propagate_clip(session, frames.__getitem__, start, direction))
    pixels = torch.cat([model_pixels(ours.detector, [f]) for f in frames])
    xywh = None
    if box is not None:
        x1, y1, x2, y2 = box.xyxy
        xywh = [x1 / WIDTH, y1 / HEIGHT, (x2 - x1) / WIDTH, (y2 - y1) / HEIGHT]
    expected = meta_session(meta, pixels, HEIGHT, WIDTH, start, phrase, xywh, True, direction)

    assert [r.frame for r in got] == [e["frame"] for e in expected]
    assert len(got) == {"forward": FRAMES - start, "backward": start, "both": FRAMES}[direction]
    for result, want in zip(got, expected, strict=True):
        assert result.obj_ids == want["obj_ids"], result.frame
        np.testing.assert_allclose(result.scores, want["probs"], atol=1e-6)
        assert (result.masks != want["masks"]).sum() == 0, result.frame
    assert any(r.obj_ids for r in got)  # something was found and tracked
    if phrase is None:  # no new object after the prompt frame
        first = {obj for r in got if r.frame == start for obj in r.obj_ids}
        assert {obj for r in got for obj in r.obj_ids} <= first


@needs_sam3
@pytest.mark.extended
def test_the_box_prompts_the_next_frame_too(models):
    """Meta's detector computes frame t + 1 ahead of time with frame t's geometric prompt:
    after ``add_prompt`` with a box on frame 1, its buffered detections of frame 2 are
    those of the phrase *and the box* - ours on that frame of the forward pass, not the
    phrase alone's."""
    from meta_sam3_video import cpu_patches
    from meta_video_prompts import _empty_fill_holes, _initial_state

    from sam2serve.concepts.engine import model_pixels
    from sam2serve.samples import sample_clip

    meta, ours = models
    frames, _ = sample_clip(num_frames=3, size=(HEIGHT, WIDTH))
    pixels = torch.cat([model_pixels(ours.detector, [f]) for f in frames])
    x1, y1, x2, y2 = BOX.xyxy
    xywh = [x1 / WIDTH, y1 / HEIGHT, (x2 - x1) / WIDTH, (y2 - y1) / HEIGHT]
    with cpu_patches(), _empty_fill_holes(), torch.inference_mode():
        state = _initial_state(meta, pixels, HEIGHT, WIDTH)
        meta.add_prompt(state, frame_idx=1, text_str="red disc", boxes_xywh=[xywh], box_labels=[1])
        buffered = state["feature_cache"]["multigpu_buffer"][2]
        expected = buffered["pred_logits"][0].squeeze(-1).sigmoid()[0]
    session = ours.start(3, HEIGHT, WIDTH, "red disc", [BOX])
    session.prompt_frame = 1
    with torch.inference_mode():
        encoding, _ = ours.encode(frames[2])
        boxed = ours.detect(session, encoding, 2)
        alone = ours.detect(session, encoding, 2, reverse=True)  # backward: no box there
    meta_kept = np.sort(expected[expected > ours.th.score].numpy())
    np.testing.assert_allclose(np.sort(boxed.scores), meta_kept, atol=1e-5)
    assert boxed.scores.shape != alone.scores.shape or not np.allclose(
        np.sort(boxed.scores), np.sort(alone.scores), atol=1e-5
    )
