"""The frames of a video task that one request tracks: from Label Studio's first keyframe
on, at most a number of them, each with its Label Studio frame number.

A task's video is fetched whole (within ``max_video_upload_bytes``) and read from memory
with PyAV, by the one reader of video containers
(:class:`~sam2serve.engine.video_io.VideoReader`: its limits, checks and errors). Its frame size is read from the stream's header first (FFmpeg's probing may not
allocate a frame past ``max_pixels``), so the caller bounds and reserves the frames it will
hold before one is decoded. Then the video is sought to the last keyframe (of its codec)
before Label Studio's first keyframe, and the frames decoded in order: those before it
are dropped (at most ``max_skipped`` of them), the next ``max_frames`` kept. A video that
cannot be sought (no timestamps, a container without an index) is decoded from the start,
within the same ``max_skipped``.

Label Studio numbers frames from 1 at its Video tag's frame rate, whatever the file's:
a decoded frame at ``t`` seconds (its timestamp, from the stream's start) is Label
Studio's frame ``round(t * rate) + 1``, and Label Studio's frame ``f`` is at
``(f - 1) / rate`` seconds.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

import numpy as np

from sam2serve.engine.video_io import (
    VideoDecodeError,
    VideoError,
    VideoLimitError,
    VideoReader,
    as_rgb,
)


@dataclass(frozen=True)
class ClipHeader:
    """What the video stream declares: its frame size and rate."""

    width: int
    height: int
    fps: float | None


@dataclass(frozen=True)
class ClipWindow:
    """The frames kept (uint8 RGB, one size) and each one's Label Studio frame."""

    frames: list[np.ndarray]
    ls_frames: list[int]

    @property
    def size(self) -> tuple[int, int]:
        """(height, width)."""
        height, width = self.frames[0].shape[:2]
        return height, width

    @property
    def nbytes(self) -> int:
        return sum(frame.nbytes for frame in self.frames)

    def index_of(self, ls_frame: int) -> int | None:
        """The kept frame nearest to Label Studio's ``ls_frame`` (the earlier of two as
        near); None when it lies outside the kept frames, more than half their spacing
        before the first or after the last. A binary search: a request may name many
        keyframes."""
        frames = self.ls_frames
        at = bisect.bisect_left(frames, ls_frame)
        candidates = [i for i in (at - 1, at) if 0 <= i < len(frames)]
        best = min(candidates, key=lambda i: (abs(frames[i] - ls_frame), i))
        spacing = max(1, frames[-1] - frames[0]) / max(1, len(frames) - 1)
        outside = ls_frame < frames[0] or ls_frame > frames[-1]
        if outside and abs(frames[best] - ls_frame) > spacing / 2:
            return None
        return best


def read_header(data: bytes, name: str, max_pixels: int) -> ClipHeader:
    """The video's frame size and rate, nothing decoded; VideoLimitError past
    ``max_pixels``, VideoError when it is no video."""
    with VideoReader(data, name, max_pixels=max_pixels) as video:
        return ClipHeader(video.width, video.height, video.fps)


def decode_window(
    data: bytes,
    name: str,
    header: ClipHeader,
    *,
    frame_rate: float,
    first_frame: int,
    max_frames: int,
    max_skipped: int,
    max_pixels: int,
) -> ClipWindow:
    """The frames from Label Studio's ``first_frame`` on (the one nearest to it first), at
    most ``max_frames``; VideoLimitError when more than ``max_skipped`` frames are decoded
    before it, VideoError when the video ends before it. A start past the first frame is
    sought (to the keyframe before it), unless the container cannot seek or its frames
    have no timestamps: then the frames are decoded from the start."""
    plan = _Plan(name, header, frame_rate, first_frame, max_frames, max_skipped, max_pixels)
    if plan.start > 0:
        try:
            return _decode(data, plan, seek=True)
        except _SeekFailed:
            pass
    return _decode(data, plan, seek=False)


@dataclass(frozen=True)
class _Plan:
    name: str
    header: ClipHeader
    frame_rate: float
    first_frame: int
    max_frames: int
    max_skipped: int
    max_pixels: int

    @property
    def start(self) -> float:
        """Seconds from the stream's start to Label Studio's first frame."""
        return (self.first_frame - 1) / self.frame_rate

    @property
    def tolerance(self) -> float:
        """Half the shorter of a file frame and a Label Studio frame, in seconds."""
        return 0.5 / max(self.header.fps or self.frame_rate, self.frame_rate)


class _SeekFailed(Exception):
    """Seeking did not land on or before the start: decode from the beginning."""


def _decode(data: bytes, plan: _Plan, *, seek: bool) -> ClipWindow:
    name, header = plan.name, plan.header
    file_rate = header.fps or plan.frame_rate
    frames: list[np.ndarray] = []
    ls_frames: list[int] = []
    skipped = 0
    try:
        with VideoReader(data, name, max_pixels=plan.max_pixels) as video:
            if (video.width, video.height) != (header.width, header.height):
                raise VideoError(
                    f"{name!r} declares {video.width}x{video.height} now, "
                    f"{header.width}x{header.height} when its header was read"
                )
            origin = video.origin
            if seek:
                _seek(video, plan.start + origin)
            for index, frame in enumerate(video.frames()):
                if frame.time is None and seek:
                    raise _SeekFailed
                seconds = frame.time - origin if frame.time is not None else index / file_rate
                if seek and index == 0 and seconds > plan.start + plan.tolerance:
                    raise _SeekFailed  # landed after the start
                if seconds < plan.start - plan.tolerance:
                    skipped += 1
                    if skipped > plan.max_skipped:
                        raise VideoLimitError(
                            f"{name!r}: Label Studio's frame {plan.first_frame} comes after "
                            f"more than {plan.max_skipped} frames (max_video_frames) from "
                            "the nearest point the video can be sought to: the backend "
                            "decodes at most that many frames before the first keyframe"
                        )
                    continue
                frames.append(as_rgb(frame))
                ls_frames.append(round(max(seconds, 0.0) * plan.frame_rate) + 1)
                if len(frames) >= plan.max_frames:
                    break
    except VideoDecodeError:  # what PyAV raised on a file cut short or corrupt
        if seek:
            raise _SeekFailed from None
        raise
    if not frames:
        if seek:
            raise _SeekFailed
        raise VideoError(
            f"{name!r} has no frame at Label Studio's frame {plan.first_frame} or later (at "
            f"{plan.frame_rate:g} frames per second, the Video tag's frameRate)"
        )
    return ClipWindow(frames, ls_frames)


def _seek(video: VideoReader, seconds: float) -> None:
    """To the stream's last keyframe at or before ``seconds`` (its own clock)."""
    if video.stream.time_base is None:
        raise _SeekFailed
    try:
        video.seek(int(seconds / video.stream.time_base))
    except (OSError, ValueError, TypeError, OverflowError):  # past int64: a start far out
        raise _SeekFailed from None


__all__ = ["ClipHeader", "ClipWindow", "decode_window", "read_header"]
