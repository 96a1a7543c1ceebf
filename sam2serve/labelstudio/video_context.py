"""The annotator's VideoRectangle regions (Label Studio's ``context`` on a video) as one
tracking prompt per object.

Every VideoRectangle region of the context is one object: its enabled keyframes are box
prompts on their frames (Label Studio numbers frames from 1); a region with none (hidden
from its first keyframe on) has nothing to track and is left out. Boxes stay in percent
of the frame until the video's size is known. Rotated boxes are refused (SAM takes
axis-aligned boxes only), as are regions of other types mixed in and regions on two
different Video tags.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sam2serve.labelstudio.context import PercentBox
from sam2serve.labelstudio.protocol import Context, Keyframe
from sam2serve.server.errors import ApiError

VIDEO_BOX_TYPE = "videorectangle"
# Label Studio's percentages may overshoot 100 by rounding: tolerated, then clamped.
_PERCENT_SLACK = 1e-3


@dataclass(frozen=True)
class KeyBox:
    """A box prompt: on Label Studio's ``frame`` (from 1), in percent of the frame."""

    frame: int
    box: PercentBox


@dataclass(frozen=True)
class TrackPrompt:
    """One object to track: its region (id, tags, labels, keyframes as sent) and the boxes
    that prompt it, in frame order."""

    region_id: str
    from_name: str | None
    to_name: str | None
    labels: tuple[str, ...]
    boxes: tuple[KeyBox, ...]
    sequence: tuple[Keyframe, ...]  # the region's keyframes as sent (kept in the answer)
    frames_count: int | None
    duration: float | None

    @property
    def first_frame(self) -> int:
        return self.boxes[0].frame


def is_video_context(context: Context | None) -> bool:
    """Whether the context holds VideoRectangle regions (a video task's interaction)."""
    return context is not None and any(
        region.type.lower() == VIDEO_BOX_TYPE for region in context.result
    )


def track_prompts(context: Context) -> list[TrackPrompt]:
    """The objects of the context's VideoRectangle regions (those with an enabled keyframe);
    every bad region is a 422 naming it (``context.result[i]``)."""
    prompts: list[TrackPrompt] = []
    video_name: str | None = None
    seen_ids: set[str] = set()
    for i, region in enumerate(context.result):
        where = f"context.result[{i}]"
        if region.type.lower() != VIDEO_BOX_TYPE:
            raise _bad(
                f"{where}.type: {region.type!r} next to VideoRectangle regions; a video's "
                f"interaction is boxes on keyframes ({VIDEO_BOX_TYPE}) only"
            )
        if video_name is not None and region.to_name not in (None, video_name):
            raise _bad(
                f"{where}.to_name: {region.to_name!r}, but earlier regions are on "
                f"{video_name!r}; one prediction is on one video"
            )
        video_name = region.to_name or video_name
        value = region.value
        if not value.sequence:
            raise _bad(f"{where}.value.sequence: a VideoRectangle needs its keyframes")
        region_id = region.id or f"region{i}"
        if region_id in seen_ids:
            raise _bad(f"{where}.id: {region_id!r} is the id of an earlier region too")
        seen_ids.add(region_id)
        boxes: dict[int, KeyBox] = {}
        for k, keyframe in enumerate(value.sequence):
            at = f"{where}.value.sequence[{k}]"
            if keyframe.rotation:
                raise _bad(
                    f"{at}.rotation: {keyframe.rotation:g} degrees; SAM takes axis-aligned "
                    "boxes only (rotation 0)"
                )
            box = _box(keyframe, at)
            if keyframe.enabled:
                boxes[keyframe.frame] = KeyBox(keyframe.frame, box)
            else:
                boxes.pop(keyframe.frame, None)
        if not boxes:
            continue  # hidden from its first keyframe: nothing to track
        labels = tuple(value.labels or value.rectanglelabels or ())
        prompts.append(
            TrackPrompt(
                region_id=region_id,
                from_name=region.from_name,
                to_name=region.to_name,
                labels=labels,
                boxes=tuple(boxes[frame] for frame in sorted(boxes)),
                sequence=tuple(value.sequence),
                frames_count=value.framesCount,
                duration=value.duration,
            )
        )
    return prompts


def _box(keyframe: Keyframe, where: str) -> PercentBox:
    if keyframe.width < 0 or keyframe.height < 0:
        raise _bad(f"{where}: width {keyframe.width:g} and height {keyframe.height:g} must be >= 0")
    return PercentBox(
        _percent(keyframe.x, f"{where}.x"),
        _percent(keyframe.y, f"{where}.y"),
        _percent(keyframe.x + keyframe.width, f"{where}.x + width"),
        _percent(keyframe.y + keyframe.height, f"{where}.y + height"),
    )


def _percent(value: float, where: str) -> float:
    if not -_PERCENT_SLACK <= value <= 100 + _PERCENT_SLACK:
        raise _bad(f"{where}: {value:g} is outside the frame; accepted: 0 to 100 (percent)")
    return min(max(value, 0.0), 100.0)


def keyframe_dict(keyframe: Keyframe) -> dict[str, Any]:
    """A keyframe as Label Studio sent it (its own extra fields kept)."""
    return keyframe.model_dump(exclude_none=True)


def _bad(message: str) -> ApiError:
    return ApiError(422, "invalid_request", message)


__all__ = [
    "VIDEO_BOX_TYPE",
    "KeyBox",
    "TrackPrompt",
    "is_video_context",
    "keyframe_dict",
    "track_prompts",
]
