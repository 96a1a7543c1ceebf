"""How ``run --task concepts`` writes an image's instances: ``<stem>_concepts.json`` (strict
JSON, written atomically), the overlay (each phrase its colour, every instance labelled
with its phrase and score, the RANDOM WEIGHTS stamp) and the image's part of the COCO
dataset whose categories are the run's phrases (written once, at the end).

An instance's record: ``score``; ``segmentation``, COCO's compressed RLE; ``area``, its
pixels; ``bbox``, COCO's ``[x, y, w, h]`` of the mask as pycocotools' ``toBbox`` gives it
(the COCO file's bbox, so the two files agree); ``box``, the detector's own box
``[x1, y1, x2, y2]`` in image pixels (it may reach past the mask).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sam2serve.commands.common import info_line
from sam2serve.commands.concept_prompts import ImageConcepts
from sam2serve.commands.inputs import ImageInput
from sam2serve.commands.run_outputs import write_json
from sam2serve.engine.coco import CocoWriter, coco_bbox, coco_info

CONCEPTS_SUFFIX = "_concepts.json"
CONCEPTS_OVERLAY_SUFFIX = "_concepts.png"
SUPERCATEGORY = "concept"


def categories(phrases: Sequence[str]) -> list[dict[str, Any]]:
    """The COCO categories of a run: its phrases, ids 1..N in order."""
    return [
        {"id": index, "name": phrase, "supercategory": SUPERCATEGORY}
        for index, phrase in enumerate(phrases, start=1)
    ]


def instance_records(instances: Sequence[Any], max_instances: int | None) -> list[dict[str, Any]]:
    """One phrase's instances (``concepts.engine.Instance``) as records, the highest scores
    first (ties keep the detector's order), at most ``max_instances``."""
    import numpy as np
    import torch

    from sam2serve.engine.rle import coco_to_rle, masks_to_coco

    ranked = sorted(instances, key=lambda instance: -instance.score)[:max_instances]
    if not ranked:
        return []
    masks = torch.from_numpy(np.stack([instance.mask for instance in ranked]))
    rles, areas = masks_to_coco(masks)
    return [
        {
            "score": float(instance.score),
            "bbox": coco_bbox(coco_to_rle(rle)),
            "area": int(area),
            "segmentation": rle,
            "box": [round(float(v), 3) for v in instance.box],
        }
        for instance, rle, area in zip(ranked, rles, areas, strict=True)
    ]


@dataclass
class ConceptOutputs:
    """Where and how each image's instances are written; the COCO file at the end."""

    out_dir: Path
    phrases: tuple[str, ...]  # the run's: category ids 1..N
    overlay: bool = False
    stamp: str | None = None
    coco_path: Path | None = None
    info: Mapping[str, Any] = field(default_factory=dict)
    coco: CocoWriter | None = None

    def __post_init__(self) -> None:
        if self.coco_path is not None:
            extra = {k: v for k, v in self.info.items() if k != "description"}
            description = str(self.info.get("description", "concepts by sam2serve"))
            self.coco = CocoWriter(coco_info(description, **extra), categories(self.phrases))

    def category_id(self, phrase: str) -> int:
        return self.phrases.index(phrase) + 1

    def write(
        self,
        item: ImageInput,
        pixels: Any,
        found: Mapping[str, Sequence[Any]],
        wanted: ImageConcepts,
        header: Mapping[str, Any],
        timer: Any,
        max_instances: int | None,
    ) -> int:
        """Write one image's files; returns its number of instances."""
        height, width = pixels.shape[:2]
        with timer.stage("rle"):
            concepts: list[dict[str, Any]] = [
                {
                    "phrase": phrase,
                    "category_id": self.category_id(phrase),
                    "instances": instance_records(found[phrase], max_instances),
                }
                for phrase in wanted.phrases
            ]
        result = {
            "image": item.name,
            "source": str(item.path) if item.path else f"skimage.data.{item.sample}",
            "width": int(width),
            "height": int(height),
            **header,
            "phrases": list(wanted.phrases),
            "boxes": [box.as_json() for box in wanted.boxes],
            "timings": timer.as_dict(),
            "concepts": concepts,
        }
        write_json(self.out_dir / f"{item.stem}{CONCEPTS_SUFFIX}", result)
        records = [
            {**instance, "category_id": concept["category_id"], "phrase": concept["phrase"]}
            for concept in concepts
            for instance in concept["instances"]
        ]
        if self.overlay:
            self._overlay(item, pixels, records, wanted)
        if self.coco is not None:
            self.coco.add_image(item.name, width, height, records)
        return len(records)

    def _overlay(
        self, item: ImageInput, pixels: Any, records: list[dict[str, Any]], wanted: ImageConcepts
    ) -> None:
        from PIL import ImageDraw

        from sam2serve.engine.overlay import (
            colour,
            draw_labels,
            draw_legend,
            draw_overlay,
            draw_stamp,
        )

        keys = [record["category_id"] - 1 for record in records]
        image = draw_overlay(pixels, records, colour_keys=keys)
        draw = ImageDraw.Draw(image)
        for box in wanted.boxes:  # the exemplars: green positive, red negative
            draw.rectangle(box.xyxy, outline=(0, 200, 0) if box.positive else (230, 0, 0), width=2)
        # Each instance labelled at its detector box's corner; a legend of the phrases at
        # the bottom (the labels of masks that cover the image pile up at the top).
        labels = [
            ((r["box"][0], r["box"][1]), f"{r['phrase']} {r['score']:.2f}", colour(key))
            for r, key in zip(records, keys, strict=True)
        ]
        draw_labels(image, labels)
        legend = [self.category_id(phrase) - 1 for phrase in wanted.phrases]
        draw_legend(
            image, [(f"{self.phrases[key]}: {keys.count(key)}", colour(key)) for key in legend]
        )
        if self.stamp:
            draw_stamp(image, self.stamp)
        image.save(self.out_dir / f"{item.stem}{CONCEPTS_OVERLAY_SUFFIX}")

    def finish(self) -> None:
        """Write the COCO file of the images done (the others failed, and are named)."""
        if self.coco is None or self.coco_path is None:
            return
        self.coco.write(self.coco_path)
        info_line(
            f"coco: {len(self.coco.images)} image(s), {len(self.phrases)} categories, "
            f"{len(self.coco.annotations)} annotation(s) written to {str(self.coco_path)!r}"
        )
