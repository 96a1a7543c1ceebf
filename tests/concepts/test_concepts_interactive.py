"""SAM 3 interactive: ours (the sam2 neck + SAM 2.1's heads and predictor at SAM 3's size,
sam2serve.concepts.interactive) equals Meta's sam3 ``Sam3Image.predict_inst`` on identical
seeded random weights, reduced size; the tracker's keys load strictly."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from unittest import mock

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
if importlib.util.find_spec("sam3") is None:  # Meta's package: pip install --no-deps sam3
    pytest.skip("Meta's sam3 is not installed", allow_module_level=True)
from meta_sam3 import build_meta_image_model, sam3_checkpoint

from sam2serve.concepts.checkpoint import CheckpointMismatch, load_strict, meta_to_transformers
from sam2serve.concepts.engine import encode_images
from sam2serve.concepts.interactive import InteractivePredictor, fill_holes
from sam2serve.concepts.model import Sam3Size, build_model
from sam2serve.concepts.runtime import randomize_
from sam2serve.concepts.tokenizer import clip_bpe_path
from sam2serve.concepts.tracker_heads import (
    build_tracker_heads,
    load_tracker_heads,
    split_tracker_state,
)
from sam2serve.engine.prompts import PromptError

SIZE = Sam3Size.tiny()
# The detector's oracle's tolerances (tests/concepts/test_concepts_fidelity.py)
SCORE_ATOL, MASK_MISMATCH = 1e-5, 1e-3
LOGIT_ATOL = 1e-4
HEIGHT, WIDTH = 200, 300


@pytest.fixture(scope="module")
def pair():
    meta = build_meta_image_model(SIZE.as_dict(), clip_bpe_path(), interactive=True)
    randomize_(meta, 1)
    state = sam3_checkpoint(meta)
    model = build_model(SIZE)
    load_strict(model, meta_to_transformers(state))
    heads = build_tracker_heads(SIZE)
    video = load_tracker_heads(heads, state)
    assert video and all(not k.startswith("sam_") for k in video)  # the video tracker's
    image = np.random.default_rng(0).integers(0, 256, (HEIGHT, WIDTH, 3), dtype=np.uint8)
    [encoding] = encode_images(model, [image], heads)
    return meta, meta_state(meta, image), InteractivePredictor(heads), encoding, model


def meta_state(meta, image):
    from PIL import Image
    from sam3.model.sam3_image_processor import Sam3Processor

    processor = Sam3Processor(meta, SIZE.image_size, "cpu")
    with mock.patch.object(torch.Tensor, "pin_memory", lambda self, *a, **k: self):
        return processor.set_image(Image.fromarray(image))


CASES = {
    "one click, multimask": {"point_coords": [[100.0, 80.0]], "point_labels": [1]},
    "clicks, single mask": {
        "point_coords": [[100.0, 80.0], [250.0, 150.0]],
        "point_labels": [1, 0],
        "multimask_output": False,
    },
    "box": {"box": [30.0, 40.0, 160.0, 180.0], "multimask_output": False},
    "box and click": {
        "box": [30.0, 40.0, 160.0, 180.0],
        "point_coords": [[90.0, 90.0]],
        "point_labels": [1],
    },
    "objects": {
        "box": [[30.0, 40.0, 160.0, 180.0], [150.0, 20.0, 290.0, 120.0]],
        "point_coords": [[[90.0, 90.0]], [[200.0, 60.0]]],
        "point_labels": [[1], [0]],
        "multimask_output": False,
    },
}


def ours_predict(predictor, side, case: dict):
    arrays = {k: np.asarray(v) for k, v in case.items() if k != "multimask_output"}
    prediction = predictor.predict(
        side,
        point_coords=arrays.get("point_coords"),
        point_labels=arrays.get("point_labels"),
        boxes=arrays.get("box"),
        mask_input=arrays.get("mask_input"),
        multimask_output=case.get("multimask_output", True),
    )
    return prediction.numpy()


def assert_equal(meta_out, ours_out, objects: int) -> dict[str, float]:
    m_masks, m_iou, m_low = (np.asarray(a) for a in meta_out)
    masks, iou, low = ours_out
    if objects == 1:  # Meta drops the object axis of a single object
        masks, iou, low = masks[0], iou[0], low[0]
    assert masks.shape == m_masks.shape
    np.testing.assert_allclose(iou, m_iou, atol=SCORE_ATOL)
    np.testing.assert_allclose(low, m_low, atol=LOGIT_ATOL)
    mismatch = float((masks != m_masks.astype(bool)).mean())
    assert mismatch < MASK_MISMATCH
    return {
        "iou": float(np.abs(iou - m_iou).max()),
        "logit": float(np.abs(low - m_low).max()),
        "mask_fraction": mismatch,
    }


@pytest.mark.parametrize("decoder", ["reference", "fast"])
@pytest.mark.parametrize("name", list(CASES))
def test_equal_to_meta(pair, name, decoder):
    """SAM 2.1's reference decoder, and its fast one (what the surfaces run), on SAM 3's heads."""
    meta, state, predictor, encoding, _ = pair
    case = CASES[name]
    if decoder == "fast":
        predictor = InteractivePredictor(predictor.tracker_heads, decoder="fast")
        encoding = encoding.owned()  # the fast decoder keeps its side in the encoding's
    with torch.inference_mode():
        expected = meta.predict_inst(
            state, **{k: np.asarray(v) if k != "multimask_output" else v for k, v in case.items()}
        )
        got = ours_predict(predictor, encoding.tracker, case)
    print(f"\n{name}, {decoder}: {assert_equal(expected, got, 2 if name == 'objects' else 1)}")


def test_mask_input_refinement_equal_to_meta(pair):
    """A second click with the first answer's low-res logits as mask input, as a page sends."""
    meta, state, predictor, encoding, _ = pair
    first = {"point_coords": [[100.0, 80.0]], "point_labels": [1]}
    with torch.inference_mode():
        _, iou, low = meta.predict_inst(state, **{k: np.asarray(v) for k, v in first.items()})
        best = low[int(np.argmax(iou))][None]
        case = {
            "point_coords": [[100.0, 80.0], [140.0, 120.0]],
            "point_labels": [1, 0],
            "mask_input": best,
            "multimask_output": False,
        }
        expected = meta.predict_inst(
            state, **{k: np.asarray(v) if k != "multimask_output" else v for k, v in case.items()}
        )
        got = ours_predict(predictor, encoding.tracker, case)
    assert_equal(expected, got, 1)


def test_holes_are_filled_as_meta_fills_them(pair):
    """Random weights give ragged masks: Meta's hole filling changes them, and ours with it
    (without it, the masks differ where Meta filled holes)."""
    meta, state, predictor, encoding, _ = pair
    case = CASES["one click, multimask"]
    with torch.inference_mode():
        expected = meta.predict_inst(state, **{k: np.asarray(v) for k, v in case.items()})
        unfilled = InteractivePredictor(predictor.tracker_heads, max_hole_area=0)
        raw = ours_predict(unfilled, encoding.tracker, case)
    assert (raw[0][0] != expected[0].astype(bool)).mean() > MASK_MISMATCH


def test_fill_holes_counts_eight_connected_cells():
    logits = torch.full((2, 40, 40), 5.0)
    logits[0, 2:18, 2:18] = -1.0  # 256 cells: filled
    logits[1, 2:19, 2:18] = -1.0  # 272 cells: kept
    logits[:, 30, 30] = -1.0
    logits[:, 31, 31] = -1.0  # diagonal neighbours: one region of 2 cells
    filled = fill_holes(logits, 256)
    assert bool((filled[0] > 0).all())
    assert int((filled[1] <= 0).sum()) == 17 * 16
    assert float(filled[0, 30, 30]) == 10.0
    assert fill_holes(logits, 0) is logits


def test_one_backbone_pass_feeds_both_paths(pair):
    *_, predictor, _, model = pair
    calls = []
    handle = model.vision_encoder.backbone.register_forward_hook(lambda *a: calls.append(1))
    try:
        images = [np.zeros((64, 80, 3), np.uint8), np.full((50, 50, 3), 200, np.uint8)]
        encodings = encode_images(model, images, predictor.tracker_heads)
    finally:
        handle.remove()
    assert len(calls) == 1
    grid = SIZE.image_size // 14
    assert encodings[1].tracker.image_embed.shape == (1, 256, grid, grid)
    assert encodings[1].tracker.original_size == (50, 50)
    owned = encodings[1].owned()
    assert owned.tracker.image_embed.untyped_storage().data_ptr() != (
        encodings[1].tracker.image_embed.untyped_storage().data_ptr()
    )
    assert owned.nbytes == encodings[1].nbytes > 0


def test_bad_prompts_are_named(pair):
    *_, predictor, encoding, _ = pair
    with pytest.raises(PromptError, match="mask_input must have shape"):
        predictor.predict(encoding.tracker, [[1.0, 2.0]], [1], mask_input=np.zeros((1, 64, 64)))
    with pytest.raises(PromptError, match="point_labels"):
        predictor.predict(encoding.tracker, [[1.0, 2.0]], [7])
    with pytest.raises(ValueError, match="max_hole_area"):
        InteractivePredictor(predictor.tracker_heads, max_hole_area=-1)


def test_tracker_keys_load_strictly(pair):
    meta, *_ = pair
    state = sam3_checkpoint(meta)
    heads_state, _ = split_tracker_state(state)
    missing = dict(state)
    missing.pop("tracker.sam_mask_decoder.iou_token.weight")
    with pytest.raises(CheckpointMismatch, match="iou_token"):
        load_tracker_heads(build_tracker_heads(SIZE), missing)
    neck = dict(state)
    neck.pop("detector.backbone.vision_backbone.sam2_convs.1.conv_3x3.bias")
    with pytest.raises(CheckpointMismatch, match=r"neck\.fpn_layers\.1\.proj2\.bias"):
        load_tracker_heads(build_tracker_heads(SIZE), neck)
    unknown = dict(state)
    unknown["tracker.surprise.weight"] = torch.zeros(1)
    with pytest.raises(CheckpointMismatch, match="tracker.surprise.weight"):
        split_tracker_state(unknown)
    assert len(heads_state) == len(build_tracker_heads(SIZE).state_dict())


@pytest.mark.extended
def test_full_size_heads_equal_to_meta():
    """Second tier: SAM 3's full-size interactive path after the ViT (the sam2 neck on a
    1024 x 72² ViT output, the tracker heads at 1008 px, 288² low-res logits, Meta's hole
    filling) through Meta's own ``predict_inst`` on its ``build_tracker`` and its dual
    neck's ``sam2_convs``, on identical seeded weights (the ViT before it is the
    detector's, checked at full size by test_concepts_fidelity.py)."""
    from meta_sam3 import _interactive, import_sam3

    builder = import_sam3()  # the shims first on the path
    from sam3.model.necks import Sam3DualViTDetNeck
    from sam3.model.sam1_task_predictor import SAM3InteractiveImagePredictor
    from sam3.model.sam3_image import Sam3Image

    full = Sam3Size.full()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        with _interactive(builder, full.image_size):
            tracker = builder.build_tracker(apply_temporal_disambiguation=False)
        trunk = torch.nn.Module()
        trunk.channel_list = [full.vit_dim]
        neck = Sam3DualViTDetNeck(trunk, None, 256, add_sam2_neck=True)
    tracker.eval()
    randomize_(tracker, 2)
    randomize_(neck.sam2_convs, 3)
    state = {f"tracker.{k}": v for k, v in tracker.state_dict().items()}
    prefix = "detector.backbone.vision_backbone.sam2_convs."
    state.update({prefix + k: v for k, v in neck.sam2_convs.state_dict().items()})
    heads = build_tracker_heads(full)
    load_tracker_heads(heads, state)

    grid = full.image_size // 14
    vit = torch.randn(1, full.vit_dim, grid, grid, generator=torch.Generator().manual_seed(4))
    size = (300, 420)
    with torch.inference_mode():
        levels = [neck.sam2_convs[i](vit) for i in range(3)]  # Meta's dual neck, scalp=1
        decoder = tracker.sam_mask_decoder
        fpn = [decoder.conv_s0(levels[0]), decoder.conv_s1(levels[1]), levels[2]]
        inference_state = {
            "original_height": size[0],
            "original_width": size[1],
            "backbone_out": {
                "sam2_backbone_out": {"backbone_fpn": fpn, "vision_pos_enc": fpn},
            },
        }
        host = torch.nn.Module()
        host.inst_interactive_predictor = SAM3InteractiveImagePredictor(tracker)
        side = heads.embedding(heads.neck_levels(vit), (size,))
        for case in (
            {"point_coords": [[120.0, 90.0]], "point_labels": [1]},
            {
                "box": [40.0, 30.0, 260.0, 240.0],
                "point_coords": [[150.0, 100.0]],
                "point_labels": [0],
                "multimask_output": False,
            },
        ):
            kwargs = {k: v if isinstance(v, bool) else np.asarray(v) for k, v in case.items()}
            expected = Sam3Image.predict_inst(host, inference_state, **kwargs)
            for decoder_name in ("reference", "fast"):
                predictor = InteractivePredictor(heads, decoder=decoder_name)
                got = ours_predict(predictor, side, case)
                print(f"\nfull size, {decoder_name}: {assert_equal(expected, got, 1)}")
