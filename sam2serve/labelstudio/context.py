"""The annotator's interaction (Label Studio's ``context``) as one SAM prompt.

Every click (KeyPointLabels / KeyPoint) and box (RectangleLabels / Rectangle) of the
context prompts one object: clicks are positive unless Label Studio marked them
``is_positive: false`` (an Alt-click in its editor); of several boxes the last one drawn
counts (SAM takes one box per object). Coordinates stay in percent until the image's size
is known, then become pixels: ``x% of the width``, whatever size the context claims
(a percentage does not depend on it). Rotated images or boxes are refused: the editor's
rotation is not SAM's frame.
"""

from __future__ import annotations

from dataclasses import dataclass

from sam2serve.engine.prompts import BACKGROUND, FOREGROUND, Prompt
from sam2serve.labelstudio.protocol import Context, ContextRegion
from sam2serve.server.errors import ApiError

KEYPOINT_TYPES = ("keypointlabels", "keypoint")
BOX_TYPES = ("rectanglelabels", "rectangle")
# Label Studio's percentages may overshoot 100 by rounding: tolerated, then clamped.
_PERCENT_SLACK = 1e-3


@dataclass(frozen=True)
class PercentPoint:
    x: float
    y: float
    positive: bool


@dataclass(frozen=True)
class PercentBox:
    x0: float
    y0: float
    x1: float
    y1: float

    def in_pixels(self, width: int, height: int) -> tuple[float, float, float, float]:
        """``[x0, y0, x1, y1]`` on a ``width`` x ``height`` image: ``x% of the width``."""
        return (
            self.x0 / 100 * width,
            self.y0 / 100 * height,
            self.x1 / 100 * width,
            self.y1 / 100 * height,
        )


@dataclass(frozen=True)
class ClickPrompt:
    """An object's prompt in percent of the image, with the label the annotator chose and
    the Image tag the regions are on."""

    points: tuple[PercentPoint, ...]
    box: PercentBox | None
    label: str | None
    image_name: str | None

    @property
    def single_click(self) -> bool:
        """One click and no box: ambiguous, so SAM's best of three masks answers it."""
        return len(self.points) == 1 and self.box is None

    def in_pixels(self, width: int, height: int) -> Prompt:
        """The prompt on a ``width`` x ``height`` image, as the engine's Prompt."""
        points = [(p.x / 100 * width, p.y / 100 * height) for p in self.points]
        labels = [FOREGROUND if p.positive else BACKGROUND for p in self.points]
        box = list(self.box.in_pixels(width, height)) if self.box is not None else None
        return Prompt(points, labels, box)


def prompt_from_context(context: Context) -> ClickPrompt | None:
    """The prompt of the context's regions; None when it has none. Every bad region is a
    422 naming it (``context.result[i]``) and what is accepted."""
    points: list[PercentPoint] = []
    box: PercentBox | None = None
    label: str | None = None
    image_name: str | None = None
    for i, region in enumerate(context.result):
        where = f"context.result[{i}]"
        kind = region.type.lower()
        if kind not in (*KEYPOINT_TYPES, *BOX_TYPES):
            raise _bad(
                f"{where}.type: {region.type!r} is not a prompt; accepted: "
                f"{', '.join((*KEYPOINT_TYPES, *BOX_TYPES))}"
            )
        check_unrotated(region, where)
        if image_name is not None and region.to_name not in (None, image_name):
            raise _bad(
                f"{where}.to_name: {region.to_name!r}, but earlier regions are on "
                f"{image_name!r}; one prediction is on one image"
            )
        image_name = region.to_name or image_name
        label = _label_of(region) or label
        if kind in KEYPOINT_TYPES:
            x, y = (
                _percent(region.value.x, f"{where}.value.x"),
                _percent(region.value.y, f"{where}.value.y"),
            )
            points.append(PercentPoint(x, y, region.is_positive is not False))
        else:
            box = percent_box(region, where)
    if not points and box is None:
        return None
    return ClickPrompt(tuple(points), box, label, image_name)


def check_unrotated(region: ContextRegion, where: str) -> None:
    """422 for a region on a rotated image: the editor's rotation is not SAM's frame."""
    if region.image_rotation:
        raise _bad(
            f"{where}.image_rotation: {region.image_rotation:g} degrees; the backend "
            "takes clicks on the unrotated image only (rotation 0)"
        )


def percent_box(region: ContextRegion, where: str) -> PercentBox:
    """A rectangle region's box in percent of the image (corners clamped to 0..100); a
    rotated, incomplete, negative or outside one is a 422 naming ``where``."""
    value = region.value
    if value.rotation:
        raise _bad(
            f"{where}.value.rotation: {value.rotation:g} degrees; SAM takes axis-aligned "
            "boxes only (rotation 0)"
        )
    if value.width is None or value.height is None:
        raise _bad(f"{where}.value: a rectangle needs width and height (percent of the image)")
    if value.x is None or value.y is None:
        raise _bad(f"{where}.value: a rectangle needs x and y (percent of the image)")
    if value.width < 0 or value.height < 0:
        raise _bad(f"{where}.value: width {value.width:g} and height {value.height:g} must be >= 0")
    x0 = _percent(value.x, f"{where}.value.x")
    y0 = _percent(value.y, f"{where}.value.y")
    x1 = _percent(value.x + value.width, f"{where}.value.x + width")
    y1 = _percent(value.y + value.height, f"{where}.value.y + height")
    return PercentBox(x0, y0, x1, y1)


def _percent(value: float | None, where: str) -> float:
    if value is None:
        raise _bad(f"{where}: missing; a click and a box have x and y (percent of the image)")
    if not -_PERCENT_SLACK <= value <= 100 + _PERCENT_SLACK:
        raise _bad(f"{where}: {value:g} is outside the image; accepted: 0 to 100 (percent)")
    return min(max(value, 0.0), 100.0)


def _label_of(region: ContextRegion) -> str | None:
    value = region.value
    labels = value.keypointlabels or value.rectanglelabels or value.labels or []
    return labels[0] if labels else None


def _bad(message: str) -> ApiError:
    return ApiError(422, "invalid_request", message)


__all__ = [
    "ClickPrompt",
    "PercentBox",
    "PercentPoint",
    "check_unrotated",
    "percent_box",
    "prompt_from_context",
]
