"""POST /v1/videos/{session_id}/concepts: SAM 3's instances on one frame become objects.

SAM 3's detector runs on the session's frame; each instance above ``score_thresh``
(duplicates across phrases dropped, highest score first, at most ``max_instances``:
:mod:`sam2serve.concepts.video_seed`) is added as a new object of the session through
the same mask-prompt path as ``POST /v1/videos/{session_id}/prompts`` with a mask, named by
its phrase; ``POST .../propagate`` then tracks them with every other object. This is not
Meta's SAM 3 video model: nothing is detected on later frames.

Needs a server with video (``--video``) and concepts (``--concepts``). Every bound is
checked before model work: the phrase and box counts (max_concept_phrases,
max_concept_boxes), the frame index, the boxes inside the frame, ``max_instances``
against max_concept_instances and against the room the session has (max_video_objects
minus its objects, and its bytes), and the masks SAM 3 may hold against the decode budget.
New objects get the smallest free ids from 1, and their phrase as their name (the
session keeps it: every later answer and GET carry it; PATCH .../objects/{obj_id} renames).
If adding them fails half way, the ones added are removed again: a request adds every seed
or none. The seeding is one long job on the model worker: clicks of other clients run
between its torch operations while SAM 3 encodes and detects, and before each object it
adds (:mod:`sam2serve.server.batching`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import Request
from fastapi.responses import Response

from sam2serve.concepts.video_seed import Seed, concept_seeds
from sam2serve.engine.video.outputs import ObjectMask, object_masks
from sam2serve.engine.video.predictor import VideoPromptError
from sam2serve.engine.video.sources import FrameGone
from sam2serve.server import schemas
from sam2serve.server import video_schemas as vs
from sam2serve.server.answers import json_answer
from sam2serve.server.batching import JobContext
from sam2serve.server.dependencies import ServiceDep
from sam2serve.server.errors import ApiError
from sam2serve.server.routes.common import (
    format_segmentations,
    guarded,
    json_body_doc,
    read_body,
    v1_router,
)
from sam2serve.server.routes.concepts import check_boxes_inside, concepts_of, exemplar_boxes
from sam2serve.server.routes.videos import VideosDep
from sam2serve.server.service import RequestClock
from sam2serve.server.settings import ConceptSettings
from sam2serve.server.video_answers import frame_gone
from sam2serve.server.video_prompt_checks import check_frame
from sam2serve.server.video_sessions import VideoSession, VideoSessions

JOB = "video_concepts"

router = v1_router()


@router.post(
    "/videos/{session_id}/concepts",
    response_model=vs.VideoConceptsResponse,
    summary="Every instance of noun phrases on one frame as new tracked objects (SAM 3 seeds "
    "SAM 2.1; serve --video --concepts)",
    openapi_extra=json_body_doc(vs.VideoConceptsRequest),
    responses={
        404: {
            "model": schemas.ErrorResponse,
            "description": "Unknown session ('session_not_found'), or the server runs without "
            "video ('video_disabled': --video) or the concept model ('concepts_disabled': "
            "--concepts)",
        },
        413: {
            "model": schemas.ErrorResponse,
            "description": "max_instances more objects than the session has room for "
            "('too_many_objects', 'session_too_large'), or SAM 3's masks would not fit in "
            "max_decoded_bytes_in_flight ('over_decode_budget')",
        },
    },
)
async def add_concepts(
    request: Request, session_id: str, service: ServiceDep, videos: VideosDep
) -> Response:
    clock = RequestClock()
    model = concepts_of(service)
    body, _ = await read_body(request, vs.VideoConceptsRequest, service)
    body = body.with_server_default(model.concepts.spec.random_weights)
    limits = model.limits
    session = videos.get(session_id)
    state = session.state
    room = videos.limits.max_objects - session.object_count
    count = body.max_instances or max(1, min(room, limits.max_concept_instances))
    _check_counts(body, count, limits)
    check_frame(body.frame_idx, state.num_frames, "frame_idx")
    check_boxes_inside(body, (state.height, state.width))
    videos.check_new_objects(session, count, f"max_instances {count}")
    phrases = body.prompt_phrases()
    size = (state.height, state.width)
    model.check_mask_budget(len(phrases), count, size)
    boxes = exemplar_boxes(body)

    async def work() -> Response:
        reservation = await service.decoding.reserve(
            model.mask_bytes(len(phrases), count, size),
            f"SAM 3's masks of {len(phrases)} phrase(s) on a {size[1]}x{size[0]} frame",
        )
        with reservation, videos.using(session, "concepts"):
            videos.check_new_objects(session, count, "the objects asked for")
            ids = _free_ids(session, count)
            videos.check_live_prompt(session, ids[0], body.frame_idx)

            def run(context: JobContext) -> tuple[list[Seed], list[ObjectMask]]:
                frame = state.source.frame(body.frame_idx)
                with context.between_ops():  # SAM 3's seconds: clicks run in between
                    seeds = concept_seeds(
                        model.concepts,
                        frame,
                        phrases,
                        boxes,
                        body.score_thresh,
                        count,
                        body.dedupe_iou,
                    )
                    if seeds:  # SAM 2.1's features of the frame, which every seed's add
                        # reads (computed here, where clicks can run between operations)
                        videos.predictor.frame_features(state, body.frame_idx)
                del frame  # the job holds no frame of the session beyond this line
                added = _add_objects(videos, session, body.frame_idx, ids, seeds, context.check)
                return seeds, added

            try:
                seeds, records = await service.run_job(JOB, run, clock, long=True)
            except VideoPromptError as exc:
                raise ApiError(422, "invalid_request", str(exc)) from None
            except FrameGone as exc:  # a live frame dropped since the check above
                raise frame_gone(exc) from None
            for obj_id, seed in zip(ids, seeds, strict=False):  # the session keeps the phrases
                session.set_name(obj_id, seed.phrase)
        by_id = {record.obj_id: record for record in records}
        ordered = [by_id[obj_id] for obj_id in ids[: len(seeds)]]  # highest score first
        segmentations = await format_segmentations(
            [r.rle for r in ordered], body.mask_format, service
        )
        timed = clock.timed()
        return await json_answer(
            lambda: vs.VideoConceptsResponse(
                session_id=session.session_id,
                frame_idx=body.frame_idx,
                objects=_objects_out(ordered, seeds, segmentations),
                **timed,
            ),
            pieces=("objects",),
        )

    return await guarded(request, work, service)


def _check_counts(body: vs.VideoConceptsRequest, wanted: int, limits: ConceptSettings) -> None:
    """The server's concept limits (the schema's bounds are the API's; these may be lower)."""
    for field, count, limit, name in (
        ("phrases", len(body.phrases), limits.max_concept_phrases, "max_concept_phrases"),
        ("boxes", len(body.boxes), limits.max_concept_boxes, "max_concept_boxes"),
        ("max_instances", wanted, limits.max_concept_instances, "max_concept_instances"),
    ):
        if count > limit:
            raise ApiError(
                422,
                "too_many_prompts",
                f"{field}: {count}; at most {limit} per request on this server ({name})",
            )


def _free_ids(session: VideoSession, count: int) -> list[int]:
    """The ``count`` smallest object ids from 1 the session does not use (SAM 2.1's and
    those of objects SAM 3's video predictor reported)."""
    used = session.used_ids()
    ids: list[int] = []
    candidate = 1
    while len(ids) < count:
        if candidate not in used:
            ids.append(candidate)
        candidate += 1
    return ids


def _add_objects(
    videos: VideoSessions,
    session: VideoSession,
    frame_idx: int,
    ids: list[int],
    seeds: list[Seed],
    check: Callable[[], None],
) -> list[ObjectMask]:
    """(On the model worker.) Each seed's mask as a new object's prompt; the frame's masks
    of the new objects. Before each seed ``check()``: waiting clicks run there (each seed
    is a SAM 2 memory encoding), or the job stops when its client has gone. On any failure
    (that one included) the objects added are removed again."""
    added: list[int] = []
    frame = None
    try:
        for obj_id, seed in zip(ids, seeds, strict=False):
            check()
            added.append(obj_id)
            frame = videos.predictor.add_mask(session.state, frame_idx, obj_id, seed.mask)
    except BaseException:
        for obj_id in added:
            if obj_id in session.state.objects:
                videos.predictor.remove_object(session.state, obj_id)
        raise
    if frame is None:
        return []
    new = set(added)
    return [record for record in object_masks(frame) if record.obj_id in new]


def _objects_out(
    ordered: list[ObjectMask], seeds: list[Seed], formatted: list[Any]
) -> list[vs.VideoConceptObjectOut]:
    """(In a worker thread.) The new objects, highest score first, ``formatted`` their
    segmentations in order."""
    return [
        vs.VideoConceptObjectOut(
            obj_id=r.obj_id,
            name=seed.phrase,
            score=seed.score,
            area=r.area,
            bbox=r.bbox,
            segmentation=seg,
        )
        for r, seed, seg in zip(ordered, seeds, formatted, strict=True)
    ]
