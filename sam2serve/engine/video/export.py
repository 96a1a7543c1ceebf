"""Tracked masks of a video as a dataset: COCO instances (one image per frame) and
YouTube-VIS (one annotation per object, a segmentation per frame).

Both take the same values: the video (its name, size, frame count and, if known, each
frame's file name), the objects (``obj_id`` and a name, which is its category) and the
masks, one per object per frame where the object was tracked, as RLE (the engine's
uncompressed runs or COCO's compressed string). An empty mask means the object is not on
that frame: COCO writes no annotation for it, YouTube-VIS a ``null``.

- :func:`video_coco`: every frame is an image with its ``video_id``, ``video`` (name)
  and ``frame_index``; every mask an annotation with COCO's compressed RLE, ``area``,
  ``bbox`` (pycocotools' ``toBbox``), ``iscrowd`` 0, ``track_id`` (the object's
  ``obj_id``), ``video_id`` and ``frame_index``. ``pycocotools.coco.COCO`` loads it; a
  ``videos`` list names the video.
- :func:`video_youtube_vis`: the YouTube-VIS 2019/2021 layout: ``videos`` with
  ``file_names`` (one per frame) and ``length``; per object an annotation whose
  ``segmentations``, ``areas`` and ``bboxes`` have one entry per frame, ``null`` where
  the object is absent; ``height``, ``width`` and ``length`` 1 as the official files
  have them, and ``obj_id`` (the session's id of the object).

Categories are the objects' distinct names, in order of first appearance, ids from 1.
Pure and numpy-only: the server's export route and any script share it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

import numpy as np

from sam2serve.engine.coco import coco_bbox, coco_info
from sam2serve.engine.formats import encode_mask
from sam2serve.engine.user_text import check_file_name

__all__ = [
    "DEFAULT_OBJECT_NAME",
    "FrameMask",
    "TrackedObject",
    "VideoInfo",
    "frame_file_name",
    "video_coco",
    "video_folder",
    "video_youtube_vis",
]

DEFAULT_OBJECT_NAME = "object"
VIDEO_ID = 1  # one video per file


@dataclass(frozen=True)
class VideoInfo:
    """The video the masks are of."""

    name: str
    width: int
    height: int
    num_frames: int
    frame_names: Sequence[str] | None = None  # each frame's file name, if it had one
    fps: float | None = None


@dataclass(frozen=True)
class TrackedObject:
    """One object: the session's ``obj_id`` and its name (its category)."""

    obj_id: int
    name: str = DEFAULT_OBJECT_NAME


@dataclass(frozen=True)
class FrameMask:
    """One object's mask on one frame: an RLE of the video's size (either form)."""

    frame_idx: int
    obj_id: int
    segmentation: Mapping[str, Any]
    score: float | None = None


@dataclass(frozen=True)
class _Encoded:
    segmentation: dict[str, Any]  # COCO's compressed RLE
    area: int
    bbox: list[float]
    score: float | None


def video_folder(name: str) -> str:
    """The folder a video's frames are filed under: its name's stem (``video`` for none),
    a safe file name or a ValueError naming it."""
    return check_file_name(PurePosixPath(name).stem or "video", f"the stem of {name!r:.80}")


def frame_file_name(video: VideoInfo, frame_idx: int) -> str:
    """The frame's file name in the dataset: ``<video stem>/<its own name>`` when the
    frames were files, else ``<video stem>/<index, 5 digits>.jpg`` (YouTube-VIS's way).
    Both parts must be safe file names (:func:`~sam2serve.engine.user_text.check_file_name`:
    a ValueError names the one that is not), so no file name leaves the dataset's folder."""
    stem = video_folder(video.name)
    if video.frame_names is not None:
        name = PurePosixPath(video.frame_names[frame_idx]).name
        return f"{stem}/{check_file_name(name, f'frame {frame_idx} file name')}"
    return f"{stem}/{frame_idx:05d}.jpg"


def video_coco(
    video: VideoInfo,
    objects: Sequence[TrackedObject],
    masks: Iterable[FrameMask],
    description: str = "tracked with sam2serve",
) -> dict[str, Any]:
    """The COCO instances dict: an image per frame, an annotation per non-empty mask."""
    categories, category_of = _categories(objects)
    encoded = _encoded_masks(video, objects, masks)
    images = [
        {
            "id": frame_idx + 1,
            "file_name": frame_file_name(video, frame_idx),
            "width": video.width,
            "height": video.height,
            "video_id": VIDEO_ID,
            "video": video.name,
            "frame_index": frame_idx,
        }
        for frame_idx in range(video.num_frames)
    ]
    annotations: list[dict[str, Any]] = []
    for (frame_idx, obj_id), mask in sorted(encoded.items()):
        if mask.area == 0:
            continue
        annotation: dict[str, Any] = {
            "id": len(annotations) + 1,
            "image_id": frame_idx + 1,
            "category_id": category_of[obj_id],
            "segmentation": mask.segmentation,
            "area": mask.area,
            "bbox": mask.bbox,
            "iscrowd": 0,
            "track_id": obj_id,
            "video_id": VIDEO_ID,
            "frame_index": frame_idx,
        }
        if mask.score is not None:
            annotation["score"] = mask.score
        annotations.append(annotation)
    return {
        "info": coco_info(description, video=video.name, frames=video.num_frames),
        "licenses": [],
        "videos": [_video_entry(video)],
        "images": images,
        "annotations": annotations,
        "categories": categories,
    }


def video_youtube_vis(
    video: VideoInfo,
    objects: Sequence[TrackedObject],
    masks: Iterable[FrameMask],
    description: str = "tracked with sam2serve",
) -> dict[str, Any]:
    """The YouTube-VIS dict: per object present on some frame, one annotation whose
    per-frame lists hold its mask, area and bbox, ``null`` where it is absent."""
    categories, category_of = _categories(objects)
    encoded = _encoded_masks(video, objects, masks)
    annotations: list[dict[str, Any]] = []
    for obj in objects:
        frames = [encoded.get((frame_idx, obj.obj_id)) for frame_idx in range(video.num_frames)]
        present = [mask if mask is not None and mask.area > 0 else None for mask in frames]
        if not any(present):
            continue
        annotations.append(
            {
                "id": len(annotations) + 1,
                "video_id": VIDEO_ID,
                "category_id": category_of[obj.obj_id],
                "obj_id": obj.obj_id,
                "segmentations": [m.segmentation if m else None for m in present],
                "areas": [m.area if m else None for m in present],
                "bboxes": [m.bbox if m else None for m in present],
                "iscrowd": 0,
                "height": video.height,
                "width": video.width,
                "length": 1,
            }
        )
    entry = _video_entry(video)
    entry["file_names"] = [frame_file_name(video, i) for i in range(video.num_frames)]
    return {
        "info": coco_info(description, video=video.name, frames=video.num_frames),
        "licenses": [],
        "videos": [entry],
        "annotations": annotations,
        "categories": categories,
    }


def _video_entry(video: VideoInfo) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "id": VIDEO_ID,
        "name": video.name,
        "width": video.width,
        "height": video.height,
        "length": video.num_frames,
    }
    if video.fps is not None:
        entry["fps"] = video.fps
    return entry


def _categories(
    objects: Sequence[TrackedObject],
) -> tuple[list[dict[str, Any]], dict[int, int]]:
    """The categories (distinct names, first appearance first) and each obj_id's id."""
    ids: dict[str, int] = {}
    category_of: dict[int, int] = {}
    for obj in objects:
        if obj.obj_id in category_of:
            raise ValueError(f"obj_id {obj.obj_id} is listed twice")
        name = obj.name or DEFAULT_OBJECT_NAME
        category_of[obj.obj_id] = ids.setdefault(name, len(ids) + 1)
    names = ids or {DEFAULT_OBJECT_NAME: 1}
    categories = [
        {"id": index, "name": name, "supercategory": DEFAULT_OBJECT_NAME}
        for name, index in names.items()
    ]
    return categories, category_of


def _encoded_masks(
    video: VideoInfo, objects: Sequence[TrackedObject], masks: Iterable[FrameMask]
) -> dict[tuple[int, int], _Encoded]:
    """Each (frame_idx, obj_id)'s mask as COCO's RLE with its area and bbox; ValueError
    for a frame outside the video, an unknown object, a repeated pair or a wrong size."""
    if video.width < 1 or video.height < 1 or video.num_frames < 1:
        raise ValueError(
            f"a video needs a size and frames, got {video.width}x{video.height}, "
            f"{video.num_frames} frames"
        )
    if video.frame_names is not None and len(video.frame_names) != video.num_frames:
        raise ValueError(f"{len(video.frame_names)} frame names for {video.num_frames} frames")
    known = {obj.obj_id for obj in objects}
    size = [video.height, video.width]
    encoded: dict[tuple[int, int], _Encoded] = {}
    for mask in masks:
        where = f"frame {mask.frame_idx}, obj_id {mask.obj_id}"
        if not 0 <= mask.frame_idx < video.num_frames:
            raise ValueError(f"{where}: the video has frames 0 to {video.num_frames - 1}")
        if mask.obj_id not in known:
            raise ValueError(f"{where}: not one of the objects {sorted(known)}")
        if (mask.frame_idx, mask.obj_id) in encoded:
            raise ValueError(f"{where}: a second mask for the same object and frame")
        rle = _uncompressed(mask.segmentation)
        if [int(v) for v in rle["size"]] != size:
            raise ValueError(
                f"{where}: mask size {list(rle['size'])} is not the video's [height, width] {size}"
            )
        counts = np.asarray(rle["counts"], dtype=np.int64)
        if (
            counts.ndim != 1
            or (counts < 0).any()
            or int(counts.sum()) != video.height * video.width
        ):
            raise ValueError(
                f"{where}: the runs must be >= 0 and cover the {video.height}x{video.width} "
                "frame exactly"
            )
        encoded[(mask.frame_idx, mask.obj_id)] = _Encoded(
            segmentation=encode_mask(rle, "coco_rle"),
            area=int(counts[1::2].sum()),
            bbox=coco_bbox(rle),
            score=mask.score,
        )
    return encoded


def _uncompressed(segmentation: Mapping[str, Any]) -> dict[str, Any]:
    counts = segmentation.get("counts")
    if isinstance(counts, (str, bytes)):
        from sam2serve.engine.rle import coco_to_rle

        return coco_to_rle(dict(segmentation))
    return {"size": list(segmentation["size"]), "counts": np.asarray(counts, dtype=np.int64)}
