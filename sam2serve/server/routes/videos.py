"""/v1/videos: track objects through a video in a session held by this server.

- POST /v1/videos: upload a video (multipart file part ``video``: MP4, WebM, MOV, GIF,
  anything FFmpeg decodes) or its frames (one file part ``frame`` per frame, in order);
  201 with the session (its ``session_id``).
- POST /v1/videos/{session_id}/prompts: clicks, a box or a mask for one object on one
  frame; answered at once with that frame's masks of every object. Again after a
  propagation, it is a correction: the next propagation takes it into account.
- POST /v1/videos/{session_id}/propagate: track every object through the video; the
  masks of each frame are streamed as Server-Sent Events as soon as they are computed
  (``event: frame``), then ``event: done`` (or ``event: error``).
- GET /v1/videos/{session_id}: the session; DELETE: close it (its memory is freed).
- DELETE /v1/videos/{session_id}/objects/{obj_id}: stop tracking an object;
  PATCH /v1/videos/{session_id}/objects/{obj_id} ``{"name": ...}``: name or rename it
  (its class or label; a prompt's optional ``name`` does the same); every answer carries
  each object's ``name`` (null when unnamed);
  POST /v1/videos/{session_id}/reset: forget every object and prompt (frames stay).

All model work runs on the app's model worker, as the image endpoints' does: a prompt is
an interactive job, a propagation a bulk job that lets waiting clicks (of any image or
session) run between its frames and stops when its client disconnects. One request at a
time per session (409 ``session_busy``); the limits are :mod:`sam2serve.server.video_sessions`'.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncGenerator, Iterator, Mapping
from typing import Annotated, Any

import numpy as np
from fastapi import Depends, Request
from fastapi.responses import Response
from starlette.datastructures import UploadFile
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from sam2serve.engine.prompts import Prompt
from sam2serve.engine.rle import checked_counts
from sam2serve.engine.video.outputs import ObjectMask, object_masks
from sam2serve.engine.video.predictor import VideoPromptError
from sam2serve.engine.video.sources import FrameGone
from sam2serve.engine.video_io import (
    VideoError,
    VideoFormatError,
    VideoFrames,
    VideoLimitError,
    VideoProbe,
    check_frame_sizes,
    decode_video,
    probe_video,
)
from sam2serve.server import video_schemas as vs
from sam2serve.server.answers import dump_json, json_answer
from sam2serve.server.batching import JobCancelled, JobContext, WorkerStopped
from sam2serve.server.decode_budget import (
    RGB_BYTES_PER_PIXEL,
    Reservation,
    image_decode_bytes,
    video_decode_bytes,
)
from sam2serve.server.dependencies import ServiceDep
from sam2serve.server.errors import ApiError, ClientGone, error_body
from sam2serve.server.event_stream import EVENT_STREAM, EventStream
from sam2serve.server.memory import release_free_memory
from sam2serve.server.prompts import check_inside
from sam2serve.server.request_body import JSON_MEDIA
from sam2serve.server.routes.common import (
    client_address,
    format_segmentations,
    guarded,
    inline_schema,
    json_body_doc,
    json_response,
    read_body,
    v1_router,
)
from sam2serve.server.service import RequestClock, Service
from sam2serve.server.session_ids import SESSION_HEADER
from sam2serve.server.uploads import decode_image, probe_image
from sam2serve.server.video_sessions import VideoSession, VideoSessions

log = logging.getLogger("sam2serve.server")

VIDEOS_PATH = "/v1/videos"
VIDEO_PART = "video"
FRAME_PART = "frame"

router = v1_router()


async def get_videos(service: ServiceDep) -> VideoSessions:
    """The app's video sessions, or 404 when the server was started without --video."""
    if service.videos is None:
        raise ApiError(
            404,
            "video_disabled",
            "this server does not track video: start it with 'sam2serve serve --video' "
            "(settings.video.enabled) to create video sessions",
        )
    return service.videos


VideosDep = Annotated[VideoSessions, Depends(get_videos)]


# --------------------------------------------------------------------------- sessions


@router.post(
    "/videos",
    status_code=201,
    response_model=vs.VideoSessionOut,
    summary="Create a tracking session from a video file or its frames",
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {
                "multipart/form-data": {
                    "schema": {
                        "type": "object",
                        "properties": {
                            VIDEO_PART: {
                                "type": "string",
                                "format": "binary",
                                "description": "A video file (MP4, WebM, MOV, MKV, GIF, ...).",
                            },
                            FRAME_PART: {
                                "type": "array",
                                "items": {"type": "string", "format": "binary"},
                                "description": "Or: the frames as image files, in order.",
                            },
                        },
                    }
                }
            },
        }
    },
)
async def create_session(request: Request, service: ServiceDep, videos: VideosDep) -> Response:
    client = client_address(request)
    videos.check_room(client)  # before reading a large body that could not be kept
    frames, reservation = await _read_video_upload(request, service, videos)
    with reservation:  # from here the session holds the frames, and its limits count them
        session = videos.create(frames, client)
    answer = json_response(_session_out(session, videos, service), status=201)
    answer.headers[SESSION_HEADER] = session.session_id  # the cluster pins the session by it
    return answer


@router.get(
    "/videos/{session_id}",
    response_model=vs.VideoSessionOut,
    summary="Describe a tracking session",
)
async def get_session(session_id: str, service: ServiceDep, videos: VideosDep) -> Response:
    # Reading a session is not using it: it does not keep the session from expiring.
    return json_response(_session_out(videos.get(session_id, touch=False), videos, service))


@router.delete(
    "/videos/{session_id}",
    response_model=vs.VideoSessionOut,
    summary="Close a tracking session and free its memory",
)
async def close_session(session_id: str, service: ServiceDep, videos: VideosDep) -> Response:
    session = videos.close(session_id)
    answer = json_response(_session_out(session, videos, service))
    del session  # the last reference: its frames and tracking state are freed here
    # ... and their pages given back to the system before the answer says so (the
    # allocator would keep them until the model worker next falls idle).
    await asyncio.to_thread(release_free_memory)
    return answer


@router.post(
    "/videos/{session_id}/reset",
    response_model=vs.VideoSessionOut,
    summary="Forget every object, prompt and result of the session (the frames stay)",
)
async def reset_session(session_id: str, service: ServiceDep, videos: VideosDep) -> Response:
    session = videos.get(session_id)
    with videos.using(session, "reset"):
        await service.run_job(
            "video_edit", lambda _: videos.predictor.reset(session.state), RequestClock()
        )
        session.forget_names()
    return json_response(_session_out(session, videos, service))


@router.delete(
    "/videos/{session_id}/objects/{obj_id}",
    response_model=vs.VideoSessionOut,
    summary="Stop tracking one object (its prompts and masks are dropped)",
)
async def remove_object(
    session_id: str, obj_id: int, service: ServiceDep, videos: VideosDep
) -> Response:
    session = videos.get(session_id)
    _check_tracked(session, obj_id)
    with videos.using(session, "remove_object"):
        await service.run_job(
            "video_edit",
            lambda _: videos.predictor.remove_object(session.state, obj_id),
            RequestClock(),
        )
        session.forget_names()
    return json_response(_session_out(session, videos, service))


@router.patch(
    "/videos/{session_id}/objects/{obj_id}",
    response_model=vs.VideoSessionOut,
    summary="Name or rename one object (its class or label; null: unnamed)",
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {JSON_MEDIA: {"schema": inline_schema(vs.ObjectRenameRequest)}},
        }
    },
)
async def rename_object(
    request: Request, session_id: str, obj_id: int, service: ServiceDep, videos: VideosDep
) -> Response:
    body, _ = await read_body(request, vs.ObjectRenameRequest, service)
    session = videos.get(session_id)
    _check_tracked(session, obj_id)
    # A name is the session's metadata, not tracking state: no model work, so a rename is
    # taken while a propagation or a live connection holds the session (its next frames
    # carry the new name).
    session.set_name(obj_id, body.name)
    return json_response(_session_out(session, videos, service))


def _check_tracked(session: VideoSession, obj_id: int) -> None:
    if obj_id not in session.state.objects:
        raise ApiError(
            404,
            "object_not_found",
            f"obj_id {obj_id} is not tracked in this session (its objects: "
            f"{session.state.obj_ids})",
        )


def _session_out(session: VideoSession, videos: VideoSessions, service: Service) -> Any:
    return vs.session_out(session.describe(videos.limits, videos.clock()), service.model_name)


# --------------------------------------------------------------------------- prompts


@router.post(
    "/videos/{session_id}/prompts",
    response_model=vs.VideoPromptResponse,
    summary="Clicks, a box or a mask for one object on one frame: that frame's masks",
    openapi_extra=json_body_doc(vs.VideoPromptRequest),
)
async def add_prompt(
    request: Request, session_id: str, service: ServiceDep, videos: VideosDep
) -> Response:
    clock = RequestClock()
    body, _ = await read_body(request, vs.VideoPromptRequest, service)
    session = videos.get(session_id)
    state = session.state
    _check_frame(body.frame_idx, state.num_frames, "frame_idx")
    prompt = None if body.mask is not None else Prompt.from_api(body)
    if prompt is not None:
        check_inside(prompt, (state.height, state.width), what="frame")
    _check_clicks(body, 0, service.settings.limits.max_points_per_object)
    mask, reservation = None, Reservation(None, 0)
    if body.mask is not None:
        mask, reservation = await _mask_of(body.mask, state.height, state.width, service)

    async def work() -> Response:
        with videos.using(session, "prompt"):
            videos.check_new_object(session, body.obj_id)
            videos.check_live_prompt(
                session, body.obj_id, body.frame_idx, service.settings.live.max_live_prompted_frames
            )
            if not body.clear_old_points:
                earlier = videos.clicks_on(session, body.obj_id, body.frame_idx)
                _check_clicks(body, earlier, service.settings.limits.max_points_per_object)

            def run(context: JobContext) -> list[ObjectMask]:
                predictor = videos.predictor
                if prompt is None:
                    frame = predictor.add_mask(state, body.frame_idx, body.obj_id, mask)
                else:
                    frame = predictor.add_prompt(
                        state,
                        body.frame_idx,
                        body.obj_id,
                        prompt,
                        clear_old_points=body.clear_old_points,
                    )
                return object_masks(frame)

            try:
                records = await service.run_job("video_prompt", run, clock)
            except VideoPromptError as exc:
                raise ApiError(422, "invalid_request", str(exc)) from None
            except FrameGone as exc:  # a live frame dropped since the check above
                raise frame_gone(exc) from None
            if body.name is not None:  # the object exists now: its name is kept
                session.set_name(body.obj_id, body.name)
        objects = await _objects_out(records, body.mask_format, service, session.names)
        timed = clock.timed()
        return await json_answer(
            lambda: vs.VideoPromptResponse(
                session_id=session.session_id, frame_idx=body.frame_idx, objects=objects, **timed
            ),
            pieces=("objects",),
        )

    with reservation:  # the mask's bytes, until the prompt is done (or abandoned)
        return await guarded(request, work, service)


def frame_gone(exc: FrameGone) -> ApiError:
    """410 for a frame a live session no longer holds (its message says which it holds)."""
    return ApiError(410, "frame_gone", f"{exc} (live_frames_kept)")


def _check_frame(frame_idx: int, num_frames: int, field: str) -> None:
    if frame_idx >= num_frames:
        raise ApiError(
            422,
            "invalid_request",
            f"{field}: {frame_idx} is past the video's last frame (it has {num_frames} "
            f"frames: 0 to {num_frames - 1})",
        )


def _check_clicks(body: vs.VideoPromptRequest, earlier: int, limit: int) -> None:
    """The object's clicks on the frame, the ``earlier`` ones it keeps included, within
    max_points_per_object (Meta's predictor would add them up without bound)."""
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


async def _mask_of(
    mask: vs.MaskPrompt, height: int, width: int, service: Service
) -> tuple[np.ndarray, Reservation]:
    """The prompt's binary mask, which must have the frame's size, read off the event loop
    within the decode budget (its bytes reserved until the prompt is done)."""
    if list(mask.size) != [height, width]:
        raise ApiError(
            422,
            "invalid_request",
            f"mask.size: {mask.size} is not the frame's [height, width] = [{height}, {width}]",
        )
    # A run takes one char at least and 7 at most: a longer string cannot cover the frame
    # (zero-length runs only first and last), so it is refused before it is read.
    longest = _MAX_CHARS_PER_RUN * (height * width + 2)
    if len(mask.counts) > longest:
        raise ApiError(
            422,
            "invalid_request",
            f"mask.counts: {len(mask.counts):,} runs or characters; a mask of the "
            f"{width}x{height} frame has at most {height * width + 2:,} runs",
        )
    need = height * width + _MASK_BYTES_PER_RUN * len(mask.counts)
    reservation = await service.decoding.reserve(need, "mask")
    try:
        return await asyncio.to_thread(_decode_mask, mask, height, width), reservation
    except BaseException:
        reservation.release()
        raise


_MAX_CHARS_PER_RUN = 7
_MASK_BYTES_PER_RUN = 16  # the runs as int64 while the mask is drawn from them


def _decode_mask(mask: vs.MaskPrompt, height: int, width: int) -> np.ndarray:
    """(In a worker thread.) The (height, width) bool mask of checked runs."""
    try:
        counts = checked_counts(mask.counts, height, width)
    except ValueError as exc:
        raise ApiError(422, "invalid_request", f"mask.counts: not a valid RLE ({exc})") from None
    values = (np.arange(counts.size) % 2).astype(bool)
    return np.ascontiguousarray(np.repeat(values, counts).reshape(width, height).T)


async def _objects_out(
    records: list[ObjectMask],
    mask_format: str,
    service: Service,
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


# --------------------------------------------------------------------------- propagation


@router.post(
    "/videos/{session_id}/propagate",
    summary="Track every object through the video, streaming each frame (Server-Sent Events)",
    openapi_extra=json_body_doc(vs.PropagateRequest),
    responses={
        200: {
            "content": {
                EVENT_STREAM: {
                    "schema": {"type": "string"},
                    "example": 'event: frame\ndata: {"frame_idx": 0, "objects": [...]}\n\n'
                    'event: done\ndata: {"frames": 24, "elapsed_ms": 5120.0, '
                    '"frames_per_s": 4.69}\n\n',
                }
            },
            "description": "One 'frame' event per frame (data: VideoFrameOut as JSON), then "
            "'done' (data: PropagateDone) or 'error' (data: the error shape).",
        }
    },
)
async def propagate(
    request: Request, session_id: str, service: ServiceDep, videos: VideosDep
) -> Response:
    body, _ = await read_body(request, vs.PropagateRequest, service)
    session = videos.get(session_id)
    state = session.state
    if body.start_frame_idx is not None:
        _check_frame(body.start_frame_idx, state.num_frames, "start_frame_idx")
    if session.live:
        raise ApiError(
            409,
            "live_session",
            "a live session tracks each frame as it arrives over "
            f"/v1/videos/{session.session_id}/live; it has no stored video to propagate through",
        )
    if not state.objects:
        raise ApiError(
            422,
            "no_prompts",
            "the session has no objects to track: add prompts first "
            f"(POST /v1/videos/{session.session_id}/prompts)",
        )
    loop = asyncio.get_running_loop()
    frames: asyncio.Queue[tuple[int, list[ObjectMask]]] = asyncio.Queue()

    def run(context: JobContext) -> int:
        count = 0
        steps = videos.predictor.propagate(
            state,
            start_frame_idx=body.start_frame_idx,
            # Meta's count excludes the start frame; the API's counts every frame sent.
            max_frame_num_to_track=None if body.max_frames is None else body.max_frames - 1,
            reverse=body.reverse,
        )
        with contextlib.closing(steps):
            for frame in steps:
                loop.call_soon_threadsafe(frames.put_nowait, (frame.frame_idx, object_masks(frame)))
                count += 1
                context.check()  # stops if the client left; lets waiting clicks run
        return count

    # The session and the client's bulk slot are held until the job has really ended,
    # not just until the stream does.
    held = contextlib.ExitStack()
    with held:
        held.enter_context(videos.using(session, "propagate"))
        held.enter_context(service.bulk_slot(client_address(request)))
        handle = service.submit_job("video_propagate", run, bulk=True)
        held = held.pop_all()
    handle.future.add_done_callback(lambda _: loop.call_soon_threadsafe(held.close))
    # The stream ends the job when it ends: a client that leaves stops the propagation at
    # its next frame (a finished job is not affected).
    return EventStream(
        _frame_events(handle, frames, body.mask_format, service, session.names), handle.cancel
    )


async def _frame_events(
    handle: Any, frames: asyncio.Queue, mask_format: str, service: Service, names: Mapping[int, str]
) -> AsyncGenerator[bytes, None]:
    """The stream: each frame as it comes, then done (or error)."""
    started = time.perf_counter()
    finished = asyncio.wrap_future(handle.future)
    # The job's outcome is read below, unless the client leaves first: then it is nobody's.
    finished.add_done_callback(_outcome_seen)
    getter: asyncio.Future | None = None
    sent = 0
    try:
        while True:
            getter = asyncio.ensure_future(frames.get())
            await asyncio.wait({getter, finished}, return_when=asyncio.FIRST_COMPLETED)
            if not getter.done():
                break
            yield await _frame_event(getter.result(), mask_format, service, names)
            sent += 1
        while not frames.empty():  # frames queued before the job's end was seen
            yield await _frame_event(frames.get_nowait(), mask_format, service, names)
            sent += 1
        try:
            finished.result()
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
        elapsed = time.perf_counter() - started
        done = vs.PropagateDone(
            frames=sent,
            elapsed_ms=round(elapsed * 1000, 3),
            frames_per_s=round(sent / elapsed, 3) if elapsed > 0 else 0.0,
        )
        yield _event("done", done.model_dump())
    finally:
        if getter is not None:
            getter.cancel()  # no-op once it has a frame
        handle.cancel()  # no-op once it has ended


def _outcome_seen(future: asyncio.Future) -> None:
    if not future.cancelled():
        future.exception()


async def _frame_event(
    item: tuple[int, list[ObjectMask]], mask_format: str, service: Service, names: Mapping[int, str]
) -> bytes:
    frame_idx, records = item
    objects = await _objects_out(records, mask_format, service, names)
    # A frame of many objects' masks: serialised off the event loop, object by object.
    data = await asyncio.to_thread(
        lambda: dump_json(vs.VideoFrameOut(frame_idx=frame_idx, objects=objects), ("objects",))
    )
    return f"event: frame\ndata: {data}\n\n".encode()


def _event(name: str, data: dict[str, Any]) -> bytes:
    return f"event: {name}\ndata: {json.dumps(data)}\n\n".encode()


# --------------------------------------------------------------------------- uploads


async def _read_video_upload(
    request: Request, service: Service, sessions: VideoSessions
) -> tuple[VideoFrames, Reservation]:
    """The frames of the uploaded video file or frame files, within the limits, and their
    bytes reserved in the decode budget: every limit is checked from the file's header or
    the video's stream metadata before a frame is decoded."""
    settings = service.settings
    media = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if media != "multipart/form-data":
        raise ApiError(
            415,
            "unsupported_media_type",
            f"Content-Type {media or 'missing'!r} is not accepted here; send "
            f"multipart/form-data with a file part '{VIDEO_PART}' (a video file) or one "
            f"file part '{FRAME_PART}' per frame",
        )
    try:
        form = await request.form(
            max_files=settings.video.max_video_frames + 1, max_fields=0, max_part_size=1024 * 1024
        )
    except ClientDisconnect:
        raise ClientGone("upload") from None
    except StarletteHTTPException as exc:
        raise ApiError(
            400, "invalid_multipart", f"cannot parse the multipart body: {exc.detail}"
        ) from None
    try:
        unknown = sorted(set(form.keys()) - {VIDEO_PART, FRAME_PART})
        video_parts, frame_parts = form.getlist(VIDEO_PART), form.getlist(FRAME_PART)
        if unknown or bool(video_parts) == bool(frame_parts) or len(video_parts) > 1:
            raise ApiError(
                400,
                "invalid_multipart",
                f"send one file part '{VIDEO_PART}' (a video file) or file parts "
                f"'{FRAME_PART}' (the frames, in order) - not both, not neither"
                + (f"; unknown part(s) {', '.join(map(repr, unknown))}" if unknown else ""),
            )
        parts = video_parts or frame_parts
        if any(not isinstance(part, UploadFile) for part in parts):
            raise ApiError(400, "invalid_multipart", "the video and frames must be file parts")
        if frame_parts and len(frame_parts) > settings.video.max_video_frames:
            raise ApiError(
                413,
                "too_many_frames",
                f"more than {settings.video.max_video_frames} frame parts; a session takes at most "
                f"{settings.video.max_video_frames} frames (max_video_frames)",
            )
        uploaded = sum(part.size or 0 for part in parts)
        if uploaded > settings.video.max_video_upload_bytes:
            raise ApiError(
                413,
                "upload_too_large",
                f"the upload is {uploaded:,} bytes; the limit is "
                f"{settings.video.max_video_upload_bytes:,} (max_video_upload_bytes)",
            )
        if video_parts:
            return await _video_file_frames(video_parts[0], service, sessions)
        return await _frame_files_frames(frame_parts, service, sessions)
    finally:
        await form.close()


async def _video_file_frames(
    upload: UploadFile, service: Service, sessions: VideoSessions
) -> tuple[VideoFrames, Reservation]:
    probe = await asyncio.to_thread(_probe_video_part, upload, service)
    sessions.check_frames(probe.frames, probe.height, probe.width)
    reservation = await service.decoding.reserve(
        video_decode_bytes(probe.frames, probe.width, probe.height),
        f"the video ({probe.frames} frames of {probe.width}x{probe.height})",
    )
    try:
        frames = await asyncio.to_thread(_decode_video_part, upload, service, probe)
    except BaseException:
        reservation.release()
        raise
    reservation.shrink(sum(frame.nbytes for frame in frames.frames))
    return frames, reservation


async def _frame_files_frames(
    parts: list[UploadFile], service: Service, sessions: VideoSessions
) -> tuple[VideoFrames, Reservation]:
    sizes = await asyncio.to_thread(_probe_frame_parts, parts, service)
    frames_bytes = sum(width * height * RGB_BYTES_PER_PIXEL for width, height in sizes)
    sessions.check_frame_bytes(len(parts), frames_bytes)
    largest = max(image_decode_bytes(width, height) for width, height in sizes)
    reservation = await service.decoding.reserve(frames_bytes + largest, f"the {len(parts)} frames")
    try:
        frames = await asyncio.to_thread(_decode_frame_parts, parts, service)
    except BaseException:
        reservation.release()
        raise
    reservation.shrink(sum(frame.nbytes for frame in frames.frames))
    return frames, reservation


@contextlib.contextmanager
def _video_errors() -> Iterator[None]:
    """VideoLimitError as 413 ``video_too_large``, VideoFormatError (a container or codec
    not taken) as 415 ``unsupported_video``, any other VideoError as 400."""
    try:
        yield
    except VideoFormatError as exc:
        raise ApiError(415, "unsupported_video", str(exc)) from None
    except VideoLimitError as exc:
        raise ApiError(
            413, "video_too_large", f"{exc} (max_video_frames, max_pixels, max_video_session_bytes)"
        ) from None
    except VideoError as exc:
        raise ApiError(
            400, "invalid_video", f"{exc}; send a video FFmpeg can decode (MP4, WebM, MOV, ...)"
        ) from None


def _probe_video_part(upload: UploadFile, service: Service) -> VideoProbe:
    """(In a worker thread.) The uploaded video's size and frame count, nothing decoded."""
    settings = service.settings
    name = upload.filename or VIDEO_PART
    upload.file.seek(0)
    with _video_errors():
        return probe_video(
            upload.file,
            name,
            max_frames=settings.video.max_video_frames,
            max_pixels=settings.limits.max_pixels,
        )


def _decode_video_part(upload: UploadFile, service: Service, probe: VideoProbe) -> VideoFrames:
    settings = service.settings
    name = upload.filename or VIDEO_PART
    upload.file.seek(0)
    with _video_errors():
        return decode_video(
            upload.file,
            name,
            max_frames=settings.video.max_video_frames,
            max_pixels=settings.limits.max_pixels,
            max_bytes=settings.video.max_video_session_bytes,
            probe=probe,
        )


def _probe_frame_parts(parts: list[UploadFile], service: Service) -> list[tuple[int, int]]:
    """(In a worker thread.) Each frame file's (width, height) from its header: 413 past
    max_pixels; (0, 0) for a file that is no image (decoding it says why)."""
    sizes = []
    for i, part in enumerate(parts):
        part.file.seek(0)
        header = part.file.read(_HEADER_BYTES)
        name = part.filename or f"{FRAME_PART}[{i}]"
        size = probe_image(
            header, service.settings.limits.max_pixels, f"{FRAME_PART}[{i}] ({name})"
        )
        if size == (0, 0):  # a header Pillow needs more of: read the whole file
            part.file.seek(0)
            size = probe_image(
                part.file.read(), service.settings.limits.max_pixels, f"{FRAME_PART}[{i}] ({name})"
            )
        sizes.append(size)
    return sizes


# Enough of an image file for Pillow to read its size (PNG, JPEG, WebP, BMP, TIFF headers).
_HEADER_BYTES = 64 * 1024


def _decode_frame_parts(parts: list[UploadFile], service: Service) -> VideoFrames:
    settings = service.settings
    frames, names, held = [], [], 0
    for i, part in enumerate(parts):
        part.file.seek(0)
        data = part.file.read()
        name = part.filename or f"{FRAME_PART}[{i}]"
        try:
            frames.append(decode_image(data, settings.limits.max_pixels))
        except ApiError as exc:
            raise ApiError(
                exc.status, exc.code, f"{FRAME_PART}[{i}] ({name}): {exc.message}"
            ) from None
        names.append(name)
        held += frames[-1].nbytes
        if held > settings.video.max_video_session_bytes:
            raise ApiError(
                413,
                "video_too_large",
                f"the first {i + 1} frames already hold {held:,} bytes decoded, over the "
                f"session limit of {settings.video.max_video_session_bytes:,} "
                "(max_video_session_bytes)",
            )
    try:
        check_frame_sizes(frames, names, "the uploaded frames")
    except VideoError as exc:
        raise ApiError(422, "invalid_video", str(exc)) from None
    return VideoFrames(frames=frames, fps=None, names=names, source=f"{len(frames)} frames")
