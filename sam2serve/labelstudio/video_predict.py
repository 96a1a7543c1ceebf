"""A video task's interaction, tracked on the service's video model: the annotator's
VideoRectangle keyframes in, one VideoRectangle per object out (docs/labelling.md, "Video").

The flow, every bound decided before the step it bounds:

1. the objects (one per region with an enabled keyframe): at most ``max_video_objects``;
2. the video, fetched by the image fetcher's rules (the fetch policy, Label Studio's token
   only to Label Studio) within ``max_video_upload_bytes``, its bytes counted in the
   process's decode budget (``max_decoded_bytes_in_flight``) until its frames are decoded;
3. its frame size from the stream's header (``max_pixels``), then the frames one request
   tracks (``--video-max-frames``, at most ``max_video_frames``) checked against
   ``max_video_session_bytes`` (frames plus every object's tracking memory) and reserved
   in the process's decode budget;
4. the frames from the first keyframe on decoded, each object prompted with its keyframes'
   boxes, and all objects tracked forward together as one bulk job on the model worker
   (clicks of other clients run between its frames; a client that leaves stops it);
5. each object's mask on each frame as its bounding box, in Label Studio's keyframes.

Nothing is kept after the answer: the tracking state lives only inside the job.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Iterator
from contextlib import contextmanager
from typing import Any

from sam2serve.engine.prompts import Prompt
from sam2serve.engine.video.outputs import object_masks
from sam2serve.engine.video_io import VideoError, VideoFormatError, VideoLimitError
from sam2serve.labelstudio.images import ByteLimit, ImageFetcher, LabelStudioAccess
from sam2serve.labelstudio.label_config import LabelConfig, LabelConfigError, VideoTag
from sam2serve.labelstudio.options import LabelStudioOptions
from sam2serve.labelstudio.protocol import Task
from sam2serve.labelstudio.video_context import TrackPrompt
from sam2serve.labelstudio.video_frames import ClipWindow, decode_window, read_header
from sam2serve.labelstudio.video_result import tracked_keyframes, video_region
from sam2serve.server.batching import JobContext
from sam2serve.server.decode_budget import Reservation, video_decode_bytes
from sam2serve.server.errors import ApiError
from sam2serve.server.service import RequestClock, Service

MiB = 1024 * 1024
# One object's boxes on the kept frames (None: not seen), in the kept frames' order.
Boxes = list[list[float] | None]


async def track_task(
    task: Task,
    where: str,
    config: LabelConfig,
    prompts: list[TrackPrompt],
    service: Service,
    fetcher: ImageFetcher,
    access: LabelStudioAccess,
    options: LabelStudioOptions,
    client: str,
) -> list[dict[str, Any]]:
    """The VideoRectangle regions of ``task`` for the objects ``prompts``."""
    videos = service.videos
    if videos is None:
        raise ApiError(
            422,
            "video_disabled",
            "this backend does not track video: start it with 'sam2serve labelstudio "
            "--video' (settings.video.enabled) to answer VideoRectangle keyframes",
        )
    if not prompts:
        return []
    limits = videos.limits
    if len(prompts) > limits.max_objects:
        raise ApiError(
            413,
            "too_many_objects",
            f"context.result: {len(prompts)} VideoRectangle regions to track; at most "
            f"{limits.max_objects} per request (max_video_objects)",
        )
    wanted = prompts[0].to_name
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
    # One of the client's bulk slots from the fetch on: a client's concurrent video
    # requests (each may hold a whole file, then its frames) are bounded like its AMG.
    with service.bulk_slot(client):
        return await _fetch_and_track(
            task, where, control.name, video, frame_rate, prompts, service, fetcher, access,
            options,
        )  # fmt: skip


async def _fetch_and_track(
    task: Task,
    where: str,
    control_name: str,
    video: VideoTag,
    frame_rate: float,
    prompts: list[TrackPrompt],
    service: Service,
    fetcher: ImageFetcher,
    access: LabelStudioAccess,
    options: LabelStudioOptions,
) -> list[dict[str, Any]]:
    """Steps 2 to 5 (the module's docstring) for the objects of one video task."""
    videos = service.videos
    assert videos is not None and videos.limits.max_upload_bytes is not None
    source = f"{where}.data.{video.field}"
    limit = ByteLimit(
        videos.limits.max_upload_bytes, "video", "max_video_upload_bytes", data_uri=False
    )
    # The download is held in memory until its frames are decoded: counted in the
    # process's decode budget from before the first byte (its most), then as it is.
    download = await service.decoding.reserve(
        min(limit.max_bytes, service.decoding.limit), f"{source}: the video's download"
    )
    with download:
        fetch = fetcher.fetch(task.data[video.field], access, source, limit)
        return await _decode_and_track(
            fetch, download, source, control_name, video, frame_rate, prompts, service, options
        )


async def _decode_and_track(
    fetch: Awaitable[bytes],
    download: Reservation,
    source: str,
    control_name: str,
    video: VideoTag,
    frame_rate: float,
    prompts: list[TrackPrompt],
    service: Service,
    options: LabelStudioOptions,
) -> list[dict[str, Any]]:
    videos = service.videos
    assert videos is not None
    limits = videos.limits
    data = await fetch  # only this frame holds it: dropped once decoded
    download.shrink(len(data))
    with _video_errors():
        header = await asyncio.to_thread(read_header, data, source, service.limits.max_pixels)
    max_frames = min(options.video_max_frames, limits.max_frames)
    frames_bytes = max_frames * header.width * header.height * 3
    tracking = len(prompts) * max_frames * videos.object_frame_bytes
    if frames_bytes + tracking > limits.max_bytes:
        raise ApiError(
            413,
            "session_too_large",
            f"{source}: {max_frames} frames of {header.width}x{header.height} "
            f"({frames_bytes / MiB:.1f} MiB) plus {tracking / MiB:.1f} MiB to track "
            f"{len(prompts)} object(s) through them would pass "
            f"{limits.max_bytes / MiB:.1f} MiB (max_video_session_bytes); "
            "track fewer frames (--video-max-frames) or objects",
        )
    first = min(prompt.first_frame for prompt in prompts)
    reservation = await service.decoding.reserve(
        video_decode_bytes(max_frames, header.width, header.height),
        f"the video ({max_frames} frames of {header.width}x{header.height})",
    )
    with reservation:
        with _video_errors():
            window = await asyncio.to_thread(
                decode_window,
                data,
                source,
                header,
                frame_rate=frame_rate,
                first_frame=first,
                max_frames=max_frames,
                max_skipped=limits.max_frames,
                max_pixels=service.limits.max_pixels,
            )
        del data
        download.release()
        reservation.shrink(window.nbytes)
        boxes, starts = await _track(service, window, prompts)
    height, width = window.size
    regions = []
    for obj_id, prompt in enumerate(prompts):
        start = starts.get(obj_id)
        tracked = []
        if start is not None:
            tracked = tracked_keyframes(
                boxes[obj_id][start:], window.ls_frames[start:], width, height, frame_rate
            )
        regions.append(video_region(prompt, tracked, control_name, video.name))
    return regions


async def _track(
    service: Service, window: ClipWindow, prompts: list[TrackPrompt]
) -> tuple[dict[int, Boxes], dict[int, int]]:
    """Each object's boxes on the kept frames, and the kept frame each object starts on
    (its first keyframe; objects whose keyframes are all past the kept frames: none)."""
    assert service.videos is not None
    predictor = service.videos.predictor
    height, width = window.size
    placed: dict[int, list[tuple[int, Prompt]]] = {}
    for obj_id, prompt in enumerate(prompts):
        for key in prompt.boxes:
            index = window.index_of(key.frame)
            if index is None:
                continue
            b = key.box
            box = (b.x0 / 100 * width, b.y0 / 100 * height, b.x1 / 100 * width, b.y1 / 100 * height)
            placed.setdefault(obj_id, []).append((index, Prompt((), (), box)))
    starts = {obj_id: min(index for index, _ in keys) for obj_id, keys in placed.items()}
    if not placed:
        return {}, {}

    def run(context: JobContext) -> dict[int, Boxes]:
        state = predictor.init_state(window.frames)
        for obj_id, keys in placed.items():
            for index, prompt in keys:
                predictor.add_prompt(state, index, obj_id, prompt)
                context.check()
        boxes: dict[int, Boxes] = {obj_id: [] for obj_id in placed}
        for frame in predictor.propagate(state, start_frame_idx=min(starts.values())):
            for record in object_masks(frame):
                boxes[record.obj_id].append(list(record.bbox) if record.area else None)
            context.check()  # lets waiting clicks run; stops if the client left
        first = min(starts.values())
        before: Boxes = [None] * first
        return {obj_id: before + seen for obj_id, seen in boxes.items()}

    boxes = await service.run_job("labelstudio_video", run, RequestClock(), bulk=True)
    return boxes, starts


@contextmanager
def _video_errors() -> Iterator[None]:
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


__all__ = ["track_task"]
