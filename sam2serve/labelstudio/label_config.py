"""A project's labelling config (Label Studio's XML): which tags the backend reads and writes.

The backend writes BrushLabels regions on an Image, reads KeyPointLabels / RectangleLabels
(or KeyPoint / Rectangle) regions as clicks and boxes, and finds the image of a task in
the data field the Image tag's ``value`` names (``$image`` -> ``task["data"]["image"]``).
On a Video it reads and writes VideoRectangle regions (boxes on keyframes, tracked through
the clip), and reads the Video tag's ``frameRate`` (Label Studio numbers frames by it).
With concepts (``labelstudio --concepts``) the label names of a BrushLabels or PolygonLabels
tag are the concept prompts, and that tag is written. Tag names are compared without case,
as Label Studio does.
"""

from __future__ import annotations

import math
import xml.etree.ElementTree as ET
from collections.abc import Mapping
from dataclasses import dataclass, field

BRUSH = "brushlabels"
POLYGON = "polygonlabels"
# The tags concept pre-annotation writes (labelstudio.concept_prompts): their label names
# are the prompts.
CONCEPT_OUTPUTS = (BRUSH, POLYGON)
LABELS = "labels"
PROMPT_TAGS = ("keypointlabels", "keypoint", "rectanglelabels", "rectangle")
IMAGE = "image"
VIDEO = "video"
VIDEO_RECTANGLE = "videorectangle"
# Label Studio's frame rate of a Video tag without frameRate (its documented default).
DEFAULT_FRAME_RATE = 24.0
# A config that works (docs/labelling.md, "Label Studio"): named in every config error.
EXAMPLE_CONFIG = """\
<View>
  <Image name="image" value="$image" zoom="true"/>
  <BrushLabels name="mask" toName="image">
    <Label value="Object" background="#ff0000"/>
  </BrushLabels>
  <KeyPointLabels name="click" toName="image" smart="true">
    <Label value="Object" smart="true" background="#00ff00" showInline="true"/>
  </KeyPointLabels>
  <RectangleLabels name="box" toName="image" smart="true">
    <Label value="Object" background="#0000ff" showInline="true"/>
  </RectangleLabels>
</View>"""
_HINT = "see docs/labelling.md, 'Label Studio', for a config that works"
_VIDEO_HINT = "see docs/labelling.md, 'Video', for a config that works"
_CONCEPT_HINT = "see docs/labelling.md, 'Concept prompts', for a config that works"
_TAG_NAMES = {BRUSH: "BrushLabels", POLYGON: "PolygonLabels"}
# The frame rates taken (Label Studio's frame f is at (f - 1) / rate seconds): within them
# the seek arithmetic of the highest frame number stays finite and inside FFmpeg's int64.
MIN_FRAME_RATE = 0.01
MAX_FRAME_RATE = 1000.0
_RATES = f"a number from {MIN_FRAME_RATE:g} to {MAX_FRAME_RATE:g}"
# A video config that works (docs/labelling.md, "Video").
EXAMPLE_VIDEO_CONFIG = """\
<View>
  <Video name="video" value="$video" frameRate="25"/>
  <VideoRectangle name="box" toName="video" smart="true"/>
  <Labels name="videoLabels" toName="video">
    <Label value="Object" background="#ff0000"/>
  </Labels>
</View>"""


class LabelConfigError(ValueError):
    """The labelling config cannot be used; the message says what it lacks."""


@dataclass(frozen=True)
class ControlTag:
    """A control tag (BrushLabels, KeyPointLabels, ...): its name, the object tags it labels
    and its label values."""

    kind: str  # lower-case tag name
    name: str
    to_names: tuple[str, ...]
    labels: tuple[str, ...]


@dataclass(frozen=True)
class VideoTag:
    """A Video tag: the task data field of its video, and its frame rate: a number, or the
    task data field that holds it (``frameRate="$fps"``)."""

    name: str
    field: str
    frame_rate: float | None
    frame_rate_field: str | None = None

    def frame_rate_of(self, data: dict[str, object]) -> float:
        """The frame rate Label Studio numbers this task's frames by."""
        if self.frame_rate_field is not None:
            value = data.get(self.frame_rate_field)
            rate = frame_rate(value)
            if rate is None:
                raise LabelConfigError(
                    f"the Video tag {self.name!r} takes its frameRate from "
                    f"${self.frame_rate_field}, which is {_shown(value)}; expected {_RATES}"
                )
            return rate
        return self.frame_rate if self.frame_rate is not None else DEFAULT_FRAME_RATE


@dataclass(frozen=True)
class LabelConfig:
    images: dict[str, str]  # Image tag name -> the task data field of its image
    controls: tuple[ControlTag, ...]
    videos: dict[str, VideoTag] = field(default_factory=dict)  # Video tag name -> tag

    def _control(
        self, kind: str, tags: Mapping[str, object], name: str | None
    ) -> ControlTag | None:
        """The first control of ``kind`` labelling a tag of ``tags`` (``name`` if given)."""
        for control in self.controls:
            if control.kind == kind and any(
                target in tags and (name is None or target == name) for target in control.to_names
            ):
                return control
        return None

    def video_rectangle_for(self, video_name: str | None = None) -> ControlTag:
        """The VideoRectangle tag on ``video_name`` (any Video when None)."""
        control = self._control(VIDEO_RECTANGLE, self.videos, video_name)
        if control is not None:
            return control
        where = "a Video" if video_name is None else f"the Video named {video_name!r}"
        raise LabelConfigError(
            f"label_config: no VideoRectangle tag with toName {where}; the backend tracks "
            f"boxes on videos ({_VIDEO_HINT})"
        )

    def labels_on_video(self, video_name: str) -> ControlTag | None:
        """The first Labels tag with labels on the Video ``video_name`` (a VideoRectangle's
        labels are chosen from it), if any."""
        for control in self.controls:
            if control.kind == LABELS and control.labels and video_name in control.to_names:
                return control
        return None

    def video_of(self, control: ControlTag, video_name: str | None = None) -> VideoTag:
        """The Video tag ``control`` labels (``video_name`` if it is one of them)."""
        targets = [t for t in control.to_names if t in self.videos]
        return self.videos[video_name if video_name in targets else targets[0]]

    def brush_for(self, image_name: str | None = None) -> ControlTag:
        """The BrushLabels tag that labels ``image_name`` (any Image when None)."""
        control = self._control(BRUSH, self.images, image_name)
        if control is not None:
            return control
        where = "an Image" if image_name is None else f"the Image named {image_name!r}"
        raise LabelConfigError(
            f"label_config: no BrushLabels tag with toName {where}; the backend answers "
            f"with brush masks ({_HINT})"
        )

    def image_of(self, brush: ControlTag, image_name: str | None = None) -> str:
        """The Image tag ``brush`` draws on (``image_name`` if it is one of them)."""
        targets = [t for t in brush.to_names if t in self.images]
        return image_name if image_name in targets else targets[0]

    def concept_output_for(self, image_name: str | None = None) -> ControlTag:
        """The first BrushLabels or PolygonLabels tag (in the config's order) on
        ``image_name`` (any Image when None): with concepts, its label names are the
        prompts and its regions the answers."""
        for control in self.controls:
            if control.kind in CONCEPT_OUTPUTS and any(
                t in self.images and (image_name is None or t == image_name)
                for t in control.to_names
            ):
                if not control.labels:
                    raise LabelConfigError(
                        f"label_config: the {_TAG_NAMES[control.kind]} tag {control.name!r} "
                        "has no <Label value=...>; with concepts its labels are the prompts"
                    )
                return control
        where = "an Image" if image_name is None else f"the Image named {image_name!r}"
        raise LabelConfigError(
            f"label_config: no BrushLabels or PolygonLabels tag with toName {where}; with "
            f"concepts their label names are the prompts ({_CONCEPT_HINT})"
        )

    def label_for(self, brush: ControlTag, wanted: str | None) -> str:
        """The brush label of a region: the label chosen on the click or box when the
        BrushLabels tag has it, else the tag's first label."""
        return wanted if wanted in brush.labels else brush.labels[0]


def parse_label_config(xml: str, concepts: bool = False) -> LabelConfig:
    """The tags of ``xml``; LabelConfigError when it is not XML or has no image to label.
    ``concepts``: an Image needs a BrushLabels or a PolygonLabels tag with labels (the
    prompts), not necessarily a BrushLabels one."""
    try:
        root = ET.fromstring(xml)
    except ET.ParseError as exc:
        raise LabelConfigError(f"label_config: not valid XML ({exc})") from None
    images: dict[str, str] = {}
    videos: dict[str, VideoTag] = {}
    controls: list[ControlTag] = []
    for element in root.iter():
        kind = str(element.tag).lower()
        name = element.get("name")
        if kind == IMAGE and name:
            value = element.get("value", "")
            if value.startswith("$") and len(value) > 1:
                images[name] = value[1:]
        elif kind == VIDEO and name:
            value = element.get("value", "")
            if value.startswith("$") and len(value) > 1:
                videos[name] = _video_tag(element, name, value[1:])
        elif kind in (BRUSH, POLYGON, VIDEO_RECTANGLE, LABELS, *PROMPT_TAGS) and name:
            to_names = tuple(t.strip() for t in element.get("toName", "").split(",") if t.strip())
            labels = tuple(
                label.get("value", "")
                for label in element
                if str(label.tag).lower() == "label" and label.get("value")
            )
            controls.append(ControlTag(kind, name, to_names, labels))
    if not images and not videos:
        raise LabelConfigError(
            f'label_config: no <Image name=... value="$FIELD"> tag (nor a <Video> one); the '
            f"backend segments images and tracks boxes on videos ({_HINT})"
        )
    config = LabelConfig(images, tuple(controls), videos)
    if videos:
        config.video_rectangle_for()  # a Video needs a VideoRectangle to write
        if not any(control.kind == BRUSH for control in controls):
            return config  # images without brushes: their tasks answer 422 when asked
    if not images:
        return config
    if concepts:
        config.concept_output_for()
        return config
    brush = config.brush_for()
    if not brush.labels:
        raise LabelConfigError(
            f"label_config: the BrushLabels tag {brush.name!r} has no <Label value=...>; a "
            "brush region needs a label"
        )
    return config


def _video_tag(element: ET.Element, name: str, field_name: str) -> VideoTag:
    """A Video tag; its frameRate (``frameRate`` or ``framerate``) a number or ``$field``."""
    raw = element.get("frameRate", element.get("framerate"))
    if raw is None:
        return VideoTag(name, field_name, None)
    raw = raw.strip()
    if raw.startswith("$") and len(raw) > 1:
        return VideoTag(name, field_name, None, raw[1:])
    rate = frame_rate(raw)
    if rate is None:
        raise LabelConfigError(
            f"label_config: the Video tag {name!r} has frameRate {_shown(raw)}; expected "
            f"{_RATES}, or $FIELD"
        )
    return VideoTag(name, field_name, rate)


def frame_rate(value: object) -> float | None:
    """``value`` as a frame rate within MIN_FRAME_RATE..MAX_FRAME_RATE; None otherwise (not
    a number, NaN, infinite, zero, negative, too small or too large; a bool is no rate)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        return None
    if isinstance(value, str) and len(value) > 64:  # float() of a long digit string is slow
        return None
    try:
        rate = float(value)
    except (ValueError, OverflowError):  # OverflowError: an int too large for a float
        return None
    return rate if math.isfinite(rate) and MIN_FRAME_RATE <= rate <= MAX_FRAME_RATE else None


def _shown(value: object) -> str:
    text = repr(value) if isinstance(value, str) else str(value)[:40]
    return text if len(text) <= 42 else text[:39] + "..."


__all__ = [
    "CONCEPT_OUTPUTS",
    "DEFAULT_FRAME_RATE",
    "EXAMPLE_CONFIG",
    "EXAMPLE_VIDEO_CONFIG",
    "MIN_FRAME_RATE",
    "POLYGON",
    "ControlTag",
    "LabelConfig",
    "LabelConfigError",
    "VideoTag",
    "frame_rate",
    "parse_label_config",
]
