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

import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

__all__ = [
    "Runs",
    "area_from_rle",
    "coco_to_rle",
    "masks_to_coco",
    "masks_to_rle",
    "masks_to_runs",
    "rle_to_coco",
    "rle_to_mask",
]

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


def _run_lengths(masks: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """Run lengths of a batch of boolean masks (B, H, W), column-major, each mask's runs
    starting with zeros: (runs, offsets), mask ``i``'s counts being
    ``runs[offsets[i]:offsets[i + 1]]``.

    Where the runs change is found on the device for the whole batch and crosses to the
    host in one transfer; the rest is a few numpy passes over the change points, none over
    the pixels."""
    batch, h, w = masks.shape
    n_pixels = h * w
    # Column-major per mask; bool -> uint8 is a free view and transposes faster.
    flat = masks.view(torch.uint8).transpose(1, 2).reshape(batch, n_pixels)
    # Mask b's run boundaries at b * (n_pixels + 1) + p: before every pixel p that differs
    # from the one before it, before pixel 0 when it is set (the counts start with zeros:
    # a run of 0), and at the end (p = n_pixels). Each boundary ends one run.
    boundary = torch.empty((batch, n_pixels + 1), dtype=torch.bool, device=masks.device)
    boundary[:, 0] = flat[:, 0]
    boundary[:, n_pixels] = True
    torch.ne(flat[:, 1:], flat[:, :-1], out=boundary[:, 1:n_pixels])
    if masks.device.type == "cpu":
        # numpy's flatnonzero is several times faster than torch's nonzero on the CPU.
        where = np.flatnonzero(boundary.numpy())
    else:
        nonzero = boundary.reshape(-1).nonzero().squeeze(1)
        index_dtype = torch.int32 if boundary.numel() < 2**31 else torch.int64
        where = nonzero.to(index_dtype).cpu().numpy().astype(np.int64)  # the one transfer
    stride = n_pixels + 1
    offsets = np.zeros(batch + 1, np.int64)
    offsets[1:] = np.searchsorted(where, np.arange(1, batch + 1) * stride)
    # A run is the distance from the previous boundary; a mask's first from its start.
    runs = np.empty_like(where)
    runs[0] = where[0]
    np.subtract(where[1:], where[:-1], out=runs[1:])
    firsts = offsets[:-1]
    runs[firsts] = where[firsts] - np.arange(batch) * stride
    return runs, offsets


@dataclass(frozen=True)
class Runs:
    """The uncompressed RLEs of a batch of masks of one size, packed into two arrays: mask
    ``i``'s counts are ``runs[offsets[i]:offsets[i + 1]]``. Selecting, joining, areas and
    COCO strings are numpy passes over all masks at once; a Python list of counts is only
    made for a mask handed out as an uncompressed RLE (``rle``). Every mask has >= 1 run."""

    size: tuple[int, int]  # (h, w)
    runs: np.ndarray  # int64
    offsets: np.ndarray  # int64, (len + 1,), starting at 0

    def __len__(self) -> int:
        return self.offsets.size - 1

    @staticmethod
    def empty(size: tuple[int, int]) -> Runs:
        return Runs(size, np.zeros(0, np.int64), np.zeros(1, np.int64))

    def rle(self, i: int) -> Rle:
        """Mask ``i`` as an uncompressed RLE (counts as a list of ints)."""
        counts = self.runs[self.offsets[i] : self.offsets[i + 1]].tolist()
        return {"size": list(self.size), "counts": counts}

    def rles(self) -> list[Rle]:
        return [self.rle(i) for i in range(len(self))]

    def select(self, positions: np.ndarray | Sequence[int]) -> Runs:
        """The masks at ``positions``, in that order."""
        positions = np.asarray(positions, dtype=np.int64).reshape(-1)
        starts = self.offsets[positions]
        lengths = self.offsets[positions + 1] - starts
        offsets = np.zeros(positions.size + 1, np.int64)
        np.cumsum(lengths, out=offsets[1:])
        gather = np.repeat(starts - offsets[:-1], lengths) + np.arange(offsets[-1])
        return Runs(self.size, self.runs[gather], offsets)

    @staticmethod
    def concat(parts: Sequence[Runs], size: tuple[int, int]) -> Runs:
        if not parts:
            return Runs.empty(size)
        if len(parts) == 1:
            return parts[0]
        if any(part.size != size for part in parts):
            raise ValueError(f"cannot join runs of sizes {[p.size for p in parts]} into {size}")
        shifts = np.cumsum([0] + [part.runs.size for part in parts[:-1]])
        offsets = [parts[0].offsets[:1]] + [
            part.offsets[1:] + shift for part, shift in zip(parts, shifts, strict=True)
        ]
        return Runs(size, np.concatenate([p.runs for p in parts]), np.concatenate(offsets))

    def areas(self) -> np.ndarray:
        """Set pixels per mask (int64): the sum of each mask's odd-indexed runs."""
        return _areas(self.runs, self.offsets)

    def coco(self) -> list[Rle]:
        """Every mask as a COCO compressed RLE (``rle_to_coco`` of each, in one pass)."""
        if not len(self):
            return []
        texts = _encode_counts_batch(self.runs, self.offsets)
        return [{"size": list(self.size), "counts": text} for text in texts]


def _areas(runs: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Set pixels per mask (int64): the sum of each mask's runs at odd positions within
    its counts, i.e. at odd global positions for a mask whose counts start at an even one
    and at even ones otherwise (prefix sums of both, no per-run position array)."""
    at_odd = np.zeros(runs.size + 1, np.int64)
    np.cumsum(runs[1::2], out=at_odd[2::2])
    at_odd[1::2] = at_odd[0:-1:2]  # an even position adds nothing
    every = np.zeros(runs.size + 1, np.int64)
    np.cumsum(runs, out=every[1:])
    starts, stops = offsets[:-1], offsets[1:]
    odd_sum = at_odd[stops] - at_odd[starts]
    even_sum = every[stops] - every[starts] - odd_sum
    areas: np.ndarray = np.where(starts % 2 == 0, odd_sum, even_sum)
    return areas


def masks_to_runs(masks: torch.Tensor) -> Runs:
    """The RLEs of a batch of boolean masks (B, H, W), on any device, packed as
    :class:`Runs`: the runs are found on the device for the whole batch and cross to the
    host in one transfer; the split per mask is numpy's."""
    _check_masks(masks)
    batch, h, w = masks.shape
    if batch == 0:
        return Runs.empty((h, w))
    if h * w == 0:
        # pycocotools encodes an empty image as a single zero-length run.
        return Runs((h, w), np.zeros(batch, np.int64), np.arange(batch + 1, dtype=np.int64))
    runs, offsets = _run_lengths(masks)
    return Runs((h, w), runs.astype(np.int64, copy=False), offsets.astype(np.int64))


def masks_to_rle(masks: torch.Tensor) -> list[Rle]:
    """Uncompressed RLEs of a batch of boolean masks (B, H, W), on any device.

    Runs are found on the device for the whole batch at once and copied to the host in one
    transfer; the per-mask split happens on the host with numpy.
    """
    return masks_to_runs(masks).rles()


def masks_to_coco(masks: torch.Tensor) -> tuple[list[Rle], list[int]]:
    """COCO compressed RLEs and areas of a batch of boolean masks (B, H, W), on any device:
    ``masks_to_rle`` then ``rle_to_coco`` and ``area_from_rle`` for the whole batch, with
    no Python list of counts in between (a noisy mask has ~10^5 runs)."""
    _check_masks(masks)
    batch, h, w = masks.shape
    if batch == 0:
        return [], []
    if h * w == 0:
        return [rle_to_coco({"size": [h, w], "counts": [0]}) for _ in range(batch)], [0] * batch
    if masks.device.type != "cpu":
        texts, areas = _coco_on_device(masks)
        return [{"size": [h, w], "counts": text} for text in texts], areas
    runs, offsets = _run_lengths(masks)
    texts = _encode_counts_batch(runs, offsets)
    return [{"size": [h, w], "counts": text} for text in texts], _areas(runs, offsets).tolist()


def _coco_on_device(masks: torch.Tensor) -> tuple[list[str], list[int]]:
    """``masks_to_coco``'s strings and areas computed where the masks are (a GPU): runs,
    deltas and chars for the whole batch on the device, and only the finished chars (one
    byte each), each mask's char bounds and areas cross to the host. A noisy mask has
    ~10^5 runs, and encoding them on the host took most of a GPU's time per prompt.
    Works on any device (the tests run it on the CPU against pycocotools)."""
    batch, h, w = masks.shape
    n_pixels = h * w
    device = masks.device
    flat = masks.view(torch.uint8).transpose(1, 2).reshape(batch, n_pixels)
    # A virtual unset pixel before each mask: every mask's counts then start with a zeros
    # run (one pixel too long, corrected below), whatever its first pixel.
    padded = torch.zeros((batch, n_pixels + 1), dtype=torch.uint8, device=device)
    padded[:, 1:] = flat
    boundary = torch.ones((batch, n_pixels + 2), dtype=torch.bool, device=device)
    torch.ne(padded[:, 1:], padded[:, :-1], out=boundary[:, 1 : n_pixels + 1])
    where = boundary.reshape(-1).nonzero().squeeze(1)
    owner, position = where // (n_pixels + 2), where % (n_pixels + 2)
    same_mask = owner[1:] == owner[:-1]
    runs = (position[1:] - position[:-1])[same_mask]
    lengths = torch.bincount(owner, minlength=batch) - 1  # runs per mask
    offsets = torch.zeros(batch + 1, dtype=torch.int64, device=device)
    torch.cumsum(lengths, 0, out=offsets[1:])
    runs[offsets[:-1]] -= 1  # the virtual pixel
    run_owner = owner[1:][same_mask]
    index = torch.arange(runs.numel(), device=device) - offsets[run_owner]
    areas = torch.zeros(batch, dtype=torch.int64, device=device)
    areas.index_add_(0, run_owner, torch.where(index % 2 == 1, runs, 0))
    # From a list's 4th count on, the difference to the count two before it.
    values = runs.clone()
    later = index >= 3
    values[later] -= runs[torch.nonzero(later).squeeze(1) - 2]
    magnitude = torch.where(values < 0, ~values, values)
    n_chars = torch.ones_like(values)
    for extra in range(1, _MAX_CHARS_PER_COUNT):  # one more char per 5 more bits
        n_chars += magnitude >= (1 << (_BITS_PER_CHAR * extra - 1))
    char_ends = torch.cumsum(n_chars, 0)
    value_of_char = torch.repeat_interleave(torch.arange(values.numel(), device=device), n_chars)
    k = torch.arange(value_of_char.numel(), device=device) - (char_ends - n_chars)[value_of_char]
    payload = (values[value_of_char] >> (_BITS_PER_CHAR * k)) & _PAYLOAD_MASK
    more = k < n_chars[value_of_char] - 1
    chars = (payload + more * _MORE_BIT + _CHAR_OFFSET).to(torch.uint8)
    bounds = torch.cat([char_ends.new_zeros(1), char_ends])[offsets]
    text = chars.cpu().numpy().tobytes()
    host = torch.cat([bounds, areas]).cpu().tolist()
    bounds_host, areas_host = host[: batch + 1], host[batch + 1 :]
    return [text[a:b].decode("ascii") for a, b in itertools.pairwise(bounds_host)], areas_host


def _check_masks(masks: torch.Tensor) -> None:
    if masks.ndim != 3:
        raise ValueError(f"masks must have shape (B, H, W), got {tuple(masks.shape)}")
    if masks.dtype != torch.bool:
        raise TypeError(f"masks must be a bool tensor, got dtype {masks.dtype}")


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
    counts = rle["counts"]
    if isinstance(counts, np.ndarray):
        return int(counts[1::2].sum())
    return int(sum(counts[1::2]))


def _encode_counts(counts: np.ndarray) -> str:
    """pycocotools' rleToString: counts -> compact ASCII string."""
    counts = np.asarray(counts, dtype=np.int64)
    return _encode_counts_batch(counts, np.array([0, counts.size]))[0]


def _encode_counts_batch(counts: np.ndarray, offsets: np.ndarray) -> list[str]:
    """pycocotools' rleToString for many count lists at once: ``counts[offsets[i]:
    offsets[i + 1]]`` -> string ``i``. Every char of every list is computed in one pass
    per char position (a value has 1 to 7 chars; noisy masks' mostly 1 or 2), in int32:
    a count is at most 2**31 - 1 pixels, a difference of two fits too."""
    if counts.size and int(counts.max()) >= 2**31:
        raise ValueError("a run of 2**31 pixels or more cannot be encoded")
    counts = counts.astype(np.int32)
    # From the 4th count of a list on, store the difference to the count two before it
    # (same parity), which is small for smooth shapes; the first three as they are.
    values = counts.copy()
    np.subtract(counts[2:], counts[:-2], out=values[2:])
    starts, lengths = offsets[:-1], np.diff(offsets)
    for k in range(3):
        at = starts[lengths > k] + k
        values[at] = counts[at]
    # Chars per value: 5 payload bits each, the top one of the last char the sign, so
    # a value needs bit_length(v if v >= 0 else ~v) // 5 + 1 chars.
    magnitude = values ^ (values >> 31)
    width = int(magnitude.max()).bit_length() // _BITS_PER_CHAR + 1 if values.size else 1
    n_chars = np.ones(values.size, np.int8)
    for extra in range(1, width):
        n_chars += magnitude >= (1 << (_BITS_PER_CHAR * extra - 1))
    # Char k of every value (those past a value's last char are dropped below).
    chars = np.empty((values.size, width), np.uint8)
    keep = np.empty((values.size, width), bool)
    rest = values
    for k in range(width):
        np.greater(n_chars, k, out=keep[:, k])
        column = (rest & _PAYLOAD_MASK).astype(np.uint8)
        column += _CHAR_OFFSET
        if k < width - 1:
            column += (n_chars > k + 1).view(np.uint8) * np.uint8(_MORE_BIT)
            rest = rest >> _BITS_PER_CHAR
        chars[:, k] = column
    text = (chars[keep] if width > 1 else chars).tobytes()
    char_ends = np.zeros(values.size + 1, np.int64)
    np.cumsum(n_chars, out=char_ends[1:])
    bounds = char_ends[offsets].tolist()
    return [text[a:b].decode("ascii") for a, b in itertools.pairwise(bounds)]


def _decode_counts(text: str | bytes | bytearray) -> np.ndarray:
    """pycocotools' rleFrString: compact ASCII string -> counts."""
    pieces = [counts for counts, _ in _coco_count_pieces(text)]
    return np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.int64)


# Long strings are read in pieces of this many chars: a char costs a few int64 temporaries,
# so a piece's are a few MB whatever the mask.
PIECE_CHARS = 1 << 18


def _coco_count_pieces(text: str | bytes | bytearray) -> Iterator[tuple[np.ndarray, bool]]:
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
    text = bytes(counts) if isinstance(counts, bytearray) else counts
    return {"size": [h, w], "counts": _decode_counts(text).tolist()}
