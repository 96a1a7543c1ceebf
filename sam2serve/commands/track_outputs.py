"""What ``sam2serve track`` writes: one COCO RLE JSON file per frame (written as soon as the
frame is computed), the optional overlay video, the run's summary line and file name; shared
by SAM 2.1's tracker (:mod:`sam2serve.commands.track`) and SAM 3's video predictor
(:mod:`sam2serve.commands.track_sam3`)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sam2serve.commands.common import UsageError, info_line
from sam2serve.commands.run_outputs import json_safe

SUMMARY_NAME = "track.json"


@dataclass
class TrackResults:
    records: dict[int, list[dict[str, Any]]]  # frame index -> its records (for --overlay)
    frames_written: int
    seconds: list[float]  # per propagated frame (decode + memory + RLE + write)
    wall: float

    def summary(self) -> dict[str, Any]:
        import numpy as np

        ms = np.asarray(self.seconds) * 1000
        return {
            "frames_tracked": len(self.seconds),
            "seconds": round(self.wall, 3),
            "frames_per_second": round(len(self.seconds) / self.wall, 3) if self.wall else None,
            "frame_ms_p50": round(float(np.percentile(ms, 50)), 1) if len(ms) else None,
            "frame_ms_p90": round(float(np.percentile(ms, 90)), 1) if len(ms) else None,
        }


def write_frame(
    result: Any, names: Any, out_dir: Path, object_names: dict[int, str]
) -> list[dict[str, Any]]:
    from sam2serve.engine.rle import rle_to_coco
    from sam2serve.engine.video.outputs import object_masks

    records = [
        {
            "obj_id": obj.obj_id,
            **({"name": object_names[obj.obj_id]} if obj.obj_id in object_names else {}),
            "segmentation": rle_to_coco(obj.rle),
            "area": obj.area,
            "bbox": obj.bbox,
        }
        for obj in object_masks(result)
    ]
    height, width = result.masks.shape[-2:]
    frame = {
        "frame": result.frame_idx,
        "name": names[result.frame_idx],
        "width": int(width),
        "height": int(height),
        "objects": records,
    }
    path = out_dir / f"frame_{result.frame_idx:05d}.json"
    staging = path.with_suffix(".json.tmp")
    staging.write_text(json.dumps(json_safe(frame)) + "\n")
    staging.replace(path)
    return records


def write_overlay(
    path: Path,
    frames: list[Any],
    records: dict[int, list[dict[str, Any]]],
    fps: float,
    random_weights: bool,
) -> None:
    import numpy as np

    from sam2serve.engine.overlay import draw_overlay
    from sam2serve.engine.video_io import VideoError, write_video

    drawn = []
    for index, pixels in enumerate(frames):
        frame_records = records.get(index, [])
        image = draw_overlay(
            pixels,
            frame_records,
            stamp="RANDOM WEIGHTS" if random_weights else None,
            colour_keys=[record["obj_id"] - 1 for record in frame_records],
        )
        drawn.append(np.asarray(image))
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_video(path, drawn, fps)
    except (OSError, VideoError) as exc:
        raise UsageError(f"cannot write --overlay {str(path)!r}: {exc}") from None


def print_summary(results: TrackResults, out_dir: Path, overlay: Path | None) -> None:
    summary = results.summary()
    fps = summary["frames_per_second"]
    info_line(
        f"tracked {results.frames_written} frames in {summary['seconds']:.1f} s "
        f"({fps if fps is not None and math.isfinite(fps) else 0:.2f} frames/s; per frame "
        f"p50 {summary['frame_ms_p50']} ms, p90 {summary['frame_ms_p90']} ms) -> {out_dir}"
        + (f"; overlay {overlay}" if overlay is not None else "")
    )
