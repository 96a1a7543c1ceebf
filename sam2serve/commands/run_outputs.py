"""How ``sam2serve run`` writes an image's results: the mask filters, then the JSON file
(one entry per line, strict JSON, written atomically), the overlay and the image's part of
the COCO dataset (written once, at the end of the run).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sam2serve.commands.common import UsageError, info_line
from sam2serve.commands.inputs import MASKS_SUFFIX, ImageInput
from sam2serve.engine.coco import CocoWriter, select_masks
from sam2serve.engine.formats import encode_mask

__all__ = [
    "OVERLAY_SUFFIX",
    "Outputs",
    "format_json",
    "in_mask_format",
    "json_safe",
    "prepare_out_dir",
    "write_json",
]

OVERLAY_SUFFIX = "_overlay.png"


def prepare_out_dir(out: Path) -> Path:
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {str(out)!r} exists and is not a directory")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"cannot create --out directory {str(out)!r}: {exc.strerror}") from None
    return out


@dataclass
class Outputs:
    """Where and how an image's masks are written, after the --min-score / --max-masks
    filters: its JSON, its overlay (stamped with random weights) and the COCO dataset."""

    out_dir: Path
    overlay: bool = False
    stamp: str | None = None
    min_score: float | None = None
    max_masks: int | None = None
    coco_path: Path | None = None
    coco: CocoWriter | None = None

    def select(self, records: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [dict(r) for r in select_masks(records, self.min_score, self.max_masks)]

    def write(
        self, item: ImageInput, pixels: Any, records: list[dict[str, Any]], result: dict, task: str
    ) -> None:
        write_json(self.out_dir / f"{item.stem}{MASKS_SUFFIX}", result)
        if self.overlay:
            from sam2serve.engine.overlay import draw_overlay

            if hasattr(pixels, "cpu"):  # a tensor decoded on the device: drawn on the host
                pixels = pixels.cpu().numpy()
            image = draw_overlay(pixels, records, show_points=task != "amg", stamp=self.stamp)
            image.save(self.out_dir / f"{item.stem}{OVERLAY_SUFFIX}")
        if self.coco is not None:
            self.coco.add_image(item.name, result["width"], result["height"], records)

    def finish(self) -> None:
        """Write the COCO file of the images done (the others failed, and are named)."""
        if self.coco is None or self.coco_path is None:
            return
        self.coco.write(self.coco_path)
        info_line(
            f"coco: {len(self.coco.images)} image(s), {len(self.coco.annotations)} "
            f"annotation(s) written to {str(self.coco_path)!r}"
        )


# --------------------------------------------------------------------------- JSON


def in_mask_format(records: list[dict[str, Any]], mask_format: str) -> list[dict[str, Any]]:
    """The records (the engine's tasks give COCO RLE) with each mask in ``mask_format``."""
    if mask_format == "coco_rle":
        return records
    from sam2serve.engine.rle import coco_to_rle

    return [
        {**record, "segmentation": encode_mask(coco_to_rle(record["segmentation"]), mask_format)}
        for record in records
    ]


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Write atomically: a reader never sees half a file."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(format_json(data), encoding="utf-8")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def json_safe(value: Any) -> Any:
    """NaN/inf (an empty mask's 0/0 stability score) become null: JSON has no NaN."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, list):
        return [json_safe(v) for v in value]
    return value


def format_json(data: dict[str, Any]) -> str:
    """One top-level entry per line, and one line per element of a list of records:
    easy to read and to diff, and still plain JSON."""
    data = json_safe(data)
    entries = []
    for key, value in data.items():
        if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
            text = "[\n" + ",\n".join(f"  {json.dumps(v)}" for v in value) + "\n ]"
        else:
            text = json.dumps(value)
        entries.append(f" {json.dumps(key)}: {text}")
    return "{\n" + ",\n".join(entries) + "\n}\n"
