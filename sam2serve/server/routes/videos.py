"""/v1/videos: tracking sessions held by this server, created, read, edited and closed.

- POST /v1/videos: upload a video (multipart file part ``video``: MP4, WebM, MOV, GIF,
  anything FFmpeg decodes) or its frames (one file part ``frame`` per frame, in order);
  201 with the session (its ``session_id``). The upload is read by
  :mod:`sam2serve.server.video_uploads`.
- GET /v1/videos/{session_id}: the session; DELETE: close it (its memory is freed).
- DELETE /v1/videos/{session_id}/objects/{obj_id}: stop tracking an object (one SAM 3's
  video predictor reported: forget it and its name);
  PATCH /v1/videos/{session_id}/objects/{obj_id} ``{"name": ...}``: name or rename it
  (its class or label; a prompt's optional ``name`` does the same); every answer carries
  each object's ``name`` (null when unnamed);
  POST /v1/videos/{session_id}/reset: forget every object and prompt (frames stay).

Prompts and propagation are :mod:`sam2serve.server.routes.video_prompts`'. All model work
runs on the app's model worker, as the image endpoints' does. One request at a time per
session (409 ``session_busy``); the limits are :mod:`sam2serve.server.video_sessions`'.
"""

from __future__ import annotations

import asyncio
from typing import Annotated

from fastapi import Depends, Request
from fastapi.responses import Response

from sam2serve.server import video_schemas as vs
from sam2serve.server.dependencies import ServiceDep
from sam2serve.server.errors import ApiError
from sam2serve.server.memory import release_free_memory
from sam2serve.server.request_body import JSON_MEDIA
from sam2serve.server.routes.common import (
    client_address,
    inline_schema,
    json_response,
    read_body,
    v1_router,
)
from sam2serve.server.service import RequestClock, Service
from sam2serve.server.session_ids import SESSION_HEADER
from sam2serve.server.video_answers import session_out
from sam2serve.server.video_sessions import VideoSession, VideoSessions
from sam2serve.server.video_uploads import FRAME_PART, VIDEO_PART, VideoUpload

VIDEOS_PATH = "/v1/videos"

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
    upload = VideoUpload(videos, service.limits.max_pixels, service.decoding)
    frames, reservation = await upload.read(request)
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
        session.forget_concept_tracks()  # and every name
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
        if obj_id in session.concept_tracks:  # SAM 3 reported it: nothing tracks it now
            del session.concept_tracks[obj_id]
            session.forget_names()
            return json_response(_session_out(session, videos, service))
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
    if not session.has_object(obj_id):
        raise ApiError(
            404,
            "object_not_found",
            f"obj_id {obj_id} is not an object of this session (its objects: "
            f"{sorted(session.used_ids())})",
        )


def _session_out(
    session: VideoSession, videos: VideoSessions, service: Service
) -> vs.VideoSessionOut:
    return session_out(session, videos, service.model_name)


__all__ = ["VIDEOS_PATH", "VideosDep", "get_videos", "router"]
