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

from collections.abc import Iterator, Sequence
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
    pieces = [counts for counts, _ in _coco_count_pieces(text)]
    return np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.int64)


# Long strings are read in pieces of this many chars: a char costs a few int64 temporaries,
# so a piece's are a few MB whatever the mask.
PIECE_CHARS = 1 << 18


def _coco_count_pieces(text: str | bytes) -> Iterator[tuple[np.ndarray, bool]]:
    """The counts of a compressed string a piece at a time (and whether it is the last):
    a long string costs a piece's temporaries at once, and a reader that finds a bad
    count stops there instead of decoding the rest."""
    start, first_index = 0, 0
    sums = [0, 0]  # running sums of the values at even indices >= 2 and at odd indices
    while start < len(text):
        end = min(len(text), start + max(PIECE_CHARS, _MAX_CHARS_PER_COUNT))
        piece = text[start:end]  # a copy of the piece only, never of the whole string
        raw = piece.encode("ascii") if isinstance(piece, str) else bytes(piece)
        codes = np.frombuffer(raw, dtype=np.uint8).astype(np.int64) - _CHAR_OFFSET
        if (codes < 0).any() or (codes > _MORE_BIT + _PAYLOAD_MASK).any():
            raise ValueError("COCO RLE counts string has characters outside '0'..'o'")
        is_last = (codes & _MORE_BIT) == 0
        if end < len(text):  # cut after the piece's last whole value
            ends = np.flatnonzero(is_last)
            cut = int(ends[-1]) + 1 if ends.size else 0
            if cut == 0 or codes.size - cut >= _MAX_CHARS_PER_COUNT:
                raise ValueError("COCO RLE counts string has a value longer than a 32-bit count")
            codes, is_last, end = codes[:cut], is_last[:cut], start + cut
        elif not is_last[-1]:
            raise ValueError("COCO RLE counts string is truncated (last value is unfinished)")
        values = _values_of(codes, is_last)
        yield _undo_delta(values, first_index, sums), end == len(text)
        first_index += values.size
        start = end


def _values_of(codes: np.ndarray, is_last: np.ndarray) -> np.ndarray:
    """The signed values of whole values' chars (offset removed)."""
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
    return values


def _undo_delta(values: np.ndarray, first_index: int, sums: list[int]) -> np.ndarray:
    """Counts of ``values`` that start at index ``first_index`` of the string's values.

    From index 3 on, count[i] = value[i] + count[i - 2]: so counts 0 and 2 are stored as
    is, evens from 2 on are a running sum, and so are odds from 1 on. ``sums`` carries the
    two running sums from one piece to the next."""
    counts = values.copy()
    index = np.arange(first_index, first_index + values.size)
    for parity, where in enumerate(((index % 2 == 0) & (index >= 2), index % 2 == 1)):
        if where.any():
            running = sums[parity] + np.cumsum(values[where])
            counts[where] = running
            sums[parity] = int(running[-1])
    return counts


def checked_counts(counts: str | bytes | Sequence[int], height: int, width: int) -> np.ndarray:
    """The run lengths of a ``height`` x ``width`` mask given as COCO's compressed string
    or as the runs, checked as they are read: no run below 0, none of length 0 but the
    first and the last (pycocotools writes none; any other 0 only lengthens the list), and
    together exactly height * width pixels. ValueError names the first bad run, so a
    hostile string is refused after one piece, not after all of it."""
    pixels = height * width
    if isinstance(counts, (str, bytes)):
        pieces: Iterator[tuple[np.ndarray, bool]] = _coco_count_pieces(counts)
    else:
        pieces = iter([(np.asarray(counts, dtype=np.int64).reshape(-1), True)])
    out: list[np.ndarray] = []
    first_index, covered = 0, 0
    for piece, final in pieces:
        if piece.size and piece.min() < 0:
            index = first_index + int(np.argmax(piece < 0))
            raise ValueError(f"run {index} is {int(piece[index - first_index])}; runs are >= 0")
        zeros = np.flatnonzero(piece == 0) + first_index
        zeros = zeros[(zeros > 0) & ~(final & (zeros == first_index + piece.size - 1))]
        if zeros.size:
            raise ValueError(
                f"run {int(zeros[0])} has length 0; only the first and the last run may"
            )
        covered += int(piece.sum())
        if covered > pixels:
            raise ValueError(f"the runs cover more than the {height}x{width} = {pixels} pixels")
        out.append(piece)
        first_index += piece.size
    if covered != pixels:
        raise ValueError(f"the runs cover {covered} pixels, not the {height}x{width} = {pixels}")
    return np.concatenate(out)


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
