"""engine.coco: the COCO instances file loads with pycocotools, decodes back to the very
masks it was given (in either RLE form), and carries pycocotools' own area and bbox; the
filters keep the right masks; the write is atomic; the module imports no torch."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from pycocotools import mask as mask_utils
from pycocotools.coco import COCO

from sam2serve.engine.coco import DEFAULT_CATEGORY, CocoWriter, coco_bbox, select_masks


def hand_masks(height: int, width: int) -> list[np.ndarray]:
    """Edge cases of the run-length code: empty, full, one pixel in each corner, a run
    that wraps from one column into the next, a ring, random speckle."""
    masks = [np.zeros((height, width), bool), np.ones((height, width), bool)]
    for row, col in ((0, 0), (height - 1, width - 1), (0, width - 1), (height - 1, 0)):
        one = np.zeros((height, width), bool)
        one[row, col] = True
        masks.append(one)
    wrap = np.zeros((height, width), bool)
    wrap[height - 2 :, 3] = True  # the bottom of column 3 ...
    wrap[:2, 4] = True  # ... runs on into the top of column 4
    ring = np.zeros((height, width), bool)
    ring[2:9, 3:12] = True
    ring[4:7, 6:9] = False
    speckle = np.random.default_rng(3).uniform(size=(height, width)) > 0.7
    return [*masks, wrap, ring, speckle]


def pycoco_rle(mask: np.ndarray) -> dict:
    """pycocotools' compressed RLE, counts as str (the form JSON holds)."""
    rle = mask_utils.encode(np.asfortranarray(mask.astype(np.uint8)))
    return {"size": list(rle["size"]), "counts": rle["counts"].decode("ascii")}


def uncompressed_rle(mask: np.ndarray) -> dict:
    """Column-major run lengths starting with zeros, computed by hand."""
    flat = mask.flatten(order="F").astype(np.int8)
    changes = np.flatnonzero(np.diff(flat)) + 1
    counts = np.diff(np.concatenate(([0], changes, [flat.size]))).tolist()
    if flat.size and flat[0]:
        counts = [0, *counts]
    return {"size": list(mask.shape), "counts": counts}


@pytest.fixture
def dataset(tmp_path):
    """Two images: one given COCO RLE records, one uncompressed RLE records."""
    first, second = hand_masks(12, 17), hand_masks(20, 9)
    writer = CocoWriter()
    records_a = [
        {"segmentation": pycoco_rle(m), "predicted_iou": 0.5 + i / 40, "area": -1}
        for i, m in enumerate(first)
    ]
    records_b = [{"segmentation": uncompressed_rle(m), "score": 0.25} for m in second]
    assert writer.add_image("a.jpg", 17, 12, records_a) == 1
    assert writer.add_image("dir/b.png", 9, 20, records_b) == 2
    path = writer.write(tmp_path / "instances.json")
    return path, first + second, records_a + records_b


def test_pycocotools_loads_it_and_every_mask_round_trips(dataset):
    path, masks, records = dataset
    coco = COCO(str(path))
    assert sorted(coco.getImgIds()) == [1, 2]
    assert coco.loadImgs(1)[0] == {"id": 1, "file_name": "a.jpg", "width": 17, "height": 12}
    assert coco.loadImgs(2)[0]["file_name"] == "dir/b.png"
    assert coco.loadCats(coco.getCatIds()) == [DEFAULT_CATEGORY]
    annotation_ids = coco.getAnnIds()
    assert annotation_ids == list(range(1, len(masks) + 1))
    for annotation, mask, record in zip(coco.loadAnns(annotation_ids), masks, records, strict=True):
        assert np.array_equal(coco.annToMask(annotation).astype(bool), mask)
        assert isinstance(annotation["segmentation"]["counts"], str)
        rle = coco.annToRLE(annotation)
        assert annotation["area"] == int(mask.sum()) == int(mask_utils.area(rle))
        assert annotation["bbox"] == mask_utils.toBbox(rle).tolist()
        assert annotation["iscrowd"] == 0 and annotation["category_id"] == 1
        assert annotation["score"] == record.get("score", record.get("predicted_iou"))
    per_image = len(masks) // 2
    assert [a["image_id"] for a in coco.loadAnns(annotation_ids)] == [1] * per_image + [
        2
    ] * per_image


def test_the_file_is_a_valid_prediction_file_for_cocoeval(dataset):
    """loadRes accepts the annotations as detections (it needs score and segmentation)."""
    path, _, _ = dataset
    coco = COCO(str(path))
    results = coco.loadRes(json.loads(path.read_text())["annotations"])
    assert len(results.getAnnIds()) == len(coco.getAnnIds())


def test_bbox_is_pycocotools_tobbox():
    for mask in hand_masks(13, 7) + hand_masks(1, 5):
        expected = mask_utils.toBbox(mask_utils.encode(np.asfortranarray(mask.astype(np.uint8))))
        assert coco_bbox(uncompressed_rle(mask)) == expected.tolist()


def test_a_mask_of_another_size_is_refused_naming_it():
    writer = CocoWriter()
    mask = np.ones((4, 5), bool)
    with pytest.raises(ValueError, match=r"mask 1 of image 1 has size \[4, 5\] but the image is"):
        writer.add_image("x.png", 6, 4, [{"segmentation": pycoco_rle(np.ones((4, 6), bool))}, {"segmentation": pycoco_rle(mask)}])  # fmt: skip
    with pytest.raises(ValueError, match="segmentation must be an RLE"):
        writer.add_image("x.png", 5, 4, [{"segmentation": [[0, 0, 1, 1]]}])


def test_records_take_their_category_and_an_unknown_one_is_refused():
    categories = [{"id": 1, "name": "cat"}, {"id": 2, "name": "dog"}]
    writer = CocoWriter(categories=categories)
    mask = pycoco_rle(np.eye(2, 3, dtype=bool))
    writer.add_image(
        "a.png", 3, 2, [{"segmentation": mask, "category_id": 2}, {"segmentation": mask}]
    )
    assert [a["category_id"] for a in writer.annotations] == [2, 1]  # default: the first
    with pytest.raises(ValueError, match=r"mask 0 of image 2 has category_id 3, not one of"):
        writer.add_image("b.png", 3, 2, [{"segmentation": mask, "category_id": 3}])
    assert len(writer.images) == 1  # the refused image was not added


def test_write_is_atomic_and_replaces(tmp_path):
    path = tmp_path / "instances.json"
    path.write_text("old")
    writer = CocoWriter(info={"description": "test"})
    writer.add_image("a.png", 3, 2, [{"segmentation": pycoco_rle(np.eye(2, 3, dtype=bool))}])
    writer.write(path)
    assert json.loads(path.read_text())["info"] == {"description": "test"}
    assert [p.name for p in tmp_path.iterdir()] == ["instances.json"]
    # A failed write (a score JSON cannot hold) leaves the old file and no temporary file.
    writer.add_image("b.png", 3, 2, [{"segmentation": pycoco_rle(np.eye(2, 3, dtype=bool)), "score": float("nan")}])  # fmt: skip
    with pytest.raises(ValueError):
        writer.write(path)
    assert json.loads(path.read_text())["info"] == {"description": "test"}
    assert [p.name for p in tmp_path.iterdir()] == ["instances.json"]


def test_select_masks_by_score_and_count():
    records = [{"predicted_iou": s, "n": i} for i, s in enumerate([0.2, 0.9, 0.5, 0.9, 0.7])]
    picked = select_masks(records, min_score=0.5)
    assert [r["n"] for r in picked] == [1, 2, 3, 4]
    # The two best (ties keep their order), written in the records' order.
    assert [r["n"] for r in select_masks(records, max_masks=2)] == [1, 3]
    assert [r["n"] for r in select_masks(records, min_score=0.6, max_masks=2)] == [1, 3]
    assert [r["n"] for r in select_masks(records, max_masks=3)] == [1, 3, 4]
    assert select_masks(records) == records
    # A mask without a score (drawn by a person) passes min_score and ranks last.
    unscored = [{"n": 9}, *records]
    assert [r["n"] for r in select_masks(unscored, min_score=0.8)] == [9, 1, 3]
    assert [r["n"] for r in select_masks(unscored, max_masks=5)] == [0, 1, 2, 3, 4]


def test_importing_it_needs_no_torch():
    code = "import sys, sam2serve.engine.coco; print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"
