"""A video prompt's checks, and its mask read within the decode budget.

Shared by POST /v1/videos/{id}/prompts, a live connection's prompts and SAM 3's seeding of
a session (POST .../concepts): the frame index is one the session has, an object's clicks
on a frame stay within ``max_points_per_object`` (Meta's predictor would add them up
without bound), and a mask prompt's runs are checked against the frame before a byte of
it is drawn.
"""

from __future__ import annotations

import asyncio

import numpy as np

from sam2serve.engine.rle import checked_counts
from sam2serve.server import video_schemas as vs
from sam2serve.server.decode_budget import DecodeBudget, Reservation
from sam2serve.server.errors import ApiError

# A run takes one char at least and 7 at most in a compressed counts string.
_MAX_CHARS_PER_RUN = 7
_MASK_BYTES_PER_RUN = 16  # the runs as int64 while the mask is drawn from them


def check_frame(frame_idx: int, num_frames: int, field: str) -> None:
    """422 unless ``frame_idx`` is one of the video's ``num_frames`` frames."""
    if frame_idx >= num_frames:
        raise ApiError(
            422,
            "invalid_request",
            f"{field}: {frame_idx} is past the video's last frame (it has {num_frames} "
            f"frames: 0 to {num_frames - 1})",
        )


def check_clicks(body: vs.VideoPromptRequest, earlier: int, limit: int) -> None:
    """The object's clicks on the frame, the ``earlier`` ones it keeps included, within
    max_points_per_object (``limit``)."""
    total = earlier + len(body.points)
    if total > limit:
        kept = f" added to the {earlier} it already has there" if earlier else ""
        raise ApiError(
            422,
            "too_many_prompts",
            f"points: {len(body.points)} clicks{kept} for obj_id {body.obj_id} on frame "
            f"{body.frame_idx} make {total}; at most {limit} per object and frame "
            "(max_points_per_object): send clear_old_points true to start again",
        )


async def read_mask_prompt(
    mask: vs.MaskPrompt, height: int, width: int, decoding: DecodeBudget
) -> tuple[np.ndarray, Reservation]:
    """The prompt's binary mask, which must have the frame's size, read off the event loop
    within the decode budget (its bytes reserved until the prompt is done: release it)."""
    if list(mask.size) != [height, width]:
        raise ApiError(
            422,
            "invalid_request",
            f"mask.size: {mask.size} is not the frame's [height, width] = [{height}, {width}]",
        )
    # A longer string than 7 chars a run cannot cover the frame (zero-length runs only
    # first and last), so it is refused before it is read.
    longest = _MAX_CHARS_PER_RUN * (height * width + 2)
    if len(mask.counts) > longest:
        raise ApiError(
            422,
            "invalid_request",
            f"mask.counts: {len(mask.counts):,} runs or characters; a mask of the "
            f"{width}x{height} frame has at most {height * width + 2:,} runs",
        )
    need = height * width + _MASK_BYTES_PER_RUN * len(mask.counts)
    reservation = await decoding.reserve(need, "mask")
    try:
        return await asyncio.to_thread(_decode_mask, mask, height, width), reservation
    except BaseException:
        reservation.release()
        raise


def _decode_mask(mask: vs.MaskPrompt, height: int, width: int) -> np.ndarray:
    """(In a worker thread.) The (height, width) bool mask of checked runs."""
    try:
        counts = checked_counts(mask.counts, height, width)
    except ValueError as exc:
        raise ApiError(422, "invalid_request", f"mask.counts: not a valid RLE ({exc})") from None
    values = (np.arange(counts.size) % 2).astype(bool)
    return np.ascontiguousarray(np.repeat(values, counts).reshape(width, height).T)


__all__ = ["check_clicks", "check_frame", "read_mask_prompt"]
