"""A video task's interaction, tracked on the service's video model: the annotator's
VideoRectangle keyframes in, one VideoRectangle per object out (docs/labelling.md, "Video").

The flow, every bound decided before the step it bounds:

1. the objects (one per region with an enabled keyframe): at most ``max_video_objects``;
2. the clip (:mod:`sam2serve.labelstudio.video_clip`): the video fetched within
   ``max_video_upload_bytes``, its frame size checked from the header (``max_pixels``),
   the frames one request tracks (``--video-max-frames``, at most ``max_video_frames``)
   plus every object's tracking memory checked against ``max_video_session_bytes``, and
   the frames from the first keyframe on decoded within the process's decode budget;
3. each object prompted with its keyframes' boxes, and all objects tracked forward
   together as one bulk job on the model worker (clicks of other clients run between its
   frames; a client that leaves stops it);
4. each object's mask on each frame as its bounding box, in Label Studio's keyframes.

Nothing is kept after the answer: the tracking state lives only inside the job.
"""

from __future__ import annotations

from typing import Any

from sam2serve.engine.prompts import Prompt
from sam2serve.engine.video.outputs import object_masks
from sam2serve.labelstudio.images import ImageFetcher, LabelStudioAccess
from sam2serve.labelstudio.label_config import LabelConfig
from sam2serve.labelstudio.options import LabelStudioOptions
from sam2serve.labelstudio.protocol import Task
from sam2serve.labelstudio.video_clip import (
    TrackingCost,
    clip_window,
    video_sessions,
    video_target,
)
from sam2serve.labelstudio.video_context import TrackPrompt
from sam2serve.labelstudio.video_frames import ClipWindow
from sam2serve.labelstudio.video_result import tracked_keyframes, video_region
from sam2serve.server.batching import JobContext
from sam2serve.server.errors import ApiError
from sam2serve.server.service import RequestClock, Service

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
    videos = video_sessions(service, "VideoRectangle keyframes")
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
    target = video_target(task, where, config, prompts[0].to_name)

    def cost_of(frames: int, height: int, width: int) -> TrackingCost:
        return TrackingCost(
            len(prompts) * frames * videos.object_frame_bytes,
            f"to track {len(prompts)} object(s) through them",
            "track fewer frames (--video-max-frames) or objects",
        )

    first = min(prompt.first_frame for prompt in prompts)
    # One of the client's bulk slots from the fetch on: a client's concurrent video
    # requests (each may hold a whole file, then its frames) are bounded like its AMG.
    with service.bulk_slot(client):
        async with clip_window(target, first, cost_of, service, fetcher, access, options) as window:
            boxes, starts = await _track(service, window, prompts)
    height, width = window.size
    regions = []
    for obj_id, prompt in enumerate(prompts):
        start = starts.get(obj_id)
        tracked = []
        if start is not None:
            tracked = tracked_keyframes(
                boxes[obj_id][start:], window.ls_frames[start:], width, height, target.frame_rate
            )
        regions.append(video_region(prompt, tracked, target.control.name, target.video.name))
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


__all__ = ["track_task"]
