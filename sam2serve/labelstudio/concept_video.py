"""A phrase (or several) on a video task answered by SAM 3's own video predictor
(``labelstudio --concepts --video``): every instance of the phrase found and tracked
through the clip,
new ones picked up as they appear and lost ones ended, each answered as a VideoRectangle
(docs/labelling.md, "Text prompts on a video").

The flow, every bound decided before the step it bounds:

1. the phrases (:mod:`sam2serve.labelstudio.concept_video_prompt`: by the text rule, at
   most ``--concept-max-labels``), the Video they were typed on, and the config's
   VideoRectangle tag on it;
2. the clip (:mod:`sam2serve.labelstudio.video_clip`): fetched within
   ``max_video_upload_bytes``; from the stream's header its frame size (``max_pixels``)
   and the frames one request tracks from Label Studio's frame 1 (``--video-max-frames``,
   at most ``max_video_frames``) with SAM 3's tracking memory (:meth:`ConceptVideoTracker.
   tracking_cost`: ``max_objects`` per phrase) checked against ``max_video_session_bytes``;
   then decoded within the
   process's decode budget;
3. one bulk job on the model worker: Meta's session over those frames
   (:class:`~sam2serve.concepts.video_predictor.Sam3VideoPredictor`: the detector on
   every frame, SAM 3's memory tracker, detections associated with tracks, new objects
   added above the new-object threshold, unmatched or duplicated young ones removed, the
   outputs held back ``hotstart_delay`` frames), at most ``max_objects`` objects tracked
   at once; several phrases are one such session each over one ViT pass per frame
   (:mod:`sam2serve.concepts.video_phrases`: its own detections, tracks, hot start and
   ``max_objects``; ids ``i * n + k``, so the phrase of an id is ``id % n``); clicks of other clients run between its torch operations, a client that
   leaves stops it, and its progress is logged every tenth of the frames;
4. each object id one VideoRectangle: the predictor's box on every frame the object is
   output (``FrameResult.boxes``: pixel indices of the first and last column and row of
   its mask, so ``x1 - x0 + 1`` pixels wide), ``enabled: false`` on the first frame of
   each absence (ended, hidden by an overlapping object, or not seen), labelled with the
   Labels tag's label that is its phrase (ignoring case), else that tag's first label,
   its phrase and the object id in the region's meta text. Objects of different phrases
   may overlap.

Nothing is kept after the answer: the session lives only inside the job.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from sam2serve.concepts.video_association import VideoThresholds
from sam2serve.concepts.video_memory import object_bytes
from sam2serve.concepts.video_phrases import (
    PhrasesFrame,
    PhrasesState,
    run_phrases,
    start_phrases,
)
from sam2serve.concepts.video_predictor import FrameResult, Sam3VideoPredictor
from sam2serve.labelstudio.concept_video_prompt import VideoTextPrompt
from sam2serve.labelstudio.images import ImageFetcher, LabelStudioAccess
from sam2serve.labelstudio.label_config import LabelConfig
from sam2serve.labelstudio.options import LabelStudioOptions
from sam2serve.labelstudio.protocol import Task
from sam2serve.labelstudio.video_clip import (
    TrackingCost,
    VideoTarget,
    clip_window,
    video_sessions,
    video_target,
)
from sam2serve.labelstudio.video_frames import ClipWindow
from sam2serve.labelstudio.video_result import PixelBox, concept_track_region, tracked_keyframes
from sam2serve.server.batching import JobContext
from sam2serve.server.service import RequestClock, Service

log = logging.getLogger("sam2serve.labelstudio")

FIRST_FRAME = 1  # a phrase is followed from Label Studio's first frame
PROGRESS_STEPS = 10  # progress lines per job
# Bytes of one video-size mask pixel while a frame's outputs are made (the upsampled float
# logits, the bool mask and the overlap resolution's float claim and copies).
_OUTPUT_BYTES_PER_PIXEL = 10


def video_thresholds(score_thresh: float, max_objects: int) -> VideoThresholds:
    """Meta's video settings with ``--concept-score-thresh`` as the detection threshold
    (new objects from ``NEW_OBJECT_MARGIN`` above it) and ``max_objects`` tracked at once."""
    return VideoThresholds.from_detection(score_thresh, max_objects)


@dataclass(frozen=True)
class Seen:
    """An object on one frame: the predictor's box (x0, y0, x1, y1, pixel indices) and its
    score."""

    box: tuple[float, float, float, float]
    score: float


@dataclass(frozen=True)
class Track:
    """One object through the kept frames: its box on each (COCO's [x, y, w, h] in pixels;
    None where it is not output) and its score on the first frame it is."""

    boxes: list[PixelBox | None]
    score: float


def object_tracks(frames: Sequence[Mapping[int, Seen]]) -> dict[int, Track]:
    """Each object id of the frames' outputs (``frames[i]``: the objects output on kept
    frame ``i``) as its track, in id order."""
    tracks: dict[int, Track] = {}
    for index, objects in enumerate(frames):
        for obj_id, seen in objects.items():
            if obj_id not in tracks:
                tracks[obj_id] = Track([None] * len(frames), seen.score)
            x0, y0, x1, y1 = seen.box
            tracks[obj_id].boxes[index] = [x0, y0, x1 - x0 + 1, y1 - y0 + 1]
    return dict(sorted(tracks.items()))


def phrase_label(phrase: str, labels: Sequence[str]) -> str | None:
    """The label of a phrase's objects: the one that is the phrase (exactly, else ignoring
    case), else the first; None without labels."""
    if not labels:
        return None
    if phrase in labels:
        return phrase
    folded = phrase.casefold()
    return next((label for label in labels if label.casefold() == folded), labels[0])


class ConceptVideoTracker:
    """SAM 3's video predictor bound to the backend's options: stateless per clip (a
    request's session lives in its job), shared by every request."""

    def __init__(self, predictor: Sam3VideoPredictor, options: LabelStudioOptions) -> None:
        self.predictor = predictor
        self.options = options

    @property
    def max_objects(self) -> int:
        """Objects tracked at once (new detections past it are not added)."""
        return self.predictor.th.max_objects

    def object_bytes(self, frames: int, height: int, width: int) -> int:
        """What one tracked object may hold at most through ``frames`` frames of a
        ``height`` x ``width`` video: its bounded tracker state
        (:func:`~sam2serve.concepts.video_memory.object_bytes`) and its outputs as they
        are made."""
        held = object_bytes(
            self.predictor.tracker.image_size,
            height,
            width,
            frames,
            self.predictor.th.hotstart_delay,
        )
        return held + _OUTPUT_BYTES_PER_PIXEL * height * width

    def tracking_cost(self, frames: int, height: int, width: int, phrases: int = 1) -> TrackingCost:
        """SAM 3's memory beside the frames: every object it may track at once, for each of
        ``phrases`` phrases (its memory is bounded whatever the number of frames)."""
        objects = phrases * self.max_objects
        each = f" ({self.max_objects} for each of {phrases} phrases)" if phrases > 1 else ""
        fewer = "phrases, " if phrases > 1 else ""
        return TrackingCost(
            objects * self.object_bytes(frames, height, width),
            f"for SAM 3 to track up to {objects} objects{each} through them",
            f"track fewer {fewer}frames (--video-max-frames) or objects at once "
            "(--max-video-objects, --concept-max-instances)",
        )

    async def regions(
        self,
        task: Task,
        where: str,
        config: LabelConfig,
        prompt: VideoTextPrompt,
        service: Service,
        fetcher: ImageFetcher,
        access: LabelStudioAccess,
        client: str,
    ) -> list[dict[str, Any]]:
        """The VideoRectangle regions of every object of the phrases on ``task``'s video."""
        video_sessions(service, "text prompts on a video")
        phrases = list(prompt.phrases)
        if not phrases:
            return []  # a TextArea without a phrase: nothing to follow
        target = video_target(task, where, config, prompt.video_name)

        def cost(frames: int, height: int, width: int) -> TrackingCost:
            return self.tracking_cost(frames, height, width, len(phrases))

        # One of the client's bulk slots from the fetch on, as keyframe tracking holds.
        with service.bulk_slot(client):
            async with clip_window(
                target, FIRST_FRAME, cost, service, fetcher, access, self.options
            ) as window:
                tracks = await self._follow(service, window, phrases, target.source)
        labels_tag = config.labels_on_video(target.video.name)
        labels = labels_tag.labels if labels_tag else ()
        return _regions(tracks, window, target, phrases, labels)

    async def _follow(
        self, service: Service, window: ClipWindow, phrases: list[str], where: str
    ) -> dict[int, Track]:
        """Meta's session on the window's frames (one per phrase over a shared encoding),
        one bulk job; each object's track, by id (``where``: the task's video, named in the
        log)."""
        predictor = self.predictor
        height, width = window.size
        total = len(window.frames)
        named = ", ".join(map(repr, phrases))

        def run(context: JobContext) -> dict[int, Track]:
            started = time.perf_counter()
            log.info(
                "SAM 3 video: %s on %s, %d frames of %dx%d, at most %d objects at once%s",
                named,
                where[:200],
                total,
                width,
                height,
                self.max_objects,
                " per phrase" if len(phrases) > 1 else "",
            )
            outputs: list[dict[int, Seen]] = [{} for _ in range(total)]
            with context.between_ops():  # clicks run between SAM 3's torch operations
                results: Iterator[FrameResult | PhrasesFrame]
                if len(phrases) == 1:  # Meta's session as it is
                    sam3 = PhrasesState(
                        phrases, [predictor.start(total, height, width, phrases[0])]
                    )
                    frames = _fed(window.frames, sam3, context, named, started)
                    results = predictor.run(sam3.states[0], frames)
                else:
                    sam3 = start_phrases(predictor, total, height, width, phrases)
                    frames = _fed(window.frames, sam3, context, named, started)
                    results = run_phrases(predictor, sam3, frames)
                for result in results:
                    outputs[result.frame] = {
                        obj_id: Seen(box, score)
                        for obj_id, score, box in zip(
                            result.obj_ids, result.scores, result.boxes, strict=True
                        )
                    }  # its masks are dropped here: the boxes are the answer
                    context.check()
            tracks = object_tracks(outputs)
            stages = ", ".join(f"{k} {v:.1f} s" for k, v in sam3.stage_seconds.items())
            log.info(
                "SAM 3 video: %s, %d frames in %.1f s: %d objects answered (%s)",
                named,
                total,
                time.perf_counter() - started,
                len(tracks),
                stages,
            )
            return tracks

        tracks: dict[int, Track] = await service.run_job(
            "labelstudio_concept_video", run, RequestClock(), bulk=True
        )
        return tracks


def _fed(
    frames: Sequence[np.ndarray],
    sam3: PhrasesState,
    context: JobContext,
    named: str,
    started: float,
) -> Iterator[np.ndarray]:
    """The frames as the predictor takes them: a checkpoint before each, and a progress
    line every tenth of them."""
    step = max(1, len(frames) // PROGRESS_STEPS)
    for index, frame in enumerate(frames):
        context.check()
        if index and index % step == 0:
            log.info(
                "SAM 3 video: %s, frame %d of %d, %d objects so far, %.1f s",
                named,
                index + 1,
                len(frames),
                sum(state.max_obj_id + 1 for state in sam3.states),
                time.perf_counter() - started,
            )
        yield frame


def _regions(
    tracks: dict[int, Track],
    window: ClipWindow,
    target: VideoTarget,
    phrases: Sequence[str],
    labels: Sequence[str],
) -> list[dict[str, Any]]:
    """Each track's region, labelled by its phrase (an id's phrase is ``id % n``)."""
    height, width = window.size
    regions = []
    for obj_id, track in tracks.items():
        phrase = phrases[obj_id % len(phrases)]
        keyframes = tracked_keyframes(
            track.boxes, window.ls_frames, width, height, target.frame_rate
        )
        regions.append(
            concept_track_region(
                keyframes,
                target.control.name,
                target.video.name,
                phrase_label(phrase, labels),
                track.score,
                f"{phrase} (SAM 3 object {obj_id})",
            )
        )
    return regions


__all__ = [
    "ConceptVideoTracker",
    "Seen",
    "Track",
    "object_tracks",
    "phrase_label",
    "video_thresholds",
]
