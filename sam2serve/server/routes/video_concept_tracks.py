"""POST /v1/videos/{session_id}/concepts/track: SAM 3's own video predictor on a session.

Every instance of one noun phrase (or of several: one run of SAM 3's video predictor per
phrase over one shared image encoding per frame, :mod:`sam2serve.concepts.video_phrases`),
found and tracked through the session's stored frames from ``frame_idx`` forward (at most
``max_frames``) by SAM 3's video predictor, Meta's ``Sam3VideoPredictor`` semantics
(docs/concepts-video.md): the detector on every frame, SAM 3's memory tracker, new
instances picked up, lost ones ended, outputs held back 15 frames for hot start. The
frames are streamed as Server-Sent Events as soon as SAM 3 lets them out (``event:
frame``, propagate's shape plus each object's ``score``), then ``event: done`` (counts,
SAM 3's seconds per stage, every object's first and last frame) or ``event: error``.
Unlike POST .../concepts (SAM 3 seeds SAM 2.1 on one frame) no SAM 2.1 object is made: SAM
3's objects are the session's (ids and names, :mod:`concept_tracks`) and their masks are
what the stream sent.

Needs ``serve --video --concepts``; a live session is refused (409, it has no stored
frames; its WebSocket runs SAM 3 on the frames it receives: ``{"type": "concepts_track"}``).
Every bound is checked before model work:
the phrases (the one rule of phrases and names; none twice; at most max_concept_phrases),
``frame_idx``, the objects SAM 3 may track at once over all phrases together (the
session's room: max_video_objects minus its objects, at most max_concept_instances, and
what its state may hold beside the session's bytes within max_video_session_bytes and
max_video_total_bytes: 413 / 429 when not one object fits; shared out evenly among the
phrases, 413 when not one each), and one frame's masks against the decode budget (held
while the run streams). The run is a bulk job on the model worker, as a propagation is: it
holds the session (409 ``session_busy`` to other requests) and one of the client's bulk
slots until it has really ended, lets waiting clicks run between SAM 3's torch operations,
and stops when the client leaves. Running a phrase again replaces the objects its earlier
run reported. Each object is named by its phrase; objects of different phrases may
overlap. ``clicks`` (one phrase): clicks on SAM 3's objects after the pass, stateless per
request (:mod:`sam2serve.server.concept_clicks`: the pass again, the clicks, Meta's partial
pass; a frame answered again is streamed again, its last event final).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Generator, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from fastapi import Request
from fastapi.responses import Response

from sam2serve.concepts.video_phrases import PhrasesFrame, run_phrases, start_phrases
from sam2serve.concepts.video_predictor import Sam3VideoPredictor
from sam2serve.engine.video.outputs import ObjectMask, masks_of
from sam2serve.server import schemas
from sam2serve.server import video_schemas as vs
from sam2serve.server.answers import dump_json
from sam2serve.server.batching import JobContext
from sam2serve.server.concept_clicks import PASS, REPASS, clicked_answers, plan_clicks
from sam2serve.server.concept_room import check_phrase_count, run_room
from sam2serve.server.concept_tracks import RunBytes, TrackIds, run_thresholds
from sam2serve.server.dependencies import ServiceDep
from sam2serve.server.errors import ApiError
from sam2serve.server.event_stream import EVENT_STREAM, EventStream
from sam2serve.server.routes.common import client_address, json_body_doc, read_body, v1_router
from sam2serve.server.routes.concepts import concepts_of
from sam2serve.server.routes.videos import VideosDep
from sam2serve.server.segmentations import Measured, format_segmentations
from sam2serve.server.video_answers import done_counts, job_events, server_event
from sam2serve.server.video_prompt_checks import check_frame
from sam2serve.server.video_sessions import ConceptTrack, VideoSession

JOB = "video_concept_track"

router = v1_router()

Answers = Iterator[tuple[int, PhrasesFrame]]  # a run's answers, each with its phase


@dataclass(frozen=True)
class TrackedFrame:
    """One frame of a run, as its job hands it to the stream: the objects (session ids,
    ascending), their scores and phrases."""

    frame_idx: int
    records: list[ObjectMask]
    scores: dict[int, float]
    phrases: dict[int, str]
    sam3_ids: dict[int, int]  # session id -> SAM 3's id in its phrase's own run
    phase: int = PASS  # clicks: the answers of the clicks, then of the pass after them


@dataclass(frozen=True)
class RunOutcome:
    """What a finished run tells its ``done`` event."""

    stage_seconds: dict[str, float]
    dropped: int
    clicks: int = 0


@router.post(
    "/videos/{session_id}/concepts/track",
    summary="Every instance of a noun phrase (or of several) found and tracked by SAM 3's "
    "own video predictor, streaming each frame (Server-Sent Events; serve --video --concepts)",
    openapi_extra=json_body_doc(vs.ConceptTrackRequest),
    responses={
        200: {
            "content": {
                EVENT_STREAM: {
                    "schema": {"type": "string"},
                    "example": 'event: frame\ndata: {"frame_idx": 0, "objects": [{"obj_id": 1, '
                    '"name": "person", "score": 0.91, ...}]}\n\n'
                    'event: done\ndata: {"frames": 24, "elapsed_ms": 5120.0, '
                    '"frames_per_s": 4.69, "stage_seconds": {...}, "objects": [...], ...}\n\n',
                }
            },
            "description": "One 'frame' event per frame (data: ConceptTrackFrameOut as JSON), "
            "then 'done' (data: ConceptTrackDone) or 'error' (data: the error shape).",
        },
        404: {
            "model": schemas.ErrorResponse,
            "description": "Unknown session ('session_not_found'), or the server runs without "
            "video ('video_disabled': --video) or the concept model ('concepts_disabled': "
            "--concepts)",
        },
        409: {
            "model": schemas.ErrorResponse,
            "description": "A live session ('live_session': no stored frames), the "
            "session is busy with another request ('session_busy'), or a click names "
            "another phrase's or a SAM 2.1 object ('click_object')",
        },
        413: {
            "model": schemas.ErrorResponse,
            "description": "No room for one more object, or for one per phrase "
            "('too_many_objects'), SAM 3's state "
            "for one object would pass max_video_session_bytes ('session_too_large'), or "
            "a frame's masks would not fit in max_decoded_bytes_in_flight "
            "('over_decode_budget')",
        },
        429: {
            "model": schemas.ErrorResponse,
            "description": "Every session's bytes together ('video_memory_full') or the "
            "client's bulk jobs ('too_many_bulk_jobs') are at their limit",
        },
    },
)
async def track_concept(
    request: Request, session_id: str, service: ServiceDep, videos: VideosDep
) -> Response:
    model = concepts_of(service)
    body, _ = await read_body(request, vs.ConceptTrackRequest, service)
    phrases = body.track_phrases()
    check_phrase_count(len(phrases), model.limits.max_concept_phrases)
    session = videos.get(session_id)
    state = session.state
    if session.live:
        raise ApiError(
            409,
            "live_session",
            "a live session has no stored frames for SAM 3's video predictor to track "
            f"through; send the phrase on its WebSocket (/v1/videos/{session.session_id}/live) "
            'as {"type": "concepts_track", "text": ...} to track it over the frames it '
            "receives, or create a session from the video (POST /v1/videos) and track the "
            "phrase there",
        )
    check_frame(body.frame_idx, state.num_frames, "frame_idx")
    last = state.num_frames if body.max_frames is None else body.frame_idx + body.max_frames
    stop = min(state.num_frames, last)
    plan = None
    if body.clicks is not None:
        plan = plan_clicks(body.clicks, phrases, session, body.frame_idx, stop)
    size = (state.height, state.width)
    clicks = None if plan is None else len(plan.clicks)
    run_bytes = RunBytes(
        model.video.image_size, size[0], size[1], stop - body.frame_idx, clicks=clicks
    )
    what = f"tracking {', '.join(map(repr, phrases))} through {stop - body.frame_idx} frames"
    room = run_room(
        session, videos, phrases, model.limits.max_concept_instances, run_bytes.per_object, what
    )
    replaced, per_phrase, max_objects = room.replaced, room.per_phrase, room.max_objects
    model.check_mask_budget(1, max_objects, size)
    thresholds = run_thresholds(body.score_thresh, model.concepts.spec.random_weights, per_phrase)
    loop = asyncio.get_running_loop()
    frames: asyncio.Queue[TrackedFrame] = asyncio.Queue()
    ids = TrackIds(session.used_ids() - {t.obj_id for t in replaced}, max_objects)
    if plan is not None:
        plan.seed(ids)
    finals: set[int] = set()  # objects of the pass after the clicks so far

    def deliver(item: TrackedFrame) -> None:
        """(On the event loop.) The session keeps the frame's objects, then the stream
        gets it."""
        for record in item.records:
            obj = record.obj_id
            track = session.concept_tracks.get(obj)
            if track is None:
                score, phrase = item.scores[obj], item.phrases[obj]
                sam3 = item.sam3_ids[obj]
                track = ConceptTrack(obj, phrase, score, item.frame_idx, 0, sam3)
                session.add_concept_track(track)
            if item.phase == REPASS and obj not in finals:  # its final span starts
                finals.add(obj)
                track.first_frame = item.frame_idx
            track.last_frame = item.frame_idx
        frames.put_nowait(item)

    def answers(predictor: Sam3VideoPredictor) -> tuple[Answers, Callable[[], dict[str, float]]]:
        """(On the model worker.) The run's answers with their phase, and its stage
        seconds."""
        frame_at = state.source.frame
        clip = (state.num_frames, state.height, state.width)
        if plan is not None:
            one = predictor.start(*clip, plan.phrase, interactive=True)
            clicked = clicked_answers(predictor, plan, one, frame_at, body.frame_idx, ids)
            return clicked, lambda: dict(one.stage_seconds)
        many = start_phrases(predictor, *clip, phrases)
        source = (frame_at(i) for i in range(body.frame_idx, stop))
        results = run_phrases(predictor, many, source, start=body.frame_idx)
        return ((PASS, result) for result in results), lambda: dict(many.stage_seconds)

    def run(context: JobContext) -> RunOutcome:
        predictor = model.video.predictor(thresholds)  # bounded unless the state is interactive
        with context.between_ops():
            results, stage_seconds = answers(predictor)
        try:
            while True:
                with context.between_ops():  # SAM 3's seconds: clicks run in between
                    answer = next(results, None)
                if answer is None:
                    break
                phase, result = answer
                item = _reported(result, ids, len(phrases), phase)
                loop.call_soon_threadsafe(deliver, item)
                context.check()  # stops if the client left; lets waiting clicks run
        finally:
            if isinstance(results, Generator):
                results.close()
        return RunOutcome(stage_seconds(), len(ids.dropped), clicks or 0)

    # The session, the client's bulk slot and the masks' bytes are held until the job has
    # really ended, not just until the stream does.
    held = contextlib.ExitStack()
    with held:
        held.enter_context(videos.using(session, "concepts_track"))
        held.enter_context(service.bulk_slot(client_address(request)))
        reservation = await service.decoding.reserve(
            model.mask_bytes(1, max_objects, size),
            f"SAM 3's masks of {max_objects} object(s) on a {size[1]}x{size[0]} frame",
        )
        held.enter_context(reservation)
        held.callback(_run_ended, session)
        session.concept_run_bytes = run_bytes.total(max_objects)
        handle = service.submit_job(JOB, run, bulk=True)
        for phrase in phrases:  # this run's objects replace them
            session.forget_concept_tracks(phrase)
        held = held.pop_all()
    handle.future.add_done_callback(lambda _: loop.call_soon_threadsafe(held.close))

    async def render(item: TrackedFrame) -> bytes:
        return await _frame_event(item, body.mask_format, service, session.names)

    def done(outcome: RunOutcome, sent: int, elapsed: float) -> dict[str, Any]:
        if plan is not None:  # the session keeps what the final answers report
            for obj in set(ids.given.values()) - finals:
                session.concept_tracks.pop(obj, None)
            session.forget_names()
        spans = [
            vs.ConceptTrackSpan(
                obj_id=obj,
                name=session.name_of(obj),
                first_frame=track.first_frame,
                last_frame=track.last_frame,
            )
            for obj, track in sorted(session.concept_tracks.items())
            if obj in ids.given.values()
        ]
        return vs.ConceptTrackDone(
            **done_counts(sent, elapsed),
            stage_seconds={k: round(v, 6) for k, v in outcome.stage_seconds.items()},
            objects=spans,
            dropped_objects=outcome.dropped,
            score_thresh=thresholds.score,
            new_object_thresh=thresholds.new_det,
            max_objects=max_objects,
            clicks_applied=outcome.clicks,
        ).model_dump()

    # The stream ends the job when it ends: a client that leaves stops the run at SAM 3's
    # next operation (a finished job is not affected).
    return EventStream(job_events(handle, frames, render, done), handle.cancel)


def _reported(result: PhrasesFrame, ids: TrackIds, count: int, phase: int) -> TrackedFrame:
    """(On the model worker.) SAM 3's answer on a frame with the session's ids, the masks
    run-length encoded in one batch; objects past the room dropped. ``count`` phrases."""
    pairs = [
        (index, obj) for index, obj in enumerate(ids.session_ids(result.obj_ids)) if obj is not None
    ]
    rows = [index for index, _ in pairs]
    records = masks_of([obj for _, obj in pairs], torch.from_numpy(result.masks[rows]))
    scores = {obj: float(result.scores[index]) for index, obj in pairs}
    phrases = {obj: result.phrases[index] for index, obj in pairs}
    # a merged id is Meta's id times the phrases plus the phrase's index (video_phrases)
    sam3_ids = {obj: result.obj_ids[index] // count for index, obj in pairs}
    return TrackedFrame(result.frame, records, scores, phrases, sam3_ids, phase)


def _run_ended(session: VideoSession) -> None:
    session.concept_run_bytes = 0  # the run's state is gone with its job


async def _frame_event(
    item: TrackedFrame, mask_format: str, service: Measured, names: Mapping[int, str]
) -> bytes:
    """A frame's objects in the wire format, each with its name as the session holds it
    now (a rename during the run shows in its next frames) and its score."""
    segmentations = await format_segmentations([r.rle for r in item.records], mask_format, service)
    named = dict(names)

    def build() -> str:  # each a validation and serialisation of a whole mask's runs
        objects = [
            vs.ConceptTrackObjectOut(
                obj_id=r.obj_id,
                name=named.get(r.obj_id),
                score=item.scores[r.obj_id],
                phrase=item.phrases[r.obj_id],
                area=r.area,
                bbox=r.bbox,
                segmentation=seg,
            )
            for r, seg in zip(item.records, segmentations, strict=True)
        ]
        frame = vs.ConceptTrackFrameOut(frame_idx=item.frame_idx, objects=objects)
        return dump_json(frame, ("objects",))

    return server_event("frame", await asyncio.to_thread(build))


__all__ = ["router"]
