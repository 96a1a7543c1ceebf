"""Masks <-> run-length encodings: uncompressed RLE and COCO's compressed string.

An uncompressed RLE is ``{"size": [h, w], "counts": [int, ...]}``: run lengths of the mask
flattened in column-major (Fortran) order, alternating zeros and ones and starting with
zeros (so a mask whose first pixel is set starts with a count of 0). This is the form
pycocotools reads with ``frPyObjects``.

The COCO form keeps the size and packs the counts into an ASCII string, as pycocotools'
``rleToString`` does. It is implemented here with numpy so pycocotools is not a runtime
dependency (the tests check it against pycocotools byte for byte).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

__all__ = ["area_from_rle", "coco_to_rle", "masks_to_rle", "rle_to_coco", "rle_to_mask"]

Rle = dict[str, Any]

# COCO's string format: each count becomes 1+ chars of 5 payload bits, least significant
# group first; bit 0x20 says "another char follows", bit 0x10 of the last char is the sign.
# Chars are offset by 48 so they are printable ('0'..'o').
_CHAR_OFFSET = 48
_PAYLOAD_MASK = 0x1F
_SIGN_BIT = 0x10
_MORE_BIT = 0x20
_BITS_PER_CHAR = 5
# A delta of two uint32 counts fits in 33 signed bits: at most 7 chars of 5 bits.
_MAX_CHARS_PER_COUNT = 7


def masks_to_rle(masks: torch.Tensor) -> list[Rle]:
    """Uncompressed RLEs of a batch of boolean masks (B, H, W), on any device.

    Change points are found on the device for the whole batch at once and copied to the
    host in one transfer; the per-mask split happens on the host with numpy.
    """
    if masks.ndim != 3:
        raise ValueError(f"masks must have shape (B, H, W), got {tuple(masks.shape)}")
    if masks.dtype != torch.bool:
        raise TypeError(f"masks must be a bool tensor, got dtype {masks.dtype}")
    batch, h, w = masks.shape
    n_pixels = h * w
    if batch == 0:
        return []
    if n_pixels == 0:
        # pycocotools encodes an empty image as a single zero-length run.
        return [{"size": [h, w], "counts": [0]} for _ in range(batch)]

    flat = masks.transpose(1, 2).reshape(batch, n_pixels)  # column-major per mask
    changes = (flat[:, 1:] != flat[:, :-1]).nonzero()  # (K, 2): mask index, position
    # Pack "first pixel set" flags and change points into one tensor: one host transfer.
    payload = torch.cat([flat[:, 0].to(torch.int64), changes.reshape(-1)]).cpu().numpy()
    starts_with_one = payload[:batch].astype(bool)
    changes_np = payload[batch:].reshape(-1, 2)

    # nonzero() is row-major, so each mask's change points are contiguous and sorted.
    run_ends_per_mask = np.split(
        changes_np[:, 1] + 1, np.searchsorted(changes_np[:, 0], np.arange(1, batch))
    )
    rles = []
    for first_set, run_ends in zip(starts_with_one, run_ends_per_mask, strict=True):
        boundaries = np.concatenate(([0], run_ends, [n_pixels]))
        counts = np.diff(boundaries).tolist()
        if first_set:
            counts.insert(0, 0)
        rles.append({"size": [h, w], "counts": counts})
    return rles


def _size_and_counts(rle: Rle) -> tuple[int, int, np.ndarray]:
    h, w = (int(v) for v in rle["size"])
    counts = np.asarray(rle["counts"], dtype=np.int64)
    if counts.ndim != 1 or (counts < 0).any():
        raise ValueError("RLE counts must be a flat list of non-negative integers")
    if int(counts.sum()) != h * w:
        raise ValueError(
            f"RLE counts sum to {int(counts.sum())} but size {[h, w]} has {h * w} pixels"
        )
    return h, w, counts


def rle_to_mask(rle: Rle) -> np.ndarray:
    """Decode an uncompressed RLE into a C-contiguous (H, W) bool array."""
    h, w, counts = _size_and_counts(rle)
    # Runs alternate 0, 1, 0, ...: run i has the value of i's parity.
    values = (np.arange(counts.size) % 2).astype(bool)
    flat = np.repeat(values, counts)
    return np.ascontiguousarray(flat.reshape(w, h).T)


def area_from_rle(rle: Rle) -> int:
    """Number of set pixels: the sum of the odd-indexed (ones) runs."""
    return int(sum(rle["counts"][1::2]))


def _encode_counts(counts: np.ndarray) -> str:
    """pycocotools' rleToString: counts -> compact ASCII string."""
    values = counts.astype(np.int64)
    # From the 4th count on, store the difference to the count two before it (same
    # parity), which is small for smooth shapes.
    values[3:] -= counts[1:-2].astype(np.int64)

    chars = np.zeros((values.size, _MAX_CHARS_PER_COUNT), dtype=np.int64)
    emitted = np.zeros_like(chars, dtype=bool)
    active = np.ones(values.size, dtype=bool)  # counts still emitting chars
    remaining = values.copy()
    for k in range(_MAX_CHARS_PER_COUNT):
        payload = remaining & _PAYLOAD_MASK
        remaining >>= _BITS_PER_CHAR  # arithmetic shift, as on a C long
        # Stop once the rest is pure sign extension of the payload's top bit.
        more = np.where(payload & _SIGN_BIT, remaining != -1, remaining != 0)
        chars[:, k] = payload + np.where(more, _MORE_BIT, 0) + _CHAR_OFFSET
        emitted[:, k] = active
        active &= more
    return chars[emitted].astype(np.uint8).tobytes().decode("ascii")


def _decode_counts(text: str | bytes) -> np.ndarray:
    """pycocotools' rleFrString: compact ASCII string -> counts."""
    raw = text.encode("ascii") if isinstance(text, str) else bytes(text)
    codes = np.frombuffer(raw, dtype=np.uint8).astype(np.int64) - _CHAR_OFFSET
    if codes.size == 0:
        return np.zeros(0, dtype=np.int64)
    if (codes < 0).any() or (codes > _MORE_BIT + _PAYLOAD_MASK).any():
        raise ValueError("COCO RLE counts string has characters outside '0'..'o'")
    is_last = (codes & _MORE_BIT) == 0
    if not is_last[-1]:
        raise ValueError("COCO RLE counts string is truncated (last value is unfinished)")

    # Group chars into values: value index of each char, and its position in the value.
    value_of_char = np.concatenate(([0], np.cumsum(is_last)[:-1]))
    value_starts = np.flatnonzero(np.concatenate(([True], is_last[:-1])))
    position = np.arange(codes.size) - value_starts[value_of_char]
    if position.max() >= _MAX_CHARS_PER_COUNT:
        raise ValueError("COCO RLE counts string has a value longer than a 32-bit count")

    payload = (codes & _PAYLOAD_MASK) << (_BITS_PER_CHAR * position)
    values = np.add.reduceat(payload, value_starts)
    # Sign-extend values whose last char has the sign bit set.
    last_chars = codes[is_last]
    n_bits = _BITS_PER_CHAR * (position[is_last] + 1)
    negative = (last_chars & _SIGN_BIT) != 0
    values[negative] -= np.left_shift(1, n_bits[negative])

    # Undo the delta: from index 3 on, count[i] = value[i] + count[i - 2]. So counts 0 and
    # 2 are stored as is, evens from 2 on are a running sum, and so are odds from 1 on.
    counts = values.copy()
    counts[2::2] = np.cumsum(values[2::2])
    counts[1::2] = np.cumsum(values[1::2])
    return counts


def rle_to_coco(rle: Rle) -> Rle:
    """COCO compressed RLE ``{"size": [h, w], "counts": str}`` of an uncompressed RLE."""
    h, w = (int(v) for v in rle["size"])
    counts = np.asarray(rle["counts"], dtype=np.int64)
    return {"size": [h, w], "counts": _encode_counts(counts)}


def coco_to_rle(coco: Rle) -> Rle:
    """Uncompressed RLE of a COCO compressed RLE (counts as str or bytes)."""
    h, w = (int(v) for v in coco["size"])
    counts = coco["counts"]
    if not isinstance(counts, (str, bytes, bytearray)):
        raise TypeError(f"COCO RLE counts must be str or bytes, got {type(counts).__name__}")
    return {"size": [h, w], "counts": _decode_counts(counts).tolist()}
