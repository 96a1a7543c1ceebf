"""``sam2serve run``: masks for a batch of images (amg, sps or mps), one JSON file each.

It checks the flags and every input (images, prompts, AMG parameters, the --coco file's
directory) before the model loads, loads it once, and for each image times decode +
encode + mask decoding + RLE, writes ``<stem>_masks.json`` (and with ``--overlay``
``<stem>_overlay.png``), then the ``--coco`` dataset of the whole run and a latency
summary. One image that fails is reported and skipped (exit 1 at the end).

With random weights, amg keeps every mask unless the quality thresholds are given (Meta's
defaults drop every random mask, and a first run that shows nothing explains nothing),
and every overlay carries a RANDOM WEIGHTS stamp.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sam2serve.commands import model as model_flags
from sam2serve.commands import run_concepts
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
    info_line,
    warning_line,
)
from sam2serve.commands.inputs import (
    DEFAULT_PROMPTS_NAME,
    IMAGE_EXTENSIONS,
    MASKS_SUFFIX,
    ImageInput,
    Prompts,
    add_images_argument,
    check_coco_file,
    check_filters,
    expand_images,
    load_prompts,
    match_prompts,
)
from sam2serve.commands.run_outputs import (
    OVERLAY_SUFFIX,
    Outputs,
    in_mask_format,
    prepare_out_dir,
)
from sam2serve.engine.coco import CocoWriter, coco_info
from sam2serve.engine.formats import FORMATS, JSON_FORMATS
from sam2serve.runtime.modes import MODES
from sam2serve.samples import SAMPLE_NAMES

# SAM 2.1's tasks: engine.tasks.TASKS (checked by the tests), without torch. --task also
# takes "concepts", SAM 3's task (sam2serve.concepts, not engine.tasks), run by
# run_concepts.py; bench and the cluster's burst run the SAM 2.1 tasks only.
TASKS = ("amg", "sps", "mps")
RUN_TASKS = (*TASKS, run_concepts.TASK)
RANDOM_WEIGHTS_STAMP = "RANDOM WEIGHTS: masks are meaningless"
# What amg keeps with random weights unless the flags are given: every mask (Meta's
# defaults, 0.8 and 0.95, drop all of a random model's masks).
RANDOM_WEIGHTS_THRESHOLDS = {"pred_iou_thresh": 0.0, "stability_score_thresh": 0.0}

DESCRIPTION = f"""\
Segment a batch of images with SAM 2.1 (or SAM 3's concepts) and write one JSON file of
masks per image.

tasks:
  amg  automatic mask generation: a grid of clicks over the whole image, masks filtered by
       predicted IoU and stability, duplicates removed by box NMS (Meta's
       SAM2AutomaticMaskGenerator; every parameter is a flag below, Meta's defaults)
  sps  single point segmentation: the FIRST prompt of each image's --prompts entry,
       3 candidate masks, the one with the highest predicted IoU is kept
  mps  multi point segmentation: EVERY prompt of the image's --prompts entry is decoded
       on its own (all in one call); the best of 3 candidates is kept for each
{run_concepts.TASK_HELP}

prompts (--prompts FILE): a JSON object mapping image file name (or stem) to a list of
  prompts, each a click [x, y] or an object {{"points": [[x, y], ...], "labels": [1, 0, ...],
  "box": [x0, y0, x1, y1]}} (labels: 1 foreground, 0 background, default 1; a box alone
  is allowed); checked against each image's size before the model loads
{run_concepts.PROMPTS_HELP}

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
                       "runtime", "weights", "params", "filters", "mask_format",
                       "timings", "masks": [...]}}; each mask has "segmentation" (in
                       --mask-format), "area", "bbox" (XYWH), "predicted_iou",
                       "point_coords"; amg adds "stability_score" and "crop_box", an
                       object prompt "point_labels" and "box". "timings" (ms) cover decode +
                       encode + masks + RLE (and "stages", finer), not reading the file,
                       converting to --mask-format or writing the JSON.
  <stem>{OVERLAY_SUFFIX}  with --overlay: the masks in distinct colours over the image
  --coco FILE         one COCO instances file for the run (images, annotations with COCO
                       RLE, area, bbox, score = predicted IoU, one category "object"),
                       loadable with pycocotools.coco.COCO
{run_concepts.OUTPUTS_HELP}
  stderr              a progress bar, then per-image latency p50/p90/mean and images/s
  --min-score and --max-masks filter the masks of every output

mask formats (--mask-format; 'annotate' reads coco_rle, the default):
{described({name: FORMATS[name].description for name in JSON_FORMATS})}

weights:
  official SAM 2.1 checkpoints by default, found in $SAM2SERVE_CACHE/checkpoints (default
  ~/.cache/sam2serve/checkpoints) under Meta's file names (sam2.1_hiera_tiny.pt, ...) or
  downloaded there (SAM2SERVE_OFFLINE=1 turns the download off). Random weights give
  meaningless masks; they are announced on stderr, recorded in every JSON and stamped on
  every overlay, and amg then keeps every mask (--pred-iou-thresh 0
  --stability-score-thresh 0) unless those flags are given.

{EXIT_STATUS_HELP}
"""

EPILOG = f"""\
examples:
  {PROG} run --task amg {SAMPLES_ARG} --out out/ --fallback-random-weights --points-per-side 16 \\
      --overlay
  {PROG} run --task amg photos/ --out amg/ --checkpoint sam2.1_hiera_tiny.pt --overlay \\
      --coco amg/instances.json --min-score 0.9
  {PROG} annotate amg/                      # writes amg/{DEFAULT_PROMPTS_NAME}
  {PROG} run --task sps photos/ --out sps/ --prompts amg/{DEFAULT_PROMPTS_NAME}
  {PROG} run --task concepts --text "cat,dog" photos/ --out concepts/ --coco concepts/coco.json \\
      --overlay
"""


def register(subcommands: argparse._SubParsersAction) -> None:
    add_command(
        subcommands,
        "run",
        help="masks for a batch of images (amg, sps, mps, or concepts with SAM 3)",
        description=DESCRIPTION,
        epilog=EPILOG,
        handler=run_command,
        add_arguments=add_arguments,
    )


def add_arguments(parser: CommandParser) -> None:
    add_images_argument(parser)
    parser.add_argument(
        "--task",
        choices=RUN_TASKS,
        required=True,
        help="amg (automatic masks), sps (single point), mps (multi point) or concepts "
        "(every instance of --text phrases, SAM 3)",
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
        help="sps/mps: JSON object mapping image file name (or stem) to a list of prompts: "
        '[x, y] pixel points or {"points", "labels", "box"} objects (see "prompts" above), '
        f"e.g. from '{PROG} annotate'; concepts: exemplar boxes and phrases per image (see "
        '"concepts prompts" above)',
    )
    parser.add_argument(
        "--overlay",
        action="store_true",
        help=f"also write <stem>{OVERLAY_SUFFIX}: the masks over the image",
    )
    parser.add_argument(
        "--coco",
        type=Path,
        metavar="FILE",
        help="also write one COCO instances file of every image's masks (see above)",
    )
    parser.add_argument(
        "--min-score",
        type=float,
        metavar="X",
        help="keep only masks whose predicted IoU is at least X, in [0, 1] (every output)",
    )
    parser.add_argument(
        "--max-masks",
        type=int,
        metavar="N",
        help="keep at most N masks per image, the highest predicted IoU first (every output)",
    )
    parser.add_argument(
        "--mask-format",
        choices=JSON_FORMATS,
        default="coco_rle",
        help='form of each mask\'s "segmentation" (see "mask formats" above; default: %(default)s)',
    )
    model = parser.add_argument_group("model")
    add_model_flag(model)
    add_mode_flag(model, concepts=True)
    add_backend_flag(model)
    add_device_flag(model)
    add_threads_flag(model)
    add_weights_flags(model)
    model_flags.add_image_decode_flag(model, "; --task sps and mps (amg decodes on the host)")
    model.add_argument(
        "--fallback-random-weights",
        action="store_true",
        help="use random weights if the checkpoint cannot be found or loaded "
        "(a loud warning is printed and recorded)",
    )
    add_amg_flags(parser.add_argument_group(AMG_GROUP_TITLE + "; --task amg"))
    run_concepts.add_arguments(parser)


def run_command(args: argparse.Namespace) -> int:
    run_concepts.check_task_flags(args, add_arguments)  # no flag of the other model's tasks
    if args.task == run_concepts.TASK:
        return run_concepts.run_concepts(args)
    spec = model_flags.runtime_spec(args)
    if args.task == "amg" and args.prompts is not None:
        raise UsageError("--prompts is for --task sps and mps; amg needs no prompts")
    if args.task != "amg" and args.prompts is None:
        raise UsageError(
            f"--task {args.task} needs --prompts FILE: a JSON object mapping image names to "
            f"[[x, y], ...] points (or objects with points, labels and a box); make one from "
            f"amg outputs with "
            f"'{PROG} run --task amg IMAGES --out AMG_DIR' then '{PROG} annotate AMG_DIR'"
        )
    images = expand_images(args.images)
    prompts = None
    if args.prompts is not None:
        prompts = match_prompts(load_prompts(args.prompts), images, args.prompts)
    params = amg_params_from(args)  # validated for every task: a bad value is a bad value
    check_filters(args.min_score, args.max_masks)
    out_dir = prepare_out_dir(args.out)
    if args.coco is not None:
        check_coco_file(args.coco)

    from sam2serve.engine.tasks import mask_generator
    from sam2serve.runtime.modes import get_mode
    from sam2serve.runtime.threads import check_threads

    # Checked (and for SPS / MPS made and tested) before the model loads: 'device' that
    # cannot run here is exit 2; AMG decodes on the host.
    decoder = model_flags.check_image_decode(
        args.image_decode, spec.device, decode=args.task != "amg"
    )
    predictor = model_flags.build(args, spec)
    random_weights = predictor.model.weights_info.is_random
    if args.task == "amg" and random_weights:
        params = _keep_all_masks(args, params)
    mode = get_mode(spec.mode)
    generator = mask_generator(predictor, params, mode) if args.task == "amg" else None
    segmenter = Segmenter(args.task, predictor, mode, generator, decoder)
    header = {
        "task": args.task,
        "model": spec.model,
        "mode": spec.mode,
        "device": spec.device,
        "runtime": spec.replace(threads=check_threads(spec.threads)).as_dict(),
        "weights": model_flags.weights_record(predictor.model.weights_info),
        "params": _task_params(args.task, params, args.mask_format),
        "filters": {"min_score": args.min_score, "max_masks": args.max_masks},
        "mask_format": args.mask_format,
    }
    if decoder is not None and decoder.where == "device":
        info_line(f"image decode: {decoder.describe()}")
    outputs = Outputs(
        out_dir,
        overlay=args.overlay,
        stamp=RANDOM_WEIGHTS_STAMP if random_weights else None,
        min_score=args.min_score,
        max_masks=args.max_masks,
        coco_path=args.coco,
        coco=None if args.coco is None else CocoWriter(_coco_info(header, random_weights)),
    )
    return _run_images(images, segmenter, prompts, header, outputs)


def _keep_all_masks(args: argparse.Namespace, params: Any) -> Any:
    """Random weights: the quality thresholds the user did not set keep every mask."""
    changed = {
        name: value
        for name, value in RANDOM_WEIGHTS_THRESHOLDS.items()
        if getattr(args, name) is None
    }
    if not changed:
        return params
    flags = " ".join(f"--{name.replace('_', '-')} {value:g}" for name, value in changed.items())
    info_line(
        f"random weights: amg keeps every mask ({flags}; Meta's defaults would drop them "
        "all); give these flags to choose other thresholds"
    )
    return params.replace(**changed)


def _coco_info(header: dict[str, Any], random_weights: bool) -> dict[str, Any]:
    return coco_info(
        f"{PROG} run --task {header['task']}",
        task=header["task"],
        runtime=header["runtime"],
        weights=header["weights"],
        random_weights=random_weights,
        params=header["params"],
        filters=header["filters"],
    )


def _task_params(task: str, params: Any, mask_format: str) -> dict[str, Any]:
    if task == "amg":  # the library's parameters for these records, output form included
        return {**params.to_dict(), "output_mode": mask_format}
    return {
        "multimask_output": True,
        "selection": "highest predicted_iou of the 3 masks of each prompt",
        "prompts_per_image": "first prompt only" if task == "sps" else "every prompt",
    }


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
    decoder: Any = None  # engine.decode_choice.ImageDecoder for sps and mps (None: host)

    def __call__(
        self, item: ImageInput, source: Any, points: Prompts | None
    ) -> tuple[Any, list[dict[str, Any]], Timings]:
        from sam2serve.engine import tasks

        timer = tasks.StageTimer(self.predictor.device)
        with timer.stage("decode"):
            pixels = item.decode(source, self.decoder)
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
    prompts: dict[str, Prompts] | None,
    header: dict[str, Any],
    outputs: Outputs,
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
            records = outputs.select(records)
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
            outputs.write(item, pixels, records, result, segmenter.task)
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
    outputs.finish()
    _print_summary(done, failed, segmenter.task, outputs.out_dir)
    return EXIT_FAILED if failed else EXIT_OK


def _points_for(item: ImageInput, task: str, prompts: dict[str, Prompts] | None) -> Prompts | None:
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
