"""A video task's clip for one tracking request: the task's video found through the
labelling config, fetched, bounded and decoded, whichever model tracks it (SAM 2.1 from
the annotator's keyframes, :mod:`sam2serve.labelstudio.video_predict`; SAM 3 from a
phrase, :mod:`sam2serve.labelstudio.concept_video`).

Every bound is decided before the step it bounds:

1. the video, fetched by the image fetcher's rules (the fetch policy, Label Studio's token
   only to Label Studio) within ``max_video_upload_bytes``, its bytes counted in the
   process's decode budget (``max_decoded_bytes_in_flight``) until its frames are decoded;
2. its frame size from the stream's header (``max_pixels``), then the frames one request
   tracks (``--video-max-frames``, at most ``max_video_frames``) checked, with what the
   tracker holds beside them (the caller's :class:`TrackingCost`), against
   ``max_video_session_bytes``, and reserved in the process's decode budget;
3. the frames from Label Studio's first frame to track on decoded
   (:func:`~sam2serve.labelstudio.video_frames.decode_window`), held in that reservation
   while the caller tracks them.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from typing import Any

from sam2serve.engine.video_io import VideoError, VideoFormatError, VideoLimitError
from sam2serve.labelstudio.images import ByteLimit, ImageFetcher, LabelStudioAccess
from sam2serve.labelstudio.label_config import (
    ControlTag,
    LabelConfig,
    LabelConfigError,
    VideoTag,
)
from sam2serve.labelstudio.options import LabelStudioOptions
from sam2serve.labelstudio.protocol import Task
from sam2serve.labelstudio.video_frames import ClipWindow, decode_window, read_header
from sam2serve.server.decode_budget import video_decode_bytes
from sam2serve.server.errors import ApiError
from sam2serve.server.service import Service
from sam2serve.server.video_sessions import VideoSessions

MiB = 1024 * 1024


@dataclass(frozen=True)
class TrackingCost:
    """What a tracker holds beside the frames it tracks: bytes, and how a refusal says it
    (``what``: "to track 2 object(s) through them"; ``remedy``: what to change)."""

    nbytes: int
    what: str
    remedy: str


# The tracker's cost of ``frames`` frames of ``height`` x ``width``.
CostOf = Callable[[int, int, int], TrackingCost]


@dataclass(frozen=True)
class VideoTarget:
    """A video task's VideoRectangle tag, its Video tag, the frame rate Label Studio numbers
    the task's frames by, and the task's reference to its video (``source``: its place in
    the request, named in errors)."""

    control: ControlTag
    video: VideoTag
    frame_rate: float
    reference: Any
    source: str


def video_sessions(service: Service, asked: str) -> VideoSessions:
    """The service's video sessions (their limits); 422 ``video_disabled`` without
    ``--video`` (``asked``: what the request asked, named in the refusal)."""
    if service.videos is None:
        raise ApiError(
            422,
            "video_disabled",
            "this backend does not track video: start it with 'sam2serve labelstudio "
            f"--video' (settings.video.enabled) to answer {asked}",
        )
    return service.videos


def video_target(task: Task, where: str, config: LabelConfig, wanted: str | None) -> VideoTarget:
    """The VideoRectangle tag on the Video ``wanted`` (any Video when None) and what the
    task shows on it; 422 for a config without one or a task without its field."""
    try:
        control = config.video_rectangle_for(wanted)
        video = config.video_of(control, wanted)
        frame_rate = video.frame_rate_of(task.data)
    except LabelConfigError as exc:
        raise ApiError(422, "invalid_label_config", str(exc)) from None
    if video.field not in task.data:
        fields = ", ".join(sorted(map(str, task.data))[:10]) or "none"
        raise ApiError(
            422,
            "invalid_request",
            f"{where}.data: no field {video.field!r} (the Video tag {video.name!r} shows "
            f"${video.field}); the task's fields: {fields}",
        )
    source = f"{where}.data.{video.field}"
    return VideoTarget(control, video, frame_rate, task.data[video.field], source)


@asynccontextmanager
async def clip_window(
    target: VideoTarget,
    first_frame: int,
    cost_of: CostOf,
    service: Service,
    fetcher: ImageFetcher,
    access: LabelStudioAccess,
    options: LabelStudioOptions,
) -> AsyncIterator[ClipWindow]:
    """The frames from Label Studio's ``first_frame`` on (steps 1 to 3 of the module's
    docstring), held in the process's decode budget until the block ends."""
    videos = video_sessions(service, "video tasks")
    limits = videos.limits
    assert limits.max_upload_bytes is not None
    source = target.source
    limit = ByteLimit(limits.max_upload_bytes, "video", "max_video_upload_bytes", data_uri=False)
    # The download is held in memory until its frames are decoded: counted in the
    # process's decode budget from before the first byte (its most), then as it is.
    download = await service.decoding.reserve(
        min(limit.max_bytes, service.decoding.limit), f"{source}: the video's download"
    )
    with download:
        data = await fetcher.fetch(target.reference, access, source, limit)
        download.shrink(len(data))
        with video_errors():
            header = await asyncio.to_thread(read_header, data, source, service.limits.max_pixels)
        max_frames = min(options.video_max_frames, limits.max_frames)
        frames_bytes = max_frames * header.width * header.height * 3
        cost = cost_of(max_frames, header.height, header.width)
        if frames_bytes + cost.nbytes > limits.max_bytes:
            raise ApiError(
                413,
                "session_too_large",
                f"{source}: {max_frames} frames of {header.width}x{header.height} "
                f"({frames_bytes / MiB:.1f} MiB) plus {cost.nbytes / MiB:.1f} MiB "
                f"{cost.what} would pass {limits.max_bytes / MiB:.1f} MiB "
                f"(max_video_session_bytes); {cost.remedy}",
            )
        reservation = await service.decoding.reserve(
            video_decode_bytes(max_frames, header.width, header.height),
            f"the video ({max_frames} frames of {header.width}x{header.height})",
        )
        with reservation:
            with video_errors():
                window = await asyncio.to_thread(
                    decode_window,
                    data,
                    source,
                    header,
                    frame_rate=target.frame_rate,
                    first_frame=first_frame,
                    max_frames=max_frames,
                    max_skipped=limits.max_frames,
                    max_pixels=service.limits.max_pixels,
                )
            del data
            download.release()
            reservation.shrink(window.nbytes)
            yield window


@contextmanager
def video_errors() -> Iterator[None]:
    """A video past a limit as 413 ``video_too_large``; a container or codec not taken, 415
    ``unsupported_video``; one that cannot be read, 422."""
    try:
        yield
    except VideoFormatError as exc:
        raise ApiError(415, "unsupported_video", str(exc)) from None
    except VideoLimitError as exc:
        raise ApiError(413, "video_too_large", f"{exc} (max_pixels, max_video_frames)") from None
    except VideoError as exc:
        raise ApiError(
            422, "invalid_video", f"{exc}; a video FFmpeg can decode (MP4, WebM, ...)"
        ) from None


__all__ = [
    "CostOf",
    "TrackingCost",
    "VideoTarget",
    "clip_window",
    "video_errors",
    "video_sessions",
    "video_target",
]
