"""RLE encoding checked byte for byte against pycocotools (and Meta's torch encoder)."""

from __future__ import annotations

import numpy as np
import pytest
import skimage.data
import torch
from pycocotools import mask as coco_mask
from reference import import_reference
from torch.utils._python_dispatch import TorchDispatchMode

from sam2serve.engine.rle import (
    Runs,
    _coco_on_device,
    area_from_rle,
    checked_counts,
    coco_to_rle,
    masks_to_coco,
    masks_to_rle,
    masks_to_runs,
    rle_to_coco,
    rle_to_mask,
)


def coco_encode(mask: np.ndarray) -> dict:
    return coco_mask.encode(np.asfortranarray(mask.astype(np.uint8)))


def mask_cases() -> list[tuple[str, np.ndarray]]:
    """Named (H, W) bool masks covering the edge cases of run-length coding."""
    rng = np.random.default_rng(0)
    cases = [
        ("empty", np.zeros((6, 9), bool)),
        ("full", np.ones((6, 9), bool)),
        ("single_pixel_first", np.pad(np.ones((1, 1), bool), ((0, 4), (0, 6)))),
        ("single_pixel_last", np.pad(np.ones((1, 1), bool), ((4, 0), (6, 0)))),
        ("single_pixel_middle", np.pad(np.ones((1, 1), bool), ((2, 3), (4, 1)))),
        ("one_by_one_set", np.ones((1, 1), bool)),
        ("one_by_one_unset", np.zeros((1, 1), bool)),
        ("row_vector", rng.random((1, 17)) < 0.5),
        ("column_vector", rng.random((13, 1)) < 0.5),
        ("starts_with_one", np.eye(7, 11, dtype=bool)),
    ]
    for density in (0.02, 0.5, 0.98):
        cases.append((f"random_{density}", rng.random((37, 23)) < density))
    # A real shape: long runs, large counts, deltas of both signs.
    cases.append(("horse", skimage.data.horse() == 0))
    cases.append(("horse_inverted", skimage.data.horse() != 0))
    return cases


CASES = mask_cases()
CASE_IDS = [name for name, _ in CASES]
CASE_MASKS = [mask for _, mask in CASES]


@pytest.mark.parametrize("mask", CASE_MASKS, ids=CASE_IDS)
def test_coco_string_equals_pycocotools(mask):
    h, w = mask.shape
    (rle,) = masks_to_rle(torch.from_numpy(mask)[None])
    assert rle["size"] == [h, w]
    ours = rle_to_coco(rle)
    assert ours["size"] == [h, w]
    assert isinstance(ours["counts"], str)
    assert ours["counts"].encode() == coco_encode(mask)["counts"]
    assert ours["counts"].encode() == coco_mask.frPyObjects(rle, h, w)["counts"]


@pytest.mark.parametrize("mask", CASE_MASKS, ids=CASE_IDS)
def test_round_trips_and_area(mask):
    h, w = mask.shape
    (rle,) = masks_to_rle(torch.from_numpy(mask)[None])
    decoded = rle_to_mask(rle)
    assert decoded.dtype == bool and decoded.flags.c_contiguous
    np.testing.assert_array_equal(decoded, mask)
    assert area_from_rle(rle) == int(mask.sum()) == int(coco_mask.area(coco_encode(mask)))
    # Our string decodes with pycocotools, and pycocotools' string decodes with ours.
    ours = rle_to_coco(rle)
    np.testing.assert_array_equal(
        coco_mask.decode({"size": [h, w], "counts": ours["counts"].encode()}), mask
    )
    theirs = coco_encode(mask)
    assert coco_to_rle(theirs) == rle  # bytes
    assert coco_to_rle({"size": theirs["size"], "counts": theirs["counts"].decode()}) == rle


def test_first_count_is_zeros_column_major():
    mask = np.array([[1, 0, 0], [1, 1, 0]], dtype=bool)  # Fortran order: 1 1 0 1 0 0
    (rle,) = masks_to_rle(torch.from_numpy(mask)[None])
    assert rle == {"size": [2, 3], "counts": [0, 2, 1, 1, 2]}
    (empty,) = masks_to_rle(torch.zeros(1, 2, 3, dtype=torch.bool))
    assert empty["counts"] == [6]
    (full,) = masks_to_rle(torch.ones(1, 2, 3, dtype=torch.bool))
    assert full["counts"] == [0, 6]


def test_batch_matches_per_mask_and_meta():
    import_reference()
    from sam2.utils.amg import mask_to_rle_pytorch

    rng = np.random.default_rng(1)
    masks = torch.from_numpy(rng.random((9, 31, 19)) < 0.3)
    masks[0] = False
    masks[1] = True
    masks[2, 0, 0] = True
    masks[3, 0, 0] = False
    batched = masks_to_rle(masks)
    assert batched == [masks_to_rle(m[None])[0] for m in masks]
    assert batched == mask_to_rle_pytorch(masks)


def test_packed_runs_select_join_and_encode_like_each_mask():
    """AMG keeps its masks as packed Runs: selecting (repeats, reordering, nothing),
    joining, areas and COCO strings give exactly the per-mask functions' values."""
    rng = np.random.default_rng(5)
    masks = torch.from_numpy(rng.random((7, 13, 11)) < 0.4)
    masks[0], masks[1], masks[2, 0, 0] = False, True, True
    runs = masks_to_runs(masks)
    rles = masks_to_rle(masks)
    assert len(runs) == 7 and runs.rles() == rles and runs.runs.dtype == np.int64
    assert runs.areas().tolist() == [int(m.sum()) for m in masks]
    assert runs.coco() == [rle_to_coco(rle) for rle in rles]
    assert all(
        c == coco_encode(m.numpy())["counts"].decode()
        for c, m in zip((c["counts"] for c in runs.coco()), masks, strict=True)
    )
    picked = runs.select(np.array([6, 0, 6, 3]))
    assert picked.rles() == [rles[i] for i in (6, 0, 6, 3)]
    assert picked.areas().tolist() == [int(masks[i].sum()) for i in (6, 0, 6, 3)]
    nothing = runs.select(np.zeros(0, np.int64))
    assert len(nothing) == 0 and nothing.rles() == [] and nothing.coco() == []
    assert nothing.areas().tolist() == []
    joined = Runs.concat([runs.select([2]), nothing, runs, runs.select([1, 0])], (13, 11))
    assert joined.rles() == [rles[2], *rles, rles[1], rles[0]]
    assert Runs.concat([], (13, 11)).rles() == []
    with pytest.raises(ValueError, match="sizes"):
        Runs.concat([runs, masks_to_runs(torch.zeros(1, 3, 3, dtype=torch.bool))], (13, 11))
    empty_image = masks_to_runs(torch.zeros(2, 0, 4, dtype=torch.bool))
    assert empty_image.rles() == masks_to_rle(torch.zeros(2, 0, 4, dtype=torch.bool))
    assert empty_image.areas().tolist() == [0, 0]


def test_batch_to_coco_equals_per_mask_path_and_pycocotools():
    """masks_to_coco (the batched path) = rle_to_coco + area_from_rle of each mask, and
    pycocotools' encoder, on masks of every kind in one batch (first pixel set or not,
    empty, full, noisy, a real shape)."""
    rng = np.random.default_rng(1)
    horse = skimage.data.horse() == 0
    h, w = horse.shape
    batch = np.stack(
        [
            horse,
            ~horse,
            np.zeros((h, w), bool),
            np.ones((h, w), bool),
            rng.random((h, w)) < 0.5,
            np.eye(h, w, dtype=bool),
        ]
    )
    cocos, areas = masks_to_coco(torch.from_numpy(batch))
    for mask, coco, area in zip(batch, cocos, areas, strict=True):
        (rle,) = masks_to_rle(torch.from_numpy(mask)[None])
        assert coco == rle_to_coco(rle)
        assert area == area_from_rle(rle) == int(mask.sum())
        assert coco["counts"].encode() == coco_encode(mask)["counts"]
    assert masks_to_coco(torch.zeros(0, 3, 4, dtype=torch.bool)) == ([], [])
    # The device path (what a GPU runs), here on the CPU: the same strings and areas.
    texts, device_areas = _coco_on_device(torch.from_numpy(batch))
    assert texts == [coco["counts"] for coco in cocos] and device_areas == areas
    tiny = torch.tensor([[[True]], [[False]]])
    assert _coco_on_device(tiny) == (["01", "1"], [1, 0])


def test_device_path_reads_back_a_fixed_number_of_times():
    """The device path's host reads (nonzero, sizes of boolean selections, the final copy)
    do not grow with the masks: 1 and 16 masks make the same calls."""

    def calls(batch: int) -> dict[str, int]:
        masks = torch.rand(batch, 20, 30, generator=torch.Generator().manual_seed(batch)) < 0.5
        with OpCounter() as counter:
            _coco_on_device(masks)
        return {k: v for k, v in counter.calls.items() if k in ("nonzero", "_local_scalar_dense")}

    assert calls(1) == calls(16)


class OpCounter(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.calls: dict[str, int] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        self.calls[name] = self.calls.get(name, 0) + 1
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("batch", [1, 16])
def test_one_host_sync_per_batch(batch):
    """No per-mask scalar reads: at most one nonzero for the batch (none on the CPU, where
    numpy finds the change points) and no .item()-style syncs."""
    masks = torch.rand(batch, 20, 30) < 0.5
    with OpCounter() as counter:
        masks_to_rle(masks)
        masks_to_coco(masks)
    assert counter.calls.get("nonzero", 0) <= 2
    assert counter.calls.get("_local_scalar_dense", 0) == 0
    assert counter.calls.get("item", 0) == 0


def test_degenerate_shapes():
    assert masks_to_rle(torch.zeros(0, 4, 5, dtype=torch.bool)) == []
    zero_pixels = masks_to_rle(torch.zeros(2, 0, 4, dtype=torch.bool))
    assert zero_pixels == [{"size": [0, 4], "counts": [0]}] * 2
    assert rle_to_coco(zero_pixels[0])["counts"].encode() == coco_encode(np.zeros((0, 4)))["counts"]


def test_large_counts_encode_like_pycocotools():
    # Counts near 9e6 give deltas that need many chars, of both signs.
    for counts in ([5, 8_999_990, 5], [8_999_990, 5, 5], [0, 1, 8_999_998, 1]):
        rle = {"size": [3000, 3000], "counts": counts}
        ours = rle_to_coco(rle)
        assert ours["counts"].encode() == coco_mask.frPyObjects(rle, 3000, 3000)["counts"]
        assert coco_to_rle(ours) == rle


def test_errors():
    with pytest.raises(ValueError, match=r"\(B, H, W\)"):
        masks_to_rle(torch.zeros(4, 5, dtype=torch.bool))
    with pytest.raises(TypeError, match="float32"):
        masks_to_rle(torch.zeros(1, 4, 5))
    with pytest.raises(ValueError, match="sum to 5 but size"):
        rle_to_mask({"size": [2, 3], "counts": [2, 3]})
    with pytest.raises(ValueError, match="outside"):
        coco_to_rle({"size": [2, 3], "counts": "6 "})
    with pytest.raises(ValueError, match="truncated"):
        coco_to_rle({"size": [2, 3], "counts": "6o"})
    with pytest.raises(TypeError, match="str or bytes"):
        coco_to_rle({"size": [2, 3], "counts": [6]})


def test_long_strings_are_read_and_written_in_pieces(monkeypatch):
    """With pieces of a few chars, every piece boundary (inside runs of many chars, at
    every parity) gives the same counts as pycocotools."""
    import sam2serve.engine.rle as rle_module

    rng = np.random.default_rng(1)
    masks = [rng.random((37, 29)) < p for p in (0.1, 0.5, 0.9)]
    masks.append(np.pad(np.ones((300, 300), bool), ((40, 1), (0, 700))))  # runs of 3+ chars
    for chunk in (1, 7, 8, 9, 13):  # a piece is at least one whole value (7 chars)
        monkeypatch.setattr(rle_module, "PIECE_CHARS", chunk)
        for mask in masks:
            expected = coco_encode(mask)
            rle = masks_to_rle(torch.from_numpy(mask)[None])[0]
            assert rle_to_coco(rle)["counts"] == expected["counts"].decode()
            assert coco_to_rle(expected)["counts"] == rle["counts"]
            counts = checked_counts(expected["counts"].decode(), *mask.shape)
            assert counts.tolist() == rle["counts"]


@pytest.mark.parametrize(
    ("counts", "message"),
    [
        ([-1, 55], "run 0 is -1"),
        ([3, 0, 51], "run 1 has length 0"),
        ([10, 10], "cover 20 pixels"),
        ([50, 10], "cover more than"),
        ("0" * 1000, "run 1 has length 0"),  # zero-length runs
        ("1" * 1000, "cover more than"),  # runs that grow: refused in the first piece
    ],
)
def test_checked_counts_names_the_first_bad_run(counts, message):
    with pytest.raises(ValueError, match=message):
        checked_counts(counts, 6, 9)


def test_checked_counts_takes_a_leading_and_a_trailing_zero():
    assert checked_counts([0, 54, 0], 6, 9).tolist() == [0, 54, 0]
    string = rle_to_coco({"size": [6, 9], "counts": [0, 54, 0]})["counts"]
    assert checked_counts(string, 6, 9).tolist() == [0, 54, 0]
