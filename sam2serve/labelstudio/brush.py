"""Label Studio's brush RLE: a mask in the form Label Studio stores a BrushLabels region.

Label Studio keeps a brush region as an RGBA bitmap of the image's original size, packed
in the run-length format of thi.ng's ``rle-pack`` (what its editor decodes with; the
Python decoder is ``label_studio_sdk.converter.brush.decode_rle``). The stream is a bit
string, most significant bit first, zero-padded to whole bytes:

- header: the number of values (32 bits), the word size minus one (5 bits), and four
  run-length field widths, each minus one (4 bits each);
- then chunks until every value is covered, each: a repeat flag (1 bit), the index of
  the run-length field width it uses (2 bits), the run length minus one (in that many
  bits), then one word repeated that many times (flag 1) or that many words (flag 0).

A mask is H x W x 4 bytes in row-major order, each pixel's 0 or 255 in all four channels
(Label Studio's converter reads the alpha channel). Every run is then a multiple of four
long, so the encoder writes only repeat chunks, each in the narrowest width that holds
its length (runs longer than the widest field are split). The encoding is vectorised:
the cost is one pass over the mask plus a few numpy operations per run.
"""

from __future__ import annotations

import numpy as np

CHANNELS = 4  # R, G, B, A: every pixel's value is written to all four
WORD_BITS = 8
FOREGROUND = 255
# Bits of "run length - 1" that each width index selects (Label Studio's own choice).
RUN_LENGTH_BITS = (3, 4, 8, 16)
_LONGEST_RUN = 1 << RUN_LENGTH_BITS[-1]
_COUNT_BITS = 32
_FLAG_AND_INDEX_BITS = 3  # repeat flag + 2-bit width index


def mask_to_brush_rle(mask: np.ndarray) -> list[int]:
    """The brush RLE bytes (as a list of ints, the JSON Label Studio takes) of ``mask``, a
    2-D array whose nonzero entries are the region."""
    mask = np.asarray(mask)
    if mask.ndim != 2:
        raise ValueError(f"mask must be 2-D (height, width), got shape {mask.shape}")
    pixels = mask.reshape(-1).astype(bool)
    n_values = pixels.size * CHANNELS
    if n_values >= 1 << _COUNT_BITS:
        raise ValueError(f"mask of {mask.shape[0]}x{mask.shape[1]} is too large for brush RLE")
    header = _pack_fields(
        np.array([n_values, WORD_BITS - 1, *(b - 1 for b in RUN_LENGTH_BITS)], dtype=np.int64),
        np.array([_COUNT_BITS, 5, 4, 4, 4, 4], dtype=np.int64),
    )
    lengths, values = _chunks(pixels)
    index = np.searchsorted(1 << np.array(RUN_LENGTH_BITS), lengths - 1, side="right")
    length_bits = np.array(RUN_LENGTH_BITS, dtype=np.int64)[index]
    code = (((0b100 | index) << length_bits | (lengths - 1)) << WORD_BITS) | values
    body = _pack_fields(code, _FLAG_AND_INDEX_BITS + length_bits + WORD_BITS)
    return np.packbits(np.concatenate((header, body))).tolist()


def _chunks(pixels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(length, value) of each repeat chunk: the runs of ``pixels`` in values (x4), the
    longer ones split into chunks of at most the widest field's length."""
    if pixels.size == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    starts = np.concatenate(([0], np.flatnonzero(pixels[1:] != pixels[:-1]) + 1))
    run_lengths = np.diff(np.append(starts, pixels.size)).astype(np.int64) * CHANNELS
    run_values = np.where(pixels[starts], FOREGROUND, 0).astype(np.int64)
    pieces = -(-run_lengths // _LONGEST_RUN)
    lengths = np.full(int(pieces.sum()), _LONGEST_RUN, dtype=np.int64)
    last_piece = np.cumsum(pieces) - 1
    lengths[last_piece] = run_lengths - (pieces - 1) * _LONGEST_RUN
    return lengths, np.repeat(run_values, pieces)


def _pack_fields(values: np.ndarray, widths: np.ndarray) -> np.ndarray:
    """The bits (uint8 0/1) of each value in its own width, most significant first, one
    field after another."""
    if values.size == 0:
        return np.zeros(0, np.uint8)
    widest = int(widths.max())
    bits = np.empty((values.size, widest), dtype=np.uint8)
    for column in range(widest):
        bits[:, column] = (values >> (widest - 1 - column)) & 1
    # Right-aligned in `widest` columns: a field's bits are its last `width` columns.
    keep = np.arange(widest)[None, :] >= (widest - widths)[:, None]
    return bits[keep]


__all__ = ["CHANNELS", "FOREGROUND", "RUN_LENGTH_BITS", "mask_to_brush_rle"]
