"""engine.tasks: the three tasks honour the mode flags without changing the masks, point
records are the Predictor's best of 3 (checked against pycocotools), prompts come from
the largest masks first, and the stage timer splits time exclusively."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from pycocotools import mask as mask_utils
from skimage import data

from sam2serve.engine import tasks
from sam2serve.engine.amg import AMGParams, MaskGenerator
from sam2serve.engine.predictor import Predictor
from sam2serve.engine.tasks import StageTimer, TaskOptions

REFERENCE_WAY = TaskOptions(batch_prompts=False, batch_rle=False)
BATCHED = TaskOptions(batch_prompts=True, batch_rle=True)
POINTS = [[30.0, 40.0], [200.0, 150.0], [420.0, 250.0], [5.0, 290.0], [225.5, 10.25]]


@pytest.fixture(scope="module")
def predictor(tiny_model):
    return Predictor(tiny_model)


@pytest.fixture(scope="module")
def image():
    return data.chelsea()  # 300 x 451


@pytest.fixture(scope="module")
def embedding(predictor, image):
    return predictor.encode(image)


def decode_coco(segmentation: dict) -> np.ndarray:
    coco = {"size": segmentation["size"], "counts": segmentation["counts"].encode()}
    return mask_utils.decode(coco).astype(bool)


def test_mps_records_are_the_predictors_best_of_three(predictor, image, embedding):
    records = tasks.mps(predictor, image, POINTS, embedding=embedding)
    assert [r["point_coords"] for r in records] == [[p] for p in POINTS]
    for point, record in zip(POINTS, records, strict=True):
        one = predictor.predict(embedding, point_coords=[point], point_labels=[1])
        best = int(one.iou_scores[0].argmax())
        expected = one.masks[0, best].numpy()
        mask = decode_coco(record["segmentation"])
        assert mask.shape == image.shape[:2]
        # One prompt alone or five together: float rounding may flip a few edge pixels.
        assert np.logical_xor(mask, expected).sum() <= max(5, expected.sum() // 1000)
        assert record["area"] == int(mask.sum())
        assert record["predicted_iou"] == pytest.approx(float(one.iou_scores[0, best]), abs=1e-4)


def test_reference_way_and_batched_way_give_the_same_records(predictor, image, embedding):
    """batch_prompts / batch_rle change how the work is done, never the answer."""
    one_by_one = tasks.mps(predictor, image, POINTS, flags=REFERENCE_WAY, embedding=embedding)
    batched = tasks.mps(predictor, image, POINTS, flags=BATCHED, embedding=embedding)
    assert len(one_by_one) == len(batched) == len(POINTS)
    for a, b in zip(one_by_one, batched, strict=True):
        assert a["point_coords"] == b["point_coords"]
        assert a["predicted_iou"] == pytest.approx(b["predicted_iou"], abs=1e-5)
        mask_a, mask_b = decode_coco(a["segmentation"]), decode_coco(b["segmentation"])
        assert np.logical_xor(mask_a, mask_b).sum() <= max(5, mask_a.sum() // 1000)


def test_rle_one_mask_at_a_time_equals_batched_rle(predictor, image, embedding):
    """With the prompts decoded the same way, only the RLE path differs: identical."""
    per_mask = TaskOptions(batch_prompts=True, batch_rle=False)
    assert tasks.mps(predictor, image, POINTS, flags=per_mask, embedding=embedding) == tasks.mps(
        predictor, image, POINTS, flags=BATCHED, embedding=embedding
    )


def test_sps_is_mps_with_one_point(predictor, image, embedding):
    (single,) = tasks.sps(predictor, image, POINTS[1], embedding=embedding)
    assert single == tasks.mps(predictor, image, POINTS[1:2], embedding=embedding)[0]
    assert tasks.mps(predictor, image, [], embedding=embedding) == []


def test_bbox_is_metas_xywh(predictor, image, embedding):
    for record in tasks.mps(predictor, image, POINTS, embedding=embedding):
        mask = decode_coco(record["segmentation"])
        if not mask.any():
            assert record["bbox"] == [0.0, 0.0, 0.0, 0.0]
            continue
        cols, rows = np.flatnonzero(mask.any(0)), np.flatnonzero(mask.any(1))
        expected = [cols[0], rows[0], cols[-1] - cols[0], rows[-1] - rows[0]]
        assert record["bbox"] == [float(v) for v in expected]


def test_amg_rle_one_mask_at_a_time_keeps_the_masks(predictor, image, embedding):
    """batch_rle=False (baseline) reaches AMG's RLE too, with the same records."""
    params = AMGParams(points_per_side=4, pred_iou_thresh=0.0, stability_score_thresh=0.0)
    batched = tasks.mask_generator(predictor, params)
    assert batched.params.output_mode == "coco_rle"
    one_by_one = tasks.mask_generator(predictor, params, REFERENCE_WAY)
    calls: list[int] = []
    counted = tasks.rle_encoder(False)
    coco = params.replace(output_mode="coco_rle")
    probe = MaskGenerator(predictor, coco, rle=lambda m: calls.append(len(m)) or counted(m))
    default = tasks.amg(batched, image, embedding=embedding)
    assert default, "thresholds at 0 keep masks even with random weights"
    assert tasks.amg(one_by_one, image, flags=REFERENCE_WAY, embedding=embedding) == default
    assert [dict(r) for r in probe.generate(image, embedding=embedding)] == default
    assert calls and sum(calls) >= len(default)
    for record in default:
        assert set(record) >= {"segmentation", "area", "bbox", "predicted_iou", "crop_box"}
        assert record["area"] == int(decode_coco(record["segmentation"]).sum())


def test_timed_amg_gives_the_same_records_and_fills_the_stages(predictor, image):
    params = AMGParams(points_per_side=4, pred_iou_thresh=0.0, stability_score_thresh=0.0)
    generator = tasks.mask_generator(predictor, params)
    timer = StageTimer(predictor.device)
    timed = tasks.amg(generator, image, timer=timer)
    assert timed == tasks.amg(generator, image)
    for stage in ("decode", "preprocess", "encode", "decode_masks", "postprocess", "rle"):
        assert timer.ms[stage] > 0, stage


def test_timed_point_task_fills_every_stage(predictor, image):
    timer = StageTimer(predictor.device)
    tasks.mps(predictor, image, POINTS, flags=REFERENCE_WAY, timer=timer)
    assert set(timer.ms) == set(tasks.STAGES)
    assert all(timer.ms[stage] > 0 for stage in tasks.STAGES), timer.ms
    assert timer.total_ms == pytest.approx(sum(timer.ms.values()))
    assert set(timer.as_dict()) == {f"{stage}_ms" for stage in tasks.STAGES}


def test_stage_timer_is_exclusive_when_nested(monkeypatch):
    """A stage opened inside another pauses it: with a fake clock the split is exact."""
    now = [0.0]
    monkeypatch.setattr(tasks.time, "perf_counter", lambda: now[0])
    timer = StageTimer("cpu")
    with timer.stage("postprocess"):
        now[0] += 1.0
        with timer.stage("decode_masks"):
            now[0] += 2.0
            with timer.stage("decode_masks"):  # re-entering a stage is fine
                now[0] += 0.5
        now[0] += 0.25
        with timer.stage("rle"):
            now[0] += 4.0
    now[0] += 100.0  # outside every stage: not counted
    assert timer.ms["postprocess"] == pytest.approx(1250.0)
    assert timer.ms["decode_masks"] == pytest.approx(2500.0)
    assert timer.ms["rle"] == pytest.approx(4000.0)
    assert timer.total_ms == pytest.approx(7750.0)
    with pytest.raises(ValueError, match="unknown stage 'nms'"), timer.stage("nms"):
        pass


def test_stage_timer_still_closes_a_stage_that_raised(monkeypatch):
    now = [0.0]
    monkeypatch.setattr(tasks.time, "perf_counter", lambda: now[0])
    timer = StageTimer()
    with pytest.raises(RuntimeError), timer.stage("encode"):
        now[0] += 1.0
        raise RuntimeError("boom")
    with timer.stage("rle"):
        now[0] += 1.0
    assert timer.ms["encode"] == pytest.approx(1000.0)
    assert timer.ms["rle"] == pytest.approx(1000.0)


def test_prompt_points_largest_mask_first():
    def record(mask: np.ndarray) -> dict:
        coco = mask_utils.encode(np.asfortranarray(mask.astype(np.uint8)))
        return {
            "segmentation": {"size": coco["size"], "counts": coco["counts"].decode()},
            "area": int(mask.sum()),
        }

    small, large, empty = (np.zeros((20, 30), dtype=bool) for _ in range(3))
    small[2:4, 2:5] = True
    large[8:19, 10:29] = True
    points = tasks.prompt_points([record(small), record(empty), record(large)])
    assert len(points) == 2  # the empty mask gives no point
    (x0, y0), (x1, y1) = points
    assert large[round(y0), round(x0)] and small[round(y1), round(x1)]


def test_unbatched_decoding_calls_the_decoder_once_per_prompt(predictor, image, embedding):
    calls = []
    original = predictor.decode_low_res

    def counting(*args, **kwargs):
        calls.append(args[1].shape[0])
        return original(*args, **kwargs)

    predictor.decode_low_res = counting
    try:
        tasks.mps(predictor, image, POINTS, flags=REFERENCE_WAY, embedding=embedding)
        assert calls == [1] * len(POINTS)
        calls.clear()
        tasks.mps(predictor, image, POINTS, flags=BATCHED, embedding=embedding)
        assert calls == [len(POINTS)]
    finally:
        del predictor.decode_low_res


def test_a_wrong_embedding_is_refused(predictor, image, embedding):
    with pytest.raises(ValueError, match="embedding is for"):
        tasks.mps(predictor, image[:100], POINTS[:1], embedding=embedding)
    assert torch.is_inference_mode_enabled() is False


# --------------------------------------------------------------------------- object prompts

BOX = [120.0, 60.0, 330.0, 260.0]
OBJECTS = [
    {"points": [], "labels": [], "box": BOX},  # a box alone
    {"points": [[200.0, 150.0]], "labels": [0], "box": BOX},  # a box and a negative click
    {"points": [[200.0, 150.0], [60.0, 40.0]], "labels": [1, 0], "box": None},
]


def best_of_three(predictor, embedding, **prompt) -> tuple[np.ndarray, float]:
    """The Predictor's own answer for one object: its best mask and score."""
    one = predictor.predict(embedding, multimask_output=True, **prompt)
    best = int(one.iou_scores[0].argmax())
    return one.masks[0, best].numpy(), float(one.iou_scores[0, best])


def assert_record_is(record: dict, mask: np.ndarray, score: float) -> None:
    found = decode_coco(record["segmentation"])
    assert np.logical_xor(found, mask).sum() <= max(5, mask.sum() // 1000)
    assert record["predicted_iou"] == pytest.approx(score, abs=1e-4)


def test_sps_with_an_object_is_the_predictors_box_and_labels(predictor, image, embedding):
    """Each object alone against Predictor.predict given the box as ``boxes`` (which puts
    the corners first itself) and the clicks with their labels."""
    for prompt in OBJECTS:
        (record,) = tasks.sps(predictor, image, prompt, embedding=embedding)
        kwargs = {"boxes": prompt["box"]} if prompt["box"] else {}
        if prompt["points"]:
            kwargs |= {"point_coords": [prompt["points"]], "point_labels": [prompt["labels"]]}
        assert_record_is(record, *best_of_three(predictor, embedding, **kwargs))
        assert record["point_coords"] == prompt["points"]
        assert record["point_labels"] == prompt["labels"] and record["box"] == prompt["box"]


def test_mps_pads_shorter_objects_with_not_a_point(predictor, image, embedding):
    """Objects of different lengths are decoded together, the shorter padded with SAM's
    "not a point" (label -1) as the service does: the box-only object is the Predictor's
    answer for its corners plus one padding point, written out by hand."""
    records = tasks.mps(predictor, image, OBJECTS, embedding=embedding)
    assert len(records) == 3
    padded_box = {"point_coords": [[[120, 60], [330, 260], [0, 0]]], "point_labels": [[2, 3, -1]]}
    assert_record_is(records[0], *best_of_three(predictor, embedding, **padded_box))
    (alone,) = tasks.sps(predictor, image, OBJECTS[1], embedding=embedding)  # the longest
    assert_record_is(records[1], *best_of_three(predictor, embedding, boxes=BOX, point_coords=[[[200, 150]]], point_labels=[[0]]))  # fmt: skip
    assert records[1]["predicted_iou"] == pytest.approx(alone["predicted_iou"], abs=1e-4)
    one_by_one = tasks.mps(predictor, image, OBJECTS, flags=REFERENCE_WAY, embedding=embedding)
    for a, b in zip(one_by_one, records, strict=True):
        assert a["predicted_iou"] == pytest.approx(b["predicted_iou"], abs=1e-5)


def test_point_records_keep_their_form(predictor, image, embedding):
    """A bare click keeps the original record (no labels, no box); objects add them."""
    plain, obj = tasks.mps(predictor, image, [POINTS[0], OBJECTS[2]], embedding=embedding)
    assert set(plain) == {"segmentation", "area", "bbox", "predicted_iou", "point_coords"}
    assert set(obj) == set(plain) | {"point_labels", "box"}
    with pytest.raises(ValueError, match="needs at least one point or a box"):
        tasks.mps(predictor, image, [{"points": []}], embedding=embedding)


def test_the_fast_decoder_gives_objects_the_same_masks(predictor, image, embedding):
    """Padded objects through the fast decoder (enough prompts to use it) as through the
    reference decoder."""
    fast = Predictor(predictor.model, decoder="fast", fast_min_prompts=1)
    prompts = [*OBJECTS, POINTS[0], *OBJECTS]
    reference = tasks.mps(predictor, image, prompts, embedding=embedding)
    for a, b in zip(tasks.mps(fast, image, prompts, embedding=embedding), reference, strict=True):
        assert_record_is(a, decode_coco(b["segmentation"]), b["predicted_iou"])
