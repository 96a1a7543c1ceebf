"""Live video: a session that starts empty and tracks each frame as it arrives.

- POST /v1/videos/live ``{"width": W, "height": H, "fps": optional, "mode": optional}``:
  201 with the session (no frames yet; ``live`` true). ``mode`` "every" (the default)
  tracks every frame; "latest" skips frames that come faster than they are tracked
  (server/live_modes.py; a connection may choose with ``?mode=``). Its tracking keeps
  only what SAM 2's memory reads next (retention "bounded"), and the newest
  ``live_frames_kept`` frames.
- WebSocket /v1/videos/{session_id}/live: frames as binary messages and prompts as text
  messages, each answered in order; the protocol is :mod:`sam2serve.server.live_protocol`'.

One connection per session at a time (the session is busy while it is open; a second is
closed with 1013 after an error message). docs/video.md has a client.
"""

from __future__ import annotations

import json

from fastapi import APIRouter, Request, WebSocket
from fastapi.responses import Response

from sam2serve.server import video_schemas as vs
from sam2serve.server.auth import websocket_allowed
from sam2serve.server.dependencies import ServiceDep
from sam2serve.server.errors import ApiError
from sam2serve.server.live_modes import LIVE_MODES
from sam2serve.server.live_protocol import (
    CLOSE_POLICY,
    CLOSE_TRY_LATER,
    LiveConnection,
    error_message,
)
from sam2serve.server.routes.common import client_address, json_response, read_body, v1_router
from sam2serve.server.routes.videos import VideosDep
from sam2serve.server.service import Service
from sam2serve.server.session_ids import SESSION_HEADER
from sam2serve.server.settings_groups import AccessSettings
from sam2serve.server.video_answers import session_out

router = v1_router()
# The WebSocket route checks the API key itself (the HTTP security dependencies read a
# Request); it is a route of the same /v1 prefix.
ws_router = APIRouter(prefix="/v1")


@router.post(
    "/videos/live",
    status_code=201,
    response_model=vs.VideoSessionOut,
    summary="Create an empty live session: frames come over its WebSocket",
)
async def create_live_session(request: Request, service: ServiceDep, videos: VideosDep) -> Response:
    body, _ = await read_body(request, vs.LiveVideoRequest, service)
    max_pixels = service.limits.max_pixels
    if body.width * body.height > max_pixels:
        raise ApiError(
            413,
            "image_too_large",
            f"frames of {body.width}x{body.height} exceed the {max_pixels:,}-pixel "
            "limit (max_pixels)",
        )
    client = client_address(request)
    session = videos.create_live(body.height, body.width, body.fps, client, body.mode)
    answer = json_response(session_out(session, videos, service.model_name), status=201)
    answer.headers[SESSION_HEADER] = session.session_id
    return answer


@ws_router.websocket("/videos/{session_id}/live")
async def live_connection(websocket: WebSocket, session_id: str) -> None:
    service: Service = websocket.app.state.service
    access: AccessSettings = websocket.app.state.access
    if not websocket_allowed(websocket, access):
        await websocket.close(code=CLOSE_POLICY)  # before accepting: an HTTP 403
        return
    await websocket.accept()
    refusal = _refusal(service, session_id)
    if refusal is not None:
        code, message, close_code = refusal
        await websocket.send_text(json.dumps(error_message(code, message)))
        await websocket.close(code=close_code)
        return
    videos = service.videos
    assert videos is not None
    session = videos.get(session_id)
    mode = websocket.query_params.get("mode", session.live_mode)
    if mode not in LIVE_MODES:
        message = f"mode {mode[:80]!r}: one of {', '.join(LIVE_MODES)}"
        await websocket.send_text(json.dumps(error_message("invalid_mode", message)))
        await websocket.close(code=CLOSE_POLICY)
        return
    try:
        holding = videos.using(session, "live")
        holding.__enter__()
    except ApiError as exc:
        await websocket.send_text(json.dumps(error_message(exc.code, exc.message)))
        await websocket.close(code=CLOSE_TRY_LATER)
        return
    connection = LiveConnection(
        websocket,
        service,
        videos,
        session,
        mode,
        limits=service.limits,
    )
    try:
        reason, close_code = await connection.run()
    finally:
        holding.__exit__(None, None, None)  # the session is free again
    await connection.close(reason, close_code)


def _refusal(service: Service, session_id: str) -> tuple[str, str, int] | None:
    if service.videos is None:
        return "video_disabled", "start the server with --video for live sessions", CLOSE_POLICY
    try:
        session = service.videos.get(session_id, touch=False)
    except ApiError as exc:
        return exc.code, exc.message, CLOSE_POLICY
    if not session.live:
        return (
            "not_live",
            (
                "this session was created from a video; live frames go to a session made "
                "by POST /v1/videos/live"
            ),
            CLOSE_POLICY,
        )
    return None


__all__ = ["router", "ws_router"]
