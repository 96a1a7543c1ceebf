"""``sam2serve bench --task concepts``: SAM 3 concept segmentation, per stage, per mode.

One process, one model: the concept model is loaded once and every mode
(:mod:`sam2serve.runtime.concepts`) is derived from a copy of it, so every mode runs on
identical weights. Each repeat takes the next image (cycled) and times, one after another:

- ``preprocess``: the uint8 image resized and normalised on the device (the upload);
- ``backbone``: the vision encoder (ViT + neck), once per image;
- ``text``: the phrases' text encoder (one batch);
- ``detector``: geometry/exemplar encoder, DETR encoder and decoder, mask decoder and
  scoring, all phrases as one batch over the image's one encoding;
- ``postprocess``: Meta's rule (scores, boxes, masks resized to the image, to the host).

The image stages do not depend on the phrases, so each repeat encodes its image once and
then runs every phrase count (default 1 and 10) on that encoding: a row's total per repeat
is the image stages of that repeat plus its own phrase stages. Warm-up repeats run the
same work untimed. FLOPs are counted once per stage on the baseline with
``torch.utils.flop_counter.FlopCounterMode`` (matrix products, convolutions and attention;
resizes and elementwise work are not counted) and, given host-peak numbers, each timed
stage is reported as a share of the host's peak for its arithmetic (fp32, int8 or bf16).

Accuracy: each mode's instances are compared with the baseline's on the same image and
phrases (score threshold 0, so every query is an instance and instances match by query
index), the ``top_k`` queries by baseline score: mIoU of the masks and the largest score
difference (:func:`sam2serve.concepts.agreement.agreement`).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from sam2serve.bench.machine import MachineInfo, load_average, machine_info
from sam2serve.concepts import engine
from sam2serve.concepts.agreement import agreement
from sam2serve.concepts.runtime import Concepts, ConceptsSpec
from sam2serve.runtime.concepts import CONCEPT_MODES, apply_concepts_mode, stage_precisions

BASELINE, FURIOUS, INT8 = "baseline", "furious", "int8"

__all__ = [
    "CONCEPTS_TASK",
    "PHRASES",
    "STAGES",
    "ConceptsBenchConfig",
    "ConceptsBenchResult",
    "ConceptsRow",
    "HostPeak",
    "count_flops",
    "parse_host_peak",
    "run_concepts_bench",
]

CONCEPTS_TASK = "concepts"
IMAGE_STAGES = ("preprocess", "backbone")
PHRASE_STAGES = ("text", "detector", "postprocess")
STAGES = (*IMAGE_STAGES, *PHRASE_STAGES)
PHRASES = ("cat", "dog", "person", "car", "tree", "cup", "bicycle", "bird", "chair", "bottle")


class ConceptsBenchError(Exception):
    """A problem with the concept bench's inputs (one line for the user)."""


@dataclass(frozen=True)
class HostPeak:
    """Matrix-product peaks of this host (``host-peak.py``'s output): GFLOP/s or GOP/s."""

    fp32: float | None = None
    bf16: float | None = None
    int8: float | None = None
    bf16_emulated: bool = False
    source: str = ""


def parse_host_peak(text: str, source: str = "") -> HostPeak:
    """``fp32 68 GFLOP/s`` / ``bf16 17 GFLOP/s (emulated ...)`` / ``int8 246 GOP/s`` lines."""
    found: dict[str, float] = {}
    emulated = False
    for line in text.splitlines():
        match = re.match(r"\s*(fp32|bf16|int8)\s+([0-9.]+)\s+G(?:FL)?OP/s", line)
        if match:
            found[match.group(1)] = float(match.group(2))
            emulated |= match.group(1) == "bf16" and "emulated" in line
    if not found:
        raise ConceptsBenchError(
            f"no 'fp32/bf16/int8 N GFLOP/s' line in the host-peak output {source!r}"
        )
    return HostPeak(**found, bf16_emulated=emulated, source=source)


@dataclass(frozen=True)
class ConceptsBenchConfig:
    spec: ConceptsSpec
    modes: tuple[str, ...] = (BASELINE, FURIOUS, INT8)
    images: tuple[tuple[str, np.ndarray], ...] = ()  # (name, uint8 RGB), cycled per repeat
    phrase_counts: tuple[int, ...] = (1, 10)
    repeats: int = 3
    warmup: int = 1
    score_thresh: float = 0.0
    top_k: int = 20
    count_flops: bool = True
    host_peak: HostPeak | None = None
    native_bf16: bool | None = None  # None: read the host (sam2serve.runtime.host)
    command: str = ""

    def __post_init__(self) -> None:
        unknown = [m for m in self.modes if m not in CONCEPT_MODES]
        if unknown:
            raise ConceptsBenchError(
                f"unknown concepts mode(s) {', '.join(map(repr, unknown))}; expected some of "
                f"{', '.join(CONCEPT_MODES)}"
            )
        if not self.images:
            raise ConceptsBenchError("the concept bench needs at least one image")
        bad = [n for n in self.phrase_counts if not 1 <= n <= len(PHRASES)]
        if not self.phrase_counts or bad:
            raise ConceptsBenchError(
                f"phrase counts must be 1..{len(PHRASES)}; got {list(self.phrase_counts)}"
            )
        if self.repeats < 1 or self.warmup < 0 or self.top_k < 1:
            raise ConceptsBenchError(
                f"repeats >= 1, warmup >= 0 and top_k >= 1 are needed; got {self.repeats}, "
                f"{self.warmup}, {self.top_k}"
            )
        if not 0.0 <= self.score_thresh <= 1.0:
            raise ConceptsBenchError(f"score_thresh must be in [0, 1]; got {self.score_thresh}")


@dataclass
class ConceptsRow:
    """One mode and phrase count: per repeat, each stage's milliseconds."""

    mode: str
    phrases: int
    stages_ms: dict[str, list[float]] = field(default_factory=dict)
    miou: float | None = None  # against the baseline (None for the baseline itself)
    max_score_diff: float | None = None
    compared: int = 0  # instances compared with the baseline
    load_start: tuple[float, float, float] = (0.0, 0.0, 0.0)
    load_end: tuple[float, float, float] = (0.0, 0.0, 0.0)
    note: str = ""  # why the row is not timed, where it is not
    ran: bool = False  # the mode was built and ran (timed or not)
    # What each model stage computed in (runtime.concepts.stage_precisions): backbone, text,
    # detector -> int8 / bf16 / fp16 / fp32; the other stages are fp32.
    precisions: dict[str, str] = field(default_factory=dict)

    @property
    def timed(self) -> bool:
        return bool(self.stages_ms)

    def totals_ms(self) -> list[float]:
        return [sum(parts) for parts in zip(*self.stages_ms.values(), strict=True)]


@dataclass
class ConceptsBenchResult:
    config: ConceptsBenchConfig
    machine: MachineInfo
    started: str
    duration_s: float
    load_start: tuple[float, float, float]
    load_end: tuple[float, float, float]
    niceness: int
    parameters: int
    build_s: float
    flops: dict[tuple[str, int], float]  # (stage, phrases) -> FLOPs (image stages: phrases 0)
    rows: list[ConceptsRow]


def _cpu_flash_sdpa_flops(query, key, value, *args, out_shape=None, **kwargs) -> int:
    from torch.utils.flop_counter import sdpa_flop_count

    return sdpa_flop_count(query, key, value)


def count_flops(fn: Callable[[], Any]) -> tuple[float, Any]:
    """FLOPs of ``fn()`` (products, convolutions, attention, CPU flash attention included)
    and its result."""
    from torch.utils.flop_counter import FlopCounterMode

    custom = {}
    cpu_flash = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)
    if cpu_flash is not None:
        custom[cpu_flash] = _cpu_flash_sdpa_flops
    with FlopCounterMode(display=False, custom_mapping=custom) as counter:
        result = fn()
    return float(counter.get_total_flops()), result


class _Clock:
    """Stage times in ms, the device synchronised at each boundary."""

    def __init__(self, device: torch.device) -> None:
        self.sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
        self.sync()
        self.last = time.perf_counter()

    def lap(self) -> float:
        self.sync()
        now = time.perf_counter()
        elapsed, self.last = (now - self.last) * 1000, now
        return elapsed


def _text(concepts: Concepts, phrases: Sequence[str]):
    return engine.encode_text(concepts.model, concepts.tokenize, phrases)


@torch.inference_mode()
def _image_pass(concepts: Concepts, image: np.ndarray, times: dict[str, float] | None):
    clock = _Clock(concepts.device)
    pixels = engine.model_pixels(concepts.model, [image])
    preprocess_ms = clock.lap()
    vision = concepts.model.get_vision_features(pixel_values=pixels)
    backbone_ms = clock.lap()
    if times is not None:
        times.update(preprocess=preprocess_ms, backbone=backbone_ms)
    return engine.split_encodings(vision, [image])[0]


@torch.inference_mode()
def _phrase_pass(
    concepts: Concepts,
    encoding: engine.ConceptEncoding,
    phrases: Sequence[str],
    score_thresh: float,
    times: dict[str, float] | None,
) -> list[list[engine.Instance]]:
    clock = _Clock(concepts.device)
    text = _text(concepts, phrases)
    text_ms = clock.lap()
    outputs = engine.run_detector(concepts.model, encoding, len(phrases), (), text)
    detector_ms = clock.lap()
    instances = engine.postprocess(outputs, encoding.height, encoding.width, score_thresh)
    post_ms = clock.lap()
    if times is not None:
        times.update(text=text_ms, detector=detector_ms, postprocess=post_ms)
    return instances


def _best(instances: list[engine.Instance], top_k: int) -> set[int]:
    """The indices of the ``top_k`` best scores."""
    return set(sorted(range(len(instances)), key=lambda i: -instances[i].score)[:top_k])


def _top_only(instances: list[engine.Instance], keep: set[int]) -> list[engine.Instance]:
    """The same list with masks kept at the indices ``keep`` only (memory: 200 full-size
    masks per phrase otherwise)."""
    empty = np.zeros((0, 0), dtype=bool)
    return [
        inst if i in keep else engine.Instance(empty, inst.box, inst.score)
        for i, inst in enumerate(instances)
    ]


def phrase_flops(
    concepts: Concepts, encoding: engine.ConceptEncoding, count: int
) -> tuple[float, float]:
    """Counted FLOPs of the text encoder and of the detector for the first ``count``
    phrases on ``encoding``."""
    with torch.inference_mode():
        text_flops, text = count_flops(lambda: _text(concepts, PHRASES[:count]))
        detector_flops, _ = count_flops(
            lambda: engine.run_detector(concepts.model, encoding, count, (), text)
        )
    return text_flops, detector_flops


def _measure_flops(
    concepts: Concepts, config: ConceptsBenchConfig, log: Callable[[str], None]
) -> dict[tuple[str, int], float]:
    """FLOPs per stage, once, on the first image (outside any timing). The phrase stages
    are counted for one phrase and scaled: every phrase is its own prompt of the batch
    (tokens padded to the 32-token context, the image's features expanded), so N phrases
    are exactly N times the work (tests/bench/test_bench_concepts.py counts both)."""
    image = config.images[0][1]
    # transformers types a nested config loosely (dict | config | None): read as declared.
    vision_config: Any = concepts.model.config.vision_config
    size = vision_config.backbone_config.image_size
    flops: dict[tuple[str, int], float] = {}
    with torch.inference_mode():
        pixels = engine.preprocess([image], size, concepts.device)
        flops["backbone", 0], vision = count_flops(
            lambda: concepts.model.get_vision_features(pixel_values=pixels)
        )
    encoding = engine.split_encodings(vision, [image])[0]
    text_flops, detector_flops = phrase_flops(concepts, encoding, 1)
    for count in config.phrase_counts:
        flops["text", count] = text_flops * count
        flops["detector", count] = detector_flops * count
    log(f"FLOPs counted: backbone {flops['backbone', 0] / 1e9:.1f} GFLOP")
    return flops


def _run_mode(
    concepts: Concepts,
    mode: str,
    config: ConceptsBenchConfig,
    timed: bool,
    reference: dict[tuple[int, int], list[list[engine.Instance]]],
    log: Callable[[str], None],
) -> list[ConceptsRow]:
    """Every phrase count of ``mode``: warm-up, then the timed repeats (or, when not
    ``timed``, one untimed repeat for the accuracy alone)."""
    rows = {n: ConceptsRow(mode, n, load_start=load_average()) for n in config.phrase_counts}
    repeats = config.repeats if timed else 1
    for index in range(-config.warmup if timed else 0, repeats):
        image = config.images[max(index, 0) % len(config.images)][1]
        image_times: dict[str, float] = {}
        encoding = _image_pass(concepts, image, image_times)
        for count, row in rows.items():
            phrase_times: dict[str, float] = {}
            per_phrase = _phrase_pass(
                concepts, encoding, PHRASES[:count], config.score_thresh, phrase_times
            )
            if index < 0:
                continue
            if timed:
                for stage, ms in {**image_times, **phrase_times}.items():
                    row.stages_ms.setdefault(stage, []).append(ms)
            if mode == BASELINE:
                reference[index, count] = [
                    _top_only(instances, _best(instances, config.top_k)) for instances in per_phrase
                ]
            elif (index, count) in reference:
                # The masks compared are those of the baseline's best queries: a reduced
                # precision may reorder the scores, so its own best ones are not those.
                kept = [
                    _top_only(instances, _best(base, config.top_k))
                    for instances, base in zip(per_phrase, reference[index, count], strict=True)
                ]
                _accumulate(row, reference[index, count], kept, config.top_k)
        log(
            f"{mode}: repeat {index + 1 if index >= 0 else 'warm-up'} "
            f"backbone {image_times['backbone'] / 1000:.1f} s"
        )
    for row in rows.values():
        row.ran, row.load_end = True, load_average()
    return list(rows.values())


def _accumulate(row: ConceptsRow, base, other, top_k: int) -> None:
    """Fold one image's per-phrase agreement into the row (mIoU weighted by instances)."""
    for reference, instances in zip(base, other, strict=True):
        result = agreement(reference, instances, top_k)
        total = row.compared + result.compared
        previous = (row.miou or 0.0) * row.compared
        row.miou = (previous + result.miou * result.compared) / total if total else 1.0
        row.max_score_diff = max(row.max_score_diff or 0.0, result.max_score_diff)
        row.compared = total


def run_concepts_bench(
    config: ConceptsBenchConfig,
    concepts: Concepts | None = None,
    log: Callable[[str], None] = lambda line: None,
    after_mode: Callable[[ConceptsBenchResult], None] | None = None,
) -> ConceptsBenchResult:
    """Load the model (unless given), then every mode, the baseline first;
    ``after_mode`` gets the result so far after each mode (a partial report)."""
    import os

    from sam2serve.concepts.runtime import load_concepts
    from sam2serve.runtime.host import host_isa

    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    clock, load_start = time.perf_counter(), load_average()
    build = time.perf_counter()
    if concepts is None:
        concepts = load_concepts(config.spec)
    build_s = time.perf_counter() - build
    log(f"model ready in {build_s:.0f} s")
    native_bf16 = host_isa().native_bf16 if config.native_bf16 is None else config.native_bf16
    if concepts.device.type == "cuda":
        native_bf16 = True
    flops = _measure_flops(concepts, config, log) if config.count_flops else {}
    reference: dict[tuple[int, int], list[list[engine.Instance]]] = {}
    rows: list[ConceptsRow] = []

    def result() -> ConceptsBenchResult:
        return ConceptsBenchResult(
            config=config,
            machine=machine_info(),
            started=started,
            duration_s=time.perf_counter() - clock,
            load_start=load_start,
            load_end=load_average(),
            niceness=os.nice(0),
            parameters=sum(p.numel() for p in concepts.model.parameters()),
            build_s=build_s,
            flops=flops,
            rows=list(rows),
        )

    for mode in (BASELINE, *(m for m in config.modes if m != BASELINE)):
        if mode == INT8 and concepts.device.type != "cpu":
            rows += [
                ConceptsRow(mode, n, note="not run: int8 is a CPU mode")
                for n in config.phrase_counts
            ]
            continue
        # Where bf16 is emulated, furious would answer in fp32 (the product's rule): the
        # bench builds it in bf16 anyway, to check its accuracy, and does not time it.
        emulated = mode == FURIOUS and not native_bf16 and concepts.device.type == "cpu"
        reduced = torch.bfloat16 if emulated else None
        moded = apply_concepts_mode(concepts, mode, reduced=reduced, copy=True)
        mode_rows = _run_mode(moded, mode, config, not emulated, reference, log)
        precisions = stage_precisions(moded, mode)
        for row in mode_rows:
            row.precisions = precisions
            if emulated:
                row.note = "not measured: no bf16 on this host (emulated; accuracy only)"
        rows += mode_rows
        del moded
        if after_mode is not None:
            after_mode(result())
    return result()


def load_images(source: str, n: int | None) -> tuple[tuple[str, np.ndarray], ...]:
    """``samples`` (the bundled photos) or a directory's images, cycled to ``n``."""
    from sam2serve.bench.runner import IMAGE_EXTENSIONS, SAMPLES

    if source == SAMPLES:
        from sam2serve.samples import SAMPLE_NAMES, load_sample

        found = [(name, load_sample(name)) for name in SAMPLE_NAMES]
    else:
        from sam2serve.engine.image import load_image

        directory = Path(source)
        if not directory.is_dir():
            raise ConceptsBenchError(f"--images {source!r} is neither '{SAMPLES}' nor a directory")
        files = sorted(
            p for p in directory.iterdir() if p.is_file() and p.suffix.lower() in IMAGE_EXTENSIONS
        )
        if not files:
            raise ConceptsBenchError(f"--images directory {source!r} has no image files")
        try:
            found = [(p.name, load_image(p)) for p in files[: n or len(files)]]
        except ValueError as exc:
            raise ConceptsBenchError(str(exc)) from None
    count = n or len(found)
    return tuple(found[i % len(found)] for i in range(count))
