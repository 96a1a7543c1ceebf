"""GET /v1/videos/{session_id}/frames/{frame_idx}: one frame of a session, as a JPEG.

What the annotation page shows while a person scrubs a video: the very frames the session
tracks (decoded once by the server, by FFmpeg for a video file), so the masks of frame
``i`` are drawn over frame ``i`` whatever codecs the browser has and however its own
decoder would seek. JPEG (quality 90) because it is for the eye: the masks are drawn on a
canvas of their own, at the frame's size, never from these pixels.

Reading a frame is allowed while the session is busy (a propagation only reads the
frames too) and keeps the session from expiring. What one request allocates is the
encoder's copy of one frame and its JPEG, reserved in the process's decode budget before
the encoding starts (the frame's pixels are already in memory, within the session limits).
A live session holds only its newest frames: an older one is 410 ``frame_gone``.
"""

from __future__ import annotations

import asyncio
import io

import numpy as np
from fastapi import Path
from fastapi.responses import Response

from sam2serve.engine.video.sources import FrameGone
from sam2serve.server.dependencies import ServiceDep
from sam2serve.server.errors import ApiError
from sam2serve.server.routes.common import v1_router
from sam2serve.server.routes.videos import VideosDep
from sam2serve.server.video_answers import frame_gone

JPEG_QUALITY = 90
# The encoder's RGB copy of the frame and its output (never larger than the frame).
ENCODE_COPIES = 2

router = v1_router()


@router.get(
    "/videos/{session_id}/frames/{frame_idx}",
    summary="One frame of a tracking session, as a JPEG (what the page shows)",
    response_class=Response,
    responses={
        200: {
            "description": "The frame as the session decoded it, JPEG-encoded.",
            "content": {"image/jpeg": {"schema": {"type": "string", "format": "binary"}}},
        },
        410: {"description": "A live session's frame it no longer holds (frame_gone)."},
    },
)
async def read_frame(
    session_id: str,
    service: ServiceDep,
    videos: VideosDep,
    frame_idx: int = Path(ge=0, le=2**31 - 1, description="The frame (0-based)."),
) -> Response:
    session = videos.get(session_id)
    frames = session.state.frames
    if frame_idx >= len(frames):
        raise ApiError(
            422,
            "invalid_request",
            f"frame_idx {frame_idx}: the session has frames 0 to {len(frames) - 1}"
            if len(frames)
            else f"frame_idx {frame_idx}: the live session has no frames yet",
        )
    try:
        frame = frames[frame_idx]
    except FrameGone as exc:  # a live session holds its newest frames only
        raise frame_gone(exc) from None
    reservation = await service.decoding.reserve(ENCODE_COPIES * frame.nbytes, "the frame")
    with reservation:
        data = await asyncio.to_thread(jpeg_bytes, frame)
    return Response(
        data,
        media_type="image/jpeg",
        # A session's frames never change: the browser may keep them while it lives.
        headers={"Cache-Control": "private, max-age=3600", "X-Content-Type-Options": "nosniff"},
    )


def jpeg_bytes(frame: np.ndarray) -> bytes:
    """(In a worker thread.) The uint8 (H, W, 3) frame as a JPEG."""
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(frame).save(buffer, format="JPEG", quality=JPEG_QUALITY)
    return buffer.getvalue()


__all__ = ["router"]
