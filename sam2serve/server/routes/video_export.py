"""POST /v1/video-export: a video's tracked masks a client holds -> COCO or YouTube-VIS.

The annotation page's video export: the masks it received while propagating (and after
corrections), per frame and object, as COCO's compressed RLE, go in with the video's size
and frame count and the objects' names; the dataset comes back, written by
:mod:`sam2serve.engine.video.export` (``format`` ``coco``: an image per frame with its
video and frame index; ``youtube_vis``: per object a segmentation per frame, null where
it is absent).

Stateless, like POST /v1/coco, and for the same reasons: what is exported is exactly what
the person saw and corrected, the server keeps no copy of a clip's masks at the frames'
size (a session holds low-resolution logits), and the export works after the session
has expired. Only the objects' names may come from a live session: with ``session_id``,
an object given without a name takes the name the session keeps for it (prompts,
renames, concept seeding), so every name is a category. Names follow the one rule for
names (:mod:`sam2serve.engine.user_text`); the video's name and the frames' names must be
safe file names (one path component: never ``..``, a separator or a drive), else 422
naming the field, so no ``file_name`` written climbs out of the dataset. No model work.
What a request may make the process allocate is bounded before the work: the body by the
server's body and JSON limits, the frames by ``max_video_frames``, the objects by
:data:`MAX_OBJECTS`, YouTube-VIS's per-frame lists by :data:`MAX_TRACK_CELLS` (objects x
frames), the frame by ``max_pixels``; every mask's runs are checked as they are read (a
hostile string is refused at its first bad run) within the process's decode budget.
"""

from __future__ import annotations

import asyncio
import json
from typing import Annotated, Any, Literal

from fastapi import Request
from fastapi.responses import Response
from pydantic import AfterValidator, Field

from sam2serve.engine.rle import checked_counts
from sam2serve.engine.user_text import FILE_NAME_RULE, MAX_FILE_NAME_BYTES, check_file_name
from sam2serve.engine.video.export import (
    DEFAULT_OBJECT_NAME,
    FrameMask,
    TrackedObject,
    VideoInfo,
    video_coco,
    video_folder,
    video_youtube_vis,
)
from sam2serve.server.dependencies import ServiceDep, VideoSettingsDep
from sam2serve.server.errors import ApiError
from sam2serve.server.memory import release_free_memory
from sam2serve.server.request_body import JSON_MEDIA
from sam2serve.server.routes.coco import (
    ENCODE_BYTES_PER_RUN,
    HELD_BYTES_PER_RUN,
    PIECE_BYTES_PER_CHAR,
    CategoryName,
    DatasetFileName,
    RleIn,
    _Strict,
)
from sam2serve.server.routes.common import inline_schema, read_body, v1_router
from sam2serve.server.service import Service
from sam2serve.server.video_sessions import VideoSession

EXPORT_PATH = "/v1/video-export"
MAX_OBJECTS = 1000
# YouTube-VIS writes objects x frames entries (null where an object is absent): bounded.
MAX_TRACK_CELLS = 2_000_000
FORMATS = {"coco": video_coco, "youtube_vis": video_youtube_vis}

router = v1_router()

ObjId = Annotated[int, Field(ge=0, le=2**31 - 1)]
FrameIdx = Annotated[int, Field(ge=0, le=2**31 - 1)]


def _video_name(name: str) -> str:
    video_folder(check_file_name(name, "the name"))  # its stem names the frames' folder
    return name


class VideoIn(_Strict):
    name: Annotated[str, AfterValidator(_video_name)] = Field(
        min_length=1,
        max_length=MAX_FILE_NAME_BYTES,
        description=f"The video's (or frames folder's) name, {FILE_NAME_RULE}; its stem "
        "names the folder of the frames' file names.",
    )
    width: int = Field(ge=1, le=1_000_000, description="Frame width in pixels.")
    height: int = Field(ge=1, le=1_000_000, description="Frame height in pixels.")
    num_frames: int = Field(ge=1, le=2**31 - 1, description="Frames in the video.")
    frame_names: list[DatasetFileName] | None = Field(
        None,
        description="Each frame's file name (frames uploaded as files), in order: "
        f"{FILE_NAME_RULE}.",
    )
    fps: float | None = Field(None, gt=0, le=10_000, allow_inf_nan=False)


class ExportObjectIn(_Strict):
    obj_id: ObjId
    name: CategoryName = DEFAULT_OBJECT_NAME


class ExportMaskIn(_Strict):
    obj_id: ObjId
    segmentation: RleIn = Field(description="The object's mask on the frame (frame-sized).")
    score: float | None = Field(None, allow_inf_nan=False)


class ExportFrameIn(_Strict):
    frame_idx: FrameIdx
    objects: list[ExportMaskIn] = Field(
        default_factory=list, max_length=MAX_OBJECTS, description="The frame's masks."
    )


class VideoExportRequest(_Strict):
    """A video's masks, per frame and object, to be written as one dataset."""

    format: Literal["coco", "youtube_vis"] = Field(
        description="coco: an image per frame (video_id, frame_index), an annotation per "
        "mask (track_id); youtube_vis: per object a segmentation per frame, null if absent."
    )
    video: VideoIn
    objects: list[ExportObjectIn] = Field(min_length=1, max_length=MAX_OBJECTS)
    frames: list[ExportFrameIn] = Field(
        default_factory=list, description="The frames with masks (others: no mask)."
    )
    description: str = Field("tracked with the sam2serve page", max_length=1000)
    session_id: str | None = Field(
        None,
        pattern=r"^vs-[0-9a-f]{32}$",
        description="A live session of these objects: an object given without a name "
        "takes the session's name for it (404 'session_not_found' once it is closed or "
        "expired: send the names then; in the cluster, send it as the "
        "serve_multiplexed_model_id header too). Omitted: every name is the request's.",
    )


@router.post(
    "/video-export",
    summary="A COCO or YouTube-VIS file of a video's masks (the page's video export)",
    responses={200: {"description": "The dataset, as JSON.", "content": {JSON_MEDIA: {}}}},
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {JSON_MEDIA: {"schema": inline_schema(VideoExportRequest)}},
        }
    },
)
async def video_export(request: Request, service: ServiceDep, video: VideoSettingsDep) -> Response:
    body, image = await read_body(request, VideoExportRequest, service)
    if image is not None:
        raise ApiError(422, "invalid_request", "image: /v1/video-export takes masks, not images")
    check_bounds(body, video.max_video_frames, service.limits.max_pixels)
    names = session_names(body, service)
    reservation = await service.decoding.reserve(decode_bytes(body), "the masks' runs")
    with reservation:
        text = await asyncio.to_thread(dataset_json, body, names)
    return Response(text, media_type=JSON_MEDIA)


def check_bounds(body: VideoExportRequest, max_frames: int, max_pixels: int) -> None:
    """422 for a video larger than the server tracks or an answer larger than it writes."""
    video = body.video
    problems = []
    if video.num_frames > max_frames:
        problems.append(
            f"video.num_frames: {video.num_frames}; this server tracks at most "
            f"{max_frames} frames (max_video_frames)"
        )
    if video.width * video.height > max_pixels:
        problems.append(
            f"video: {video.width}x{video.height} pixels; the limit is {max_pixels} (max_pixels)"
        )
    if len(body.objects) * video.num_frames > MAX_TRACK_CELLS:
        problems.append(
            f"objects x frames is {len(body.objects) * video.num_frames:,}; an export holds at "
            f"most {MAX_TRACK_CELLS:,} (export fewer objects at a time)"
        )
    if video.frame_names is not None and len(video.frame_names) != video.num_frames:
        problems.append(
            f"video.frame_names: {len(video.frame_names)} names for {video.num_frames} frames"
        )
    if problems:
        raise ApiError(422, "invalid_request", "; ".join(problems))


def session_names(body: VideoExportRequest, service: Service) -> dict[int, str]:
    """The names the request's session keeps for its objects ({} without a session_id);
    404 for a session this server does not hold (or a server without video)."""
    if body.session_id is None:
        return {}
    if service.videos is None:
        raise ApiError(
            404,
            "video_disabled",
            "session_id: this server does not track video (serve --video); send each "
            "object's name instead",
        )
    session: VideoSession = service.videos.get(body.session_id, touch=False)
    return {obj.obj_id: name for obj in body.objects if (name := session.name_of(obj.obj_id))}


def decode_bytes(body: VideoExportRequest) -> int:
    """What checking and re-encoding the masks holds at most, from their strings' sizes."""
    from sam2serve.engine.rle import PIECE_CHARS

    lengths = [len(mask.segmentation.counts) for frame in body.frames for mask in frame.objects]
    longest = max(lengths, default=0)
    return (
        HELD_BYTES_PER_RUN * sum(lengths)
        + ENCODE_BYTES_PER_RUN * longest
        + PIECE_BYTES_PER_CHAR * min(longest, PIECE_CHARS)
    )


def dataset_json(body: VideoExportRequest, names: dict[int, str] | None = None) -> str:
    """(In a worker thread.) The dataset as JSON text, or a 422 naming the bad mask."""
    try:
        return json.dumps(build_dataset(body, names), allow_nan=False)
    finally:
        release_free_memory()


def build_dataset(body: VideoExportRequest, names: dict[int, str] | None = None) -> dict[str, Any]:
    """The dataset; an object without a name of its own in the request is named by
    ``names`` (the session's) where it has one there, else the default name."""
    video = body.video
    info = VideoInfo(
        name=video.name,
        width=video.width,
        height=video.height,
        num_frames=video.num_frames,
        frame_names=video.frame_names,
        fps=video.fps,
    )
    names = names or {}
    objects = [
        TrackedObject(
            obj.obj_id,
            obj.name if "name" in obj.model_fields_set else names.get(obj.obj_id, obj.name),
        )
        for obj in body.objects
    ]
    masks = [
        FrameMask(frame.frame_idx, mask.obj_id, checked_rle(mask, video, i, j), mask.score)
        for i, frame in enumerate(body.frames)
        for j, mask in enumerate(frame.objects)
    ]
    try:
        return FORMATS[body.format](info, objects, masks, body.description)
    except ValueError as exc:
        raise ApiError(422, "invalid_request", f"frames: {exc}") from None


def checked_rle(mask: ExportMaskIn, video: VideoIn, i: int, j: int) -> dict[str, Any]:
    """The mask as uncompressed runs of the frame's size (422 naming it otherwise)."""
    where = f"frames[{i}].objects[{j}].segmentation"
    if mask.segmentation.size != [video.height, video.width]:
        raise ApiError(
            422,
            "invalid_request",
            f"{where}.size: {mask.segmentation.size} is not the video's [height, width] "
            f"{[video.height, video.width]}",
        )
    try:
        counts = checked_counts(mask.segmentation.counts, video.height, video.width)
    except ValueError as exc:  # UnicodeError too: a string of other than COCO's chars
        raise ApiError(422, "invalid_request", f"{where}.counts: {exc}") from None
    return {"size": [video.height, video.width], "counts": counts}


__all__ = ["EXPORT_PATH", "VideoExportRequest", "router"]
