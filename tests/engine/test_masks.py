"""AMG geometry helpers compared with Meta's sam2.utils.amg on random inputs."""

from __future__ import annotations

import importlib.util
import sys
import types
from collections import deque

import numpy as np
import pytest
import torch
from reference import import_reference

from sam2serve.engine import masks as ours

HAS_CV2 = importlib.util.find_spec("cv2") is not None


@pytest.fixture(scope="module")
def meta():
    import_reference()
    from sam2.utils import amg

    return amg


def random_masks(generator: torch.Generator, shape: tuple[int, ...]) -> torch.Tensor:
    """Random rectangles with holes punched in, and some empty masks."""
    *batch, h, w = shape
    n = int(np.prod(batch)) if batch else 1
    masks = torch.zeros(n, h, w, dtype=torch.bool)
    for i in range(n):
        if torch.rand(1, generator=generator).item() < 0.2:
            continue  # leave empty
        y0, y1 = sorted(torch.randint(0, h + 1, (2,), generator=generator).tolist())
        x0, x1 = sorted(torch.randint(0, w + 1, (2,), generator=generator).tolist())
        masks[i, y0:y1, x0:x1] = True
    masks &= torch.rand(n, h, w, generator=generator) < 0.9
    return masks.reshape(shape)


# --- grids and crops ----------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 2, 7, 16, 32])
def test_build_point_grid(meta, n):
    grid = ours.build_point_grid(n)
    assert grid.shape == (n * n, 2)
    np.testing.assert_array_equal(grid, meta.build_point_grid(n))


def test_build_point_grid_by_hand():
    np.testing.assert_allclose(
        ours.build_point_grid(2), [[0.25, 0.25], [0.75, 0.25], [0.25, 0.75], [0.75, 0.75]]
    )


@pytest.mark.parametrize(("n", "layers", "scale"), [(32, 0, 1), (32, 2, 2), (16, 3, 2), (9, 2, 3)])
def test_build_all_layer_point_grids(meta, n, layers, scale):
    grids = ours.build_all_layer_point_grids(n, layers, scale)
    reference = meta.build_all_layer_point_grids(n, layers, scale)
    assert len(grids) == len(reference) == layers + 1
    for grid, ref in zip(grids, reference, strict=True):
        np.testing.assert_array_equal(grid, ref)


@pytest.mark.parametrize("im_size", [(1024, 1024), (480, 640), (1365, 2048), (7, 5)])
@pytest.mark.parametrize("n_layers", [0, 1, 2, 3])
@pytest.mark.parametrize("overlap", [0.0, 512 / 1500, 0.5])
def test_generate_crop_boxes(meta, im_size, n_layers, overlap):
    assert ours.generate_crop_boxes(im_size, n_layers, overlap) == meta.generate_crop_boxes(
        im_size, n_layers, overlap
    )


def test_generate_crop_boxes_by_hand():
    boxes, layers = ours.generate_crop_boxes((100, 200), 1, 0.0)
    assert boxes == [[0, 0, 200, 100], [0, 0, 100, 50], [0, 50, 100, 100],
                     [100, 0, 200, 50], [100, 50, 200, 100]]  # fmt: skip
    assert layers == [0, 1, 1, 1, 1]


# --- mask statistics -----------------------------------------------------------------


@pytest.mark.parametrize("offset", [0.0, 1.0, 2.5])
def test_calculate_stability_score(meta, offset):
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(4, 3, 64, 48, generator=generator) * 4
    logits[0, 0] = 10.0  # everything above both thresholds: score 1
    score = ours.calculate_stability_score(logits, 0.0, offset)
    assert score.shape == (4, 3)
    assert score.dtype == torch.float32
    assert torch.equal(score, meta.calculate_stability_score(logits, 0.0, offset))
    assert score[0, 0].item() == 1.0


def test_stability_score_by_hand():
    logits = torch.tensor([[[-2.0, -0.5, 0.5, 2.0]]])  # > 1: 1 pixel; > -1: 3 pixels
    assert ours.calculate_stability_score(logits, 0.0, 1.0).item() == pytest.approx(1 / 3)


@pytest.mark.parametrize("shape", [(40, 30), (12, 40, 30), (3, 5, 17, 23), (1, 1, 1)])
def test_batched_mask_to_box(meta, shape):
    masks = random_masks(torch.Generator().manual_seed(1), shape)
    boxes = ours.batched_mask_to_box(masks)
    assert boxes.shape == (*shape[:-2], 4)
    assert boxes.dtype == torch.int64
    assert torch.equal(boxes, meta.batched_mask_to_box(masks))


def test_batched_mask_to_box_by_hand():
    masks = torch.zeros(2, 6, 8, dtype=torch.bool)
    masks[0, 1:4, 2:7] = True  # rows 1..3, cols 2..6
    assert ours.batched_mask_to_box(masks).tolist() == [[2, 1, 6, 3], [0, 0, 0, 0]]
    empty_batch = ours.batched_mask_to_box(torch.zeros(0, 6, 8, dtype=torch.bool))
    assert empty_batch.shape == (0, 4)


# --- crops ---------------------------------------------------------------------------


CROP_BOXES = [[0, 0, 640, 480], [0, 0, 427, 320], [213, 160, 640, 480], [100, 37, 300, 200]]


def random_boxes(generator: torch.Generator, n: int, dtype=torch.int64) -> torch.Tensor:
    xy = torch.randint(0, 400, (n, 2), generator=generator)
    wh = torch.randint(1, 300, (n, 2), generator=generator)
    return torch.cat([xy, xy + wh], dim=1).to(dtype)


@pytest.mark.parametrize("crop_box", CROP_BOXES)
def test_is_box_near_crop_edge(meta, crop_box):
    boxes = random_boxes(torch.Generator().manual_seed(2), 500)
    # Pin some boxes onto the crop's own edges (in crop coordinates).
    x0, y0, x1, y1 = crop_box
    boxes[:20] = torch.tensor([0, 0, x1 - x0, y1 - y0])
    orig_box = [0, 0, 640, 480]
    near = ours.is_box_near_crop_edge(boxes, crop_box, orig_box)
    assert near.dtype == torch.bool and near.shape == (500,)
    assert torch.equal(near, meta.is_box_near_crop_edge(boxes, crop_box, orig_box))
    assert torch.equal(
        ours.is_box_near_crop_edge(boxes, crop_box, orig_box, atol=5.0),
        meta.is_box_near_crop_edge(boxes, crop_box, orig_box, atol=5.0),
    )


def test_is_box_near_crop_edge_by_hand():
    crop, orig = [0, 0, 100, 100], [0, 0, 200, 200]
    boxes = torch.tensor([[10, 10, 90, 90], [10, 10, 50, 50], [0, 0, 10, 10]])
    # Right/bottom edge of the crop is inside the image: near; the top-left is the image's.
    assert ours.is_box_near_crop_edge(boxes, crop, orig).tolist() == [True, False, False]


def test_box_xyxy_to_xywh(meta):
    box = torch.tensor([10, 20, 110, 70])
    assert ours.box_xyxy_to_xywh(box).tolist() == [10, 20, 100, 50]
    assert torch.equal(ours.box_xyxy_to_xywh(box), meta.box_xyxy_to_xywh(box))
    assert box.tolist() == [10, 20, 110, 70]  # input untouched
    batch = random_boxes(torch.Generator().manual_seed(3), 10)
    expected = torch.stack([meta.box_xyxy_to_xywh(b) for b in batch])
    assert torch.equal(ours.box_xyxy_to_xywh(batch), expected)


@pytest.mark.parametrize("crop_box", CROP_BOXES)
@pytest.mark.parametrize("dtype", [torch.int64, torch.float32])
def test_uncrop_boxes_and_points(meta, crop_box, dtype):
    generator = torch.Generator().manual_seed(4)
    boxes = random_boxes(generator, 50, dtype)
    for shaped in (boxes, boxes.reshape(5, 10, 4)):
        result = ours.uncrop_boxes_xyxy(shaped, crop_box)
        assert result.dtype == dtype
        assert torch.equal(result, meta.uncrop_boxes_xyxy(shaped, crop_box))
    points = boxes[:, :2]
    for shaped in (points, points.reshape(5, 10, 2)):
        assert torch.equal(
            ours.uncrop_points(shaped, crop_box), meta.uncrop_points(shaped, crop_box)
        )


@pytest.mark.parametrize("crop_box", CROP_BOXES)
def test_uncrop_masks(meta, crop_box):
    x0, y0, x1, y1 = crop_box
    masks = random_masks(torch.Generator().manual_seed(5), (6, y1 - y0, x1 - x0))
    result = ours.uncrop_masks(masks, crop_box, 480, 640)
    assert result.shape == (6, 480, 640)
    assert torch.equal(result, meta.uncrop_masks(masks, crop_box, 480, 640))
    assert torch.equal(result[:, y0:y1, x0:x1], masks)
    assert result.sum() == masks.sum()


# --- remove_small_regions ------------------------------------------------------------


def bfs_connected_components_with_stats(image: np.ndarray, connectivity: int):
    """cv2.connectedComponentsWithStats for 8-connectivity, by breadth-first search.

    Labels follow raster order of each component's first pixel; background is label 0.
    Only the area column of stats (the last one, CC_STAT_AREA) is filled in.
    """
    assert connectivity == 8
    h, w = image.shape
    labels = np.zeros((h, w), dtype=np.int32)
    areas = [int((image == 0).sum())]
    for y in range(h):
        for x in range(w):
            if image[y, x] == 0 or labels[y, x]:
                continue
            label = len(areas)
            labels[y, x] = label
            queue, area = deque([(y, x)]), 0
            while queue:
                cy, cx = queue.popleft()
                area += 1
                for ny in range(max(cy - 1, 0), min(cy + 2, h)):
                    for nx in range(max(cx - 1, 0), min(cx + 2, w)):
                        if image[ny, nx] and not labels[ny, nx]:
                            labels[ny, nx] = label
                            queue.append((ny, nx))
            areas.append(area)
    stats = np.zeros((len(areas), 5), dtype=np.int32)
    stats[:, -1] = areas
    return len(areas), labels, stats, None


@pytest.fixture
def meta_with_bfs_cv2(meta, monkeypatch):
    """Meta's remove_small_regions, with OpenCV replaced by the BFS labelling above."""
    fake_cv2 = types.ModuleType("cv2")
    fake_cv2.connectedComponentsWithStats = bfs_connected_components_with_stats
    monkeypatch.setitem(sys.modules, "cv2", fake_cv2)
    return meta.remove_small_regions


def test_remove_small_regions_by_hand():
    mask = np.zeros((10, 10), dtype=bool)
    mask[0:4, 0:4] = True  # 16-pixel block...
    mask[1, 1] = False  # ...with a 1-pixel hole
    mask[4, 4] = True  # touches the block diagonally: part of it under 8-connectivity
    mask[8, 8] = True  # isolated island of 1 pixel
    mask[7, 0:2] = True  # island of 2 pixels

    no_islands, changed = ours.remove_small_regions(mask, 2, "islands")
    assert changed
    expected = mask.copy()
    expected[8, 8] = False
    np.testing.assert_array_equal(no_islands, expected)

    filled, changed = ours.remove_small_regions(mask, 2, "holes")
    assert changed
    expected = mask.copy()
    expected[1, 1] = True
    np.testing.assert_array_equal(filled, expected)

    unchanged, changed = ours.remove_small_regions(mask, 1, "islands")
    assert not changed
    np.testing.assert_array_equal(unchanged, mask)


def test_remove_small_regions_keeps_largest_when_all_islands_are_small():
    mask = np.zeros((8, 8), dtype=bool)
    mask[0, 0:2] = True  # 2 pixels, first in raster order
    mask[3, 3:6] = True  # 3 pixels: the largest
    mask[6, 6:8] = True  # 2 pixels
    result, changed = ours.remove_small_regions(mask, 10, "islands")
    assert changed
    expected = np.zeros_like(mask)
    expected[3, 3:6] = True
    np.testing.assert_array_equal(result, expected)
    # On a tie the first region in raster order is kept.
    mask[3, 5] = False
    result, _ = ours.remove_small_regions(mask, 10, "islands")
    expected = np.zeros_like(mask)
    expected[0, 0:2] = True
    np.testing.assert_array_equal(result, expected)


def test_remove_small_regions_empty_and_full(meta_with_bfs_cv2):
    empty, full = np.zeros((5, 6), bool), np.ones((5, 6), bool)
    # Nothing to label: unchanged.
    assert ours.remove_small_regions(empty, 100, "islands")[1] is False
    assert ours.remove_small_regions(full, 100, "holes")[1] is False
    # Meta's semantics: an all-background mask is one small "hole" and gets filled...
    filled, changed = ours.remove_small_regions(empty, 100, "holes")
    assert changed and filled.all()
    # ...and a lone small island is kept (it is the largest), yet reported as changed.
    kept, changed = ours.remove_small_regions(full, 100, "islands")
    assert changed and kept.all()
    for mask in (empty, full):
        for mode in ("holes", "islands"):
            result, changed = ours.remove_small_regions(mask, 100, mode)
            expected, expected_changed = meta_with_bfs_cv2(mask, 100, mode)
            assert changed == expected_changed
            np.testing.assert_array_equal(result, expected)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("mode", ["holes", "islands"])
@pytest.mark.parametrize("area_thresh", [1, 3, 8, 1000])
def test_remove_small_regions_matches_meta(meta_with_bfs_cv2, seed, mode, area_thresh):
    rng = np.random.default_rng(seed)
    density = [0.1, 0.3, 0.6, 0.9][seed]
    mask = rng.random((40, 33)) < density
    result, changed = ours.remove_small_regions(mask, area_thresh, mode)
    expected, expected_changed = meta_with_bfs_cv2(mask, area_thresh, mode)
    assert changed == expected_changed
    assert result.dtype == bool
    np.testing.assert_array_equal(result, expected)


def test_remove_small_regions_accepts_tensors():
    mask = torch.zeros(6, 6, dtype=torch.bool)
    mask[0:3, 0:3] = True
    mask[5, 5] = True
    result, changed = ours.remove_small_regions(mask, 2, "islands")
    assert changed and isinstance(result, np.ndarray)
    assert result.sum() == 9
    with pytest.raises(ValueError, match="'blobs'"):
        ours.remove_small_regions(mask, 2, "blobs")  # type: ignore[arg-type]


@pytest.mark.skipif(not HAS_CV2, reason="OpenCV not installed (optional oracle)")
@pytest.mark.parametrize("mode", ["holes", "islands"])
def test_remove_small_regions_matches_meta_with_opencv(meta, mode):
    rng = np.random.default_rng(10)
    for density in (0.1, 0.5, 0.9):
        mask = rng.random((120, 90)) < density
        for area_thresh in (2, 10, 100):
            result, changed = ours.remove_small_regions(mask, area_thresh, mode)
            expected, expected_changed = meta.remove_small_regions(mask, area_thresh, mode)
            assert changed == expected_changed
            np.testing.assert_array_equal(result, expected)


def test_count_set_counts_each_mask_like_numpy():
    generator = torch.Generator().manual_seed(0)
    masks = torch.rand(2, 3, 17, 11, generator=generator) > 0.6
    expected = masks.numpy().reshape(2, 3, -1).sum(-1)
    counts = ours.count_set(masks)
    assert counts.dtype == torch.int32 and counts.tolist() == expected.tolist()
    # A strided view (a transpose) counts the same; no masks, or empty masks, count 0.
    assert ours.count_set(masks.transpose(-1, -2)).tolist() == expected.tolist()
    assert ours.count_set(masks[:0]).shape == (0, 3)
    assert ours.count_set(torch.zeros(4, 0, 5, dtype=torch.bool)).tolist() == [0] * 4
