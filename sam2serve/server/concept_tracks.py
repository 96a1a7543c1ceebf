"""SAM 3's own video predictor in the video sessions (POST /v1/videos/{id}/concepts/track):
the server's predictor, the thresholds of a run, its ids and what its state may hold.

- :class:`ConceptVideo`: SAM 3's video predictor over the server's concept model
  (:func:`sam2serve.concepts.video_load.video_predictor`); its tracker is loaded on the
  first run, on the model worker, and shared by every later run (a run's thresholds are
  its own predictor over the same modules: they hold no state).
- :func:`run_thresholds`: Meta's video thresholds with a request's ``score_thresh`` (the
  new-object threshold 0.2 above it, Meta's 0.5 / 0.7; null: the server's default, 0 under
  random weights, as every concept route and ``track --text``) and the objects the session
  has room for as SAM 3's object limit.
- :class:`TrackIds`: SAM 3's ids (0, 1, 2, ... Meta's) -> the session's: each new id, in
  order of appearance, gets the smallest id from 1 the session does not use, so a run's
  objects never share an id with the session's SAM 2.1 objects. SAM 3 bounds the objects it
  tracks *at once*; a run that ends some and finds new ones can report more than that over
  the clip, so at most ``room`` ids are given and later new objects are dropped (counted).
- :class:`RunBytes`: what a run's state may hold, counted against the session's byte
  limits while it streams: per object :func:`sam2serve.concepts.video_memory.object_bytes`
  (SAM 3's bounded state: at most ``4 + min(frames, 16)`` tracker records, 0.95 MiB each
  at 1008, 19 MiB per object; the masks hot start holds back, 32 MiB per object at 1080p;
  its scores). The frame's encodings and the detector's outputs live
  only while a frame is processed, as SAM 2.1's propagation's do, and are not counted; the
  masks of a frame are held in the decode budget (``mask_bytes`` of the concept model).
  A run with clicks keeps every record and every frame's packed answer (Meta's
  interactive state, :func:`sam2serve.concepts.video_memory.interactive_object_bytes`):
  per object, the frames times (0.95 MiB at 1008 plus one bit per video pixel).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from sam2serve.concepts.phrases import default_score_thresh
from sam2serve.concepts.video_association import VideoThresholds
from sam2serve.concepts.video_memory import interactive_object_bytes, object_bytes, record_bytes

if TYPE_CHECKING:
    from sam2serve.concepts.runtime import Concepts
    from sam2serve.concepts.video_predictor import Sam3VideoPredictor


def run_thresholds(
    score_thresh: float | None, random_weights: bool, max_objects: int
) -> VideoThresholds:
    """Meta's video settings with the request's detection threshold (None: the server's
    default), the new-object threshold :data:`NEW_OBJECT_MARGIN` above it, and SAM 3's
    object limit."""
    if score_thresh is None:
        score_thresh = default_score_thresh(True) if random_weights else VideoThresholds().score
    return VideoThresholds.from_detection(score_thresh, max_objects)


@dataclass(frozen=True)
class RunBytes:
    """What a run's state may hold (see the module's text), for SAM 3's input side
    ``image_size`` on a ``height`` x ``width`` video through ``frames`` frames."""

    image_size: int
    height: int
    width: int
    frames: int
    hotstart_delay: int = VideoThresholds().hotstart_delay
    clicks: int | None = None  # a run with clicks: its state keeps everything (interactive)

    @property
    def record(self) -> int:
        """One object's record of one frame: memory, mask logits, pointer, scores."""
        return record_bytes(self.image_size)

    @property
    def per_object(self) -> int:
        if self.clicks is not None:
            return interactive_object_bytes(
                self.image_size, self.height, self.width, self.frames, self.clicks
            )
        return object_bytes(
            self.image_size, self.height, self.width, self.frames, self.hotstart_delay
        )

    def total(self, objects: int) -> int:
        return objects * self.per_object


@dataclass
class TrackIds:
    """One run's SAM 3 ids -> the session's ids (see the module's text)."""

    used: set[int]
    room: int
    given: dict[int, int] = field(default_factory=dict)  # SAM 3's id -> the session's
    dropped: set[int] = field(default_factory=set)  # SAM 3's ids past the room
    _next: int = 1

    def session_ids(self, sam3_ids: Iterable[int]) -> list[int | None]:
        """The session's id of each of SAM 3's ids (new ones given in this order), None for
        one dropped."""
        out: list[int | None] = []
        for sam3_id in sam3_ids:
            if sam3_id not in self.given and sam3_id not in self.dropped:
                if len(self.given) >= self.room:
                    self.dropped.add(sam3_id)
                else:
                    while self._next in self.used:
                        self._next += 1
                    self.given[sam3_id] = self._next
                    self.used.add(self._next)
            out.append(self.given.get(sam3_id))
        return out


class ConceptVideo:
    """SAM 3's video predictor of a server: the concept model's detector with SAM 3's
    tracker, loaded by the first run (on the model worker) and shared by every run."""

    def __init__(self, concepts: Concepts) -> None:
        self.concepts = concepts
        self._base: Sam3VideoPredictor | None = None

    @property
    def image_size(self) -> int:
        return self.concepts.size.image_size

    def predictor(self, thresholds: VideoThresholds) -> Sam3VideoPredictor:
        """(On the model worker.) A predictor with ``thresholds`` over the shared modules;
        bounded (the state keeps what forward propagation still reads)."""
        from sam2serve.concepts.video_predictor import Sam3VideoPredictor

        if self._base is None:
            from sam2serve.runtime.concepts import video_predictor_in_mode

            # the tracker in the mode the concept model was loaded in (serve --mode)
            self._base = video_predictor_in_mode(self.concepts)
        base = self._base
        return Sam3VideoPredictor(
            base.detector, base.tokenize, base.neck, base.tracker, thresholds, bounded=True
        )


__all__ = [
    "ConceptVideo",
    "RunBytes",
    "TrackIds",
    "run_thresholds",
]
