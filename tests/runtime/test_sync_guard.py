"""SyncGuard: requests for host values caught on the CPU, and the hot paths held to their
budget - the tracker's frame step asks for none (the masks it hands out are converted by
the caller), the image predictor's decode of host prompts asks for none, and AMG's
decoder loop asks for its filters' and its RLE's only."""

from __future__ import annotations

import fnmatch
from collections import Counter

import numpy as np
import pytest
import torch
from small_tracker import small_tiny_tracker

from sam2serve.engine.amg import MaskGenerator
from sam2serve.engine.predictor import Predictor
from sam2serve.engine.video import VideoPredictor
from sam2serve.engine.video.outputs import object_masks
from sam2serve.runtime.sync_guard import HostSyncError, SyncGuard
from sam2serve.samples import sample_clip

HANDOUT = "sam2serve.engine.video.outputs.object_masks"

x = torch.tensor([1.0, 0.0, 2.0])


@pytest.mark.parametrize(
    ("request_", "kind"),
    [
        (lambda: x[0].item(), "item"),
        (lambda: bool(x.any()), "bool"),
        (lambda: 1 if x.sum() else 0, "bool"),
        (lambda: int(x[0]), "int"),
        (lambda: float(x[0]), "float"),
        (lambda: x.tolist(), "tolist"),
        (lambda: x.numpy(), "to host"),
        (lambda: x.cpu(), "to host"),
        (lambda: torch.nonzero(x), "nonzero"),
        (lambda: torch.where(x > 0), "nonzero"),
        (lambda: x[x > 0], "boolean mask"),
        (lambda: x.masked_select(x > 0), "masked_select"),
        (lambda: x.unique(), "unique"),
        (lambda: x.repeat_interleave(torch.tensor([1, 2, 1])), "repeat_interleave"),
        (lambda: torch.tensor([1, 2], device="cpu"), "upload"),
        (lambda: torch.tensor([1, 2]).to("cpu"), "upload"),
    ],
)
def test_each_request_for_a_host_value_is_caught(request_, kind):
    with (
        pytest.raises(HostSyncError, match=f"host sync: {kind} "),
        SyncGuard(device="cpu"),
        torch.inference_mode(),
    ):
        request_()


def test_device_work_and_non_blocking_uploads_pass():
    with SyncGuard(device="cpu") as guard, torch.inference_mode():
        y = torch.where(x > 0, x * 2, 0.0).softmax(0)
        y.argmax().view(1).repeat_interleave(3)
        torch.tensor([1, 2]).to("cpu", non_blocking=True)
        torch.zeros(3)[torch.tensor([0, 2])]
        assert y.shape == (3,)
    assert guard.syncs == []


def test_allowed_callers_are_counted_and_stages_named():
    def hand_out(t):
        return t.tolist()

    guard = SyncGuard(allow=[f"{__name__}.*hand_out"], device="cpu")
    with guard, guard.stage("output"):
        hand_out(x)
        hand_out(x)
    assert guard.counts() == Counter({"output": 2})
    assert guard.counts("kind", allowed=True) == Counter({"tolist": 2})
    assert guard.disallowed == []
    assert "hand_out" in guard.syncs[0].where

    with SyncGuard(raise_on_sync=False, device="cpu") as counting:
        x.sum().item()
    assert [s.kind for s in counting.disallowed] == ["item"]


@pytest.fixture(scope="module")
def tracker():
    # All objects in one frame step, as on a GPU (a CPU's default runs them one by one).
    return VideoPredictor(small_tiny_tracker(seed=2), feature_cache_frames=3, objects_per_call=8)


def tracked_state(tracker, retention="exact"):
    frames, _ = sample_clip(3, (48, 64))
    state = tracker.init_state(frames, retention=retention)
    for frame_idx in range(3):  # the encoder is not the frame step's subject here
        tracker.frame_features(state, frame_idx)
    # Prompted on different frames: the objects' banks differ, as in a real session.
    tracker.add_points(state, 0, 1, [[20, 20]], [1])
    tracker.add_points(state, 0, 2, box=[30, 10, 50, 30])
    tracker.add_points(state, 1, 3, [[10, 40]], [1])
    tracker.commit_prompts(state)
    return state


@pytest.mark.parametrize("retention", ["exact", "bounded"])
def test_the_tracker_frame_step_asks_for_no_host_value(tracker, retention):
    """propagate / track_next ask for nothing; the masks they hand out are converted to
    RLE by the caller (object_masks: the hand-out, its transfer allowed)."""
    state = tracked_state(tracker, retention)
    per_frame = []
    with SyncGuard(allow=[HANDOUT], device="cpu") as guard:
        for frame in tracker.propagate(state, start_frame_idx=0):
            assert guard.disallowed == []
            records = object_masks(frame)
            assert [r.obj_id for r in records] == [1, 2, 3]
            per_frame.append(len(guard.syncs))
            guard.reset()
        tracker.track_next(state, 2)
        assert guard.syncs == []
    # The hand-out: the masks' change points cross to the host, at most two transfers.
    assert len(per_frame) == 3 and all(1 <= n <= 2 for n in per_frame)


def test_the_guard_fails_the_frame_step_on_a_sync(tracker, monkeypatch):
    """Not vacuous: one .item() in the heads fails the frame step, named."""
    state = tracked_state(tracker)
    heads = tracker.model.forward_heads

    def syncing_heads(*args, **kwargs):
        out = heads(*args, **kwargs)
        if out.object_score_logits.max().item() > 0:
            return out
        return out

    monkeypatch.setattr(tracker.model, "forward_heads", syncing_heads)
    with (
        pytest.raises(HostSyncError, match="item .*syncing_heads"),
        SyncGuard(allow=[HANDOUT], device="cpu"),
    ):
        next(tracker.propagate(state, start_frame_idx=1))


@pytest.fixture(scope="module")
def image_predictors():
    model = small_tiny_tracker(seed=3)
    image = np.random.default_rng(0).integers(0, 255, (48, 64, 3), dtype=np.uint8)
    return [Predictor(model, decoder=d) for d in ("reference", "fast")], image


def test_the_image_decode_of_host_prompts_asks_for_no_host_value(image_predictors):
    predictors, image = image_predictors
    for predictor in predictors:
        embedding = predictor.encode(image)
        with SyncGuard(device="cpu"):
            out = predictor.predict(
                embedding,
                np.array([[[10.0, 20.0], [30.0, 25.0]], [[40.0, 10.0], [5.0, 5.0]]]),
                [[1, 0], [1, 1]],
                boxes=[[0, 0, 30, 30], [10, 5, 60, 40]],
            )
        assert out.masks.shape == (2, 3, 48, 64)


def test_amg_decoder_loop_asks_only_for_its_filters_and_rle(image_predictors):
    """Per batch of clicks: the two filters' row selections (predicted IoU, then stability
    and crop edges) and the RLE's transfers; nothing in the decoder itself."""
    predictors, image = image_predictors
    generator = MaskGenerator(
        predictors[1], points_per_side=4, points_per_batch=4, pred_iou_thresh=0.1
    )
    with SyncGuard(raise_on_sync=False, device="cpu") as guard:
        generator.generate(image)
    batch = "sam2serve.engine.amg.MaskGenerator._process_batch"
    in_decoder = [s for s in guard.syncs if s.where.startswith("sam2serve.engine.predictor")]
    assert all(s.where.split(":")[0].endswith("_passing_rows") for s in in_decoder)
    per_batch = Counter(
        (s.kind, s.where.split(":")[0]) for s in guard.syncs if s.where.startswith(batch)
    )
    batches = 16 // 4
    assert per_batch == Counter({("nonzero", batch): 2 * batches})
    assert len(in_decoder) == batches


# The documented points where AMG asks the device for host values (engine/amg.py), by the
# innermost engine function that asks: the filters' row selections, the decoder's passing
# rows, each batch's one RLE transfer (engine.rle: change points, packed as Runs), NMS's
# kept rows (in engine.nms and for the packed RLEs) and the records handed out.
AMG_POINTS = [
    "sam2serve.engine.amg.MaskGenerator._process_batch",
    "sam2serve.engine.predictor.*_passing_rows",
    "sam2serve.engine.rle._run_lengths",
    "sam2serve.engine.nms.*",
    "sam2serve.engine.amg._Masks.select",
    "sam2serve.engine.amg.MaskGenerator._records",
    # CPU tensors only: numpy counts the stability scores' pixels in place (a view, no
    # transfer); on a device it is an int32 sum that asks nothing (engine.masks.count_set).
    "sam2serve.engine.masks.count_set",
]
KEEP_ALL = {"points_per_side": 4, "points_per_batch": 4, "pred_iou_thresh": 0.0}
KEEP_ALL["stability_score_thresh"] = 0.0


def amg_syncs(generator, image):
    """Every request keep-all AMG makes, and those made outside the documented points."""
    with SyncGuard(raise_on_sync=False, device="cpu") as guard:
        records = generator.generate(image)
    assert records, "thresholds at 0 keep masks"
    functions = [s.where.split(":")[0] for s in guard.syncs]
    outside = [f for f in functions if not any(fnmatch.fnmatch(f, p) for p in AMG_POINTS)]
    return guard.syncs, outside


def test_keep_all_amg_asks_for_host_values_only_at_its_documented_points(image_predictors):
    """Keep-all AMG (thresholds 0, every mask RLE-encoded), the whole generate: requests
    only at the documented points; the RLE crosses once per batch (two numpy views on the
    CPU, one transfer on a GPU) and nothing is asked per mask (the masks stay packed)."""
    predictors, image = image_predictors
    syncs, outside = amg_syncs(MaskGenerator(predictors[1], **KEEP_ALL), image)
    assert outside == []
    batches = 16 // 4
    rle = [s for s in syncs if s.where.startswith("sam2serve.engine.rle.")]
    assert 1 <= len(rle) <= 2 * batches
    # No upload blocks (NMS's kept rows cross pinned and non-blocking, as frames do).
    assert [s.where for s in syncs if s.kind == "upload"] == []
    # Nothing scales with the number of masks: the same count with 1 or 3 masks a click.
    single = MaskGenerator(predictors[1], multimask_output=False, **KEEP_ALL)
    assert len(amg_syncs(single, image)[0]) == len(syncs)


def test_an_rle_per_mask_fails_the_amg_counts(image_predictors, monkeypatch):
    """Not vacuous: encoding each mask on its own (a transfer per mask) is seen."""
    from sam2serve.engine.rle import Runs, masks_to_runs

    predictors, image = image_predictors

    def per_mask(masks):
        size = (masks.shape[1], masks.shape[2])
        return Runs.concat([masks_to_runs(m[None]) for m in masks], size)

    generator = MaskGenerator(predictors[1], **KEEP_ALL)
    monkeypatch.setattr(generator, "_rle", per_mask)
    syncs, _ = amg_syncs(generator, image)
    rle = [s for s in syncs if s.where.startswith("sam2serve.engine.rle.")]
    assert len(rle) > 2 * (16 // 4)
