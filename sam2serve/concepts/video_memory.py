"""What SAM 3's bounded video predictor may hold per tracked object: the one estimate the
surfaces that run it (the service's video sessions, Label Studio) check their byte limits
against before any model work.

With ``bounded=True`` (:meth:`~sam2serve.concepts.video_predictor.Sam3VideoPredictor.trim`)
an object's tracker group keeps at most the :data:`MAX_COND_FRAMES` latest conditioning
records and the :data:`MAX_OBJ_PTRS` nearest tracked ones (twice that when a forward pass
keeps what a backward pass after it reads); each record is a memory (64 x G x G bfloat16),
the low-resolution mask logits (4G x 4G float32), an object pointer and two scores, G the
tracker's grid (72 at SAM 3's 1008 px: 0.95 MiB a record). Hot start holds back
``hotstart_delay + 1`` frames of one byte per video pixel per object, and the state keeps its
scores (:data:`SCORE_BYTES`: the clip's and the frame's being processed; earlier frames'
scores are trimmed with the records).

A state started with ``interactive=True`` (clicks after the pass, :mod:`video_clicks`) keeps
every record instead, as Meta does: :func:`interactive_object_bytes` counts one record, the
frame's packed answer (one bit per video pixel) and its scores per object per frame
processed, plus the hot start's held-back masks and the clicks' conditioning records.
"""

from __future__ import annotations

from sam2serve.concepts.video_association import VideoThresholds
from sam2serve.concepts.video_tracker import HIDDEN, MAX_COND_FRAMES, MAX_OBJ_PTRS, MEM_DIM, STRIDE

# One object's scores in the state (floats in dicts: the clip's and the current frame's).
SCORE_BYTES = 128
_MEMORY_ITEM_BYTES = 2  # the tracker's memories are kept in bfloat16
_FLOAT_BYTES = 4


def record_bytes(image_size: int) -> int:
    """One object's tracker record of one frame: memory, mask logits, pointer, scores."""
    grid = image_size // STRIDE
    low_res = 4 * grid
    memory = MEM_DIM * grid * grid * _MEMORY_ITEM_BYTES
    return memory + low_res * low_res * _FLOAT_BYTES + HIDDEN * _FLOAT_BYTES + 2 * _FLOAT_BYTES


def object_bytes(
    image_size: int,
    height: int,
    width: int,
    frames: int,
    hotstart_delay: int = VideoThresholds().hotstart_delay,
    both_directions: bool = False,
) -> int:
    """What one tracked object may hold at most through ``frames`` frames of a ``height``
    x ``width`` video (bounded state), for SAM 3's input side ``image_size``."""
    kept = MAX_COND_FRAMES + min(frames, MAX_OBJ_PTRS)
    if both_directions:
        kept *= 2
    held_back = (hotstart_delay + 1) * height * width
    return kept * record_bytes(image_size) + held_back + SCORE_BYTES


def interactive_object_bytes(
    image_size: int,
    height: int,
    width: int,
    frames: int,
    clicks: int = 0,
    hotstart_delay: int = VideoThresholds().hotstart_delay,
) -> int:
    """What one tracked object may hold at most through ``frames`` frames of a ``height``
    x ``width`` video in an interactive state (every record and every frame's packed
    answer kept), ``clicks`` conditioning records besides."""
    packed = -(-height * width // 8)
    per_frame = record_bytes(image_size) + packed + SCORE_BYTES
    held_back = (hotstart_delay + 1) * height * width
    return (frames + clicks) * per_frame + held_back + SCORE_BYTES


__all__ = ["SCORE_BYTES", "interactive_object_bytes", "object_bytes", "record_bytes"]
