"""A project's labelling config (Label Studio's XML): which tags the backend reads and writes.

The backend writes BrushLabels regions on an Image, reads KeyPointLabels / RectangleLabels
(or KeyPoint / Rectangle) regions as clicks and boxes, and finds the image of a task in
the data field the Image tag's ``value`` names (``$image`` -> ``task["data"]["image"]``).
Tag names are compared without case, as Label Studio does.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import dataclass

BRUSH = "brushlabels"
PROMPT_TAGS = ("keypointlabels", "keypoint", "rectanglelabels", "rectangle")
IMAGE = "image"
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
class LabelConfig:
    images: dict[str, str]  # Image tag name -> the task data field of its image
    controls: tuple[ControlTag, ...]

    def brush_for(self, image_name: str | None = None) -> ControlTag:
        """The BrushLabels tag that labels ``image_name`` (any Image when None)."""
        for control in self.controls:
            if control.kind != BRUSH:
                continue
            if any(
                target in self.images and (image_name is None or target == image_name)
                for target in control.to_names
            ):
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

    def label_for(self, brush: ControlTag, wanted: str | None) -> str:
        """The brush label of a region: the label chosen on the click or box when the
        BrushLabels tag has it, else the tag's first label."""
        return wanted if wanted in brush.labels else brush.labels[0]


def parse_label_config(xml: str) -> LabelConfig:
    """The tags of ``xml``; LabelConfigError when it is not XML or has no image to label."""
    try:
        root = ET.fromstring(xml)
    except ET.ParseError as exc:
        raise LabelConfigError(f"label_config: not valid XML ({exc})") from None
    images: dict[str, str] = {}
    controls: list[ControlTag] = []
    for element in root.iter():
        kind = str(element.tag).lower()
        name = element.get("name")
        if kind == IMAGE and name:
            value = element.get("value", "")
            if value.startswith("$") and len(value) > 1:
                images[name] = value[1:]
        elif kind in (BRUSH, *PROMPT_TAGS) and name:
            to_names = tuple(t.strip() for t in element.get("toName", "").split(",") if t.strip())
            labels = tuple(
                label.get("value", "")
                for label in element
                if str(label.tag).lower() == "label" and label.get("value")
            )
            controls.append(ControlTag(kind, name, to_names, labels))
    if not images:
        raise LabelConfigError(
            f'label_config: no <Image name=... value="$FIELD"> tag; the backend segments '
            f"images ({_HINT})"
        )
    config = LabelConfig(images, tuple(controls))
    brush = config.brush_for()
    if not brush.labels:
        raise LabelConfigError(
            f"label_config: the BrushLabels tag {brush.name!r} has no <Label value=...>; a "
            "brush region needs a label"
        )
    return config


__all__ = [
    "EXAMPLE_CONFIG",
    "ControlTag",
    "LabelConfig",
    "LabelConfigError",
    "parse_label_config",
]
