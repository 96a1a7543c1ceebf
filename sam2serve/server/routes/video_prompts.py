"""/v1/videos/{session_id}: prompts on a session's frames, and its propagation.

- POST /v1/videos/{session_id}/prompts: clicks, a box or a mask for one object on one
  frame; answered at once with that frame's masks of every object. Again after a
  propagation, it is a correction: the next propagation takes it into account.
- POST /v1/videos/{session_id}/propagate: track every object through the video; the
  masks of each frame are streamed as Server-Sent Events as soon as they are computed
  (``event: frame``), then ``event: done`` (or ``event: error``).

A prompt is an interactive job on the app's model worker, a propagation a bulk job that
lets waiting clicks (of any image or session) run between its frames and stops when its
client disconnects. The checks and the mask prompt's decoding are
:mod:`sam2serve.server.video_prompt_checks`', the answers :mod:`sam2serve.server.video_answers`'.
"""

from __future__ import annotations

import asyncio
import contextlib

from fastapi import Request
from fastapi.responses import Response

from sam2serve.engine.prompts import Prompt
from sam2serve.engine.video.outputs import ObjectMask, object_masks
from sam2serve.engine.video.predictor import VideoPromptError
from sam2serve.engine.video.sources import FrameGone
from sam2serve.server import video_schemas as vs
from sam2serve.server.answers import json_answer
from sam2serve.server.batching import JobContext
from sam2serve.server.decode_budget import Reservation
from sam2serve.server.dependencies import ServiceDep
from sam2serve.server.errors import ApiError
from sam2serve.server.event_stream import EVENT_STREAM, EventStream
from sam2serve.server.prompts import check_inside
from sam2serve.server.routes.common import (
    client_address,
    guarded,
    json_body_doc,
    read_body,
    v1_router,
)
from sam2serve.server.routes.videos import VideosDep
from sam2serve.server.service import RequestClock
from sam2serve.server.video_answers import FrameObjects, frame_events, frame_gone, objects_out
from sam2serve.server.video_prompt_checks import check_clicks, check_frame, read_mask_prompt

router = v1_router()


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
    check_frame(body.frame_idx, state.num_frames, "frame_idx")
    prompt = None if body.mask is not None else Prompt.from_api(body)
    if prompt is not None:
        check_inside(prompt, (state.height, state.width), what="frame")
    check_clicks(body, 0, service.limits.max_points_per_object)
    mask, reservation = None, Reservation(None, 0)
    if body.mask is not None:
        mask, reservation = await read_mask_prompt(
            body.mask, state.height, state.width, service.decoding
        )

    async def work() -> Response:
        with videos.using(session, "prompt"):
            videos.check_new_object(session, body.obj_id)
            videos.check_live_prompt(session, body.obj_id, body.frame_idx)
            if not body.clear_old_points:
                earlier = videos.clicks_on(session, body.obj_id, body.frame_idx)
                check_clicks(body, earlier, service.limits.max_points_per_object)

            def run(context: JobContext) -> list[ObjectMask]:
                predictor = videos.predictor
                if prompt is None:
                    assert mask is not None  # a mask prompt: read above
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
        objects = await objects_out(records, body.mask_format, service, session.names)
        timed = clock.timed()
        return await json_answer(
            lambda: vs.VideoPromptResponse(
                session_id=session.session_id, frame_idx=body.frame_idx, objects=objects, **timed
            ),
            pieces=("objects",),
        )

    with reservation:  # the mask's bytes, until the prompt is done (or abandoned)
        return await guarded(request, work, service)


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
        check_frame(body.start_frame_idx, state.num_frames, "start_frame_idx")
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
    frames: asyncio.Queue[FrameObjects] = asyncio.Queue()

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
        frame_events(handle, frames, body.mask_format, service, session.names), handle.cancel
    )


__all__ = ["router"]
