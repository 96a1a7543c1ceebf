"""``sam2serve run --task concepts``: every instance of noun phrases (and exemplar boxes) in
a batch of images, with SAM 3 (:mod:`sam2serve.concepts`); ``run`` dispatches here.

Everything the user can get wrong is checked before the model loads: the flags (a SAM 2
flag such as --checkpoint is refused, as a concepts flag is on the SAM 2 tasks), the
phrases, the images, the prompts file (boxes inside their images), the output paths; then
the device and SAM 3's weights (missing weights: the one ``WeightsError`` line). The
phrases' text is encoded once for the whole run; each image is encoded once and all its
phrases run through the detector as one batch over that encoding. Per image it writes
``<stem>_concepts.json`` (and with --overlay ``<stem>_concepts.png``), then the --coco
dataset, whose categories are the phrases. One image that fails is reported and skipped
(exit 1 at the end).

With random weights every score is about 0.25, so Meta's threshold (0.5) would keep
nothing: unless --score-thresh is given the run keeps every instance (threshold 0) and
says so; every overlay carries the RANDOM WEIGHTS stamp.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sam2serve.commands.amg_flags import AMG_FLAG_NAMES
from sam2serve.commands.common import (
    EXIT_FAILED,
    EXIT_OK,
    PROG,
    CommandParser,
    ItemFailure,
    UsageError,
    error_line,
    flag_of,
    info_line,
    message,
)
from sam2serve.commands.concept_prompts import (
    EXAMPLE,
    MAX_BOXES,
    MAX_PHRASE_CHARS,
    MAX_PHRASES,
    VISUAL_PHRASE,
    ImageConcepts,
    image_concepts,
    load_concept_prompts,
    merged,
    parse_text,
)
from sam2serve.commands.concepts_flags import (
    add_concepts_flags,
    check_concepts_backend,
    concepts_spec,
)
from sam2serve.commands.concepts_outputs import (
    CONCEPTS_OVERLAY_SUFFIX,
    CONCEPTS_SUFFIX,
    ConceptOutputs,
)
from sam2serve.commands.inputs import ImageInput, check_coco_file, expand_images
from sam2serve.commands.run_outputs import prepare_out_dir
from sam2serve.concepts.phrases import META_SCORE_THRESH, default_score_thresh

TASK = "concepts"
DEFAULT_SCORE_THRESH = META_SCORE_THRESH  # concepts.engine's (Meta's; checked by a test)
RANDOM_WEIGHTS_STAMP = "RANDOM WEIGHTS: instances are meaningless"
GROUP_TITLE = "concepts (--task concepts: SAM 3)"
# The flags of one side only: given to the other side's task, they are a usage error.
CONCEPTS_ONLY = ("text", "score_thresh", "max_instances", "sam3_weights", "sam3_size")
SAM2_ONLY = (
    "model",
    "checkpoint",
    "artifacts",
    "fallback_random_weights",
    "min_score",
    "max_masks",
    "mask_format",
    "image_decode",
    *AMG_FLAG_NAMES,
)

TASK_HELP = f"""\
  concepts  every instance of noun phrases with SAM 3 (Meta's Segment Anything 3):
       --text "cat,dog" (comma-separated, each 1..{MAX_PHRASE_CHARS} characters; CSV's
       quotes keep a comma in a phrase: 'cat,"salt, pepper"') and/or
       exemplar boxes per image in --prompts; instances scored above --score-thresh
       (Meta's {DEFAULT_SCORE_THRESH}); --mode applies to SAM 3 too (furious: bf16
       where the CPU has it natively); the other SAM 2.1 flags (--model, --checkpoint,
       AMG, ...) do not: SAM 3 is chosen by --sam3-weights / --sam3-size"""

PROMPTS_HELP = f"""\
concepts prompts (--prompts FILE with --task concepts): a JSON object mapping image file
  name (or stem) to {{"boxes": [{{"box": [x1, y1, x2, y2], "positive": true}}, ...],
  "text": ["phrase", ...]}}, both optional: exemplar boxes (image pixels; positive false: an
  example of what is not the concept; at most {MAX_BOXES}) refine every phrase of that
  image; "text" adds phrases for that image after the --text ones (at most {MAX_PHRASES} in
  all); boxes alone find the phrase "{VISUAL_PHRASE}" (Meta's rule). Checked before the
  model loads, boxes against each image's size."""

OUTPUTS_HELP = f"""\
  <stem>{CONCEPTS_SUFFIX}  --task concepts: {{"image", "width", "height", "task", "model",
                       "device", "weights", "params", "phrases", "boxes", "timings",
                       "concepts": [{{"phrase", "category_id", "instances": [...]}}]}}; an
                       instance has "score", "bbox" (COCO XYWH of the mask), "area",
                       "segmentation" (COCO RLE) and "box" (the detector's XYXY box)
  <stem>{CONCEPTS_OVERLAY_SUFFIX}   --task concepts --overlay: each phrase in its colour, labelled
  --coco FILE with --task concepts: categories are the phrases (ids 1..N in order of
                       first appearance), score = the instance's score"""


def add_arguments(parser: CommandParser) -> None:
    group = parser.add_argument_group(GROUP_TITLE)
    group.add_argument(
        "--text",
        metavar="PHRASES",
        help='noun phrases, comma-separated: "cat,dog,red car"; one holding a comma in '
        """double quotes: 'cat,"salt, pepper"' (each 1.."""
        f"{MAX_PHRASE_CHARS} characters, no control or invisible characters; the COCO "
        "categories, in this order)",
    )
    group.add_argument(
        "--score-thresh",
        type=float,
        metavar="X",
        help=f"keep instances scored above X, in [0, 1] (default: Meta's {DEFAULT_SCORE_THRESH}; "
        "0 with --random-weights, whose scores are about 0.25)",
    )
    group.add_argument(
        "--max-instances",
        type=int,
        metavar="N",
        help="keep at most N instances per phrase and image, the highest scores first "
        "(default: every instance above the threshold)",
    )
    add_concepts_flags(group)


# --------------------------------------------------------------------------- flags


def flag_defaults(
    add_run_arguments: Callable[[CommandParser], None],
) -> tuple[dict[str, Any], dict[str, str]]:
    """run's flags' defaults and names, from a parser ``add_run_arguments`` (run's own
    add_arguments) fills (a flag not given has its default)."""
    parser = CommandParser(prog=f"{PROG} run")
    add_run_arguments(parser)
    return {action.dest: action.default for action in parser._actions}, flag_of(parser)


def check_task_flags(
    args: argparse.Namespace, add_run_arguments: Callable[[CommandParser], None]
) -> None:
    """A flag of the other model's tasks is a usage error naming it (``run`` asks, for
    every task, with its add_arguments)."""
    defaults, flags = flag_defaults(add_run_arguments)
    concepts = args.task == TASK
    for dest in SAM2_ONLY if concepts else CONCEPTS_ONLY:
        if getattr(args, dest) != defaults[dest]:
            if concepts:
                raise UsageError(
                    f"{flags[dest]} is for --task amg, sps and mps (SAM 2.1); --task concepts "
                    "runs SAM 3, chosen by --sam3-weights and --sam3-size"
                )
            raise UsageError(
                f"{flags[dest]} is for --task concepts (SAM 3); --task {args.task} is SAM 2.1"
                + (" and finds every object without phrases" if args.task == "amg" else "")
            )


def _checked_numbers(args: argparse.Namespace) -> None:
    if args.score_thresh is not None and not 0.0 <= args.score_thresh <= 1.0:  # NaN too
        raise UsageError(f"--score-thresh must be a number in [0, 1], got {args.score_thresh}")
    if args.max_instances is not None and args.max_instances < 1:
        raise UsageError(f"--max-instances must be an integer >= 1, got {args.max_instances}")


# --------------------------------------------------------------------------- the run


@dataclass
class Plan:
    """The checked inputs of a run: images, what to find in each, the categories."""

    images: list[ImageInput]
    per_image: dict[str, ImageConcepts]
    phrases: tuple[str, ...]  # every phrase of the run: the COCO categories, ids 1..N
    score_thresh: float | None
    max_instances: int | None


def plan(args: argparse.Namespace) -> Plan:
    """The checked work of ``run --task concepts`` (run has refused the SAM 2.1 flags)."""
    check_concepts_backend(args.backend)
    _checked_numbers(args)
    text = parse_text(args.text)
    if not text and args.prompts is None:
        raise UsageError(
            '--task concepts needs --text "PHRASE,PHRASE" and/or --prompts FILE of exemplar '
            f"boxes and phrases per image ({EXAMPLE})"
        )
    images = expand_images(args.images)
    prompts = None if args.prompts is None else load_concept_prompts(args.prompts, images, text)
    per_image = image_concepts(text, prompts, images)
    phrases = merged(text, *(per_image[item.name].phrases for item in images))
    return Plan(images, per_image, phrases, args.score_thresh, args.max_instances)


def run_concepts(args: argparse.Namespace) -> int:
    """The handler of ``run --task concepts``."""
    checked = plan(args)
    spec = concepts_spec(args, args.device)
    out_dir = prepare_out_dir(args.out)
    if args.coco is not None:
        check_coco_file(args.coco)

    concepts = _load(args, spec)
    thresh = checked.score_thresh
    if thresh is None:
        thresh = default_score_thresh(spec.random_weights)  # the service's rule too
        if spec.random_weights:
            info_line(
                "random weights: every instance is kept (--score-thresh 0; scores are about "
                f"0.25 and Meta's {DEFAULT_SCORE_THRESH} would drop them all); give "
                "--score-thresh to choose"
            )
    header = {
        "task": TASK,
        "model": f"sam3-{spec.size}" if spec.size != "full" else "sam3",
        "mode": args.mode,
        "device": str(concepts.device),
        "weights": _weights_record(spec),
        "params": {"score_thresh": thresh, "max_instances": checked.max_instances},
    }
    outputs = ConceptOutputs(
        out_dir,
        checked.phrases,
        overlay=args.overlay,
        stamp=RANDOM_WEIGHTS_STAMP if spec.random_weights else None,
        coco_path=args.coco,
        info={"description": f"{PROG} run --task concepts", **header},
    )
    runner = Runner(concepts, checked, thresh)
    return runner.run_all(header, outputs)


def _load(args: argparse.Namespace, spec: Any) -> Any:
    """SAM 3 on the device; every weights problem one usage-error line."""
    from sam2serve.commands.model import check_device
    from sam2serve.concepts.checkpoint import CheckpointMismatch
    from sam2serve.concepts.weights import WeightsError, require
    from sam2serve.runtime.concepts import describe_concepts_mode, load_concepts_in_mode
    from sam2serve.runtime.process import configure_process
    from sam2serve.runtime.spec import RuntimeSpec

    check_device(spec.device)
    # The mode's process settings: threads, and TF32 on CUDA only where the mode allows it.
    configure_process(RuntimeSpec(device=spec.device, threads=args.threads, mode=args.mode))
    start = time.perf_counter()
    try:
        if not spec.random_weights:
            require(spec.weights)
        concepts = load_concepts_in_mode(spec, args.mode)
    except (WeightsError, CheckpointMismatch) as exc:
        raise UsageError(str(exc)) from None
    if spec.random_weights:
        bar = "!" * 78
        message(
            f"{bar}\n!!! RANDOM WEIGHTS (seed {spec.seed}): SAM 3 ({spec.size}) is NOT a trained "
            f"model.\n!!! Every instance is meaningless: use this run only to test the pipeline."
            f"\n!!! For real ones: '{PROG} download --model sam3' (needs HF_TOKEN).\n{bar}"
        )
    where = "random weights" if spec.random_weights else f"weights {str(spec.weights or '')!r}"
    info_line(
        f"SAM 3 ({spec.size}) on {spec.device}, {where} "
        f"(loaded in {time.perf_counter() - start:.1f} s); {describe_concepts_mode(args.mode, concepts)}"
    )
    return concepts


def _weights_record(spec: Any) -> dict[str, Any]:
    record: dict[str, Any] = {"random": spec.random_weights, "size": spec.size}
    if spec.random_weights:
        record["seed"] = spec.seed
        record["warning"] = RANDOM_WEIGHTS_STAMP
    else:
        from sam2serve.concepts.weights import weights_dir

        record["path"] = str(spec.weights or weights_dir())
    return record


# --------------------------------------------------------------------------- per image


@dataclass
class Timer:
    """Milliseconds per stage of one image; CUDA work is synchronised at each boundary."""

    device: Any
    ms: dict[str, float] = field(default_factory=dict)

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        import torch

        sync = torch.cuda.synchronize if self.device.type == "cuda" else (lambda: None)
        sync()
        start = time.perf_counter()
        try:
            yield
        finally:
            sync()
            self.ms[name] = self.ms.get(name, 0.0) + (time.perf_counter() - start) * 1000

    def as_dict(self) -> dict[str, float]:
        total = sum(self.ms.values())
        return {**{f"{k}_ms": round(v, 3) for k, v in self.ms.items()}, "total_ms": round(total, 3)}


@dataclass
class Runner:
    """Runs the plan: the phrases' text encoded once, then one image at a time."""

    concepts: Any  # concepts.runtime.Concepts
    plan: Plan
    score_thresh: float
    text: Any = None
    text_ms: float = 0.0

    def encode_text(self) -> None:
        start = time.perf_counter()
        self.text = self.concepts.encode_text(list(self.plan.phrases))
        self.text_ms = (time.perf_counter() - start) * 1000

    def text_for(self, phrases: tuple[str, ...]) -> Any:
        """The run's text encoding restricted to ``phrases`` (rows of the one encoding)."""
        if phrases == self.plan.phrases:
            return self.text
        from sam2serve.concepts.engine import text_rows

        return text_rows(self.text, [self.plan.phrases.index(phrase) for phrase in phrases])

    def image(self, item: ImageInput) -> tuple[Any, dict[str, list], Timer]:
        """(pixels, {phrase: instances}, timings) of one image."""
        from sam2serve.concepts.engine import ExemplarBox

        wanted = self.plan.per_image[item.name]
        boxes = [ExemplarBox(b.xyxy, b.positive) for b in wanted.boxes]
        source = item.read()
        timer = Timer(self.concepts.device)
        with timer.stage("decode"):
            pixels = item.decode(source)
        with timer.stage("encode"):
            [encoding] = self.concepts.encode([pixels])
        with timer.stage("detect"):
            found = self.concepts.detect(
                encoding, wanted.phrases, boxes, self.score_thresh, self.text_for(wanted.phrases)
            )
        return pixels, found, timer

    def run_all(self, header: dict[str, Any], outputs: Any) -> int:
        from tqdm import tqdm

        self.encode_text()
        done: list[Timer] = []
        failed: list[str] = []
        progress = tqdm(
            self.plan.images, desc=f"{PROG} {TASK}", unit="image", file=sys.stderr,
            dynamic_ncols=True,
        )  # fmt: skip
        for item in progress:
            try:
                pixels, found, timer = self.image(item)
                wanted = self.plan.per_image[item.name]
                count = outputs.write(
                    item, pixels, found, wanted, header, timer, self.plan.max_instances
                )
            except ItemFailure as exc:
                failed.append(item.name)
                error_line(f"{exc}; skipped")
                continue
            except Exception as exc:  # noqa: BLE001 - one image must not lose the others
                failed.append(item.name)
                error_line(f"{item.describe()} failed ({type(exc).__name__}: {exc}); skipped")
                continue
            done.append(timer)
            progress.set_postfix(instances=count, refresh=False)
        progress.close()
        outputs.finish()
        self.summary(done, failed, outputs.out_dir)
        return EXIT_FAILED if failed else EXIT_OK

    def summary(self, done: list[Timer], failed: list[str], out_dir: Path) -> None:
        import numpy as np

        shown = ", ".join(failed[:10]) + (", ..." if len(failed) > 10 else "")
        lines = [
            f"{PROG}: {TASK}: {len(done)} image(s) written to {str(out_dir)!r}, "
            f"{len(failed)} failed" + (f" ({shown})" if failed else ""),
            f"{PROG}: {len(self.plan.phrases)} phrase(s) encoded once in {self.text_ms:.1f} ms",
        ]
        if done:
            totals = np.array([sum(t.ms.values()) for t in done])
            p50, p90 = np.percentile(totals, [50, 90])
            lines.append(
                f"{PROG}: latency per image (decode + encode + detect + RLE): p50 {p50:.1f} ms, "
                f"p90 {p90:.1f} ms, mean {totals.mean():.1f} ms"
            )
            lines.append(
                f"{PROG}: mean per stage: "
                + ", ".join(
                    f"{name} {np.mean([t.ms.get(name, 0.0) for t in done]):.1f} ms"
                    for name in done[0].ms
                )
            )
        print("\n".join(lines), file=sys.stderr)


__all__ = ["add_arguments", "check_task_flags", "plan", "run_concepts"]
