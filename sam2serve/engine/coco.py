"""COCO instances files: masks of many images as one dataset that COCO tools load.

:class:`CocoWriter` collects images and their mask records and writes one file in
COCO's instances format (``images``, ``annotations``, ``categories``, ``info``), which
``pycocotools.coco.COCO`` loads and ``annToMask`` decodes back to the same masks:

- every annotation's ``segmentation`` is COCO's compressed RLE (``counts`` a str), made by
  the format registry (:mod:`sam2serve.engine.formats`), so it is pycocotools' own form;
- ``area`` is the mask's pixel count and ``bbox`` is COCO's ``[x, y, w, h]`` as
  pycocotools' ``toBbox`` computes it (``w`` counts columns: one more than the XYWH of
  Meta's records, whose ``w`` is max column - min column), so detection tools read it;
- ``score`` is the model's predicted IoU (what a prediction file needs), ``iscrowd`` 0;
- one category (``{"id": 1, "name": "object"}``) by default: SAM masks carry no class; a
  writer given categories (concept phrases) takes each record's ``category_id``.

The writer takes plain records (``segmentation`` as an uncompressed or compressed RLE,
and a ``predicted_iou`` or ``score``), so ``sam2serve run --coco`` and the annotation
page's export share it. The file is written atomically (a temporary file, then a
rename), so a reader never sees half a dataset. :func:`select_masks` is the run's
``--min-score`` / ``--max-masks`` filter.

Importing this module costs no torch; reading a compressed RLE does (engine.rle).
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from sam2serve.engine.formats import encode_mask

__all__ = ["DEFAULT_CATEGORY", "CocoWriter", "coco_bbox", "coco_info", "select_masks"]

DEFAULT_CATEGORY: dict[str, Any] = {"id": 1, "name": "object", "supercategory": "object"}
Record = Mapping[str, Any]


def record_score(record: Record) -> float | None:
    """A record's score: ``score`` if it has one, else its ``predicted_iou``."""
    score = record.get("score", record.get("predicted_iou"))
    return None if score is None else float(score)


def select_masks(
    records: Sequence[Record], min_score: float | None = None, max_masks: int | None = None
) -> list[Record]:
    """The records with a score of at least ``min_score``, at most ``max_masks`` of them
    (the highest scores; ties keep their order), in their original order.

    A record without a score (a mask a person drew) passes ``min_score`` and ranks after
    every scored one for ``max_masks``.
    """
    kept = [
        (index, record)
        for index, record in enumerate(records)
        if min_score is None or (score := record_score(record)) is None or score >= min_score
    ]
    if max_masks is not None and len(kept) > max_masks:

        def rank(item: tuple[int, Record]) -> tuple[bool, float]:
            score = record_score(item[1])
            return (score is None, -(score or 0.0))

        chosen = {index for index, _ in sorted(kept, key=rank)[:max_masks]}  # sorted is stable
        kept = [(index, record) for index, record in kept if index in chosen]
    return [record for _, record in kept]


def _uncompressed(segmentation: object) -> dict[str, Any]:
    """The engine's uncompressed RLE of an RLE in either form."""
    if not isinstance(segmentation, Mapping) or "size" not in segmentation:
        raise ValueError(
            f"segmentation must be an RLE {{'size': [h, w], 'counts': ...}}, got "
            f"{segmentation!r:.80}"
        )
    counts = segmentation.get("counts")
    if isinstance(counts, (str, bytes)):
        from sam2serve.engine.rle import coco_to_rle

        return coco_to_rle(dict(segmentation))
    # An array, not a list: a mask of millions of runs is summed and encoded by numpy.
    size = [int(v) for v in segmentation["size"]]
    return {"size": size, "counts": np.asarray(counts, dtype=np.int64)}


def coco_bbox(rle: Mapping[str, Any]) -> list[float]:
    """COCO's ``[x, y, w, h]`` of an uncompressed RLE, as pycocotools' ``toBbox``: the
    columns and rows the mask covers; ``[0, 0, 0, 0]`` for an empty mask.

    Read from the runs (column-major): a run of ones from pixel ``s`` to ``e - 1`` covers
    columns ``s // h`` to ``(e - 1) // h``, and rows ``s % h`` to ``(e - 1) % h`` unless it
    wraps into the next column, when it covers every row."""
    height = int(rle["size"][0])
    counts = np.asarray(rle["counts"], dtype=np.int64)
    ends = np.cumsum(counts)
    starts = ends - counts
    ones = (np.arange(counts.size) % 2 == 1) & (counts > 0)
    if height == 0 or not ones.any():
        return [0.0, 0.0, 0.0, 0.0]
    first, last = starts[ones], ends[ones] - 1
    first_col, last_col = first // height, last // height
    wraps = first_col != last_col
    top = np.where(wraps, 0, first % height).min()
    bottom = np.where(wraps, height - 1, last % height).max()
    x0, x1 = int(first_col.min()), int(last_col.max())
    return [float(x0), float(top), float(x1 - x0 + 1), float(bottom - top + 1)]


def coco_info(description: str, **extra: Any) -> dict[str, Any]:
    """A COCO ``info`` block: COCO's own fields (year, version, date_created, ...) and
    ``extra`` (how the masks were made) under ``sam2serve``."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        package_version = version("sam2serve")
    except PackageNotFoundError:
        package_version = "unknown"
    now = datetime.now(UTC)
    return {
        "description": description,
        "contributor": "sam2serve",
        "url": "",
        "version": package_version,
        "year": now.year,
        "date_created": now.isoformat(timespec="seconds"),
        "sam2serve": extra,
    }


class CocoWriter:
    """Images and their masks, gathered one image at a time, written as one COCO file.

    ``add_image(file_name, width, height, records)`` gives the image the next image id
    and each record the next annotation id (both from 1). A record needs a
    ``segmentation`` RLE of the image's size; its ``predicted_iou`` (or ``score``)
    becomes the annotation's ``score``, and its ``category_id`` (one of ``categories``;
    default the first) the annotation's.
    """

    def __init__(
        self,
        info: Mapping[str, Any] | None = None,
        categories: Sequence[Mapping[str, Any]] = (DEFAULT_CATEGORY,),
    ) -> None:
        if not categories:
            raise ValueError("a COCO file needs at least one category")
        self.info = dict(info or coco_info("masks by sam2serve"))
        self.categories = [dict(category) for category in categories]
        self.category_id = int(self.categories[0]["id"])
        self.category_ids = {int(category["id"]) for category in self.categories}
        self.images: list[dict[str, Any]] = []
        self.annotations: list[dict[str, Any]] = []

    def add_image(self, file_name: str, width: int, height: int, records: Iterable[Record]) -> int:
        """Add one image and its masks; returns the image's id."""
        image_id = len(self.images) + 1
        annotations = [
            self._annotation(image_id, record, (height, width), index)
            for index, record in enumerate(records)
        ]
        self.images.append(
            {"id": image_id, "file_name": file_name, "width": int(width), "height": int(height)}
        )
        self.annotations += annotations
        return image_id

    def _annotation(
        self, image_id: int, record: Record, size: tuple[int, int], index: int
    ) -> dict[str, Any]:
        rle = _uncompressed(record.get("segmentation"))
        if tuple(rle["size"]) != size:
            raise ValueError(
                f"mask {index} of image {image_id} has size {rle['size']} but the image is "
                f"{list(size)} (height, width)"
            )
        category_id = int(record.get("category_id", self.category_id))
        if category_id not in self.category_ids:
            raise ValueError(
                f"mask {index} of image {image_id} has category_id {category_id}, not one of "
                f"the categories {sorted(self.category_ids)}"
            )
        annotation: dict[str, Any] = {
            "id": len(self.annotations) + index + 1,
            "image_id": image_id,
            "category_id": category_id,
            "segmentation": encode_mask(rle, "coco_rle"),
            "area": int(np.asarray(rle["counts"], dtype=np.int64)[1::2].sum()),
            "bbox": coco_bbox(rle),
            "iscrowd": 0,
        }
        score = record_score(record)
        if score is not None:
            annotation["score"] = score
        return annotation

    def dataset(self) -> dict[str, Any]:
        """The COCO instances dict (what :meth:`write` writes)."""
        return {
            "info": self.info,
            "licenses": [],
            "images": self.images,
            "annotations": self.annotations,
            "categories": self.categories,
        }

    def write(self, path: str | os.PathLike[str]) -> Path:
        """Write the file atomically: a temporary file next to it, then a rename."""
        path = Path(path)
        text = _format(self.dataset())
        # A fresh name in the same directory (the rename must not cross file systems),
        # created like any file, so the umask decides its permissions.
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
        try:
            with open(tmp, "x", encoding="utf-8") as handle:
                handle.write(text)
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)
        return path


def _format(data: Mapping[str, Any]) -> str:
    """Strict JSON (no NaN), one image or annotation per line: readable and diffable."""
    entries = []
    for key, value in data.items():
        if isinstance(value, list) and value:
            items = ",\n".join(f"  {json.dumps(item, allow_nan=False)}" for item in value)
            text = f"[\n{items}\n ]"
        else:
            text = json.dumps(value, allow_nan=False)
        entries.append(f" {json.dumps(key)}: {text}")
    return "{\n" + ",\n".join(entries) + "\n}\n"
