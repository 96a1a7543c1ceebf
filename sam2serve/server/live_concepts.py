"""SAM 3's own video predictor on a live connection: a phrase (or several) tracked
through the frames that come after it (``{"type": "concepts_track", ...}``), until
``{"type": "concepts_stop"}`` or the connection's end.

- :class:`LiveConceptsTrack` / :class:`LiveConceptsStop`: the two messages (``text``, one
  phrase, or ``phrases``, several: the rules of POST .../concepts/track's, each by the one
  rule of phrases and names, none twice, at most max_concept_phrases; ``score_thresh`` as
  the route's; ``hotstart_delay`` 0..15, Meta's 15 by default).
- :func:`start_run`: every bound before model work, as POST .../concepts/track checks them
  (:mod:`sam2serve.server.concept_tracks`): the concept model present, the phrase count,
  the session's object room over all phrases together (max_video_objects minus its
  objects, at most max_concept_instances), SAM 3's state per object
  (:class:`~sam2serve.server.concept_tracks.RunBytes`, through 16 frames: an open-ended
  stream's bounded state) beside the session's bytes within max_video_session_bytes and
  max_video_total_bytes, shared out evenly among the phrases (413 when not one each), and
  one frame's masks in the decode budget (held while the run lasts); then, on the model
  worker, SAM 3's predictor and each phrase's encoding.
- :class:`LiveConceptRun`: the run: a :class:`~sam2serve.concepts.video_stream.PhrasesStream`
  each frame is pushed to (on the worker, with SAM 2.1's step; one ViT pass a frame for
  every phrase), SAM 3's ids (``i * n + k``, :mod:`sam2serve.concepts.video_phrases`)
  mapped to the session's (:class:`~sam2serve.server.concept_tracks.TrackIds`), the
  objects it reports kept on the session named by their phrase, and its bytes released
  when it ends.

Hot start holds each SAM 3 answer ``hotstart_delay`` frames: a frame's SAM 2.1 answer
comes when it is tracked, its SAM 3 answer (``{"type": "concepts_frame", ...}``) that many
frames later, and the last ones when the run stops (``concepts_done`` follows them). A delay
below Meta's 15 answers sooner and departs from Meta's answers
(:func:`~sam2serve.concepts.video_stream.stream_thresholds`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field

from sam2serve.concepts.video_association import VideoThresholds
from sam2serve.concepts.video_phrases import PhrasesFrame, start_phrases
from sam2serve.concepts.video_stream import (
    META_HOTSTART_DELAY,
    OPEN_ENDED,
    PhrasesStream,
    stream_thresholds,
)
from sam2serve.concepts.video_tracker import MAX_OBJ_PTRS
from sam2serve.engine.video.outputs import ObjectMask, masks_of
from sam2serve.server.batching import JobContext
from sam2serve.server.concept_room import check_phrase_count, run_room
from sam2serve.server.concept_tracks import RunBytes, TrackIds, run_thresholds
from sam2serve.server.decode_budget import Reservation
from sam2serve.server.routes.concepts import concepts_of
from sam2serve.server.service import RequestClock, Service
from sam2serve.server.video_answers import objects_out
from sam2serve.server.video_schemas import PhrasesPrompt
from sam2serve.server.video_sessions import ConceptTrack, VideoSession, VideoSessions

if TYPE_CHECKING:
    import numpy as np

CONCEPTS_TRACK = "concepts_track"
CONCEPTS_STOP = "concepts_stop"


class LiveConceptsTrack(PhrasesPrompt):
    """Track every instance of a phrase (or of several) with SAM 3's own video predictor
    from the next frame on, until ``concepts_stop`` or the connection's end."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["concepts_track"]
    hotstart_delay: int = Field(
        META_HOTSTART_DELAY,
        ge=0,
        le=META_HOTSTART_DELAY,
        description="Frames each SAM 3 answer is held back (Meta's 15: a new object shows "
        "once 15 later frames confirm it); fewer answer sooner and depart from Meta's.",
    )


class LiveConceptsStop(BaseModel):
    """End the connection's SAM 3 run: its held answers, then ``concepts_done``."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["concepts_stop"]


@dataclass(frozen=True)
class ReportedFrame:
    """SAM 3's answer on one frame with the session's ids (ascending), scores and phrases."""

    frame_idx: int
    records: list[ObjectMask]
    scores: dict[int, float]
    phrases: dict[int, str]


@dataclass
class LiveConceptRun:
    """One SAM 3 run of one phrase or several on a live connection (see the module's
    text)."""

    text: str | None  # the message's text (one phrase), None when it gave phrases
    session: VideoSession
    stream: PhrasesStream
    ids: TrackIds
    thresholds: VideoThresholds
    reservation: Reservation
    seqs: dict[int, int] = field(default_factory=dict)  # frame pushed -> its seq
    frames_out: int = 0
    ended: bool = False

    @property
    def phrases(self) -> list[str]:
        return self.stream.phrases

    @property
    def label(self) -> str:
        """The phrases as a message names them: 'cat', 'dog'."""
        return ", ".join(map(repr, self.phrases))

    @property
    def max_objects(self) -> int:
        return self.ids.room

    @property
    def unreported(self) -> int:
        """Objects SAM 3 may still report (its room the session keeps free)."""
        return self.ids.room - len(self.ids.given)

    def push(self, context: JobContext, frame_idx: int, pixels: np.ndarray) -> list[ReportedFrame]:
        """(On the model worker.) One frame through SAM 3; what hot start lets out now."""
        with context.between_ops():  # SAM 3's seconds: clicks run in between
            results = self.stream.push(frame_idx, pixels)
        return [self._reported(result) for result in results]

    def flush(self) -> list[ReportedFrame]:
        """(On the model worker.) The answers hot start still holds."""
        return [self._reported(result) for result in self.stream.flush()]

    def _reported(self, result: PhrasesFrame) -> ReportedFrame:
        session_ids = self.ids.session_ids(result.obj_ids)
        pairs = [(row, obj) for row, obj in enumerate(session_ids) if obj is not None]
        rows = [row for row, _ in pairs]
        records = masks_of([obj for _, obj in pairs], torch.from_numpy(result.masks[rows]))
        scores = {obj: float(result.scores[row]) for row, obj in pairs}
        phrases = {obj: result.phrases[row] for row, obj in pairs}
        return ReportedFrame(result.frame, records, scores, phrases)

    def keep(self, frame: ReportedFrame) -> None:
        """(On the event loop.) The session keeps the frame's objects (each named by its
        phrase) and where they were seen."""
        for record in frame.records:
            track = self.session.concept_tracks.get(record.obj_id)
            if track is None:
                score, phrase = frame.scores[record.obj_id], frame.phrases[record.obj_id]
                track = ConceptTrack(record.obj_id, phrase, score, frame.frame_idx, 0)
                self.session.add_concept_track(track)
            track.last_frame = frame.frame_idx
        self.frames_out += 1

    async def message(self, frame: ReportedFrame, service: Service) -> dict[str, Any]:
        """A ``concepts_frame`` answer: the frame (and its seq), SAM 3's objects with
        their names, scores and phrases."""
        objects = await objects_out(frame.records, "coco_rle", service, self.session.names)
        answer: dict[str, Any] = {"type": "concepts_frame", "frame_idx": frame.frame_idx}
        seq = self.seqs.pop(frame.frame_idx, None)
        if seq is not None:
            answer["seq"] = seq
        answer["objects"] = [
            {
                **obj.model_dump(),
                "score": frame.scores[obj.obj_id],
                "phrase": frame.phrases[obj.obj_id],
            }
            for obj in objects
        ]
        return answer

    def done(self, elapsed_s: float) -> dict[str, Any]:
        """The ``concepts_done`` answer: counts, SAM 3's seconds per stage, each object's
        first and last frame."""
        mine = set(self.ids.given.values())
        spans = [
            {
                "obj_id": obj,
                "name": self.session.name_of(obj),
                "first_frame": track.first_frame,
                "last_frame": track.last_frame,
            }
            for obj, track in sorted(self.session.concept_tracks.items())
            if obj in mine
        ]
        stages = self.stream.state.stage_seconds
        return {
            "type": "concepts_done",
            **self.named(),
            "frames": self.frames_out,
            "elapsed_ms": round(elapsed_s * 1000, 3),
            "stage_seconds": {k: round(v, 6) for k, v in stages.items()},
            "objects": spans,
            "dropped_objects": len(self.ids.dropped),
            "score_thresh": self.thresholds.score,
            "new_object_thresh": self.thresholds.new_det,
            "hotstart_delay": self.thresholds.hotstart_delay,
            "max_objects": self.max_objects,
        }

    def named(self) -> dict[str, Any]:
        """What the answers name the run by: its ``text`` when the message gave one, and
        always its ``phrases``."""
        text = {} if self.text is None else {"text": self.text}
        return {**text, "phrases": list(self.phrases)}

    def release(self) -> None:
        """The run's bytes are free again (its state goes with it); idempotent."""
        if not self.ended:
            self.ended = True
            self.session.concept_run_bytes = 0
            self.reservation.release()


async def start_run(
    body: LiveConceptsTrack, session: VideoSession, videos: VideoSessions, service: Service
) -> LiveConceptRun:
    """Check every bound, then (on the model worker) SAM 3's predictor and each phrase's
    encoding: a run whose first frame is the next one pushed. ApiError names a bound."""
    model = concepts_of(service)
    phrases = body.track_phrases()
    check_phrase_count(len(phrases), model.limits.max_concept_phrases)
    state = session.state
    size = (state.height, state.width)
    run_bytes = RunBytes(model.video.image_size, *size, MAX_OBJ_PTRS, body.hotstart_delay)
    what = f"tracking {', '.join(map(repr, phrases))} on live frames"
    room = run_room(
        session, videos, phrases, model.limits.max_concept_instances, run_bytes.per_object, what
    )
    per_phrase, max_objects = room.per_phrase, room.max_objects
    model.check_mask_budget(1, max_objects, size)
    random_weights = model.concepts.spec.random_weights
    detection = run_thresholds(body.score_thresh, random_weights, per_phrase)
    thresholds = stream_thresholds(detection, body.hotstart_delay)
    reservation = await service.decoding.reserve(
        model.mask_bytes(1, max_objects, size),
        f"SAM 3's masks of {max_objects} object(s) on a {size[1]}x{size[0]} frame",
    )
    session.concept_run_bytes = run_bytes.total(max_objects)

    def build(_context: JobContext) -> PhrasesStream:
        predictor = model.video.predictor(thresholds)
        sam3 = start_phrases(predictor, OPEN_ENDED, state.height, state.width, phrases)
        return PhrasesStream(predictor, sam3)

    try:
        stream = await service.run_job("video_live", build, RequestClock(), long=True)
    except BaseException:  # no run: its bytes are free again
        session.concept_run_bytes = 0
        reservation.release()
        raise
    for phrase in phrases:  # this run's objects replace them
        session.forget_concept_tracks(phrase)
    ids = TrackIds(session.used_ids(), max_objects)
    return LiveConceptRun(body.text, session, stream, ids, thresholds, reservation)


__all__ = [
    "CONCEPTS_STOP",
    "CONCEPTS_TRACK",
    "LiveConceptRun",
    "LiveConceptsStop",
    "LiveConceptsTrack",
    "ReportedFrame",
    "start_run",
]
