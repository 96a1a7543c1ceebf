"""NMS against hand-computed cases and a brute-force pure-Python greedy NMS."""

from __future__ import annotations

import pytest
import torch

from sam2serve.engine.nms import _nms_with_groups, batched_nms, box_area, box_iou, nms


def python_iou(a: list[float], b: list[float]) -> float:
    """IoU of two XYXY boxes, in plain Python floats."""
    inter_w = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    inter_h = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = inter_w * inter_h
    area_a = (a[2] - a[0]) * (a[3] - a[1])
    area_b = (b[2] - b[0]) * (b[3] - b[1])
    return inter / (area_a + area_b - inter)


def brute_force_nms(
    boxes: list[list[float]], scores: list[float], categories: list[int], threshold: float
) -> list[int]:
    """The textbook greedy algorithm, one box at a time."""
    order = sorted(range(len(boxes)), key=lambda i: -scores[i])
    kept: list[int] = []
    for i in order:
        if all(
            categories[i] != categories[k] or python_iou(boxes[i], boxes[k]) <= threshold
            for k in kept
        ):
            kept.append(i)
    return kept


def random_boxes(generator: torch.Generator, n: int) -> torch.Tensor:
    """Clustered float64 boxes so that many overlap at all IoU levels."""
    centres = torch.rand(n, 2, generator=generator, dtype=torch.float64) * 50
    sizes = torch.rand(n, 2, generator=generator, dtype=torch.float64) * 40 + 1
    return torch.cat([centres - sizes / 2, centres + sizes / 2], dim=1)


def test_box_area_and_iou_by_hand():
    boxes = torch.tensor([[0, 0, 10, 10], [1, 1, 11, 11], [20, 20, 30, 30], [0, 0, 4, 2]])
    assert box_area(boxes).tolist() == [100, 100, 100, 8]
    assert box_area(boxes).dtype == torch.int64
    iou = box_iou(boxes, boxes)
    assert iou.dtype.is_floating_point
    assert iou[0, 1].item() == pytest.approx(81 / 119)
    assert iou[0, 2].item() == 0
    assert iou[0, 3].item() == pytest.approx(8 / 100)
    torch.testing.assert_close(iou.diagonal(), torch.ones(4))
    torch.testing.assert_close(iou, iou.T)


def test_nms_by_hand():
    # A and B overlap with IoU 81/119 = 0.68; C is far away.
    boxes = torch.tensor([[0.0, 0, 10, 10], [1, 1, 11, 11], [20, 20, 30, 30]])
    scores = torch.tensor([0.9, 0.8, 0.7])
    assert nms(boxes, scores, 0.5).tolist() == [0, 2]
    assert nms(boxes, scores, 0.7).tolist() == [0, 1, 2]
    # Kept indices come in decreasing score order, not input order.
    assert nms(boxes, torch.tensor([0.1, 0.8, 0.9]), 0.5).tolist() == [2, 1]
    assert nms(boxes, scores, 0.5).dtype == torch.int64


def test_iou_equal_to_threshold_is_not_suppressed():
    boxes = torch.tensor([[0.0, 0, 4, 1], [0, 0, 2, 1]])  # IoU exactly 0.5
    scores = torch.tensor([1.0, 0.5])
    assert nms(boxes, scores, 0.5).tolist() == [0, 1]
    assert nms(boxes, scores, 0.49).tolist() == [0]


def test_float_iou_is_compared_with_the_threshold_as_a_double():
    """torchvision's kernel compares ``float IoU > double threshold``: IoU 1/3 in float32 is
    0.33333334, above the double 1/3, so it suppresses; in float64 it ties and does not.
    torch's own ``tensor > 1/3`` would round the threshold to float32 and keep both."""
    pair = torch.tensor([[0.0, 0.0, 4.0, 2.0], [2.0, 0.0, 6.0, 2.0]])  # IoU 4 / 12
    scores = torch.tensor([0.9, 0.8])
    for on_device in (False, True):
        keep = _nms_with_groups(pair, scores, None, 1 / 3, on_device=on_device)
        assert keep.tolist() == [0]
        keep = _nms_with_groups(pair.double(), scores, None, 1 / 3, on_device=on_device)
        assert keep.tolist() == [0, 1]
    # A threshold whose float32 rounding lies below it: the tie does not suppress.
    square = torch.tensor([[0.0, 0.0, 10.0, 10.0], [0.0, 0.0, 10.0, 7.0]])  # IoU 0.7
    assert nms(square, scores, 0.7).tolist() == [0, 1]


def test_suppressed_boxes_do_not_suppress():
    # B overlaps A and C; A suppresses B, so C (which only overlaps B) survives.
    boxes = torch.tensor([[0.0, 0, 10, 10], [5, 0, 15, 10], [10, 0, 20, 10]])
    scores = torch.tensor([0.9, 0.8, 0.7])
    assert nms(boxes, scores, 0.3).tolist() == [0, 2]


def test_equal_scores_keep_input_order():
    boxes = torch.tensor([[0.0, 0, 10, 10], [0, 0, 10, 10], [50, 50, 60, 60]])
    scores = torch.tensor([0.5, 0.5, 0.5])
    assert nms(boxes, scores, 0.5).tolist() == [0, 2]


def test_batched_nms_categories_are_independent():
    boxes = torch.tensor([[0.0, 0, 10, 10], [1, 1, 11, 11], [0, 0, 10, 10]])
    scores = torch.tensor([0.9, 0.8, 0.7])
    assert batched_nms(boxes, scores, torch.tensor([0, 0, 0]), 0.5).tolist() == [0]
    assert batched_nms(boxes, scores, torch.tensor([0, 1, 2]), 0.5).tolist() == [0, 1, 2]
    assert batched_nms(boxes, scores, torch.tensor([0, 1, 0]), 0.5).tolist() == [0, 1]


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("threshold", [0.1, 0.3, 0.5, 0.7])
def test_matches_brute_force_on_random_boxes(seed, threshold):
    generator = torch.Generator().manual_seed(seed)
    n = 150
    boxes = random_boxes(generator, n)
    scores = torch.rand(n, generator=generator, dtype=torch.float64)
    categories = torch.randint(0, 4, (n,), generator=generator)
    box_list, score_list = boxes.tolist(), scores.tolist()

    expected_single = brute_force_nms(box_list, score_list, [0] * n, threshold)
    assert nms(boxes, scores, threshold).tolist() == expected_single
    expected_batched = brute_force_nms(box_list, score_list, categories.tolist(), threshold)
    assert batched_nms(boxes, scores, categories, threshold).tolist() == expected_batched
    # Non-trivial: something was suppressed and something survived.
    assert 0 < len(expected_single) < n


def test_float32_and_integer_boxes():
    generator = torch.Generator().manual_seed(7)
    boxes = (random_boxes(generator, 200)).round()
    scores = torch.rand(200, generator=generator)
    expected = brute_force_nms(boxes.tolist(), scores.tolist(), [0] * 200, 0.6)
    assert nms(boxes.long(), scores, 0.6).tolist() == expected
    assert nms(boxes.float(), scores, 0.6).tolist() == expected


def test_empty_and_bad_shapes():
    empty = nms(torch.zeros(0, 4), torch.zeros(0), 0.5)
    assert empty.shape == (0,) and empty.dtype == torch.int64
    assert batched_nms(torch.zeros(0, 4), torch.zeros(0), torch.zeros(0), 0.5).shape == (0,)
    with pytest.raises(ValueError, match=r"\(N, 4\)"):
        nms(torch.zeros(3, 5), torch.zeros(3), 0.5)
    with pytest.raises(ValueError, match="scores"):
        nms(torch.zeros(3, 4), torch.zeros(2), 0.5)
    with pytest.raises(ValueError, match="idxs"):
        batched_nms(torch.zeros(3, 4), torch.zeros(3), torch.zeros(2), 0.5)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("threshold", [0.0, 0.3, 0.7])
def test_the_device_pass_keeps_what_the_host_loop_keeps(seed, threshold):
    """The GPU's fixed-point greedy pass, run here on the CPU, against the host loop and
    the textbook algorithm: the same boxes, in the same order, with categories too."""
    from sam2serve.engine.nms import _nms_with_groups

    generator = torch.Generator().manual_seed(seed)
    n = 300
    boxes = random_boxes(generator, n)
    scores = torch.rand(n, generator=generator, dtype=torch.float64)
    groups = torch.randint(0, 3, (n,), generator=generator)
    for idxs in (None, groups):
        on_host = _nms_with_groups(boxes, scores, idxs, threshold, on_device=False)
        on_device = _nms_with_groups(boxes, scores, idxs, threshold, on_device=True)
        assert on_device.tolist() == on_host.tolist()
    categories = groups.tolist()
    expected = brute_force_nms(boxes.tolist(), scores.tolist(), categories, threshold)
    assert _nms_with_groups(boxes, scores, groups, threshold, on_device=True).tolist() == expected


def test_the_device_pass_follows_a_long_suppression_chain(monkeypatch):
    """Boxes each overlapping only the next: greedy keeps every other one, and the
    fixed-point pass needs as many steps as the chain is long (here past its check limit,
    so the host fallback answers)."""
    import sam2serve.engine.nms as nms_module

    monkeypatch.setattr(nms_module, "_MAX_CHECKS", 2)
    n = 40
    boxes = torch.tensor([[i * 6.0, 0.0, i * 6.0 + 10.0, 10.0] for i in range(n)])
    scores = torch.linspace(1.0, 0.1, n)
    expected = list(range(0, n, 2))
    for on_device in (False, True):
        kept = nms_module._nms_with_groups(boxes, scores, None, 0.2, on_device=on_device)
        assert kept.tolist() == expected
