"""What the video routes and the live protocol answer: a session, a frame's objects, and a
propagation's stream of frames (Server-Sent Events).

Every answer of masks goes through :func:`objects_out` (the masks in the wire format, each
with its object's name as the session holds it now), so POST .../prompts, a propagation's
frames and a live connection's frames carry the same objects.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping
from typing import Any, TypeVar

from sam2serve.engine.video.outputs import ObjectMask
from sam2serve.engine.video.predictor import VideoPromptError
from sam2serve.engine.video.sources import FrameGone
from sam2serve.server import video_schemas as vs
from sam2serve.server.answers import dump_json
from sam2serve.server.batching import JobCancelled, JobHandle, WorkerStopped
from sam2serve.server.errors import ApiError, error_body
from sam2serve.server.segmentations import Measured, format_segmentations
from sam2serve.server.video_sessions import VideoSession, VideoSessions

log = logging.getLogger("sam2serve.server")

# One frame's objects, as a propagation's job hands them to its stream.
FrameObjects = tuple[int, list[ObjectMask]]
Item = TypeVar("Item")


def session_out(
    session: VideoSession, videos: VideoSessions, model_name: str
) -> vs.VideoSessionOut:
    """The session as every session route answers it."""
    return vs.session_out(session.describe(videos.limits, videos.clock()), model_name)


def frame_gone(exc: FrameGone) -> ApiError:
    """410 for a frame a live session no longer holds (its message says which it holds)."""
    return ApiError(410, "frame_gone", f"{exc} (live_frames_kept)")


async def objects_out(
    records: list[ObjectMask],
    mask_format: str,
    service: Measured,
    names: Mapping[int, str] | None = None,
) -> list[vs.VideoObjectOut]:
    """The masks in the wire format, each with its object's name (``names``: the
    session's, read now: a rename during a propagation shows in its next frames)."""
    segmentations = await format_segmentations([r.rle for r in records], mask_format, service)
    named = dict(names or {})  # read now, on the event loop

    def build() -> list[vs.VideoObjectOut]:  # each a validation of a whole mask's runs
        return [
            vs.VideoObjectOut(
                obj_id=r.obj_id,
                name=named.get(r.obj_id),
                area=r.area,
                bbox=r.bbox,
                segmentation=seg,
            )
            for r, seg in zip(records, segmentations, strict=True)
        ]

    return await asyncio.to_thread(build)


def frame_events(
    job: JobHandle,
    frames: asyncio.Queue[FrameObjects],
    mask_format: str,
    service: Measured,
    names: Mapping[int, str],
) -> AsyncGenerator[bytes, None]:
    """A propagation's stream: each frame as its job hands it over, then ``done`` (or
    ``error``). ``job``: the propagation's model job (its result, or why it ended); ended
    when the stream ends (a finished job is not affected)."""

    async def render(item: FrameObjects) -> bytes:
        return await _frame_event(item, mask_format, service, names)

    def done(result: object, sent: int, elapsed: float) -> dict[str, Any]:
        return vs.PropagateDone(**done_counts(sent, elapsed)).model_dump()

    return job_events(job, frames, render, done)


def done_counts(sent: int, elapsed: float) -> dict[str, float]:
    """A stream's ``done`` counts: frames sent, milliseconds, frames per second."""
    return {
        "frames": sent,
        "elapsed_ms": round(elapsed * 1000, 3),
        "frames_per_s": round(sent / elapsed, 3) if elapsed > 0 else 0.0,
    }


async def job_events(
    job: JobHandle,
    items: asyncio.Queue[Item],
    render: Callable[[Item], Awaitable[bytes]],
    done: Callable[[Any, int, float], dict[str, Any]],
) -> AsyncGenerator[bytes, None]:
    """A model job's stream of frames: each item its job hands over, as ``render`` makes
    its event, then ``done`` (its data: ``done(the job's result, frames sent, seconds)``)
    or ``error``. The job is ended when the stream ends (a finished job is not
    affected)."""
    started = time.perf_counter()
    finished = asyncio.wrap_future(job.future)
    # The job's outcome is read below, unless the client leaves first: then it is nobody's.
    finished.add_done_callback(_outcome_seen)
    getter: asyncio.Future[Item] | None = None
    sent = 0
    try:
        while True:
            getter = asyncio.ensure_future(items.get())
            either: set[asyncio.Future[Any]] = {getter, finished}
            await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
            if not getter.done():
                break
            yield await render(getter.result())
            sent += 1
        while not items.empty():  # items queued before the job's end was seen
            yield await render(items.get_nowait())
            sent += 1
        try:
            result, _ = finished.result()
        except (JobCancelled, WorkerStopped) as exc:
            yield _event("error", error_body("cancelled", str(exc)))
            return
        except VideoPromptError as exc:
            yield _event("error", error_body("invalid_request", str(exc)))
            return
        except Exception:
            log.exception("video propagation failed")
            yield _event("error", error_body("internal_error", "the propagation failed"))
            return
        yield _event("done", done(result, sent, time.perf_counter() - started))
    finally:
        if getter is not None:
            getter.cancel()  # no-op once it has a frame
        job.cancel()  # no-op once it has ended


def _outcome_seen(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()


async def _frame_event(
    item: FrameObjects, mask_format: str, service: Measured, names: Mapping[int, str]
) -> bytes:
    frame_idx, records = item
    objects = await objects_out(records, mask_format, service, names)
    # A frame of many objects' masks: serialised off the event loop, object by object.
    data = await asyncio.to_thread(
        lambda: dump_json(vs.VideoFrameOut(frame_idx=frame_idx, objects=objects), ("objects",))
    )
    return f"event: frame\ndata: {data}\n\n".encode()


def server_event(name: str, data: str) -> bytes:
    """One Server-Sent Event whose data is already JSON."""
    return f"event: {name}\ndata: {data}\n\n".encode()


def _event(name: str, data: dict[str, Any]) -> bytes:
    return f"event: {name}\ndata: {json.dumps(data)}\n\n".encode()


__all__ = [
    "FrameObjects",
    "done_counts",
    "frame_events",
    "frame_gone",
    "job_events",
    "objects_out",
    "server_event",
    "session_out",
]
