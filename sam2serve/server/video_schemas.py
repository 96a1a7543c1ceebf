"""The video sessions API's bodies (/v1/videos): prompts, propagation and what comes back.

Coordinates are pixels of the video's frames, as in the image API. Objects are named by
an integer ``obj_id`` the client chooses (as in Meta's video predictor), and may carry a
name (their class or label, :mod:`sam2serve.server.object_names`) that the session keeps
and every answer repeats; frames by their 0-based index in the uploaded video.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from sam2serve.concepts.phrases import (
    META_SCORE_THRESH,
    RANDOM_WEIGHTS_SCORE_THRESH,
    check_phrase,
)
from sam2serve.concepts.video_seed import DEFAULT_DEDUPE_IOU
from sam2serve.engine.prompts import Prompt
from sam2serve.server.concept_schemas import ConceptPrompts, Phrase, clean_phrases
from sam2serve.server.live_modes import LiveMode
from sam2serve.server.object_names import NAME_DOC, ObjectName
from sam2serve.server.schemas import (
    MASK_FORMAT_DOC,
    SEGMENTATION_DOC,
    Coordinate,
    FiniteFloat,
    MaskFormat,
    Point,
    Segmentation,
    _Strict,
)
from sam2serve.server.settings import MAX_POINTS_PER_OBJECT
from sam2serve.server.settings_groups import MAX_CONCEPT_PHRASES

MAX_OBJ_ID = 2**31 - 1
MAX_FRAME_IDX = 2**31 - 1


class MaskPrompt(_Strict):
    """A binary mask of the object, as COCO RLE (compressed ``counts`` string, or the
    uncompressed list of run lengths), of the frame's size."""

    size: list[int] = Field(min_length=2, max_length=2, description="[height, width]")
    counts: str | list[int] = Field(
        description="pycocotools' compressed run-length string, or run lengths "
        "(column-major, starting with zeros)"
    )


class _ObjectPrompt(_Strict):
    """Prompts for one object on one frame: what POST .../prompts and a live prompt share
    (the frame is named by each its own way)."""

    frame_idx: int | None = Field(None, ge=0, le=MAX_FRAME_IDX, description="The frame.")
    obj_id: int = Field(
        ge=0, le=MAX_OBJ_ID, description="The object, an id the client chooses (new ids add one)."
    )
    points: list[Point] = Field(
        default_factory=list,
        max_length=MAX_POINTS_PER_OBJECT,
        description="Clicks on the frame (label 1 on the object, 0 off it); with the clicks "
        "the object already has on the frame (clear_old_points false), at most the server's "
        "max_points_per_object.",
    )
    box: list[Coordinate] | None = Field(
        None,
        min_length=4,
        max_length=4,
        description="Box around the object as [x0, y0, x1, y1] in pixels, inside the frame.",
    )
    mask: MaskPrompt | None = Field(
        None, description="The object's mask on this frame, instead of points and a box."
    )
    clear_old_points: bool = Field(
        True,
        description="true: these clicks replace the object's earlier clicks on this frame; "
        "false: they are added to them (a correction click).",
    )
    mask_format: MaskFormat = Field("coco_rle", description=MASK_FORMAT_DOC)
    name: ObjectName | None = Field(
        None,
        description=NAME_DOC + " Names (or renames) the object once the prompt is taken; "
        "null or omitted: its name stays as it is.",
    )

    @model_validator(mode="after")
    def _one_kind_of_prompt(self) -> Self:
        clicks = bool(self.points) or self.box is not None
        if self.mask is not None and clicks:
            raise ValueError("give either points and/or a box, or a mask - not both")
        if self.mask is None and not clicks:
            raise ValueError("give at least one point, a box or a mask")
        if clicks:
            Prompt.from_api(self)  # the engine's checks, as for an image's object
        return self


class VideoPromptRequest(_ObjectPrompt):
    """Prompts for one object on one frame: clicks and/or a box, or a mask."""

    frame_idx: int = Field(ge=0, le=MAX_FRAME_IDX, description="The frame (0-based).")


class LivePromptMessage(_ObjectPrompt):
    """A prompt on a live connection: POST .../prompts' body (no mask) with a type."""

    type: str = Field("prompt", pattern="^prompt$")
    frame_idx: int | None = Field(
        None, ge=0, le=MAX_FRAME_IDX, description="The frame (0-based), or give seq."
    )
    seq: int | None = Field(
        None, ge=0, description="The frame by the seq it was sent as on this connection."
    )

    @model_validator(mode="after")
    def _one_frame(self) -> Self:
        if (self.frame_idx is None) == (self.seq is None):
            raise ValueError("name the frame by frame_idx or by seq (one of them)")
        return self


class LiveVideoRequest(BaseModel):
    """A live video's frame size (and rate, for the record)."""

    model_config = ConfigDict(extra="forbid")

    width: int = Field(ge=1, le=16384, description="Frame width in pixels.")
    height: int = Field(ge=1, le=16384, description="Frame height in pixels.")
    fps: float | None = Field(None, gt=0, le=1000, description="The stream's frame rate.")
    mode: LiveMode = Field(
        "every",
        description='Frames that come faster than they are tracked: "every" tracks each '
        '(one sent while max_live_pending wait is refused, too_fast); "latest" tracks the '
        "newest, a newer frame replacing the waiting one (answered as skipped).",
    )


class PropagateRequest(_Strict):
    """Track every object of the session through the video, streaming each frame."""

    start_frame_idx: int | None = Field(
        None,
        ge=0,
        le=MAX_FRAME_IDX,
        description="First frame (default: the earliest prompted frame, or the latest "
        "when reverse).",
    )
    max_frames: int | None = Field(
        None,
        ge=1,
        le=MAX_FRAME_IDX,
        description="Frames to stream at most, the start frame included (default: to the "
        "end of the video, or to frame 0 when reverse).",
    )
    reverse: bool = Field(False, description="true: track backwards, towards frame 0.")
    mask_format: MaskFormat = Field("coco_rle", description=MASK_FORMAT_DOC)


class VideoConceptsRequest(ConceptPrompts):
    """Every instance SAM 3 finds on one frame becomes a new object of the session (its
    mask the object's prompt there, its phrase its name: phrases and names obey one rule,
    :mod:`sam2serve.engine.user_text`); propagate to track them."""

    frame_idx: int = Field(ge=0, le=MAX_FRAME_IDX, description="The frame SAM 3 looks at.")
    max_instances: int | None = Field(
        None,
        ge=1,
        le=MAX_OBJ_ID,
        description="New objects at most, highest scores first (and per phrase before the "
        "duplicates are dropped); at most the room the session has (max_video_objects minus "
        "the objects it tracks: more is a 413 naming both) and max_concept_instances "
        "(default: that room, within max_concept_instances).",
    )
    dedupe_iou: FiniteFloat = Field(
        DEFAULT_DEDUPE_IOU,
        ge=0,
        le=1,
        description="An instance whose mask IoU with a higher-scoring one (any phrase) is "
        "above this is a duplicate, not a new object.",
    )
    mask_format: MaskFormat = Field("coco_rle", description=MASK_FORMAT_DOC)


# Clicks one concepts/track request may carry (each SAM 3's add_points on one object).
MAX_CONCEPT_CLICKS = 16
# Meta's max_point_num_in_prompt_enc (concepts/video_clicks.py MAX_POINTS).
MAX_CONCEPT_CLICK_POINTS = 16


XY = Annotated[list[Coordinate], Field(min_length=2, max_length=2)]  # [x, y]
Label = Annotated[int, Field(strict=True, ge=0, le=1)]  # 1 or 0, never true / false


class ConceptClick(_Strict):
    """Clicks on one of SAM 3's objects on one frame, after the phrase's full pass (Meta's
    ``add_prompt(frame, points, point_labels, obj_id)``)."""

    frame_idx: int = Field(
        ge=0, le=MAX_FRAME_IDX, description="The frame clicked: one the pass answers."
    )
    obj_id: int = Field(
        ge=1,
        le=MAX_OBJ_ID,
        description="The session's id of an object this phrase's earlier run reported, or "
        "an id the session does not use: SAM 3 adds an object.",
    )
    points: list[XY] = Field(
        min_length=1,
        max_length=MAX_CONCEPT_CLICK_POINTS,
        description="[x, y] in the video's pixels (inside the frame), at most "
        f"{MAX_CONCEPT_CLICK_POINTS}.",
    )
    labels: list[Label] = Field(
        max_length=MAX_CONCEPT_CLICK_POINTS,
        description="One per point: 1 on the object, 0 off it.",
    )

    @model_validator(mode="after")
    def _a_label_per_point(self) -> Self:
        if len(self.labels) != len(self.points):
            raise ValueError(
                f"one label per point: {len(self.points)} points, {len(self.labels)} labels"
            )
        return self


class PhrasesPrompt(BaseModel):
    """One noun phrase (``text``) or several (``phrases``), exactly one of the two, and the
    detection threshold: the prompt of SAM 3's video predictor on a stored session (:class:`ConceptTrackRequest`)
    and on a live connection (``server.live_concepts.LiveConceptsTrack``)."""

    text: Phrase | None = Field(
        None,
        description="One noun phrase, e.g. 'person', 'yellow school bus' (1..64 characters "
        "after stripping, the rule of every phrase and name: "
        "sam2serve.engine.user_text); each object found is named by it. Give text or "
        "phrases.",
    )
    phrases: list[Phrase] | None = Field(
        None,
        min_length=1,
        max_length=MAX_CONCEPT_PHRASES,
        description="Several noun phrases, e.g. ['person', 'dog', 'car'] (each text's "
        "rule; no two the same; at most max_concept_phrases): each is its own run of "
        "SAM 3's video predictor (its own detections, tracks and hot start) over one shared "
        "image encoding per frame, its objects named by it; objects of different phrases "
        "may overlap. The objects SAM 3 may track at once are shared out evenly among the "
        "phrases. Give text or phrases.",
    )
    score_thresh: FiniteFloat | None = Field(
        None,
        ge=0,
        le=1,
        description="A detection is kept above this probability; a new object needs 0.2 "
        f"more (null: Meta's {META_SCORE_THRESH} and 0.7; "
        f"{RANDOM_WEIGHTS_SCORE_THRESH:g} and 0.2 on a server whose SAM 3 has random "
        "weights, which score every instance about 0.25).",
    )

    @field_validator("text")
    @classmethod
    def _a_phrase(cls, text: str | None) -> str | None:
        return None if text is None else check_phrase(text, "the phrase")

    @field_validator("phrases")
    @classmethod
    def _phrases_are_names(cls, phrases: list[str] | None) -> list[str] | None:
        return None if phrases is None else clean_phrases(phrases)

    @model_validator(mode="after")
    def _text_or_phrases(self) -> Self:
        if (self.text is None) == (self.phrases is None):
            raise ValueError("give text (one phrase) or phrases (several), not both or neither")
        return self

    def track_phrases(self) -> list[str]:
        """The phrases tracked, in the prompt's order."""
        return [self.text] if self.text is not None else list(self.phrases or ())


class ConceptTrackRequest(_Strict, PhrasesPrompt):
    """Every instance of one noun phrase (``text``) or of several (``phrases``), found and
    tracked by SAM 3's own video predictor from ``frame_idx`` forward (Meta's
    ``Sam3VideoPredictor``: the detector on every frame, SAM 3's memory tracker, new
    instances picked up, lost ones ended; several phrases: one such run per phrase over one
    shared image encoding per frame)."""

    frame_idx: int = Field(0, ge=0, le=MAX_FRAME_IDX, description="The first frame tracked.")
    max_frames: int | None = Field(
        None,
        ge=1,
        le=MAX_FRAME_IDX,
        description="Frames to stream at most, frame_idx included (default: to the end of "
        "the video).",
    )
    mask_format: MaskFormat = Field("coco_rle", description=MASK_FORMAT_DOC)
    clicks: list[ConceptClick] | None = Field(
        None,
        min_length=1,
        max_length=MAX_CONCEPT_CLICKS,
        description="Clicks on SAM 3's objects after the full pass (one phrase only; the "
        "pass then runs to the video's end): the clicks in order, then Meta's partial pass "
        "(only the clicked objects tracked again from frame_idx). Frames answered again "
        "are streamed again: a frame's last event is its final answer. Nothing of SAM 3 is "
        "kept between requests: the phrase's pass runs again first.",
    )


class ObjectRenameRequest(_Strict):
    """A tracked object's new name."""

    name: ObjectName | None = Field(description=NAME_DOC + " null: the object has no name.")


# --------------------------------------------------------------------------- responses


NAME_OUT_DOC = "The object's name (prompts, renames, concept seeding); null when unnamed."


class VideoObjectOut(BaseModel):
    obj_id: int
    name: str | None = Field(None, description=NAME_OUT_DOC)
    area: int = Field(description="Pixels in the mask.")
    bbox: list[float] = Field(description="[x, y, width, height] of the mask; zeros if empty.")
    segmentation: Segmentation = Field(description=SEGMENTATION_DOC)


class VideoFrameOut(BaseModel):
    """Every object's mask on one frame (an object absent there has an empty mask)."""

    frame_idx: int
    objects: list[VideoObjectOut]


class VideoPromptResponse(VideoFrameOut):
    session_id: str
    inference_ms: float
    queue_ms: float


class VideoConceptObjectOut(VideoObjectOut):
    name: str = Field(description="The phrase that found it ('visual' for boxes alone).")
    score: float = Field(description="SAM 3's score of the instance that seeded it.")


class VideoConceptsResponse(BaseModel):
    """The new objects, highest score first, with their masks on the frame (SAM 2.1's
    answer to each seed mask); empty when SAM 3 found nothing above score_thresh."""

    session_id: str
    frame_idx: int
    objects: list[VideoConceptObjectOut]
    inference_ms: float
    queue_ms: float


class ConceptTrackObjectOut(VideoObjectOut):
    """An object SAM 3 reports on a frame; its name is the phrase that found it (as the
    session keeps it: renamed or unnamed since, the new name or null)."""

    score: float = Field(description="SAM 3's detection score of the instance when it appeared.")
    phrase: str | None = Field(
        None, description="The phrase that found it (of the request's text or phrases)."
    )


class ConceptTrackFrameOut(BaseModel):
    """The objects SAM 3 reports on one frame (ids ascending; an object SAM 3 does not see
    there is absent, and one whose pixels went to an overlapping object has area 0)."""

    frame_idx: int
    objects: list[ConceptTrackObjectOut]


class ConceptTrackSpan(BaseModel):
    obj_id: int
    name: str | None = Field(description=NAME_OUT_DOC)
    first_frame: int = Field(description="The first frame it was reported on.")
    last_frame: int = Field(description="The last frame it was reported on.")


def _absent(value: object) -> bool:
    return value is None


class VideoSessionObjectOut(BaseModel):
    """An object of the session: SAM 2.1's (prompted; propagate tracks it) as ``{obj_id,
    name}``, or one SAM 3's video predictor reported (POST .../concepts/track: its masks
    were streamed; the session keeps its name and frames) with ``tracker``,
    ``first_frame`` and ``last_frame`` too."""

    obj_id: int
    name: str | None = Field(description=NAME_OUT_DOC)
    # Absent (not null) on a SAM 2.1 object: it is {obj_id, name}, as before.
    tracker: Literal["sam3"] | None = Field(
        None,
        description="'sam3': reported by SAM 3's video predictor; absent: SAM 2.1's.",
        exclude_if=_absent,
    )
    first_frame: int | None = Field(
        None,
        description="SAM 3's object: the first frame it was reported on.",
        exclude_if=_absent,
    )
    last_frame: int | None = Field(
        None,
        description="SAM 3's object: the last frame it was reported on.",
        exclude_if=_absent,
    )


class VideoSessionOut(BaseModel):
    session_id: str = Field(
        description="Names the session in every later request. In the cluster, send it as "
        "the serve_multiplexed_model_id header too: the session lives on one replica."
    )
    num_frames: int
    width: int
    height: int
    fps: float | None = Field(description="The video's frame rate; null for frame images.")
    source: str = Field(description="What the frames came from (the upload's file name).")
    obj_ids: list[int] = Field(description="The objects prompted so far (SAM 2.1's).")
    objects: list[VideoSessionObjectOut] = Field(
        default_factory=list,
        description="The objects prompted so far, with their names, then the objects SAM 3's "
        "video predictor reported (tracker 'sam3').",
    )
    frames_bytes: int = Field(description="Memory the decoded frames hold.")
    tracking_bytes: int = Field(description="Memory the objects' memories and masks hold.")
    busy: bool = Field(description="A prompt or a propagation is running on it now.")
    live: bool = Field(
        False,
        description="A live session: its frames come over /v1/videos/{session_id}/live and "
        "only the newest are held (num_frames: received so far).",
    )
    expires_in_s: float = Field(description="Seconds until it is closed if left idle.")
    model: str


class PropagateDone(BaseModel):
    """The last event of a propagation stream."""

    frames: int = Field(description="Frames streamed.")
    elapsed_ms: float
    frames_per_s: float


class ConceptTrackDone(PropagateDone):
    """The last event of a SAM 3 video tracking stream."""

    stage_seconds: dict[str, float] = Field(
        description="Wall seconds per stage over the frames processed: 'detector' (ViT, "
        "detector, NMS), 'tracker' (track steps, memory encoding, new objects), "
        "'association' (matching, hot start, occlusion, outputs)."
    )
    objects: list[ConceptTrackSpan] = Field(
        description="Every object reported, ascending ids, with its first and last frame."
    )
    dropped_objects: int = Field(
        description="New instances SAM 3 found past the session's room for objects "
        "(max_video_objects), not reported."
    )
    score_thresh: float = Field(description="The detection threshold the run used.")
    new_object_thresh: float = Field(description="The threshold of a new object.")
    max_objects: int = Field(
        description="Objects SAM 3 could track at once: the session's room (count and "
        "bytes); with several phrases, shared out evenly (each phrase max_objects divided by "
        "the phrase count)."
    )
    clicks_applied: int = Field(
        0,
        description="The request's clicks SAM 3 took (then the partial pass: the frames "
        "after the full pass are answers again, the last of a frame final); 0 without.",
    )


def session_out(description: dict[str, Any], model: str) -> VideoSessionOut:
    return VideoSessionOut(**description, model=model)


__all__ = [
    "ConceptTrackDone",
    "ConceptTrackFrameOut",
    "ConceptTrackObjectOut",
    "ConceptTrackRequest",
    "ConceptTrackSpan",
    "LivePromptMessage",
    "LiveVideoRequest",
    "MaskPrompt",
    "ObjectRenameRequest",
    "PropagateDone",
    "PropagateRequest",
    "VideoConceptObjectOut",
    "VideoConceptsRequest",
    "VideoConceptsResponse",
    "VideoFrameOut",
    "VideoObjectOut",
    "VideoPromptRequest",
    "VideoPromptResponse",
    "VideoSessionObjectOut",
    "VideoSessionOut",
    "session_out",
]
