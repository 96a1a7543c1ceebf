"""SAM 3 video: our predictor's parts equal Meta's ``sam3`` 0.1.4 (association, hot start,
hole filling, memory selection, the tracker's heads, memory encoder and memory attention)
on identical seeded random inputs and weights; and (second tier) the whole predictor
equals Meta's ``Sam3VideoInference`` on a short clip."""

from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
if importlib.util.find_spec("sam3") is None:  # Meta's package: pip install --no-deps sam3
    pytest.skip("Meta's sam3 is not installed", allow_module_level=True)
from meta_sam3 import import_sam3

from sam2serve.concepts.video_association import HotStart, VideoThresholds, associate
from sam2serve.concepts.video_fill import fill_holes
from sam2serve.concepts.video_predictor import Record, _closest_cond, _frame_filter, memory_score
from sam2serve.concepts.video_tracker import Sam3Tracker, tracker_state

import_sam3()  # the shims, before Meta's modules import torchvision/timm


def _blobs(rng: np.random.Generator, count: int, size: int = 32) -> torch.Tensor:
    """``count`` mask logits (size x size) of random rectangles: overlapping, disjoint,
    empty ones."""
    masks = np.full((count, size, size), -5.0, dtype=np.float32)
    for i in range(count):
        if rng.random() < 0.15:
            continue  # empty
        y0, x0 = rng.integers(0, size - 4, 2)
        h, w = rng.integers(3, size // 2, 2)
        masks[i, y0 : y0 + h, x0 : x0 + w] = rng.uniform(0.5, 5.0)
    return torch.from_numpy(masks)


def _meta_base():
    from sam3.model.sam3_video_base import Sam3VideoBase

    return Sam3VideoBase


def test_association_equals_meta():
    base = _meta_base()
    th = VideoThresholds(new_det=0.3)
    meta_self = types.SimpleNamespace(
        assoc_iou_thresh=th.assoc_iou,
        trk_assoc_iou_thresh=th.trk_assoc_iou,
        new_det_thresh=th.new_det,
        o2o_matching_masklets_enable=False,
    )
    rng = np.random.default_rng(0)
    checked = 0
    for trial in range(40):
        dets = _blobs(rng, int(rng.integers(0, 6)))
        trks = _blobs(rng, int(rng.integers(0, 6)))
        if trial % 2 and len(dets) and len(trks):  # a track on a detection: matched paths
            trks[0] = dets[0] + 0.1
        scores = rng.uniform(0.2, 1.0, len(dets)).astype(np.float32)
        ids = np.arange(len(trks), dtype=np.int64) + 3
        expected = base._associate_det_trk(meta_self, dets, scores, trks, ids)
        got = associate(dets, scores, trks, ids, th)
        np.testing.assert_array_equal(got.new_dets, expected[0])
        np.testing.assert_array_equal(got.unmatched, expected[1])
        assert {k: v.tolist() for k, v in got.det_to_tracks.items()} == {
            k: v.tolist() for k, v in expected[2].items()
        }
        assert got.recondition == expected[3]
        np.testing.assert_array_equal(got.empty, expected[4])
        checked += bool(expected[3])
    assert checked > 0  # the reconditioning rule was exercised


def test_hot_start_equals_meta():
    """Many frames of random matches: the ids removed on each frame are Meta's."""
    from collections import defaultdict

    base = _meta_base()
    th = VideoThresholds(hotstart_delay=4, hotstart_unmatch=2, hotstart_dup=2)
    meta_self = types.SimpleNamespace(
        hotstart_delay=th.hotstart_delay,
        hotstart_unmatch_thresh=th.hotstart_unmatch,
        hotstart_dup_thresh=th.hotstart_dup,
        init_trk_keep_alive=th.init_keep_alive,
        max_trk_keep_alive=th.max_keep_alive,
        min_trk_keep_alive=th.min_keep_alive,
        suppress_unmatched_only_within_hotstart=True,
        decrease_trk_keep_alive_for_empty_masklets=False,
    )
    meta_meta = {
        "obj_first_frame_idx": {},
        "unmatched_frame_inds": defaultdict(list),
        "trk_keep_alive": defaultdict(int),
        "overlap_pair_to_frame_inds": defaultdict(list),
        "removed_obj_ids": set(),
        "suppressed_obj_ids": defaultdict(set),
    }
    ours = HotStart()
    rng = np.random.default_rng(1)
    alive: list[int] = []
    next_id = 0
    removed_total = 0
    for frame in range(12):
        new = np.arange(next_id, next_id + int(rng.integers(0, 3)), dtype=np.int64)
        next_id += len(new)
        det_to = {
            d: np.array(sorted(rng.choice(alive, int(rng.integers(0, 3)), replace=False)))
            if len(alive) >= 2
            else np.array([], np.int64)
            for d in range(int(rng.integers(0, 3)))
        }
        matched = {o for v in det_to.values() for o in v.tolist()}
        unmatched = np.array([o for o in alive if o not in matched and rng.random() < 0.6])
        assoc = types.SimpleNamespace(det_to_tracks=det_to, unmatched=unmatched.astype(np.int64))
        expected, meta_meta = base._process_hotstart(
            meta_self, frame, 12, False, det_to, new, np.array([], np.int64),
            assoc.unmatched, meta_meta, {},
        )  # fmt: skip
        got = ours.update(frame, False, assoc, new, th)  # type: ignore[arg-type]
        assert got == expected
        removed_total += len(got)
        alive = [o for o in alive + new.tolist() if o not in ours.removed]
    assert removed_total > 0


def test_fill_holes_equals_meta():
    from sam3.model.sam3_tracker_utils import fill_holes_in_mask_scores

    rng = np.random.default_rng(2)
    logits = torch.from_numpy(rng.normal(size=(5, 1, 40, 36)).astype(np.float32))
    logits[0] = -1.0
    for area in (0, 4, 16):
        expected = fill_holes_in_mask_scores(logits.clone(), area, True, True)
        assert torch.equal(fill_holes(logits.clone(), area), expected)


def test_memory_selection_equals_meta():
    """Which past frames and conditioning frames a tracked frame reads: Meta's."""
    from sam3.model.sam3_tracker_base import Sam3TrackerBase
    from sam3.model.sam3_tracker_utils import select_closest_cond_frames

    rng = np.random.default_rng(3)
    meta_self = types.SimpleNamespace(max_obj_ptrs_in_encoder=16, mf_threshold=0.01)
    for _ in range(30):
        frame = int(rng.integers(0, 40))
        eff = {t: float(rng.uniform(-0.02, 0.05)) for t in range(frame) if rng.random() < 0.8}
        records = {}
        for t, score in eff.items():
            record = Record(torch.zeros(1), torch.zeros(1), torch.zeros(1), torch.zeros(1))
            record.eff_iou = score
            records[t] = record
        output = {"non_cond_frame_outputs": {t: {"eff_iou_score": s} for t, s in eff.items()}}
        expected = Sam3TrackerBase.frame_filter(meta_self, output, False, frame, 40, 1)
        assert _frame_filter(records, frame, 40) == expected
        cond = {int(t): None for t in rng.choice(40, int(rng.integers(1, 8)), replace=False)}
        selected, unselected = _closest_cond(frame, cond)  # type: ignore[arg-type]
        meta_sel, meta_unsel = select_closest_cond_frames(frame, cond, 4)
        assert list(selected) == list(meta_sel) and list(unselected) == list(meta_unsel)


def test_memory_score_equals_meta():
    from sam3.model.sam3_tracker_base import Sam3TrackerBase

    scores = torch.tensor([[2.0], [-1.0], [0.3]])
    iou = torch.tensor([0.9, 0.5, 0.7])
    expected = Sam3TrackerBase.cal_mem_score(None, scores, iou)
    assert memory_score(scores, iou[:, None]) == pytest.approx(float(expected), abs=1e-7)


# -- the tracker ------------------------------------------------------------------------------


IMAGE = 112  # an 8 x 8 token grid


@pytest.fixture(scope="module")
def trackers():
    """Meta's SAM 3 tracker (its builder, image size reduced) and ours with its weights."""
    from unittest import mock

    from meta_sam3 import _override

    builder = import_sam3()
    side = IMAGE // 14 * 16
    patches = {
        "Sam3TrackerPredictor": _override(builder.Sam3TrackerPredictor, image_size=IMAGE),
        "SimpleMaskDownSampler": _override(
            builder.SimpleMaskDownSampler, interpol_size=[side, side]
        ),
        "PositionEmbeddingSine": _override(
            builder.PositionEmbeddingSine, precompute_resolution=None
        ),
    }
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        with mock.patch.multiple(builder, **patches):
            meta = builder.build_tracker(apply_temporal_disambiguation=True).eval()
    from sam2serve.concepts.runtime import randomize_

    randomize_(meta, 4)
    ours = Sam3Tracker(IMAGE).eval()
    prefixed = {f"tracker.{k}": v for k, v in meta.state_dict().items()}
    ours.load_state_dict(tracker_state(prefixed), strict=True)
    return meta, ours


def _frame(ours: Sam3Tracker, seed: int):
    g = torch.Generator().manual_seed(seed)
    grid = ours.grid
    levels = (
        torch.randn(1, 256, 4 * grid, 4 * grid, generator=g),
        torch.randn(1, 256, 2 * grid, 2 * grid, generator=g),
        torch.randn(1, 256, grid, grid, generator=g),
    )
    from sam2serve.modeling.sine_encoding import grid_sine_encoding

    pos = grid_sine_encoding(256, grid, grid, torch.device("cpu"))
    return levels, pos


def _meta_feats(meta, levels, pos):
    decoder = meta.sam_mask_decoder
    s0, s1, lowest = (x.to(torch.bfloat16).float() for x in levels)
    fpn = [decoder.conv_s0(s0), decoder.conv_s1(s1), lowest]
    from sam2serve.modeling.sine_encoding import grid_sine_encoding

    cpu = torch.device("cpu")
    finer = [grid_sine_encoding(256, *x.shape[-2:], cpu) for x in fpn[:2]]
    out = {"backbone_fpn": fpn, "vision_pos_enc": [*finer, pos]}
    _, feats, pos_embeds, sizes = meta._prepare_backbone_features(out)
    return feats, pos_embeds, sizes


@torch.inference_mode()
def test_tracker_mask_prompt_and_memory_equal_meta(trackers):
    meta, ours = trackers
    levels, pos = _frame(ours, 5)
    frame = ours.frame(levels, pos)
    feats, _, sizes = _meta_feats(meta, levels, pos)
    side = ours.input_mask_size
    mask = torch.zeros(2, 1, side, side)
    mask[0, :, 10:70, 20:90] = 1
    high_res_feats = [x.permute(1, 2, 0).view(2, -1, *s) for x, s in zip(
        [f.expand(-1, 2, -1) for f in feats[:-1]], sizes[:-1], strict=True
    )]  # fmt: skip
    pix = feats[-1].expand(-1, 2, -1).permute(1, 2, 0).view(2, 256, *sizes[-1])
    expected = meta._use_mask_as_output(pix, high_res_feats, mask)
    got = ours.mask_as_output(frame, mask)
    torch.testing.assert_close(got.low_res, expected[3], atol=1e-5, rtol=0)
    torch.testing.assert_close(got.obj_ptr, expected[5], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got.object_score, expected[6])
    logits = torch.randn(2, 1, IMAGE, IMAGE, generator=torch.Generator().manual_seed(6))
    scores = torch.tensor([[3.0], [-2.0]])
    mem, mem_pos = meta._encode_new_memory(
        None, [f.expand(-1, 2, -1) for f in feats], sizes, logits, scores, True
    )
    torch.testing.assert_close(
        ours.encode_memory(frame, logits, scores, True), mem, atol=1e-4, rtol=1e-4
    )
    torch.testing.assert_close(ours.memory_pos(torch.device("cpu")), mem_pos[0][:1])


@torch.inference_mode()
def test_tracker_tracked_step_equals_meta(trackers):
    """A tracked frame: memory attention over a conditioning and a past memory plus
    pointers, then the heads with multimask: Meta's ``track_step``."""
    meta, ours = trackers
    levels, pos = _frame(ours, 7)
    frame = ours.frame(levels, pos)
    feats, pos_embeds, sizes = _meta_feats(meta, levels, pos)
    g = torch.Generator().manual_seed(8)
    grid = ours.grid

    def out(score: float):
        mem = torch.randn(1, 64, grid, grid, generator=g).to(torch.bfloat16)
        return {
            "maskmem_features": mem,
            "maskmem_pos_enc": [ours.memory_pos(torch.device("cpu"))],
            "obj_ptr": torch.randn(1, 256, generator=g),
            "eff_iou_score": score,
        }

    output = {
        "cond_frame_outputs": {0: out(0.0)},
        "non_cond_frame_outputs": {2: out(0.5), 3: out(0.0)},
    }
    from meta_sam3_video import cpu_patches

    with cpu_patches():  # Meta's .cuda() on the memories
        expected = meta.track_step(
            4, False, feats, pos_embeds, sizes, None, None, None, output, 6, run_mem_encoder=False
        )
    records = {}
    for t, o in output["non_cond_frame_outputs"].items():
        r = Record(
            torch.zeros(1), o["obj_ptr"], torch.zeros(1), torch.zeros(1), o["maskmem_features"]
        )
        r.eff_iou = o["eff_iou_score"]
        records[t] = r
    valid = _frame_filter(records, 4, 6)
    assert valid == [2, 3]
    cond = output["cond_frame_outputs"][0]
    # Meta's order: conditioning frames (slot 6), then t_pos 1..6 over valid[-(7 - t_pos)]:
    # frame 2 at t_pos 5 (slot 1), frame 3 at t_pos 6 (slot 0); pointers: the conditioning
    # frame (distance 4), then valid[-1] at distance 1 (Meta stops before valid[0])
    memories = [(cond["maskmem_features"], 6), (records[2].maskmem, 1), (records[3].maskmem, 0)]
    pointers = [(4, cond["obj_ptr"]), (1, records[3].obj_ptr)]
    pix = ours.condition(frame, 1, memories, pointers, 6)
    got = ours.track(pix, frame)
    torch.testing.assert_close(got.low_res, expected["pred_masks"], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(got.obj_ptr, expected["obj_ptr"], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(got.iou[:, 0], expected["iou_score"], atol=1e-5, rtol=0)


# -- the whole predictor (second tier: Meta's video model and ours, a few minutes) -------------


def _spans(frames: list[tuple[int, list[int]]]) -> dict[int, tuple[int, int]]:
    """Each object's first and last frame with a mask."""
    spans: dict[int, tuple[int, int]] = {}
    for frame, ids in frames:
        for obj in ids:
            first, _ = spans.get(obj, (frame, frame))
            spans[obj] = (first, frame)
    return spans


@pytest.mark.extended
def test_predictor_equals_meta_on_the_sample_clip():
    from meta_sam3_video import meta_track, meta_video_pair

    from sam2serve.concepts.engine import model_pixels
    from sam2serve.samples import sample_clip

    meta, ours = meta_video_pair()
    detector = ours.detector

    frames, _ = sample_clip(num_frames=6, size=(120, 160))
    session = ours.start(len(frames), 120, 160, "red disc")
    got = list(ours.run(session, frames))
    pixels = torch.cat([model_pixels(detector, [f]) for f in frames])
    expected = meta_track(meta, pixels, 120, 160, "red disc")

    assert [r.frame for r in got] == [e["frame"] for e in expected] == list(range(6))
    for result, want in zip(got, expected, strict=True):
        assert result.obj_ids == want["obj_ids"]
        np.testing.assert_allclose(result.scores, want["probs"], atol=1e-6)
        assert (result.masks != want["masks"]).sum() == 0
    spans = _spans([(r.frame, [o for o, m in zip(r.obj_ids, r.masks) if m.any()]) for r in got])
    assert session.hot.removed  # hot start ended tracks (and hid them from every frame)
    assert spans and all(first > 0 for first, _ in spans.values())  # found later, kept
