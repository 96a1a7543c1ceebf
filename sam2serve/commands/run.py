"""``sam2serve run``: masks for a batch of images (amg, sps or mps), one JSON file each.

It checks the flags and every input (images, prompts, AMG parameters) before the model
loads, loads it once, and for each image times decode + encode + mask decoding + RLE,
writes ``<stem>_masks.json`` (and with ``--overlay`` ``<stem>_overlay.png``), then prints a
latency summary. One image that fails is reported and skipped (exit 1 at the end).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sam2serve.commands import model as model_flags
from sam2serve.commands.amg_flags import AMG_GROUP_TITLE, add_amg_flags, amg_params_from
from sam2serve.commands.common import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_STATUS_HELP,
    PROG,
    SAMPLES_ARG,
    CommandParser,
    ItemFailure,
    UsageError,
    add_backend_flag,
    add_command,
    add_device_flag,
    add_mode_flag,
    add_model_flag,
    add_threads_flag,
    add_weights_flags,
    described,
    error_line,
    warning_line,
)
from sam2serve.commands.inputs import (
    DEFAULT_PROMPTS_NAME,
    IMAGE_EXTENSIONS,
    MASKS_SUFFIX,
    ImageInput,
    Points,
    expand_images,
    load_prompts,
    match_prompts,
)
from sam2serve.engine.formats import FORMATS, JSON_FORMATS, encode_mask
from sam2serve.runtime.modes import MODES
from sam2serve.samples import SAMPLE_NAMES

TASKS = ("amg", "sps", "mps")  # engine.tasks.TASKS (checked by the tests), without torch
OVERLAY_SUFFIX = "_overlay.png"

DESCRIPTION = f"""\
Segment a batch of images with SAM 2.1 and write one JSON file of masks per image.

tasks:
  amg  automatic mask generation: a grid of clicks over the whole image, masks filtered by
       predicted IoU and stability, duplicates removed by box NMS (Meta's
       SAM2AutomaticMaskGenerator; every parameter is a flag below, Meta's defaults)
  sps  single point segmentation: the FIRST point of each image's --prompts entry,
       3 candidate masks, the one with the highest predicted IoU is kept
  mps  multi point segmentation: EVERY point of the image's --prompts entry is its own
       prompt; the best of 3 candidates is kept for each

modes (--mode; the masks are the same in baseline and fast):
{described({name: mode.description for name, mode in MODES.items()})}
  fast is the default; furious masks may differ slightly: measure with '{PROG} bench'

images:
  files, directories (their {" ".join(e.lstrip(".") for e in IMAGE_EXTENSIONS)} files,
  sorted; not recursive) and the word '{SAMPLES_ARG}', which stands for the bundled sample
  photos ({", ".join(SAMPLE_NAMES)}; use ./{SAMPLES_ARG} for a directory of that name).
  Every argument, the prompts file and the AMG flags are checked before the model loads.

outputs, in --out:
  <stem>{MASKS_SUFFIX}   {{"image", "width", "height", "task", "model", "mode", "device",
                       "runtime", "weights", "params", "mask_format", "timings",
                       "masks": [...]}}; each mask has "segmentation" (in --mask-format),
                       "area", "bbox" (XYWH), "predicted_iou", "point_coords"; amg adds
                       "stability_score" and "crop_box". "timings" (ms) cover decode +
                       encode + masks + RLE (and "stages", finer), not reading the file,
                       converting to --mask-format or writing the JSON.
  <stem>{OVERLAY_SUFFIX}  with --overlay: the masks in distinct colours over the image
  stderr              a progress bar, then per-image latency p50/p90/mean and images/s

mask formats (--mask-format; 'annotate' reads coco_rle, the default):
{described({name: FORMATS[name].description for name in JSON_FORMATS})}

weights:
  official SAM 2.1 checkpoints by default, found in $SAM2SERVE_CACHE or
  ~/.cache/sam2serve/checkpoints under Meta's file names (sam2.1_hiera_tiny.pt, ...) or
  downloaded there (SAM2SERVE_OFFLINE=1 turns the download off). Random weights give
  meaningless masks; they are announced on stderr and recorded in every JSON.

{EXIT_STATUS_HELP}
"""

EPILOG = f"""\
examples:
  {PROG} run --task amg {SAMPLES_ARG} --out out/ --fallback-random-weights --points-per-side 16
  {PROG} run --task amg photos/ --out amg/ --checkpoint sam2.1_hiera_tiny.pt --overlay
  {PROG} annotate amg/                      # writes amg/{DEFAULT_PROMPTS_NAME}
  {PROG} run --task sps photos/ --out sps/ --prompts amg/{DEFAULT_PROMPTS_NAME}
"""


def register(subcommands: argparse._SubParsersAction) -> None:
    add_command(
        subcommands,
        "run",
        help="masks for a batch of images (amg, sps or mps)",
        description=DESCRIPTION,
        epilog=EPILOG,
        handler=run_command,
        add_arguments=add_arguments,
    )


def add_arguments(parser: CommandParser) -> None:
    parser.add_argument(
        "images",
        nargs="+",
        metavar="IMAGES_OR_DIRS",
        help=f"image files, directories of images, or '{SAMPLES_ARG}'",
    )
    parser.add_argument(
        "--task",
        choices=TASKS,
        required=True,
        help="amg (automatic masks), sps (single point) or mps (multi point)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        required=True,
        metavar="DIR",
        help="output directory (created if missing; existing files are replaced)",
    )
    parser.add_argument(
        "--prompts",
        type=Path,
        metavar="FILE",
        help="sps/mps: JSON object mapping image file name (or stem) to a list "
        f"of [x, y] pixel points, e.g. from '{PROG} annotate'",
    )
    parser.add_argument(
        "--overlay",
        action="store_true",
        help=f"also write <stem>{OVERLAY_SUFFIX}: the masks over the image",
    )
    parser.add_argument(
        "--mask-format",
        choices=JSON_FORMATS,
        default="coco_rle",
        help='form of each mask\'s "segmentation" (see "mask formats" above; default: %(default)s)',
    )
    model = parser.add_argument_group("model")
    add_model_flag(model)
    add_mode_flag(model)
    add_backend_flag(model)
    add_device_flag(model)
    add_threads_flag(model)
    add_weights_flags(model)
    model.add_argument(
        "--fallback-random-weights",
        action="store_true",
        help="use random weights if the checkpoint cannot be found or loaded "
        "(a loud warning is printed and recorded)",
    )
    add_amg_flags(parser.add_argument_group(AMG_GROUP_TITLE + "; --task amg"))


def run_command(args: argparse.Namespace) -> int:
    spec = model_flags.runtime_spec(args)
    if args.task == "amg" and args.prompts is not None:
        raise UsageError("--prompts is for --task sps and mps; amg needs no prompts")
    if args.task != "amg" and args.prompts is None:
        raise UsageError(
            f"--task {args.task} needs --prompts FILE: a JSON object mapping image names to "
            f"[[x, y], ...] points; make one from amg outputs with "
            f"'{PROG} run --task amg IMAGES --out AMG_DIR' then '{PROG} annotate AMG_DIR'"
        )
    images = expand_images(args.images)
    prompts = None
    if args.prompts is not None:
        prompts = match_prompts(load_prompts(args.prompts), images, args.prompts)
    params = amg_params_from(args)  # validated for every task: a bad value is a bad value
    out_dir = _prepare_out_dir(args.out)

    from sam2serve.engine.tasks import mask_generator
    from sam2serve.runtime.modes import get_mode
    from sam2serve.runtime.threads import check_threads

    predictor = model_flags.build(args, spec)
    mode = get_mode(spec.mode)
    generator = mask_generator(predictor, params, mode) if args.task == "amg" else None
    segmenter = Segmenter(args.task, predictor, mode, generator)
    header = {
        "task": args.task,
        "model": spec.model,
        "mode": spec.mode,
        "device": spec.device,
        "runtime": spec.replace(threads=check_threads(spec.threads)).as_dict(),
        "weights": model_flags.weights_record(predictor.model.weights_info),
        "params": _task_params(args.task, params, args.mask_format),
        "mask_format": args.mask_format,
    }
    return _run_images(images, segmenter, prompts, header, out_dir, args.overlay)


def _task_params(task: str, params: Any, mask_format: str) -> dict[str, Any]:
    if task == "amg":  # the library's parameters for these records, output form included
        return {**params.to_dict(), "output_mode": mask_format}
    return {
        "multimask_output": True,
        "selection": "highest predicted_iou of the 3 masks of each prompt",
        "prompts_per_image": "first point only" if task == "sps" else "every point",
    }


def _prepare_out_dir(out: Path) -> Path:
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {str(out)!r} exists and is not a directory")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"cannot create --out directory {str(out)!r}: {exc.strerror}") from None
    return out


# --------------------------------------------------------------------------- one image


@dataclass
class Timings:
    """Milliseconds per image: decode, encode (preprocessing + image encoder) and masks
    (prompt decoding, post-processing, RLE), plus the finer stages of engine.tasks."""

    decode_ms: float = 0.0
    encode_ms: float = 0.0
    masks_ms: float = 0.0
    stages: dict[str, float] = field(default_factory=dict)

    @classmethod
    def from_stages(cls, ms: dict[str, float]) -> Timings:
        return cls(
            decode_ms=ms["decode"],
            encode_ms=ms["preprocess"] + ms["encode"],
            masks_ms=ms["decode_masks"] + ms["postprocess"] + ms["rle"],
            stages=dict(ms),
        )

    @property
    def total_ms(self) -> float:
        return self.decode_ms + self.encode_ms + self.masks_ms

    def as_dict(self) -> dict[str, Any]:
        return {
            "decode_ms": round(self.decode_ms, 3),
            "encode_ms": round(self.encode_ms, 3),
            "masks_ms": round(self.masks_ms, 3),
            "total_ms": round(self.total_ms, 3),
            "stages": {f"{name}_ms": round(ms, 3) for name, ms in self.stages.items()},
        }


@dataclass
class Segmenter:
    """Runs one task on one image (engine.tasks, as the mode says): the timed part."""

    task: str
    predictor: Any
    mode: Any  # runtime.modes.Mode: how prompts are batched and masks turned into RLE
    generator: Any = None  # MaskGenerator for amg

    def __call__(
        self, item: ImageInput, source: Any, points: Points | None
    ) -> tuple[Any, list[dict[str, Any]], Timings]:
        from sam2serve.engine import tasks

        timer = tasks.StageTimer(self.predictor.device)
        with timer.stage("decode"):
            pixels = item.decode(source)
        flags = self.mode
        if self.task == "amg":
            records = tasks.amg(self.generator, pixels, flags=flags, timer=timer)
        elif self.task == "sps" and points:
            records = tasks.sps(self.predictor, pixels, points[0], flags=flags, timer=timer)
        else:  # mps, or sps without a point: the image is still encoded, no masks
            records = tasks.mps(self.predictor, pixels, points or [], flags=flags, timer=timer)
        return pixels, records, Timings.from_stages(timer.ms)


def _run_images(
    images: list[ImageInput],
    segmenter: Segmenter,
    prompts: dict[str, Points] | None,
    header: dict[str, Any],
    out_dir: Path,
    overlay: bool,
) -> int:
    from tqdm import tqdm

    done: list[Timings] = []
    failed: list[str] = []
    progress = tqdm(
        images, desc=f"{PROG} {segmenter.task}", unit="image", file=sys.stderr, dynamic_ncols=True
    )
    for item in progress:
        try:
            points = _points_for(item, segmenter.task, prompts)
            pixels, records, timings = segmenter(item, item.read(), points)
            height, width = pixels.shape[:2]
            result = {
                "image": item.name,
                "source": str(item.path) if item.path else f"skimage.data.{item.sample}",
                "width": width,
                "height": height,
                **header,
                "timings": timings.as_dict(),
                "masks": in_mask_format(records, header["mask_format"]),
            }
            write_json(out_dir / f"{item.stem}{MASKS_SUFFIX}", result)
            if overlay:
                from sam2serve.engine.overlay import draw_overlay

                image = draw_overlay(pixels, records, show_points=segmenter.task != "amg")
                image.save(out_dir / f"{item.stem}{OVERLAY_SUFFIX}")
        except ItemFailure as exc:
            failed.append(item.name)
            error_line(f"{exc}; skipped")
            continue
        except Exception as exc:  # noqa: BLE001 - one image must not lose the others
            failed.append(item.name)
            error_line(f"{item.describe()} failed ({type(exc).__name__}: {exc}); skipped")
            continue
        done.append(timings)
        progress.set_postfix(masks=len(records), refresh=False)
    progress.close()
    _print_summary(done, failed, segmenter.task, out_dir)
    return EXIT_FAILED if failed else EXIT_OK


def _points_for(item: ImageInput, task: str, prompts: dict[str, Points] | None) -> Points | None:
    if task == "amg":
        return None
    assert prompts is not None
    if item.name not in prompts:
        raise ItemFailure(f"no prompts for image {item.name!r} in the --prompts file")
    points = prompts[item.name]
    if not points:
        warning_line(f"the prompts for {item.name!r} are empty: no masks")
    return points[:1] if task == "sps" else points


def _print_summary(done: list[Timings], failed: list[str], task: str, out_dir: Path) -> None:
    import numpy as np

    shown = ", ".join(failed[:10]) + (", ..." if len(failed) > 10 else "")
    lines = [
        f"{PROG}: {task}: {len(done)} image(s) written to {str(out_dir)!r}, "
        f"{len(failed)} failed" + (f" ({shown})" if failed else "")
    ]
    if done:
        totals = np.array([t.total_ms for t in done])
        p50, p90 = np.percentile(totals, [50, 90])
        per_second = len(done) / (totals.sum() / 1000) if totals.sum() > 0 else float("inf")
        lines.append(
            f"{PROG}: latency per image (decode + encode + masks + RLE): p50 {p50:.1f} ms, "
            f"p90 {p90:.1f} ms, mean {totals.mean():.1f} ms; {per_second:.2f} images/s"
        )
        lines.append(
            f"{PROG}: mean per stage: decode {np.mean([t.decode_ms for t in done]):.1f} ms, "
            f"encode {np.mean([t.encode_ms for t in done]):.1f} ms, "
            f"masks {np.mean([t.masks_ms for t in done]):.1f} ms"
        )
        lines.append(
            f"{PROG}: finer: "
            + ", ".join(
                f"{name.replace('_', ' ')} {np.mean([t.stages[name] for t in done]):.1f} ms"
                for name in done[0].stages
            )
        )
    print("\n".join(lines), file=sys.stderr)


# --------------------------------------------------------------------------- JSON output


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
