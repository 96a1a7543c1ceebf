"""The ``sam2serve`` command line: ``run`` (masks for a batch of images) and ``annotate``
(prompt points from AMG outputs, for the point tasks).

A thin shell over the engine: it expands the image arguments, loads the model once, and
for each image times decode + encode + mask decoding + RLE, writes ``<stem>_masks.json``
(and optionally ``<stem>_overlay.png``), then prints a latency summary. Errors a user can
cause end in one line ``sam2serve: error: ...`` - exit 2 before any work starts, or, for
one bad image, a skipped image and exit 1 at the end, with every other result written.
"""

from __future__ import annotations

import argparse
import colorsys
import dataclasses
import json
import math
import os
import re
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from sam2serve.accel.commands import add_commands as add_export_commands
from sam2serve.accel.modes import MODES
from sam2serve.cluster.commands import add_commands as add_cluster_commands
from sam2serve.config import MODEL_SIZES, get_config
from sam2serve.engine.amg import AMGParamError, AMGParams, finite_or_none
from sam2serve.engine.tasks import TASKS, prompt_point, prompt_points
from sam2serve.samples import SAMPLE_NAMES, load_sample
from sam2serve.server.commands import add_commands as add_server_commands

__all__ = ["build_parser", "main", "prompt_point"]  # prompt_point: annotate's rule

PROG = "sam2serve"
DEFAULT_MODE = "fast"  # the fastest lossless mode: the same masks as baseline, sooner
DEVICES = ("cpu", "cuda")
SAMPLES_ARG = "samples"
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".webp", ".bmp", ".tif", ".tiff")
MASKS_SUFFIX = "_masks.json"
OVERLAY_SUFFIX = "_overlay.png"
DEFAULT_PROMPTS_NAME = "prompts.json"
EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130
OVERLAY_ALPHA = 0.5

# Help for every AMG parameter the CLI exposes, by AMGParams field name. output_mode is
# not a flag: the JSON output always holds COCO RLE.
AMG_HELP: dict[str, str] = {
    "points_per_side": "points per side of the click grid on the whole image: "
    "points_per_side**2 clicks, each decoded into up to 3 masks",
    "points_per_batch": "clicks decoded together; more is faster but holds more masks in memory",
    "pred_iou_thresh": "keep masks whose predicted IoU is above this (0 turns the filter off)",
    "stability_score_thresh": "keep masks whose stability score is at least this "
    "(0 turns the filter off)",
    "stability_score_offset": "logit shift either side of --mask-threshold that the stability "
    "score compares",
    "mask_threshold": "logit above which a pixel belongs to a mask",
    "box_nms_thresh": "box IoU above which the lower-scoring of two masks of one crop is dropped",
    "crop_n_layers": "extra crop layers: layer i adds (2**i)**2 overlapping crops, each encoded "
    "again (slow)",
    "crop_nms_thresh": "box IoU above which a mask from a larger crop loses to one from a "
    "smaller crop",
    "crop_overlap_ratio": "overlap of neighbouring layer-1 crops, as a fraction of the image's "
    "short side",
    "crop_n_points_downscale_factor": "crop layer i gets points_per_side / factor**i points "
    "per side",
    "point_grids": "JSON file with explicit click grids instead of --points-per-side: a list "
    "of [[x, y], ...] grids normalised to [0, 1], one per crop layer",
    "min_mask_region_area": "if > 0, fill holes and remove islands smaller than this many "
    "pixels in every mask",
    "use_m2m": "refine each mask once by decoding its click again with its own low-res logits",
    "multimask_output": "three masks per click (whole, part, subpart); --no-multimask-output: "
    "one per click",
}
AMG_FIXED = {"output_mode": "coco_rle"}


class UsageError(Exception):
    """A user error found before any work: one line on stderr, exit 2."""


class ImageFailure(Exception):
    """One image that cannot be processed: reported, skipped, exit 1 at the end."""


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors: ``sam2serve: error: ...`` and no usage dump."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(f"{message} (see '{self.prog} --help')")


class _HelpFormatter(argparse.RawDescriptionHelpFormatter):
    def __init__(self, prog: str) -> None:
        super().__init__(prog, max_help_position=34, width=100)


def _message(text: str) -> None:
    """A line on stderr that does not break a running progress bar."""
    from tqdm import tqdm

    tqdm.write(text, file=sys.stderr)


def _error_line(text: str) -> None:
    _message(f"{PROG}: error: {text}")


# --------------------------------------------------------------------------- parser


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _amg_defaults() -> dict[str, Any]:
    return {f.name: f.default for f in dataclasses.fields(AMGParams)}


def _add_amg_flags(group: argparse._ArgumentGroup) -> None:
    defaults = _amg_defaults()
    for name, default in defaults.items():
        if name in AMG_FIXED:
            continue
        help_text = AMG_HELP[name]  # a new AMGParams field must get a flag and help here
        if name == "point_grids":
            group.add_argument(_flag(name), metavar="JSON_FILE", type=Path, help=help_text)
        elif isinstance(default, bool):
            group.add_argument(
                _flag(name),
                action=argparse.BooleanOptionalAction,
                default=None,
                help=f"{help_text} (default: {'on' if default else 'off'})",
            )
        else:
            kind = int if isinstance(default, int) else float
            shown = f"{default:.4g}" if kind is float else default
            group.add_argument(
                _flag(name),
                type=kind,
                metavar="INT" if kind is int else "FLOAT",
                help=f"{help_text} (default: {shown})",
            )


RUN_DESCRIPTION = f"""\
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
  baseline  the reference behaviour: eager fp32, Meta's decoder, AMG 64 points per batch,
            mps one prompt per decoder call, masks to RLE one at a time
  fast      (default) lossless: fast decoder, all prompts of an image decoded together,
            only the chosen masks upscaled, batched RLE
  furious   fast + a reduced-precision image encoder (bf16 on CPU, fp16 on CUDA); masks
            may differ slightly: measure with '{PROG} bench'

images:
  files, directories (their {", ".join(e.lstrip(".") for e in IMAGE_EXTENSIONS)} files,
  sorted; not recursive) and the word '{SAMPLES_ARG}', which stands for the bundled sample
  photos ({", ".join(SAMPLE_NAMES)}; use ./{SAMPLES_ARG} for a directory of that name).

outputs, in --out:
  <stem>_masks.json   {{"image", "width", "height", "task", "model", "mode", "device",
                       "weights", "params", "timings", "masks": [...]}}; each mask has
                       "segmentation" (COCO RLE {{"size": [h, w], "counts": str}}), "area",
                       "bbox" (XYWH), "predicted_iou", "point_coords"; amg adds
                       "stability_score" and "crop_box". "timings" (ms) cover decode +
                       encode + masks + RLE (and "stages", finer), not reading the file or
                       writing the JSON.
  <stem>_overlay.png  with --overlay: the masks in distinct colours over the image
  stderr              a progress bar, then per-image latency p50/p90/mean and images/s

weights:
  official SAM 2.1 checkpoints by default, found in $SAM2SERVE_CACHE or
  ~/.cache/sam2serve/checkpoints under Meta's file names (sam2.1_hiera_tiny.pt, ...) or
  downloaded there (SAM2SERVE_OFFLINE=1 turns the download off). Random weights give
  meaningless masks; they are announced on stderr and recorded in every JSON.

exit status: 0 all written, 1 some images failed (the others are written), 2 usage error.
"""

RUN_EPILOG = f"""\
examples:
  {PROG} run --task amg {SAMPLES_ARG} --out out/ --fallback-random-weights --points-per-side 16
  {PROG} run --task amg photos/ --out amg/ --checkpoint sam2.1_hiera_tiny.pt --overlay
  {PROG} annotate amg/                      # writes amg/{DEFAULT_PROMPTS_NAME}
  {PROG} run --task sps photos/ --out sps/ --prompts amg/{DEFAULT_PROMPTS_NAME}
"""

ANNOTATE_DESCRIPTION = f"""\
Make point prompts for --task sps / mps from the outputs of --task amg.

Reads every <stem>{MASKS_SUFFIX} written by '{PROG} run --task amg' in AMG_OUT_DIR and
writes one JSON object mapping each image name to a list of [x, y] points: one point per
mask, largest mask first. The point is the mask's centroid when that lies inside the mask,
otherwise the inside point farthest from the mask's edge. So sps uses a point of the
largest mask and mps one point per mask. Pass the file to '{PROG} run --prompts'.
"""


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog=PROG,
        description="Segment Anything 2 on images: batch masks from the command line.",
        formatter_class=_HelpFormatter,
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    run = commands.add_parser(
        "run",
        help="masks for a batch of images (amg, sps or mps)",
        description=RUN_DESCRIPTION,
        epilog=RUN_EPILOG,
        formatter_class=_HelpFormatter,
    )
    run.set_defaults(handler=run_command)
    run.add_argument(
        "images",
        nargs="+",
        metavar="IMAGES_OR_DIRS",
        help=f"image files, directories of images, or '{SAMPLES_ARG}'",
    )
    run.add_argument(
        "--task",
        choices=TASKS,
        required=True,
        help="amg (automatic masks), sps (single point) or mps (multi point)",
    )
    run.add_argument(
        "--out",
        type=Path,
        required=True,
        metavar="DIR",
        help="output directory (created if missing; existing files are replaced)",
    )
    run.add_argument(
        "--model", choices=MODEL_SIZES, default="tiny", help="model size (default: %(default)s)"
    )
    weights = run.add_mutually_exclusive_group()
    weights.add_argument(
        "--checkpoint",
        type=Path,
        metavar="PATH",
        help="an official checkpoint file (.pt) for --model "
        "(default: Meta's file name in the cache directory)",
    )
    weights.add_argument(
        "--random-weights",
        action="store_true",
        help="a seeded random model instead of a checkpoint: for smoke tests, "
        "masks are meaningless",
    )
    weights.add_argument(
        "--artifacts",
        type=Path,
        metavar="DIR",
        help=f"start from '{PROG} export' artifacts (weights included; the image path runs "
        "in OpenVINO, nothing is compiled); checked against their manifest and --model/--mode",
    )
    run.add_argument(
        "--seed",
        type=int,
        default=0,
        metavar="N",
        help="seed of the random weights (default: %(default)s)",
    )
    run.add_argument(
        "--fallback-random-weights",
        action="store_true",
        help="use random weights if the checkpoint cannot be found or loaded "
        "(a loud warning is printed and recorded)",
    )
    run.add_argument(
        "--device",
        choices=DEVICES,
        default="cpu",
        help="where the model runs (default: %(default)s)",
    )
    run.add_argument(
        "--mode",
        choices=tuple(MODES),
        default=DEFAULT_MODE,
        help="how the model runs: "
        + "; ".join(f"{name}: {mode.description}" for name, mode in MODES.items())
        + " (default: %(default)s)",
    )
    run.add_argument(
        "--prompts",
        type=Path,
        metavar="FILE",
        help="sps/mps: JSON object mapping image file name (or stem) to a list "
        f"of [x, y] pixel points, e.g. from '{PROG} annotate'",
    )
    run.add_argument(
        "--overlay",
        action="store_true",
        help=f"also write <stem>{OVERLAY_SUFFIX}: the masks over the image",
    )
    amg = run.add_argument_group("automatic mask generation (--task amg; defaults are Meta's)")
    _add_amg_flags(amg)

    annotate = commands.add_parser(
        "annotate",
        help="point prompts for sps/mps from amg outputs",
        description=ANNOTATE_DESCRIPTION,
        formatter_class=_HelpFormatter,
    )
    annotate.set_defaults(handler=annotate_command)
    annotate.add_argument(
        "amg_out_dir",
        type=Path,
        metavar="AMG_OUT_DIR",
        help=f"directory with the <stem>{MASKS_SUFFIX} files of --task amg",
    )
    annotate.add_argument(
        "--out",
        type=Path,
        metavar="FILE",
        help=f"prompts file to write (default: AMG_OUT_DIR/{DEFAULT_PROMPTS_NAME})",
    )
    _add_bench_parser(commands)
    add_server_commands(commands)
    add_export_commands(commands)
    add_cluster_commands(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``sam2serve`` console script; returns the exit status."""
    try:
        argv = list(sys.argv[1:] if argv is None else argv)
        args = build_parser().parse_args(argv)
        args.argv = argv  # the exact command, for reports that must say how to rerun them
        return args.handler(args)
    except UsageError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except SystemExit as exc:  # --help
        return exc.code if isinstance(exc.code, int) else EXIT_OK


# --------------------------------------------------------------------------- inputs


@dataclass(frozen=True)
class ImageInput:
    """One image to process: a file or a bundled sample, or an argument that gave none."""

    name: str  # the image's file name (or sample name): the JSON "image" and prompts key
    stem: str  # prefix of the output files
    path: Path | None = None
    sample: str | None = None
    error: str | None = None  # why this argument yields no image

    def pixels_source(self) -> bytes | np.ndarray:
        """Encoded bytes of a file, or a sample's array; reading is not timed."""
        if self.sample is not None:
            return load_sample(self.sample)
        assert self.path is not None
        if not self.path.exists():
            raise ImageFailure(f"image file not found: {str(self.path)!r}")
        try:
            return self.path.read_bytes()
        except OSError as exc:
            raise ImageFailure(f"cannot read image file {str(self.path)!r}: {exc}") from None

    def decode(self, source: bytes | np.ndarray) -> np.ndarray:
        """uint8 RGB pixels; the error names the file (decoding bytes cannot)."""
        from sam2serve.engine.image import ImageError, load_image

        try:
            return load_image(source)
        except ImageError as exc:
            message = str(exc)
        if self.path is not None:
            try:
                load_image(self.path)  # only to get the message with the file's name
            except ImageError as exc:
                message = str(exc)
        raise ImageFailure(message)


def expand_images(arguments: Sequence[str]) -> list[ImageInput]:
    """Files, directories (their image files, sorted) and 'samples', in argument order."""
    items: list[ImageInput] = []
    for argument in arguments:
        if argument == SAMPLES_ARG:
            items += [ImageInput(name, name, sample=name) for name in SAMPLE_NAMES]
            continue
        path = Path(argument)
        if path.is_dir():
            files = sorted(
                p for p in path.iterdir() if p.is_file() and p.suffix.lower() in IMAGE_EXTENSIONS
            )
            if not files:
                items.append(
                    ImageInput(
                        argument,
                        path.name,
                        path=path,
                        error=(
                            f"no image files ({', '.join(IMAGE_EXTENSIONS)}) in directory "
                            f"{str(path)!r}"
                        ),
                    )
                )
            items += [ImageInput(p.name, p.stem, path=p) for p in files]
        else:
            # Missing or unreadable files are reported when their turn comes.
            items.append(ImageInput(path.name, path.stem, path=path))
    return _deduplicate(items)


def _deduplicate(items: list[ImageInput]) -> list[ImageInput]:
    """Drop repeats of one file; refuse two images that would write the same outputs."""
    seen: set[str] = set()
    by_stem: dict[str, ImageInput] = {}
    unique = []
    for item in items:
        identity = item.sample or str(item.path.resolve() if item.path else item.name)
        if identity in seen:
            continue
        seen.add(identity)
        if item.error is None:
            other = by_stem.get(item.stem)
            if other is not None:
                raise UsageError(
                    f"images {_describe(other)} and {_describe(item)} would both write "
                    f"{item.stem}{MASKS_SUFFIX}; rename one or run them separately"
                )
            by_stem[item.stem] = item
        unique.append(item)
    return unique


def _describe(item: ImageInput) -> str:
    return f"sample {item.sample!r}" if item.sample else repr(str(item.path))


# --------------------------------------------------------------------------- prompts


Points = list[list[float]]


def load_prompts(path: Path) -> dict[str, Points]:
    """A prompts file: a JSON object mapping image name (or stem) to [[x, y], ...]."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UsageError(f"--prompts file not found: {str(path)!r}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read --prompts file {str(path)!r}: {exc}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"--prompts file {str(path)!r} is not valid JSON: {exc}") from None
    expected = 'a JSON object like {"photo.jpg": [[x, y], ...], ...}'
    if not isinstance(data, dict):
        raise UsageError(
            f"--prompts file {str(path)!r} must hold {expected}, got a {type(data).__name__}"
        )
    prompts: dict[str, Points] = {}
    for key, points in data.items():
        where = f"--prompts file {str(path)!r}, image {key!r}"
        if not isinstance(points, list):
            raise UsageError(f"{where}: expected a list of [x, y] points, got {points!r:.80}")
        prompts[key] = [
            _parse_point(point, f"{where}, point {i}") for i, point in enumerate(points)
        ]
    return prompts


def _parse_point(point: Any, where: str) -> list[float]:
    valid = (
        isinstance(point, list)
        and len(point) == 2
        and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in point)
        and all(math.isfinite(v) for v in point)
    )
    if not valid:
        raise UsageError(f"{where}: expected [x, y] with two finite numbers, got {point!r:.80}")
    return [float(point[0]), float(point[1])]


def match_prompts(
    prompts: dict[str, Points], images: list[ImageInput], path: Path
) -> dict[str, Points]:
    """Prompts by image name; every key must name a given image (by file name or stem)."""
    by_name = {item.name: item for item in images}
    by_stem = {item.stem: item for item in images}
    matched: dict[str, Points] = {}
    unknown = []
    for key, points in prompts.items():
        item = by_name.get(key) or by_stem.get(key)
        if item is None:
            unknown.append(key)
            continue
        if item.name in matched:
            raise UsageError(
                f"--prompts file {str(path)!r} has two entries for image {item.name!r}"
            )
        matched[item.name] = points
    if unknown:
        shown = ", ".join(repr(k) for k in unknown[:5]) + (" ..." if len(unknown) > 5 else "")
        raise UsageError(
            f"--prompts file {str(path)!r} names {len(unknown)} image(s) not given on the "
            f"command line: {shown}; give those images too, or remove them from the file"
        )
    return matched


# --------------------------------------------------------------------------- weights


def random_weights_banner(size: str, seed: int | None) -> str:
    from sam2serve.checkpoint import cache_dir

    bar = "!" * 78
    return "\n".join(
        [
            bar,
            f"!!! RANDOM WEIGHTS (seed {seed}): the {size} model is NOT a trained model.",
            "!!! Every mask is meaningless: use this run only to test the pipeline.",
            f"!!! For real masks put {get_config(size).checkpoint_names[0]} in {cache_dir()}",
            '!!! (or pass --checkpoint PATH). Each JSON records "random": true.',
            bar,
        ]
    )


def load_model_for(args: argparse.Namespace) -> Any:
    """The model the flags ask for; a missing checkpoint is a usage error (exit 2)."""
    import torch

    from sam2serve.checkpoint import CheckpointError, load_model

    if args.device == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda: CUDA is not available here; use --device cpu")
    start = time.perf_counter()
    if args.random_weights:
        model = load_model(args.model, random_weights=True, seed=args.seed, device=args.device)
    else:
        try:
            model = load_model(args.model, checkpoint=args.checkpoint, device=args.device)
        except CheckpointError as exc:
            if not args.fallback_random_weights:
                raise UsageError(str(exc)) from None
            print(f"{PROG}: warning: {exc}", file=sys.stderr)
            print(
                f"{PROG}: warning: --fallback-random-weights: using random weights", file=sys.stderr
            )
            model = load_model(args.model, random_weights=True, seed=args.seed, device=args.device)
    announce_weights(
        args.model,
        model.weights_info,
        f"on {args.device}",
        f"loaded in {time.perf_counter() - start:.1f} s",
    )
    return model


def announce_weights(size: str, info: Any, where: str, how: str) -> None:
    """The model line on stderr, after the banner when the weights are random."""
    if info.is_random:
        print(random_weights_banner(size, info.seed), file=sys.stderr)
    print(f"{PROG}: model {size} {where}, {info.describe()} ({how})", file=sys.stderr)


def predictor_from_artifacts(args: argparse.Namespace) -> Any:
    """A Predictor from export artifacts; a mismatch or a missing file is a usage error."""
    from sam2serve.accel.export import ArtifactError, load_artifacts

    if args.device != "cpu":
        raise UsageError("--artifacts runs the image path in OpenVINO on the CPU: use --device cpu")
    start = time.perf_counter()
    try:
        predictor = load_artifacts(args.artifacts, args.model, args.mode)
    except ArtifactError as exc:
        raise UsageError(str(exc)) from None
    announce_weights(
        args.model,
        predictor.model.weights_info,
        f"from artifacts {str(args.artifacts)!r}",
        f"ready in {time.perf_counter() - start:.1f} s, nothing compiled "
        f"(image path {predictor.image_encoder.source}; mask decoder "
        f"{predictor.fast_decoder.source})",
    )
    return predictor


def weights_record(info: Any) -> dict[str, Any]:
    record = {**info.as_dict(), "random": info.is_random}
    if info.is_random:
        record["warning"] = info.describe()
    return record


# --------------------------------------------------------------------------- amg params


def amg_params_from(args: argparse.Namespace) -> AMGParams:
    """AMGParams from the flags that were given (the rest keep Meta's defaults)."""
    given = {
        name: getattr(args, name)
        for name in AMG_HELP
        if name != "point_grids" and getattr(args, name) is not None
    }
    if args.point_grids is not None:
        given["point_grids"] = _load_point_grids(args.point_grids)
        given.setdefault("points_per_side", None)
    try:
        return AMGParams(**{**AMG_FIXED, **given})
    except AMGParamError as exc:
        raise UsageError(_with_flag_names(str(exc))) from None


def _load_point_grids(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UsageError(f"--point-grids file not found: {str(path)!r}") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UsageError(f"--point-grids file {str(path)!r} is not readable JSON: {exc}") from None


def _with_flag_names(message: str) -> str:
    """AMGParams names parameters as in Python; say the flag instead."""
    for name in sorted(AMG_HELP, key=len, reverse=True):
        message = re.sub(rf"(?<![\w-]){name}(?!\w)", _flag(name), message)
    return message


# --------------------------------------------------------------------------- run


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
    mode: Any  # accel.modes.Mode: how prompts are batched and masks turned into RLE
    generator: Any = None  # MaskGenerator for amg

    def __call__(
        self, item: ImageInput, source: bytes | np.ndarray, points: Points | None
    ) -> tuple[np.ndarray, list[dict[str, Any]], Timings]:
        from sam2serve.engine import tasks

        timer = tasks.StageTimer(self.predictor.device)
        with timer.stage("decode"):
            pixels = item.decode(source)
        if points is not None:
            _check_points_inside(points, pixels.shape[:2])
        flags = self.mode
        if self.task == "amg":
            records = tasks.amg(self.generator, pixels, flags=flags, timer=timer)
        elif self.task == "sps" and points:
            records = tasks.sps(self.predictor, pixels, points[0], flags=flags, timer=timer)
        else:  # mps, or sps without a point: the image is still encoded, no masks
            records = tasks.mps(self.predictor, pixels, points or [], flags=flags, timer=timer)
        return pixels, records, Timings.from_stages(timer.ms)


def _check_points_inside(points: Points, size: tuple[int, int]) -> None:
    height, width = size
    for x, y in points:
        if not (0 <= x <= width and 0 <= y <= height):
            raise ImageFailure(
                f"prompt point [{x:g}, {y:g}] lies outside the {width}x{height} image "
                "(are the prompts for another image?)"
            )


def run_command(args: argparse.Namespace) -> int:
    params = amg_params_from(args)  # validated for every task: a bad value is a bad value
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
    out_dir = _prepare_out_dir(args.out)

    from sam2serve.accel.modes import configure_predictor
    from sam2serve.engine.tasks import mask_generator

    mode = MODES[args.mode]
    if args.artifacts is not None:
        predictor = predictor_from_artifacts(args)
        model = predictor.model
    else:
        model = load_model_for(args)
        predictor = configure_predictor(model, mode)
    generator = mask_generator(predictor, params, mode) if args.task == "amg" else None
    segmenter = Segmenter(args.task, predictor, mode, generator)
    header = {
        "task": args.task,
        "model": args.model,
        "mode": args.mode,
        "device": args.device,
        "weights": weights_record(model.weights_info),
        "params": _task_params(args.task, params),
    }
    return _run_images(images, segmenter, prompts, header, out_dir, args)


def _task_params(task: str, params: AMGParams) -> dict[str, Any]:
    if task == "amg":
        return params.to_dict()
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
        raise UsageError(f"cannot create --out directory {str(out)!r}: {exc}") from None
    return out


def _run_images(
    images: list[ImageInput],
    segmenter: Segmenter,
    prompts: dict[str, Points] | None,
    header: dict[str, Any],
    out_dir: Path,
    args: argparse.Namespace,
) -> int:
    from tqdm import tqdm

    done: list[Timings] = []
    failed: list[str] = []
    progress = tqdm(
        images, desc=f"{PROG} {args.task}", unit="image", file=sys.stderr, dynamic_ncols=True
    )
    for item in progress:
        try:
            if item.error is not None:
                raise ImageFailure(item.error)
            points = _points_for(item, segmenter.task, prompts, args.prompts)
            source = item.pixels_source()
            pixels, records, timings = segmenter(item, source, points)
            height, width = pixels.shape[:2]
            result = {
                "image": item.name,
                "source": str(item.path) if item.path else f"skimage.data.{item.sample}",
                "width": width,
                "height": height,
                **header,
                "timings": timings.as_dict(),
                "masks": records,
            }
            _write_json(out_dir / f"{item.stem}{MASKS_SUFFIX}", result)
            if args.overlay:
                _write_overlay(
                    out_dir / f"{item.stem}{OVERLAY_SUFFIX}",
                    pixels,
                    records,
                    show_points=segmenter.task != "amg",
                )
        except ImageFailure as exc:
            failed.append(item.name)
            _error_line(f"{exc}; skipped")
            continue
        except Exception as exc:  # noqa: BLE001 - one image must not lose the others
            failed.append(item.name)
            _error_line(f"{_describe(item)} failed ({type(exc).__name__}: {exc}); skipped")
            continue
        done.append(timings)
        progress.set_postfix(masks=len(records), refresh=False)
    progress.close()
    _print_summary(done, failed, segmenter.task, out_dir)
    return EXIT_FAILED if failed else EXIT_OK


def _points_for(
    item: ImageInput, task: str, prompts: dict[str, Points] | None, path: Path | None
) -> Points | None:
    if task == "amg":
        return None
    assert prompts is not None
    if item.name not in prompts:
        raise ImageFailure(f"no prompts for image {item.name!r} in --prompts file {str(path)!r}")
    points = prompts[item.name]
    if not points:
        _message(f"{PROG}: warning: the prompts for {item.name!r} are empty: no masks")
    return points[:1] if task == "sps" else points


def _write_json(path: Path, data: dict[str, Any]) -> None:
    """Write atomically: a reader never sees half a file."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(_format_json(data), encoding="utf-8")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _json_safe(value: Any) -> Any:
    """NaN/inf (an empty mask's 0/0 stability score) become null: JSON has no NaN."""
    if isinstance(value, float):
        return finite_or_none(value)
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_json_safe(v) for v in value]
    return value


def _format_json(data: dict[str, Any]) -> str:
    """One top-level entry per line, and one line per element of a list of records:
    easy to read and to diff, and still plain JSON."""
    data = _json_safe(data)
    entries = []
    for key, value in data.items():
        if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
            text = "[\n" + ",\n".join(f"  {json.dumps(v)}" for v in value) + "\n ]"
        else:
            text = json.dumps(value)
        entries.append(f" {json.dumps(key)}: {text}")
    return "{\n" + ",\n".join(entries) + "\n}\n"


def _colour(index: int) -> np.ndarray:
    """Distinct, bright colours: hues spaced by the golden ratio."""
    hue = (index * 0.618033988749895) % 1.0
    return np.array(colorsys.hsv_to_rgb(hue, 0.85, 1.0), dtype=np.float32) * 255


def _write_overlay(
    path: Path, pixels: np.ndarray, records: list[dict[str, Any]], show_points: bool
) -> None:
    """Masks alpha-blended over the image, largest first so small ones stay visible."""
    from PIL import Image, ImageDraw

    from sam2serve.engine.rle import coco_to_rle, rle_to_mask

    canvas = pixels.astype(np.float32)
    order = sorted(range(len(records)), key=lambda i: -records[i]["area"])
    for rank, index in enumerate(order):
        mask = rle_to_mask(coco_to_rle(records[index]["segmentation"]))
        canvas[mask] = (1 - OVERLAY_ALPHA) * canvas[mask] + OVERLAY_ALPHA * _colour(rank)
    image = Image.fromarray(np.rint(canvas).clip(0, 255).astype(np.uint8))
    if show_points:
        draw = ImageDraw.Draw(image)
        radius = max(3, round(min(image.size) / 150))
        for record in records:
            for x, y in record["point_coords"]:
                draw.ellipse(
                    (x - radius, y - radius, x + radius, y + radius),
                    fill=(255, 255, 255),
                    outline=(0, 0, 0),
                    width=1,
                )
    image.save(path)


def _print_summary(done: list[Timings], failed: list[str], task: str, out_dir: Path) -> None:
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
        stages = done[0].stages
        lines.append(
            f"{PROG}: finer: "
            + ", ".join(
                f"{name.replace('_', ' ')} {np.mean([t.stages[name] for t in done]):.1f} ms"
                for name in stages
            )
        )
    print("\n".join(lines), file=sys.stderr)


# --------------------------------------------------------------------------- annotate


def annotate_file(path: Path) -> tuple[str, Points]:
    """Image name and prompt points (largest mask first) of one amg output file."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ImageFailure(f"cannot read {str(path)!r}: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("masks"), list):
        raise ImageFailure(f'{str(path)!r} is not a {PROG} output (no "masks" list)')
    if data.get("task") != "amg":
        raise ImageFailure(
            f"{str(path)!r} holds {data.get('task')!r} results; annotate needs --task amg outputs"
        )
    name = data.get("image") or path.name[: -len(MASKS_SUFFIX)]
    try:
        points = prompt_points(data["masks"])  # largest mask first
    except (KeyError, TypeError, ValueError) as exc:
        raise ImageFailure(f"{str(path)!r} has a malformed mask record: {exc!r}") from None
    return str(name), points


def annotate_command(args: argparse.Namespace) -> int:
    directory: Path = args.amg_out_dir
    if not directory.is_dir():
        raise UsageError(f"AMG_OUT_DIR {str(directory)!r} is not a directory")
    files = sorted(directory.glob(f"*{MASKS_SUFFIX}"))
    if not files:
        raise UsageError(
            f"no *{MASKS_SUFFIX} files in {str(directory)!r}; run "
            f"'{PROG} run --task amg IMAGES --out {directory}' first"
        )
    out: Path = args.out or directory / DEFAULT_PROMPTS_NAME
    prompts: dict[str, Points] = {}
    failed = 0
    for path in files:
        try:
            name, points = annotate_file(path)
        except ImageFailure as exc:
            failed += 1
            _error_line(f"{exc}; skipped")
            continue
        if name in prompts:
            failed += 1
            _error_line(f"{str(path)!r} repeats image {name!r}; skipped")
            continue
        prompts[name] = points
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        _write_json(out, prompts)
    except OSError as exc:
        raise UsageError(f"cannot write prompts file {str(out)!r}: {exc}") from None
    total = sum(len(p) for p in prompts.values())
    print(
        f"{PROG}: wrote {total} prompt point(s) for {len(prompts)} image(s) to "
        f"{str(out)!r}" + (f"; {failed} file(s) failed" if failed else ""),
        file=sys.stderr,
    )
    return EXIT_FAILED if failed else EXIT_OK


# --------------------------------------------------------------------------- bench

BENCH_DESCRIPTION = """\
Measure the published SAM2 experiment on this machine: AMG, SPS and MPS latency per
image (decode + segmentation + RLE), first-iteration time, start-up time, peak memory and
accuracy against the baseline (mIoU, fail count), one row per mode.

Every mode and task runs in its own fresh process, with its own empty compile cache
(--warm repeats a compiling mode on the cache its cold run filled). The baseline always
runs first: SPS prompts are the centre point of its largest AMG mask, MPS prompts the
centre points of all its AMG masks, and every other mode's masks are compared with its
masks. Mode 'reference' runs Meta's own sam2 code on the same weights when the sam2
package is installed. With --random-weights AMG keeps next to no masks, so the point
tasks then use grid prompts (SPS: the image centre; MPS: --mps-prompts grid points) and
the report says so.

outputs, in --out (default bench/results): NAME.csv (every number), NAME.md (tables
shaped like the published ones, with the command, machine and date) and NAME.png (where
the time goes, by stage). The Markdown tables are also printed.
"""

BENCH_EPILOG = f"""\
examples:
  {PROG} bench --task all --model tiny --modes reference,baseline,fast,furious \\
      --images samples --n 4 --random-weights
  {PROG} bench --task amg --modes baseline,fast --images photos/ --n 100 \\
      --checkpoint sam2.1_hiera_tiny.pt --points-per-side 16
"""


def _add_bench_parser(commands: argparse._SubParsersAction) -> None:
    from sam2serve.bench.runner import PROMPT_POLICIES, REFERENCE, REFERENCES

    bench = commands.add_parser(
        "bench",
        help="latency, memory and accuracy of the modes (the published SAM2 experiment)",
        description=BENCH_DESCRIPTION,
        epilog=BENCH_EPILOG,
        formatter_class=_HelpFormatter,
    )
    bench.set_defaults(handler=bench_command)
    bench.add_argument(
        "--task",
        choices=(*TASKS, "all"),
        default="all",
        help="which task to measure, or all three (default: %(default)s)",
    )
    bench.add_argument(
        "--model", choices=MODEL_SIZES, default="tiny", help="model size (default: %(default)s)"
    )
    bench.add_argument(
        "--modes",
        default=",".join((REFERENCE, *MODES)),
        metavar="LIST",
        help="comma-separated modes, each a row: "
        f"{', '.join((*REFERENCES, *MODES))}; fast and furious also as NAME+aot (image path "
        "and mask decoder from 'sam2serve export' artifacts, exported once before the runs) "
        "or NAME+jit "
        "(converted with OpenVINO at start-up); reference-bf16 is Meta's code under bf16 "
        "autocast (default: %(default)s; baseline is always run)",
    )
    bench.add_argument(
        "--images",
        default=SAMPLES_ARG,
        metavar="DIR|samples",
        help=f"a directory of images, or '{SAMPLES_ARG}' for the bundled photos "
        "(default: %(default)s)",
    )
    bench.add_argument(
        "--n",
        type=int,
        metavar="N",
        help="images to run, cycling through the directory or the samples "
        "(default: every image of the directory; the 4 samples)",
    )
    weights = bench.add_mutually_exclusive_group(required=True)
    weights.add_argument(
        "--checkpoint", type=Path, metavar="PATH", help="an official checkpoint file for --model"
    )
    weights.add_argument(
        "--random-weights",
        action="store_true",
        help="seeded random weights, written once as an official-shaped checkpoint that "
        "every mode loads (masks are meaningless, the work is real)",
    )
    bench.add_argument(
        "--seed", type=int, default=0, metavar="N", help="random weights seed (default: 0)"
    )
    bench.add_argument(
        "--device", choices=DEVICES, default="cpu", help="where to run (default: %(default)s)"
    )
    bench.add_argument(
        "--out",
        type=Path,
        default=Path("bench/results"),
        metavar="DIR",
        help="where NAME.csv / .md / .png go (default: %(default)s)",
    )
    bench.add_argument(
        "--name",
        metavar="NAME",
        help="file name of the outputs (default: bench_MODEL_DEVICE)",
    )
    bench.add_argument(
        "--point-prompts",
        choices=PROMPT_POLICIES,
        default="auto",
        help="where SPS / MPS prompts come from: the baseline's AMG masks (amg), a grid "
        "(grid), or auto: grid with random weights, amg otherwise (default: %(default)s)",
    )
    bench.add_argument(
        "--mps-prompts",
        type=int,
        default=64,
        metavar="N",
        help="MPS prompts per image when they come from the grid (default: %(default)s)",
    )
    bench.add_argument(
        "--aot-decoder",
        choices=("aoti", "eager"),
        default="aoti",
        help="how the NAME+aot artifacts run the mask decoder: AOTInductor programs, or "
        "eagerly (exports ~2 min faster per mode) (default: %(default)s)",
    )
    bench.add_argument(
        "--warm",
        action="store_true",
        help="also run each mode that compiles a second time, on the compile cache its "
        "cold run filled",
    )
    bench.add_argument(
        "--timeout",
        type=float,
        metavar="SECONDS",
        help="give up on a run (one mode, one task) after this long (default: no limit)",
    )
    bench.add_argument(
        "--work-dir",
        type=Path,
        metavar="DIR",
        help="keep the runs' specs, raw results and images here (default: a temporary "
        "directory, removed at the end)",
    )
    amg = bench.add_argument_group("automatic mask generation (defaults are Meta's)")
    _add_amg_flags(amg)


def bench_command(args: argparse.Namespace) -> int:
    import shlex

    from sam2serve.bench.report import markdown, write_outputs
    from sam2serve.bench.runner import BenchConfig, BenchError, run_bench

    params = amg_params_from(args)
    modes = tuple(m.strip() for m in args.modes.split(",") if m.strip())
    if not modes:
        raise UsageError("--modes is empty; give e.g. --modes baseline,fast")
    if args.n is not None and args.n < 1:
        raise UsageError(f"--n must be at least 1, got {args.n}")
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise UsageError("--device cuda: CUDA is not available here; use --device cpu")
    config = BenchConfig(
        tasks=TASKS if args.task == "all" else (args.task,),
        model=args.model,
        modes=modes,
        images=args.images,
        n=args.n,
        checkpoint=args.checkpoint,
        random_weights=args.random_weights,
        seed=args.seed,
        device=args.device,
        amg_params=params,
        out_dir=args.out,
        name=args.name or f"bench_{args.model}_{args.device}",
        mps_prompts=args.mps_prompts,
        point_prompts=args.point_prompts,
        warm=args.warm,
        aot_decoder=args.aot_decoder,
        command=f"{PROG} " + shlex.join(getattr(args, "argv", [])),
        work_dir=args.work_dir,
        timeout_s=args.timeout,
    )
    try:
        result = run_bench(config)
    except BenchError as exc:
        raise UsageError(str(exc)) from None
    paths = write_outputs(result, config.out_dir, config.name)
    print(markdown(result, paths["png"].name))
    failed = [f"{run.task} {run.label}" for run in result.runs if not run.ok and not run.skipped]
    skipped = [f"{run.task} {run.label}" for run in result.runs if run.skipped]
    print(
        f"{PROG}: bench: wrote {', '.join(str(p) for p in paths.values())}"
        + (f"; skipped: {', '.join(skipped)}" if skipped else "")
        + (f"; FAILED: {', '.join(failed)}" if failed else ""),
        file=sys.stderr,
    )
    return EXIT_FAILED if failed else EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
