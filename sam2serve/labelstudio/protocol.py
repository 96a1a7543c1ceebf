"""Label Studio's ML backend protocol: the bodies it sends and the answers it reads.

Label Studio (``label_studio/ml/api_connector.py``) calls, on the backend's URL:

- ``GET /health``: is it up (1 s timeout);
- ``POST /setup`` ``{project, schema, hostname, access_token, extra_params}``: on connect
  and before predictions; answered with ``{model_version}`` (3 s timeout);
- ``POST /predict`` ``{tasks, project, label_config, params: {login, password, context}}``:
  ``context`` is the annotator's interaction (``{"result": [regions]}``) for interactive
  pre-annotation, absent when Label Studio pre-annotates tasks; answered with
  ``{results: [one prediction per task], model_version}``, a prediction being
  ``{result: [regions], score, model_version}``;
- ``GET /versions``, ``POST /webhook``.

Label Studio adds fields of its own to all of these; the models accept and ignore them.
A region's coordinates are percentages of the image's width and height. Every string the
backend reads has a length limit (below); the body as a whole has the service's limits
(bytes, JSON items and depth: :mod:`sam2serve.server.request_body`).
"""

from __future__ import annotations

import math
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

# The longest labelling config read (in /predict's label_config and /setup's schema): a
# config of thousands of labels is tens of KB.
MAX_LABEL_CONFIG_CHARS = 1_000_000
MAX_PROJECT_CHARS = 256
MAX_HOSTNAME_CHARS = 2048
MAX_TOKEN_CHARS = 4096
MAX_NAME_CHARS = 256  # a tag's name, a region's type, a label
# The largest frame number read (a day of video at 1000 frames per second is 86.4 M).
MAX_FRAME_NUMBER = 100_000_000
# /setup's largest body: a labelling config JSON-escaped (twice its characters at worst)
# and the short fields.
SETUP_BODY_BYTES = 2 * MAX_LABEL_CONFIG_CHARS + 64 * 1024

Name = Annotated[str, Field(max_length=MAX_NAME_CHARS)]
# A TextArea entry: concept prompts check it finer (labelstudio/concept_prompts.py: at most
# --concept-max-labels phrases of 64 characters, <= 1,000 x 65); this bounds any entry.
MAX_TEXT_CHARS = 65_536
MAX_TEXT_ENTRIES = 1_000
Text = Annotated[str, Field(max_length=MAX_TEXT_CHARS)]


class _Open(BaseModel):
    """A body part Label Studio may extend: unknown fields are kept, not refused."""

    model_config = ConfigDict(extra="allow")


class Keyframe(_Open):
    """One keyframe of a VideoRectangle: the box on one frame, in percent of the frame."""

    frame: int = Field(ge=1, le=MAX_FRAME_NUMBER, description="Label Studio's frame, from 1.")
    x: float = Field(description="Left, % of the frame's width.")
    y: float = Field(description="Top, % of the frame's height.")
    width: float = Field(description="% of the frame's width.")
    height: float = Field(description="% of the frame's height.")
    rotation: float = Field(0.0, description="Degrees (must be 0).")
    enabled: bool = Field(True, description="False: the object is hidden from this frame on.")
    time: float | None = Field(None, description="Seconds (Label Studio's frame / frame rate).")

    @field_validator("x", "y", "width", "height", "rotation", "time")
    @classmethod
    def _finite(cls, value: float | None) -> float | None:
        if value is not None and not math.isfinite(value):
            raise ValueError("must be a finite number")
        return value


class RegionValue(_Open):
    """Where a region is, in percent of the image, and its labels (a VideoRectangle: its
    keyframes)."""

    x: float | None = Field(
        None, description="Left (rectangle) or position (keypoint), % of width."
    )
    y: float | None = Field(
        None, description="Top (rectangle) or position (keypoint), % of height."
    )
    width: float | None = Field(None, description="Rectangle width, % of image width.")
    height: float | None = Field(None, description="Rectangle height, % of image height.")
    rotation: float = Field(0.0, description="Rectangle rotation in degrees (must be 0).")
    keypointlabels: list[Name] | None = None
    rectanglelabels: list[Name] | None = None
    labels: list[Name] | None = Field(
        None, description="The label names Label Studio's smart tools add to their regions."
    )
    sequence: list[Keyframe] | None = Field(
        None, description="VideoRectangle: the keyframes (boxes on frames)."
    )
    framesCount: int | None = Field(  # Label Studio's name
        None, ge=0, le=MAX_FRAME_NUMBER, description="VideoRectangle: the video's frames."
    )
    duration: float | None = Field(None, ge=0, description="VideoRectangle: seconds.")
    text: Annotated[list[Text], Field(max_length=MAX_TEXT_ENTRIES)] | Text | None = Field(
        None,
        description="TextArea: the text typed, one entry per submission (with --concepts: "
        "the concept prompt, phrases split at commas and line breaks).",
    )

    @field_validator("x", "y", "width", "height", "rotation")
    @classmethod
    def _finite(cls, value: float | None) -> float | None:
        if value is not None and not math.isfinite(value):
            raise ValueError("must be a finite number")
        return value


class ContextRegion(_Open):
    """One region of the annotator's interaction: a click, a box, or a box on a video's
    keyframes."""

    id: Name | None = Field(None, description="The region's id (a VideoRectangle keeps it).")
    type: Name = Field(description="keypointlabels, keypoint, rectanglelabels or rectangle.")
    value: RegionValue
    is_positive: bool | None = Field(
        None, description="Keypoints: true for a positive click, false for a negative one."
    )
    from_name: Name | None = None
    to_name: Name | None = Field(None, description="The Image tag the region is on.")
    original_width: int | None = None
    original_height: int | None = None
    image_rotation: float = 0.0


class Context(_Open):
    result: list[ContextRegion] = Field(default_factory=list)


class PredictParams(_Open):
    context: Context | None = None


class Task(_Open):
    id: int | None = None
    data: dict[str, Any] = Field(description="The task's data; the image URL is one field.")


class PredictRequest(_Open):
    tasks: list[Task] = Field(min_length=1)
    project: str | None = Field(
        None, max_length=MAX_PROJECT_CHARS, description="'<project id>.<created timestamp>'."
    )
    label_config: str = Field(
        min_length=1,
        max_length=MAX_LABEL_CONFIG_CHARS,
        description="The project's labelling config.",
    )
    params: PredictParams = Field(default_factory=PredictParams)

    @field_validator("project", mode="before")
    @classmethod
    def _project_as_text(cls, value: Any) -> Any:
        return str(value) if isinstance(value, int) else value


class SetupRequest(_Open):
    project: str | None = Field(None, max_length=MAX_PROJECT_CHARS)
    schema_: str | None = Field(
        None, alias="schema", max_length=MAX_LABEL_CONFIG_CHARS, description="The labelling config."
    )
    hostname: str | None = Field(
        None,
        max_length=MAX_HOSTNAME_CHARS,
        description="Label Studio's address, for its files: used only when the backend has "
        "no --label-studio-url and its operator allowed this host (--allow-fetch-host).",
    )
    access_token: str | None = Field(
        None,
        max_length=MAX_TOKEN_CHARS,
        description="A token to read Label Studio's files, sent only to Label Studio's address.",
    )

    @field_validator("project", mode="before")
    @classmethod
    def _project_as_text(cls, value: Any) -> Any:
        return str(value) if isinstance(value, int) else value


class Prediction(BaseModel):
    result: list[dict[str, Any]] = Field(description="Regions, in Label Studio's format.")
    score: float | None = Field(None, description="Mean score of the regions.")
    model_version: str


class PredictResponse(BaseModel):
    results: list[Prediction] = Field(description="One prediction per task, in order.")
    model_version: str


class SetupResponse(BaseModel):
    model_version: str


class HealthResponse(BaseModel):
    status: str = Field("UP", description="Always 'UP' when the process answers.")
    model_class: str = "sam2serve"
    model_version: str
    ready: bool = Field(description="The model is loaded and warmed up.")


class VersionsResponse(BaseModel):
    versions: list[str]


def project_id(project: str | None) -> str | None:
    """Label Studio's project id from its ``'<id>.<timestamp>'`` uid."""
    return None if project is None else project.split(".", 1)[0]


__all__ = [
    "MAX_LABEL_CONFIG_CHARS",
    "MAX_NAME_CHARS",
    "SETUP_BODY_BYTES",
    "Context",
    "ContextRegion",
    "HealthResponse",
    "Keyframe",
    "PredictParams",
    "PredictRequest",
    "PredictResponse",
    "Prediction",
    "RegionValue",
    "SetupRequest",
    "SetupResponse",
    "Task",
    "VersionsResponse",
    "project_id",
]
