"""sam2serve.compat against Meta's own classes, on identical weights.

Meta's notebook-style usage (its image predictor example: set_image, then a click, two
clicks, a negative click, a box, a box with a click, a batch of boxes, refinement from the
previous low-res logits, a batch of images, and automatic mask generation) runs once
through Meta's SAM2ImagePredictor / SAM2AutomaticMaskGenerator and once through ours,
switched by the imports only. Both models load the same official-shaped checkpoint (see
tests/oracle.py): ours through ``sam2serve.compat.build_sam2`` with Meta's config name.
Outputs must agree in shape and dtype exactly, and in value to float rounding.
"""

from __future__ import annotations

import inspect

import numpy as np
import pytest
import torch
from reference import import_reference
from skimage import data

from sam2serve.compat import SAM2AutomaticMaskGenerator, SAM2ImagePredictor, build_sam2
from sam2serve.compat.build import size_of
from sam2serve.engine.amg import AMGParamError, AMGParams
from sam2serve.engine.predictor import Predictor, PromptError
from tests.engine.test_amg import KEEP_ALL, assert_records_match

CONFIG = "configs/sam2.1/sam2.1_hiera_t.yaml"
RTOL = 1e-4


@pytest.fixture(scope="module")
def meta_classes():
    import_reference()
    from sam2.automatic_mask_generator import SAM2AutomaticMaskGenerator as MetaGenerator
    from sam2.sam2_image_predictor import SAM2ImagePredictor as MetaPredictor

    return MetaPredictor, MetaGenerator


@pytest.fixture(scope="module")
def our_model(tiny_checkpoint):
    return build_sam2(CONFIG, str(tiny_checkpoint), device="cpu")


@pytest.fixture(scope="module")
def image() -> np.ndarray:
    return data.coffee()  # 400 x 600: not square, so the coordinate scaling matters


@pytest.fixture(scope="module")
def predictors(meta_classes, tiny_meta_model, our_model, image):
    """(ours, Meta's), each set to the same image."""
    meta = meta_classes[0](tiny_meta_model)
    ours = SAM2ImagePredictor(our_model)
    for predictor in (meta, ours):
        predictor.set_image(image)
    return ours, meta


def mask_iou(a: np.ndarray, b: np.ndarray) -> float:
    union = np.logical_or(a, b).sum()
    return 1.0 if union == 0 else float(np.logical_and(a, b).sum() / union)


def assert_same_outputs(ours, theirs, logits: bool = False) -> None:
    """(masks, iou_predictions, low_res_masks): same shapes and dtypes; masks IoU >=
    0.999 (or logits close), IoU predictions within 1e-4, low-res logits close."""
    for a, b in zip(ours, theirs, strict=True):
        assert isinstance(a, np.ndarray)
        assert a.shape == b.shape and a.dtype == b.dtype, (a.shape, a.dtype, b.shape, b.dtype)
    masks, iou, low_res = ours
    ref_masks, ref_iou, ref_low_res = theirs
    if logits:
        scale = np.abs(ref_masks).max()
        assert np.abs(masks - ref_masks).max() <= RTOL * scale
    else:
        assert set(np.unique(masks)) <= {0.0, 1.0}
        flat = masks.reshape(-1, *masks.shape[-2:]).astype(bool)
        ref_flat = ref_masks.reshape(-1, *masks.shape[-2:]).astype(bool)
        ious = [mask_iou(a, b) for a, b in zip(flat, ref_flat, strict=True)]
        assert min(ious) >= 0.999, ious
    np.testing.assert_allclose(iou, ref_iou, atol=RTOL, rtol=0)
    assert np.abs(low_res - ref_low_res).max() <= RTOL * np.abs(ref_low_res).max()


# Meta's image predictor example, scaled to the 600 x 400 photo: (name, predict kwargs).
CASES = {
    "one_click": {"point_coords": np.array([[300, 200]]), "point_labels": np.array([1])},
    "two_clicks_one_mask": {
        "point_coords": np.array([[300, 200], [450, 300]]),
        "point_labels": np.array([1, 1]),
        "multimask_output": False,
    },
    "negative_click": {
        "point_coords": np.array([[300, 200], [100, 80]]),
        "point_labels": np.array([1, 0]),
        "multimask_output": False,
    },
    "box": {"box": np.array([180, 60, 470, 330]), "multimask_output": False},
    "box_and_negative_click": {
        "point_coords": np.array([[320, 190]]),
        "point_labels": np.array([0]),
        "box": np.array([180, 60, 470, 330]),
        "multimask_output": False,
    },
    "batched_boxes": {
        "box": np.array([[10, 10, 200, 150], [180, 60, 470, 330], [400, 200, 590, 390], [0, 0, 600, 400]]),
        "multimask_output": False,
    },
    "batched_clicks": {
        "point_coords": np.array([[[100, 100]], [[300, 200]], [[500, 300]], [[550, 50]], [[20, 380]]]),
        "point_labels": np.ones((5, 1), dtype=np.int64),
    },
    "normalized_coords": {
        "point_coords": np.array([[0.5, 0.5], [0.2, 0.7]]),
        "point_labels": np.array([1, 0]),
        "normalize_coords": False,
    },
}  # fmt: skip


@pytest.mark.parametrize("case", list(CASES))
def test_predict_matches_meta(predictors, case):
    ours, meta = predictors
    out = ours.predict(**CASES[case])
    assert_same_outputs(out, meta.predict(**CASES[case]))
    if case == "one_click":  # Meta squeezes one prompt: (C, H, W) masks, (C,) scores
        assert out[0].shape == (3, 400, 600) and out[1].shape == (3,)
        assert out[2].shape == (3, 256, 256) and out[0].dtype == np.float32
    if case == "batched_boxes":
        assert out[0].shape == (4, 1, 400, 600)


def test_logits_and_mask_threshold_match_meta(meta_classes, tiny_meta_model, predictors):
    ours, meta = predictors
    click = CASES["one_click"]
    assert_same_outputs(
        ours.predict(**click, return_logits=True), meta.predict(**click, return_logits=True), True
    )
    # A raised threshold: a second compatible predictor on the same engine and image.
    raised_ours = SAM2ImagePredictor(ours, mask_threshold=0.1)
    raised_ours.set_embedding(ours.embedding)
    raised_meta = meta_classes[0](tiny_meta_model, mask_threshold=0.1)
    raised_meta._features, raised_meta._orig_hw = meta._features, meta._orig_hw
    raised_meta._is_image_set = True
    assert_same_outputs(raised_ours.predict(**click), raised_meta.predict(**click))
    assert raised_ours.predict(**click)[0].sum() < ours.predict(**click)[0].sum()


def test_refining_with_the_previous_low_res_logits_matches_meta(predictors):
    """The notebook's refinement: the best mask's logits as mask_input, more clicks."""
    ours, meta = predictors
    refined = []
    for predictor in (ours, meta):
        _, scores, logits = predictor.predict(**CASES["one_click"])
        mask_input = logits[np.argmax(scores), :, :]
        refined.append(
            predictor.predict(
                point_coords=np.array([[300, 200], [450, 300]]),
                point_labels=np.array([1, 1]),
                mask_input=mask_input[None, :, :],
                multimask_output=False,
            )
        )
    assert_same_outputs(*refined)


def test_image_embedding_and_state_match_meta(predictors):
    ours, meta = predictors
    embedding = ours.get_image_embedding()
    assert isinstance(embedding, torch.Tensor) and embedding.shape == (1, 256, 64, 64)
    reference = meta.get_image_embedding()
    assert (embedding - reference).abs().max() <= RTOL * reference.abs().max()
    assert ours._orig_hw == [tuple(hw) for hw in meta._orig_hw] == [(400, 600)]
    assert ours._is_image_set and not ours._is_batch
    # The stateless engine takes the same embedding and gives the same answer.
    stateless = ours.engine.predict(ours.embedding, point_coords=[[300, 200]], point_labels=[1])
    np.testing.assert_allclose(
        stateless.iou_scores.numpy()[0], ours.predict(**CASES["one_click"])[1]
    )


def test_image_batch_matches_meta(meta_classes, tiny_meta_model, predictors, image):
    """set_image_batch + predict_batch with boxes per image, then clicks per image."""
    ours, _ = predictors
    meta = meta_classes[0](tiny_meta_model)
    ours = SAM2ImagePredictor(ours)  # the same engine, its own image state
    images = [image, data.chelsea()]  # 400 x 600 and 300 x 451
    boxes = [np.array([[10, 10, 200, 150], [180, 60, 470, 330]]), np.array([[50, 40, 300, 250]])]
    clicks = [np.array([[[300, 200]], [[100, 100]]]), np.array([[[200, 150]]])]
    labels = [np.ones((2, 1)), np.ones((1, 1))]
    for predictor in (ours, meta):
        predictor.set_image_batch(images)
    for kwargs in (
        {"box_batch": boxes, "multimask_output": False},
        {"point_coords_batch": clicks, "point_labels_batch": labels},
    ):
        out, ref = ours.predict_batch(**kwargs), meta.predict_batch(**kwargs)
        assert all(len(a) == len(images) for a in (*out, *ref))
        for index in range(len(images)):
            assert_same_outputs(*(tuple(lists[i][index] for i in range(3)) for lists in (out, ref)))
    assert out[0][1].shape == (3, 300, 451)  # one prompt on the second image: squeezed
    # After a batch, predict answers for the last image, as Meta's does.
    assert_same_outputs(ours.predict(**CASES["one_click"]), meta.predict(**CASES["one_click"]))


def test_automatic_mask_generation_matches_meta(meta_classes, tiny_meta_model, our_model, image):
    params = {"points_per_side": 4, **KEEP_ALL}
    small = image[::2, ::2].copy()
    theirs = meta_classes[1](tiny_meta_model, **params).generate(small)
    ours = SAM2AutomaticMaskGenerator(our_model, **params)
    records = ours.generate(small)
    assert isinstance(records[0]["segmentation"], np.ndarray)  # Meta's default binary_mask
    assert_records_match(records, theirs)
    assert len(records) >= 16
    assert ours.points_per_side == 4 and ours.pred_iou_thresh == 0.0
    assert isinstance(ours.predictor, SAM2ImagePredictor)


def test_generator_takes_metas_arguments_with_metas_defaults(meta_classes, our_model):
    signature = inspect.signature(meta_classes[1].__init__)
    defaults = {
        name: p.default
        for name, p in signature.parameters.items()
        if p.default is not inspect.Parameter.empty
    }
    generator = SAM2AutomaticMaskGenerator(our_model, **defaults)
    assert generator.params == AMGParams(**defaults) == AMGParams()
    assert generator.output_mode == "binary_mask"
    with pytest.raises(AMGParamError, match="points_per_sid"):
        SAM2AutomaticMaskGenerator(our_model, points_per_sid=16)


def connected_components(mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Meta's get_connected_components as its docstring defines it (8-connectivity, (N, 1,
    H, W) labels and per-pixel component areas), for the CPU: its CUDA kernel cannot run
    here, and Meta's predictor then skips the hole and sprinkle clean-up altogether."""
    from scipy import ndimage

    labels = np.zeros(mask.shape, dtype=np.int32)
    areas = np.zeros(mask.shape, dtype=np.int32)
    for index, plane in enumerate(mask[:, 0].numpy().astype(bool)):
        found, _ = ndimage.label(plane, structure=np.ones((3, 3)))
        labels[index, 0] = found
        areas[index, 0] = np.where(found > 0, np.bincount(found.ravel())[found], 0)
    return torch.from_numpy(labels), torch.from_numpy(areas)


def test_hole_and_sprinkle_removal_matches_meta(
    meta_classes, tiny_meta_model, predictors, monkeypatch
):
    import sam2.utils.misc

    monkeypatch.setattr(sam2.utils.misc, "get_connected_components", connected_components)
    ours, meta = predictors
    areas = {"max_hole_area": 40, "max_sprinkle_area": 25}
    cleaned_meta = meta_classes[0](tiny_meta_model, **areas)
    cleaned_meta._features, cleaned_meta._orig_hw = meta._features, meta._orig_hw
    cleaned_meta._is_image_set = True
    cleaned_ours = SAM2ImagePredictor(ours, **areas)
    cleaned_ours.set_embedding(ours.embedding)
    out = cleaned_ours.predict(**CASES["batched_clicks"])
    assert_same_outputs(out, cleaned_meta.predict(**CASES["batched_clicks"]))
    # Random weights give speckled masks: the clean-up changes them.
    assert not np.array_equal(out[0], ours.predict(**CASES["batched_clicks"])[0])


def test_errors_are_metas_or_name_the_problem(meta_classes, tiny_meta_model, our_model, predictors):
    fresh = SAM2ImagePredictor(our_model)
    meta = meta_classes[0](tiny_meta_model)
    for predictor in (fresh, meta):
        with pytest.raises(RuntimeError, match=r"An image must be set with \.set_image"):
            predictor.predict(point_coords=[[1, 1]], point_labels=[1])
        with pytest.raises(RuntimeError, match="An image must be set"):
            predictor.get_image_embedding()
    with pytest.raises(RuntimeError, match="set_image_batch"):
        fresh.predict_batch(box_batch=[np.array([0, 0, 5, 5])])
    with pytest.raises(TypeError, match="build_sam2"):
        SAM2ImagePredictor(tiny_meta_model)  # Meta's model: the message gives the way round
    with pytest.raises(TypeError, match="max_hole"):
        SAM2ImagePredictor(our_model, max_hole=3)
    fresh.set_embedding(predictors[0].embedding)
    with pytest.raises(PromptError, match="point_labels must be 1"):
        fresh.predict(point_coords=[[1, 1]], point_labels=[7])
    fresh.reset_predictor()
    with pytest.raises(RuntimeError, match="An image must be set"):
        fresh.predict(point_coords=[[1, 1]], point_labels=[1])


def test_model_names_map_to_sizes():
    assert size_of(CONFIG) == "tiny"
    assert size_of("configs/sam2.1/sam2.1_hiera_b+.yaml") == "base_plus"
    assert size_of("sam2_hiera_l.yaml") == "large"
    assert size_of("facebook/sam2.1-hiera-small") == "small"
    assert size_of("base_plus") == "base_plus"
    with pytest.raises(ValueError, match="SAM 2.0"):
        size_of("facebook/sam2-hiera-tiny")
    with pytest.raises(ValueError, match="unknown model 'huge'"):
        size_of("huge")
    with pytest.raises(ValueError, match="hydra"):
        build_sam2(CONFIG, None, "cpu", hydra_overrides_extra=["++model.x=1"])


def test_from_pretrained_loads_the_checkpoint(tiny_checkpoint, predictors):
    ours, _ = predictors
    loaded = SAM2ImagePredictor.from_pretrained(
        "facebook/sam2.1-hiera-tiny", checkpoint=str(tiny_checkpoint), device="cpu"
    )
    assert isinstance(loaded.engine, Predictor) and loaded.engine.runtime.mode == "fast"
    generator = SAM2AutomaticMaskGenerator.from_pretrained(
        "tiny", checkpoint=str(tiny_checkpoint), device="cpu", points_per_side=2
    )
    assert generator.params.points_per_side == 2
    loaded_state = loaded.model.state_dict()
    for name, tensor in ours.model.state_dict().items():
        assert torch.equal(loaded_state[name], tensor), name
