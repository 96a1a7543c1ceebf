"""Tracked boxes as Label Studio's VideoRectangle region.

A VideoRectangle is a sequence of keyframes, each ``{frame, x, y, width, height, rotation,
enabled, time}``: ``frame`` is Label Studio's frame number (from 1, counted at the Video
tag's frame rate), ``time`` that frame over the frame rate (as Label Studio's editor
writes it), the box in percent of the frame. Between two enabled keyframes the editor
interpolates the box; a keyframe with ``enabled: false`` hides the object from that frame
until the next enabled one.

The answer for one object: a keyframe on every tracked frame where its mask is not empty
(the mask's bounding box), one disabled keyframe on the first frame of each absence, and
the annotator's own keyframes kept as sent (on their frames they win, and the frames they
hide stay hidden). An object SAM 3 found from a phrase (:func:`concept_track_region`) has
no keyframes of the annotator: its tracked ones are its sequence, with its label, its
detection score and a note naming the phrase and the object. Torch-free: it takes boxes,
not masks.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from typing import Any

from sam2serve.labelstudio.protocol import Keyframe
from sam2serve.labelstudio.video_context import VIDEO_BOX_TYPE, TrackPrompt, keyframe_dict

# Decimals of a percentage written (1e-4 % of 10,000 pixels is one pixel).
_DECIMALS = 4

PixelBox = Sequence[float]  # COCO's [x, y, width, height] in pixels


def tracked_keyframes(
    boxes: Sequence[PixelBox | None],
    frames: Sequence[int],
    width: int,
    height: int,
    frame_rate: float,
) -> list[dict[str, Any]]:
    """The keyframes of one object tracked on Label Studio's ``frames`` (one per box, in
    order): its box where it is seen (None: not seen), and ``enabled: false`` on the first
    frame of each absence after it was seen. Of two boxes on the same Label Studio frame
    (a video faster than the Video tag's frame rate) the first counts."""
    keyframes: list[dict[str, Any]] = []
    last: dict[str, float] | None = None
    visible = False
    done: set[int] = set()
    for box, frame in zip(boxes, frames, strict=True):
        if frame in done:
            continue
        done.add(frame)
        if box is not None:
            last = _percent_box(box, width, height)
            keyframes.append(_keyframe(frame, last, True, frame_rate))
            visible = True
        elif visible and last is not None:
            keyframes.append(_keyframe(frame, last, False, frame_rate))
            visible = False
    return keyframes


def video_region(
    prompt: TrackPrompt,
    tracked: list[dict[str, Any]],
    from_name: str,
    to_name: str,
) -> dict[str, Any]:
    """The object's VideoRectangle region: ``tracked`` merged with the region's own
    keyframes (which win on their frames; tracked ones on frames they hide are dropped)."""
    own = {keyframe.frame: keyframe_dict(keyframe) for keyframe in prompt.sequence}
    hidden = _hidden_spans(prompt.sequence)
    merged = {
        keyframe["frame"]: keyframe
        for keyframe in tracked
        if keyframe["frame"] not in own and not _inside(keyframe["frame"], hidden)
    }
    merged.update(own)
    value: dict[str, Any] = {"sequence": [merged[frame] for frame in sorted(merged)]}
    if prompt.frames_count is not None:
        value["framesCount"] = prompt.frames_count
    if prompt.duration is not None:
        value["duration"] = prompt.duration
    if prompt.labels:
        value["labels"] = list(prompt.labels)
    return {
        "id": prompt.region_id,
        "from_name": prompt.from_name or from_name,
        "to_name": prompt.to_name or to_name,
        "type": VIDEO_BOX_TYPE,
        "value": value,
        "readonly": False,
    }


def concept_track_region(
    tracked: list[dict[str, Any]],
    from_name: str,
    to_name: str,
    label: str | None,
    score: float,
    note: str,
) -> dict[str, Any]:
    """A VideoRectangle region of one object found by a concept prompt: its tracked
    keyframes, its label (none without a Labels tag), its score, and ``note`` as the
    region's meta text (shown with the region in Label Studio's editor)."""
    value: dict[str, Any] = {"sequence": tracked}
    if label is not None:
        value["labels"] = [label]
    return {
        "id": secrets.token_hex(5),
        "from_name": from_name,
        "to_name": to_name,
        "type": VIDEO_BOX_TYPE,
        "value": value,
        "meta": {"text": [note]},
        "score": float(score),
        "readonly": False,
    }


def _percent_box(box: PixelBox, width: int, height: int) -> dict[str, float]:
    x, y, w, h = (float(v) for v in box)
    return {
        "x": round(x / width * 100, _DECIMALS),
        "y": round(y / height * 100, _DECIMALS),
        "width": round(w / width * 100, _DECIMALS),
        "height": round(h / height * 100, _DECIMALS),
    }


def _keyframe(
    frame: int, box: dict[str, float], enabled: bool, frame_rate: float
) -> dict[str, Any]:
    return {
        "frame": frame,
        **box,
        "rotation": 0,
        "enabled": enabled,
        "time": frame / frame_rate,
    }


def _hidden_spans(sequence: Sequence[Keyframe]) -> list[tuple[int, int | None]]:
    """The frames the annotator's keyframes hide: from each disabled keyframe to the next
    enabled one (None: to the end)."""
    latest: dict[int, bool] = {}
    for keyframe in sequence:
        latest[keyframe.frame] = keyframe.enabled
    spans: list[tuple[int, int | None]] = []
    start: int | None = None
    for frame in sorted(latest):
        if not latest[frame] and start is None:
            start = frame
        elif latest[frame] and start is not None:
            spans.append((start, frame))
            start = None
    if start is not None:
        spans.append((start, None))
    return spans


def _inside(frame: int, spans: list[tuple[int, int | None]]) -> bool:
    return any(start <= frame and (end is None or frame < end) for start, end in spans)


__all__ = ["concept_track_region", "tracked_keyframes", "video_region"]
