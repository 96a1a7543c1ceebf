"""Automatic mask generation against Meta's SAM2AutomaticMaskGenerator as the oracle.

Both generators run on the same random weights (see tests/oracle.py). With random weights
the logits are small (|logit| < 1) and masks are big blobs, so the cases below pick
thresholds that make each filter actually select: a low stability offset, a raised
mask threshold so crop masks stay clear of crop edges, and "no filter" settings that
keep every mask to compare them all.

Encodings are cached by image content on both sides (ours: a Predictor subclass; Meta's:
its predictor's ``set_image``), so each image and crop is encoded once per model per
session; everything after the encoder runs for real in every case.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
import skimage.data
from scipy import ndimage

from sam2serve.engine.amg import AMGParamError, AMGParams, MaskGenerator
from sam2serve.engine.predictor import Embedding, Predictor
from tests.reference import import_reference

# Keep every mask: no score filters, NMS only drops exact box duplicates (IoU > 1 never).
KEEP_ALL = {"pred_iou_thresh": 0.0, "stability_score_thresh": 0.0, "box_nms_thresh": 1.0}
EIGHT_CONNECTED = np.ones((3, 3), dtype=bool)


def content_key(image: np.ndarray) -> str:
    pixels = np.ascontiguousarray(image)
    return f"{pixels.shape}:{hashlib.sha1(pixels.tobytes()).hexdigest()}"


class CachingPredictor(Predictor):
    """Our Predictor with encodings cached by image content (test speed only)."""

    def __init__(
        self,
        model: Any,
        decoder: str = "reference",
        cache: dict[str, Embedding] | None = None,
        **options: Any,
    ) -> None:
        super().__init__(model, decoder=decoder, **options)
        self.cache: dict[str, Embedding] = {} if cache is None else cache
        self.encode_calls = 0  # per generate() crop, cached or not
        self.lock = threading.Lock()

    def encode(self, images: Any) -> Embedding:
        assert isinstance(images, np.ndarray), "AMG encodes one crop array at a time"
        key = content_key(images)
        with self.lock:
            self.encode_calls += 1
            if key not in self.cache:
                self.cache[key] = super().encode(images)
            return self.cache[key]


@pytest.fixture(scope="session")
def images() -> dict[str, np.ndarray]:
    return {
        "chelsea": skimage.data.chelsea(),  # 300 x 451, landscape
        "coffee": skimage.data.coffee()[::2, ::2].copy(),  # 200 x 300
        "astronaut": skimage.data.astronaut()[::2, ::2].copy(),  # 256 x 256, square
    }


@pytest.fixture(scope="session")
def predictor(tiny_model) -> CachingPredictor:
    return CachingPredictor(tiny_model)


@pytest.fixture(scope="session")
def fast_predictor(tiny_model, predictor) -> CachingPredictor:
    """The fast decoder (fast and furious modes), sharing the encodings."""
    return CachingPredictor(tiny_model, decoder="fast", cache=predictor.cache)


@pytest.fixture(scope="session")
def meta_records() -> dict[str, list[dict[str, Any]]]:
    """Meta's output per fidelity case, computed once for both of our decoders."""
    return {}


@pytest.fixture(scope="session")
def meta_generator(tiny_meta_model) -> Callable[..., Any]:
    """Builds Meta's generator for given parameters, sharing one encoding cache."""
    import_reference()
    from sam2.automatic_mask_generator import SAM2AutomaticMaskGenerator

    cache: dict[str, tuple[Any, Any]] = {}

    def build(**params: Any) -> Any:
        generator = SAM2AutomaticMaskGenerator(tiny_meta_model, **params)
        meta_predictor = generator.predictor
        set_image = meta_predictor.set_image

        def cached_set_image(image: np.ndarray) -> None:
            key = content_key(image)
            if key not in cache:
                set_image(image)
                cache[key] = (meta_predictor._features, meta_predictor._orig_hw)
                return
            meta_predictor.reset_predictor()
            meta_predictor._features, meta_predictor._orig_hw = cache[key]
            meta_predictor._is_image_set = True

        meta_predictor.set_image = cached_set_image
        return generator

    return build


@dataclass
class Agreement:
    """How closely our records follow Meta's, for the report printed with ``-s``."""

    count: int
    min_mask_iou: float = 1.0
    identical_masks: int = 0
    max_area_diff: int = 0
    max_iou_pred_diff: float = 0.0
    max_stability_diff: float = 0.0
    crops: set[tuple[float, ...]] = field(default_factory=set)


def to_binary(segmentation: Any) -> np.ndarray:
    """Any output_mode's segmentation as an (H, W) bool array, decoded by pycocotools."""
    from pycocotools import mask as mask_utils

    if isinstance(segmentation, np.ndarray):
        return segmentation.astype(bool)
    h, w = segmentation["size"]
    if isinstance(segmentation["counts"], list):
        segmentation = mask_utils.frPyObjects(segmentation, h, w)
    return mask_utils.decode(segmentation).astype(bool)


def same_structure(a: Any, b: Any) -> bool:
    """Equal Python types all the way down (lists of floats stay lists of floats)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, list):
        return len(a) == len(b) and all(same_structure(x, y) for x, y in zip(a, b))
    return True


def assert_records_match(ours: list[dict], theirs: list[dict]) -> Agreement:
    """Pair records by position: same count, order, fields and types; masks IoU >= 0.999;
    scores within 1e-4; boxes, clicks and crops equal; area within 2 pixels."""
    assert len(ours) == len(theirs), f"{len(ours)} masks, Meta has {len(theirs)}"
    agreement = Agreement(count=len(ours))
    for i, (a, b) in enumerate(zip(ours, theirs)):
        assert a.keys() == b.keys()
        for key in ("area", "bbox", "predicted_iou", "point_coords", "stability_score", "crop_box"):
            assert same_structure(a[key], b[key]), (i, key, a[key], b[key])
        mask_a, mask_b = to_binary(a["segmentation"]), to_binary(b["segmentation"])
        union = int((mask_a | mask_b).sum())
        iou = int((mask_a & mask_b).sum()) / union if union else 1.0
        assert iou >= 0.999, f"record {i}: mask IoU {iou:.5f} with Meta's"
        assert abs(a["predicted_iou"] - b["predicted_iou"]) <= 1e-4, i
        assert abs(a["stability_score"] - b["stability_score"]) <= 1e-4, i
        assert a["point_coords"] == b["point_coords"], i
        assert a["crop_box"] == b["crop_box"], i
        assert a["bbox"] == b["bbox"], (i, a["bbox"], b["bbox"])
        assert abs(a["area"] - b["area"]) <= 2, (i, a["area"], b["area"])
        assert a["area"] == int(mask_a.sum())
        if isinstance(a["segmentation"], dict) and np.array_equal(mask_a, mask_b):
            assert a["segmentation"] == b["segmentation"], "same mask, different RLE"
        agreement.min_mask_iou = min(agreement.min_mask_iou, iou)
        agreement.identical_masks += iou == 1.0
        agreement.max_area_diff = max(agreement.max_area_diff, abs(a["area"] - b["area"]))
        agreement.max_iou_pred_diff = max(
            agreement.max_iou_pred_diff, abs(a["predicted_iou"] - b["predicted_iou"])
        )
        agreement.max_stability_diff = max(
            agreement.max_stability_diff, abs(a["stability_score"] - b["stability_score"])
        )
        agreement.crops.add(tuple(a["crop_box"]))
    return agreement


def pair_by_origin(ours: list[dict], theirs: list[dict]) -> list[dict]:
    """Meta's records reordered to pair with ours when crops are on.

    Across crops, NMS scores a mask by 1 / (area of its crop): all masks of one crop tie.
    torchvision breaks ties with torch's unstable sort (Meta's order within a crop is an
    accident of the sort algorithm); engine.nms keeps them in input order. So records
    are paired by crop, click and closest predicted IoU, and the order is checked only
    where it is defined: smaller crops first. (The set of masks does not depend on tie
    order as long as box_nms_thresh <= crop_nms_thresh, as in the cases here.)
    """

    def crop_areas(records: list[dict]) -> list[float]:
        return [r["crop_box"][2] * r["crop_box"][3] for r in records]

    for records in (ours, theirs):
        assert crop_areas(records) == sorted(crop_areas(records)), "smaller crops first"
    remaining = list(theirs)
    paired = []
    for record in ours:
        same_origin = [
            r
            for r in remaining
            if r["crop_box"] == record["crop_box"] and r["point_coords"] == record["point_coords"]
        ]
        assert same_origin, (
            f"Meta has no mask from crop {record['crop_box']}, click {record['point_coords']}"
        )
        match = min(same_origin, key=lambda r: abs(r["predicted_iou"] - record["predicted_iou"]))
        remaining = [r for r in remaining if r is not match]
        paired.append(match)
    return paired + remaining  # leftovers make the count check fail


# --------------------------------------------------------------------------- fidelity

FIDELITY_CASES = {
    # Meta's defaults on a small grid. Random weights give no mask over the default
    # thresholds, so this proves both agree on "nothing"; the cases below select for real.
    "defaults": ("chelsea", {"points_per_side": 4}, 0),
    # Each score filter drops masks the other keeps (e.g. chelsea: 32 of 48 pass either
    # alone, 16 pass both); box NMS is off to compare every survivor.
    "filtered-chelsea": (
        "chelsea",
        {
            "points_per_side": 4,
            "pred_iou_thresh": 0.5,
            "stability_score_offset": 0.1,
            "stability_score_thresh": 0.5,
            "box_nms_thresh": 1.0,
        },
        16,
    ),
    "filtered-coffee": (
        "coffee",
        {
            "points_per_side": 4,
            "pred_iou_thresh": 0.5,
            "stability_score_offset": 0.1,
            "stability_score_thresh": 0.5,
            "box_nms_thresh": 1.0,
        },
        16,
    ),
    "filtered-astronaut": (
        "astronaut",
        {
            "points_per_side": 4,
            "pred_iou_thresh": 0.5,
            "stability_score_offset": 0.1,
            "stability_score_thresh": 0.7,
            "box_nms_thresh": 1.0,
        },
        3,
    ),
    # Box NMS: the random-weight blobs all overlap, one survives.
    "box-nms": (
        "coffee",
        {
            "points_per_side": 4,
            "pred_iou_thresh": 0.5,
            "stability_score_offset": 0.1,
            "stability_score_thresh": 0.5,
        },
        1,
    ),
    # Every mask of every click, in batches of 7 (the last one short), COCO RLE output.
    "keep-all-coco": (
        "chelsea",
        {"points_per_side": 4, "points_per_batch": 7, "output_mode": "coco_rle", **KEEP_ALL},
        48,
    ),
    "mask-threshold": (
        "coffee",
        {
            "points_per_side": 4,
            "mask_threshold": 0.2,
            "stability_score_offset": 0.5,
            "output_mode": "uncompressed_rle",
            **KEEP_ALL,
        },
        48,
    ),
    # A raised mask threshold keeps some crop masks clear of the crop edges. The tiny
    # stability threshold drops empty masks: two empty boxes have IoU 0/0 = NaN, which
    # torchvision (and engine.nms) never suppresses but the test shim's NMS does.
    "crops": (
        "astronaut",
        {
            "points_per_side": 4,
            "crop_n_layers": 1,
            "crop_n_points_downscale_factor": 2,
            "mask_threshold": 0.3,
            "stability_score_offset": 0.05,
            "stability_score_thresh": 1e-6,
            "pred_iou_thresh": 0.0,
        },
        3,
    ),
    "m2m": ("chelsea", {"points_per_side": 3, "use_m2m": True, **KEEP_ALL}, 27),
    "single-mask": ("astronaut", {"points_per_side": 4, "multimask_output": False, **KEEP_ALL}, 16),
    "point-grids": (
        "astronaut",
        {
            "points_per_side": None,
            "point_grids": [np.random.default_rng(0).uniform(0, 1, size=(10, 2))],
            "box_nms_thresh": 0.9,
            "pred_iou_thresh": 0.0,
            "stability_score_thresh": 0.0,
        },
        1,
    ),
}


@pytest.mark.parametrize("decoder", ["reference", "fast"])
@pytest.mark.parametrize(
    "case",
    # Crop layers multiply the work (Meta's generator too): the second tier.
    # crops: slow; filtered-coffee: filtered-chelsea's options on another image (12 s)
    [
        pytest.param(c, marks=pytest.mark.extended) if c in ("crops", "filtered-coffee") else c
        for c in FIDELITY_CASES
    ],
)
def test_matches_meta(
    case, decoder, images, predictor, fast_predictor, meta_generator, meta_records
):
    image_name, params, min_count = FIDELITY_CASES[case]
    image = images[image_name]
    ours = MaskGenerator(fast_predictor if decoder == "fast" else predictor, **params).generate(
        image
    )
    if case not in meta_records:
        meta_records[case] = meta_generator(**params).generate(image)
    theirs = meta_records[case]
    if params.get("crop_n_layers", 0) > 0:
        theirs = pair_by_origin(ours, theirs)
    agreement = assert_records_match(ours, theirs)
    assert agreement.count >= min_count, f"case {case!r} compares only {agreement.count} masks"
    if case == "crops":  # the whole image and at least one layer-1 crop contribute
        assert len(agreement.crops) >= 2, agreement.crops
    print(f"\n{case}: {agreement}")


def test_defaults_match_meta_signature():
    """Every parameter of Meta's generator exists here with the same default."""
    import_reference()
    from sam2.automatic_mask_generator import SAM2AutomaticMaskGenerator

    signature = inspect.signature(SAM2AutomaticMaskGenerator.__init__)
    meta_defaults = {
        name: p.default
        for name, p in signature.parameters.items()
        if name not in ("self", "model", "kwargs")
    }
    ours = AMGParams()
    assert set(meta_defaults) == set(AMGParams.field_names())
    for name, default in meta_defaults.items():
        assert getattr(ours, name) == default, name


# --------------------------------------------------------------------------- behaviour


def regions(mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sizes of the 8-connected foreground and background regions of a mask."""
    sizes = []
    for part in (mask, ~mask):
        labels, n = ndimage.label(part, structure=EIGHT_CONNECTED)
        sizes.append(np.bincount(labels.ravel(), minlength=n + 1)[1:])
    return sizes[0], sizes[1]


def small_region_pixels(mask: np.ndarray, min_area: int) -> np.ndarray:
    """Pixels of 8-connected foreground or background regions smaller than min_area."""
    small = np.zeros_like(mask)
    for part in (mask, ~mask):
        labels, n = ndimage.label(part, structure=EIGHT_CONNECTED)
        sizes = np.bincount(labels.ravel(), minlength=n + 1)
        is_small = sizes < min_area
        is_small[0] = False
        small |= is_small[labels]
    return small


def test_min_mask_region_area_removes_small_holes_and_islands(images, predictor):
    min_area = 100
    image = images["chelsea"]
    params = {"points_per_side": 4, **KEEP_ALL}
    raw = MaskGenerator(predictor, **params).generate(image)
    cleaned = MaskGenerator(predictor, min_mask_region_area=min_area, **params).generate(image)
    # The follow-up NMS runs at max(box_nms_thresh, crop_nms_thresh) = 1.0: nothing is
    # dropped, masks that needed no change come first, each group in its old order.
    assert len(cleaned) == len(raw) == 48
    by_source = {(tuple(r["point_coords"][0]), r["predicted_iou"]): r for r in raw}
    sources = [by_source[(tuple(c["point_coords"][0]), c["predicted_iou"])] for c in cleaned]
    changed = [
        not np.array_equal(c["segmentation"], s["segmentation"]) for c, s in zip(cleaned, sources)
    ]
    assert sum(changed) > 0, "no mask had a small region: the test proves nothing"
    assert changed == sorted(changed), "unchanged masks must come first"
    position = {id(record): i for i, record in enumerate(raw)}
    for group in (False, True):
        order = [position[id(s)] for s, c in zip(sources, changed) if c == group]
        assert order == sorted(order)

    for record, source in zip(cleaned, sources):
        mask = record["segmentation"]
        islands, holes = regions(mask)
        assert (holes >= min_area).all(), f"hole of {holes.min()} pixels left"
        # An all-small mask keeps its largest island rather than vanish.
        assert (islands >= min_area).all() or len(islands) == 1, sorted(islands)[:5]
        # Only pixels of small regions of the original mask may change.
        flipped = mask ^ source["segmentation"]
        assert not (flipped & ~small_region_pixels(source["segmentation"], min_area)).any()
        assert record["area"] == int(mask.sum())
        ys, xs = np.nonzero(mask)
        x0, y0 = xs.min(), ys.min()
        assert record["bbox"] == [float(x0), float(y0), float(xs.max() - x0), float(ys.max() - y0)]
        for key in ("predicted_iou", "stability_score", "point_coords", "crop_box"):
            assert record[key] == source[key]


def test_output_modes_encode_the_same_masks(images, predictor):
    from pycocotools import mask as mask_utils

    image = images["chelsea"]
    params = {"points_per_side": 2, **KEEP_ALL}
    by_mode = {
        mode: MaskGenerator(predictor, output_mode=mode, **params).generate(image)
        for mode in ("binary_mask", "uncompressed_rle", "coco_rle")
    }
    binary, uncompressed, coco = by_mode.values()
    assert len(binary) == len(uncompressed) == len(coco) == 12
    for b, u, c in zip(binary, uncompressed, coco):
        mask = b["segmentation"]
        assert mask.dtype == bool and mask.shape == image.shape[:2]
        assert b["area"] == int(mask.sum()) > 0
        assert u["segmentation"]["size"] == c["segmentation"]["size"] == list(mask.shape)
        assert np.array_equal(to_binary(u["segmentation"]), mask)
        assert sum(u["segmentation"]["counts"][1::2]) == u["area"] == b["area"]
        assert isinstance(c["segmentation"]["counts"], str)
        assert np.array_equal(mask_utils.decode(c["segmentation"]).astype(bool), mask)
        assert int(mask_utils.area(c["segmentation"])) == c["area"]
        # pycocotools' own encoding of the mask, string for string.
        expected = mask_utils.encode(np.asfortranarray(mask.astype(np.uint8)))
        assert c["segmentation"]["counts"] == expected["counts"].decode("ascii")
        for key in ("area", "bbox", "predicted_iou", "point_coords", "stability_score", "crop_box"):
            assert b[key] == u[key] == c[key]
    json.dumps([{**u, "segmentation": u["segmentation"]} for u in uncompressed])
    json.dumps(coco)


def test_crop_layers_with_no_surviving_mask(predictor):
    """Every filter can leave nothing: no mask in any crop is an empty list, not an error.
    A plain grey 257 x 257 image: its four layer-1 crops are one 172 x 172 picture, so the
    cache encodes two pictures for the five crops (the whole image and one crop), not five."""
    generator = MaskGenerator(
        predictor,
        points_per_side=4,
        crop_n_layers=1,
        crop_n_points_downscale_factor=2,
        pred_iou_thresh=1.0,
        min_mask_region_area=10,
    )
    grey = np.full((257, 257, 3), 128, np.uint8)
    calls, encoded = predictor.encode_calls, len(predictor.cache)
    assert generator.generate(grey) == []
    assert predictor.encode_calls - calls == 5  # every crop ran
    assert len(predictor.cache) - encoded <= 2


def test_embedding_is_reused_and_progress_reported(images, predictor):
    image = images["astronaut"]
    generator = MaskGenerator(predictor, points_per_side=4, points_per_batch=6, **KEEP_ALL)
    expected = generator.generate(image)
    embedding = predictor.encode(image)
    calls_before = predictor.encode_calls
    reports: list[tuple[int, int]] = []
    records = generator.generate(
        image, embedding=embedding, progress=lambda done, total: reports.append((done, total))
    )
    assert predictor.encode_calls == calls_before, "the given embedding was not used"
    assert reports == [(1, 3), (2, 3), (3, 3)]  # 16 points in batches of 6
    assert_records_match(records, expected)
    other = predictor.encode(images["chelsea"])
    with pytest.raises(ValueError, match=r"embedding is for \[\(300, 451\)\]"):
        generator.generate(image, embedding=other)


def test_mask_budget_splits_batches_without_changing_records(images, tiny_model, predictor):
    """A predictor whose mask budget holds two clicks' masks decodes 2 clicks at a time
    whatever points_per_batch says (memory bounded by configuration), with the same
    records."""
    image = images["astronaut"]  # 256 x 256
    params = {"points_per_side": 3, "points_per_batch": 64, **KEEP_ALL}
    expected = MaskGenerator(predictor, **params).generate(image)
    per_click = 3 * (256 * 256 + 4 * 256 * 256)  # 3 masks: bool at image size + low-res
    tight = CachingPredictor(tiny_model, cache=predictor.cache, mask_bytes_budget=2 * per_click)
    reports: list[tuple[int, int]] = []
    records = MaskGenerator(tight, **params).generate(
        image, progress=lambda done, total: reports.append((done, total))
    )
    assert reports[-1] == (5, 5)  # 9 clicks in batches of 2, not 1 batch of 64
    assert_records_match(records, expected)


def test_generate_accepts_paths_bytes_and_threads(images, predictor, tmp_path):
    from PIL import Image

    image = images["coffee"]
    path = tmp_path / "coffee.png"
    Image.fromarray(image).save(path)
    generator = MaskGenerator(predictor, points_per_side=2, output_mode="coco_rle", **KEEP_ALL)
    expected = generator.generate(image)
    assert len(expected) == 12
    assert generator.generate(path) == expected
    assert generator.generate(path.read_bytes()) == expected
    # One generator, several threads, different images: no state leaks between calls.
    jobs = [images["coffee"], images["astronaut"]] * 2
    alone = [generator.generate(job) for job in jobs]
    with ThreadPoolExecutor(max_workers=2) as pool:
        together = list(pool.map(generator.generate, jobs))
    assert together == alone


# --------------------------------------------------------------------------- parameters


@pytest.mark.parametrize(
    ("params", "message"),
    [
        (
            {"output_mode": "png"},
            (
                "output_mode must be one of 'coco_rle', 'uncompressed_rle', 'png_base64', "
                "'polygon', 'binary_mask', got 'png'"
            ),
        ),
        ({"points_per_side": None}, "exactly one of points_per_side and point_grids"),
        ({"point_grids": [[[0.5, 0.5]]]}, "set points_per_side=None to use point_grids"),
        ({"points_per_side": 0}, "points_per_side must be an integer >= 1, got 0"),
        ({"points_per_side": 2.5}, "points_per_side must be an integer >= 1, got 2.5"),
        ({"points_per_side": True}, "points_per_side must be an integer >= 1, got True"),
        ({"points_per_batch": 0}, "points_per_batch must be an integer >= 1, got 0"),
        ({"pred_iou_thresh": 1.5}, r"pred_iou_thresh must be a number in \[0.0, 1.0\], got 1.5"),
        ({"pred_iou_thresh": "0.8"}, "pred_iou_thresh must be a number in .*got '0.8'"),
        ({"stability_score_thresh": -0.1}, "stability_score_thresh must be .*got -0.1"),
        ({"stability_score_thresh": float("nan")}, "stability_score_thresh .*got nan"),
        ({"stability_score_offset": -1.0}, "stability_score_offset must be a number >= 0"),
        ({"mask_threshold": float("inf")}, "mask_threshold must be a finite number, got inf"),
        ({"box_nms_thresh": 2}, r"box_nms_thresh must be a number in \[0.0, 1.0\], got 2"),
        ({"crop_nms_thresh": -1}, "crop_nms_thresh must be .*got -1"),
        ({"crop_overlap_ratio": 1.0}, r"crop_overlap_ratio must be a number in \[0.0, 1.0\)"),
        ({"crop_n_layers": -1}, "crop_n_layers must be an integer >= 0, got -1"),
        ({"crop_n_points_downscale_factor": 0}, "crop_n_points_downscale_factor must be"),
        (
            {"points_per_side": 3, "crop_n_layers": 2, "crop_n_points_downscale_factor": 2},
            "points_per_side=3 leaves no points in crop layer 2",
        ),
        (
            {"points_per_side": None, "point_grids": np.full((4, 2), 0.5)},
            "wrap a single grid in a list",
        ),
        (
            {"points_per_side": None, "point_grids": [np.zeros((4, 3))]},
            r"point_grids\[0\] must have shape \(N, 2\) with N >= 1, got \(4, 3\)",
        ),
        (
            {"points_per_side": None, "point_grids": [np.zeros((0, 2))]},
            r"point_grids\[0\] must have shape",
        ),
        (
            {"points_per_side": None, "point_grids": [[[0.5, 1.5]]]},
            r"normalised to \[0, 1\], got values in \[0.5, 1.5\]",
        ),
        (
            {"points_per_side": None, "point_grids": [[[0.5, 0.5]]], "crop_n_layers": 1},
            "point_grids has 1 grid.* crop_n_layers=1 needs 2",
        ),
        (
            {"points_per_side": None, "point_grids": [[["a", 0.5]]]},
            "point_grids must be a list of .N, 2. arrays of numbers",
        ),
        ({"min_mask_region_area": -5}, "min_mask_region_area must be an integer >= 0, got -5"),
        ({"min_mask_region_area": 1.5}, "min_mask_region_area must be an integer"),
        ({"use_m2m": "yes"}, "use_m2m must be True or False, got 'yes'"),
        ({"multimask_output": 1}, "multimask_output must be True or False, got 1"),
        (
            {"points_per_sid": 16},
            "unknown AMG parameter.* points_per_sid; accepted: points_per_side, points_per_batch",
        ),
    ],
)
def test_bad_parameters_are_named(params, message, predictor):
    with pytest.raises(AMGParamError, match=message) as error:
        AMGParams.from_dict(params)
    assert isinstance(error.value, ValueError)
    with pytest.raises(ValueError, match=message):
        MaskGenerator(predictor, **params)


def test_params_are_values():
    params = AMGParams.from_dict(
        {
            "points_per_side": None,
            "point_grids": [np.array([[0.25, 0.75]]), [[0.5, 0.5]]],
            "crop_n_layers": 1,
            "min_mask_region_area": np.int64(4),
            "use_m2m": np.bool_(True),
        }
    )
    assert params.point_grids == (((0.25, 0.75),), ((0.5, 0.5),))
    assert type(params.min_mask_region_area) is int and params.use_m2m is True
    assert AMGParams.from_dict(json.loads(json.dumps(params.to_dict()))) == params
    assert hash(params) == hash(AMGParams.from_dict(params.to_dict()))
    assert [g.tolist() for g in params.layer_point_grids()] == [[[0.25, 0.75]], [[0.5, 0.5]]]
    assert len(AMGParams().layer_point_grids()[0]) == 32 * 32
    assert AMGParams(pred_iou_thresh=1).pred_iou_thresh == 1.0  # ints are fine for floats
    with pytest.raises(AMGParamError, match="params must be an AMGParams"):
        MaskGenerator(None, params={"points_per_side": 4})  # type: ignore[arg-type]
    generator = MaskGenerator(None, params, use_m2m=False)  # type: ignore[arg-type]
    assert generator.params == params.replace(use_m2m=False)
