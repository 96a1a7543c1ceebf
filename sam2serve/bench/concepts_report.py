"""The concept bench's report: a Markdown file (command, machine, load, tables) and a CSV
of every repeat's stage times."""

from __future__ import annotations

import csv
import io
from pathlib import Path

import numpy as np

from sam2serve.bench.concepts import (
    IMAGE_STAGES,
    PHRASES,
    STAGES,
    ConceptsBenchResult,
    ConceptsRow,
)
from sam2serve.runtime.concepts import CONCEPT_MODES

BASELINE = "baseline"

__all__ = ["concepts_csv", "concepts_markdown", "stage_stats", "write_concepts_outputs"]

STAGE_TITLES = {
    "preprocess": "preprocess + upload",
    "backbone": "vision backbone",
    "text": "text encoder",
    "detector": "detector + heads",
    "postprocess": "post-processing",
}


def stage_stats(values: list[float]) -> tuple[float, float, float]:
    """p50, min, max (ms)."""
    array = np.asarray(values, dtype=np.float64)
    return float(np.percentile(array, 50)), float(array.min()), float(array.max())


def _cell(values: list[float]) -> str:
    p50, low, high = stage_stats(values)
    if len(values) == 1:
        return _ms(p50)
    return f"{_ms(p50)} ({_ms(low)}–{_ms(high)})"


def _ms(value: float) -> str:
    return f"{value / 1000:.2f} s" if value >= 1000 else f"{value:.1f} ms"


def _load(load: tuple[float, float, float]) -> str:
    return "{:.2f} {:.2f} {:.2f}".format(*load)


def _flops_of(result: ConceptsBenchResult, stage: str, phrases: int) -> float | None:
    return result.flops.get((stage, 0 if stage in IMAGE_STAGES else phrases))


def _peak(result: ConceptsBenchResult, row: ConceptsRow, stage: str) -> tuple[float | None, str]:
    """The host's peak for the arithmetic this stage ran in (fp16 against bf16's)."""
    peak = result.config.host_peak
    if peak is None:
        return None, ""
    kind = row.precisions.get(stage, "fp32")
    return getattr(peak, "bf16" if kind == "fp16" else kind), kind


def _header(result: ConceptsBenchResult) -> list[str]:
    config, machine = result.config, result.machine
    spec = config.spec
    weights = (
        f"seeded random (seed {spec.seed}), size {spec.size}"
        if spec.random_weights
        else f"SAM 3 from {spec.weights or 'the cache'}"
    )
    peak = config.host_peak
    lines = [
        "# SAM 3 concepts: per-image cost by stage",
        "",
        f"- **command:** `{config.command}` (niceness {result.niceness})",
        (
            f"- **date:** {result.started} (the run took {result.duration_s / 60:.1f} min; "
            f"model built in {result.build_s:.0f} s, {result.parameters:,} parameters)"
        ),
        f"- **machine:** {machine.cpu} ({machine.cpu_isa}; torch CPU capability "
        f"{machine.torch_cpu_capability}), {machine.logical_cores} logical cores (torch "
        f"uses {machine.torch_threads} threads)"
        + (f", {machine.memory_gb:.0f} GiB RAM" if machine.memory_gb else "")
        + f"; {spec.device}; torch {machine.torch}",
        (
            f"- **load average (1/5/15 min):** {_load(result.load_start)} at the start, "
            f"{_load(result.load_end)} at the end (per row below)"
        ),
        f"- **weights:** {weights}",
        f"- **work:** {config.repeats} timed repeat(s) after {config.warmup} warm-up, each "
        f"on the next image of {', '.join(dict.fromkeys(f'{n} {a.shape[1]}x{a.shape[0]}' for n, a in config.images))}; "
        f"phrases: the first N of {', '.join(PHRASES)}; score threshold "
        f"{config.score_thresh:g}"
        + (
            " (every query kept: post-processing at its largest)"
            if config.score_thresh == 0
            else ""
        ),
    ]
    if peak is not None:
        lines.append(
            f"- **host peak** ({peak.source or 'host-peak.py'}): fp32 {peak.fp32 or '-'} "
            f"GFLOP/s, int8 {peak.int8 or '-'} GOP/s, bf16 {peak.bf16 or '-'} GFLOP/s"
            + (" (emulated)" if peak.bf16_emulated else "")
        )
    lines.append(
        "- **modes:** "
        + "; ".join(f"{m}: {CONCEPT_MODES[m]}" for m in dict.fromkeys((BASELINE, *config.modes)))
    )
    return lines


def _row_cells(row: ConceptsRow) -> list[str]:
    if not row.timed:
        return [row.note or "not run", *[""] * len(STAGES)]
    return [_cell(row.totals_ms()), *(_cell(row.stages_ms[s]) for s in STAGES)]


def _accuracy_cells(row: ConceptsRow) -> list[str]:
    if row.mode == BASELINE:
        return ["(baseline)", ""]
    if row.miou is None:
        return ["-", "-"]
    return [f"{row.miou:.4f} ({row.compared} instances)", f"{row.max_score_diff:.2e}"]


def _per_image_table(result: ConceptsBenchResult) -> list[str]:
    header = [
        "mode",
        "phrases",
        "total per image p50 (min–max)",
        *(STAGE_TITLES[s] for s in STAGES),
        f"mIoU vs baseline (top {result.config.top_k} per phrase)",
        "max score diff",
        "load start → end",
    ]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in result.rows:
        cells = [row.mode, str(row.phrases), *_row_cells(row), *_accuracy_cells(row)]
        cells.append(f"{row.load_start[0]:.2f} → {row.load_end[0]:.2f}" if row.ran else "")
        lines.append("| " + " | ".join(cells) + " |")
    done = {row.mode for row in result.rows}
    for mode in dict.fromkeys(result.config.modes):
        if mode not in done:
            cells = [mode, "-", "not finished: the run stopped before this mode"]
            lines.append("| " + " | ".join(cells + [""] * (len(header) - 3)) + " |")
    return lines


def _flops_table(result: ConceptsBenchResult) -> list[str]:
    timed = [row for row in result.rows if row.timed]
    first = result.config.phrase_counts[0]
    modes = [row.mode for row in timed if row.phrases == first]
    header = ["stage", "phrases", "GFLOP (counted)"]
    header += [f"{mode}: GFLOP/s, share of peak" for mode in modes]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for stage in STAGES:
        image = stage in IMAGE_STAGES
        for phrases in [first] if image else result.config.phrase_counts:
            flops = _flops_of(result, stage, phrases)
            cells = [STAGE_TITLES[stage], "any" if image else str(phrases)]
            cells.append(f"{flops / 1e9:,.1f}" if flops else "not counted")
            for mode in modes:
                row = next(r for r in timed if r.mode == mode and r.phrases == phrases)
                cells.append(_rate_cell(result, row, stage, flops))
            lines.append("| " + " | ".join(cells) + " |")
    return lines


def _rate_cell(result, row: ConceptsRow, stage: str, flops: float | None) -> str:
    if not flops:
        return "-"
    p50 = stage_stats(row.stages_ms[stage])[0]
    rate = flops / (p50 / 1000) / 1e9
    peak, kind = _peak(result, row, stage)
    share = f", {100 * rate / peak:.0f}% of {kind} peak" if peak else ""
    return f"{rate:,.1f}{share}"


def concepts_markdown(result: ConceptsBenchResult) -> str:
    lines = _header(result)
    lines += ["", "## Per image, by stage (p50 over the repeats, min–max in brackets)", ""]
    lines += _per_image_table(result)
    lines += [
        "",
        (
            "The image stages (preprocess, backbone) are measured once per repeat and shared by "
            "that repeat's phrase counts (they do not depend on the phrases); a row's total is "
            "its repeat's image stages plus its own phrase stages."
        ),
    ]
    if result.flops:
        lines += ["", "## Arithmetic rate per stage", ""]
        lines += _flops_table(result)
        lines += [
            "",
            (
                "FLOPs counted once per stage with torch.utils.flop_counter.FlopCounterMode on the "
                "fp32 model (matrix products, convolutions, attention; resizes and elementwise "
                "work are not counted, so preprocess and post-processing have none); a mode's "
                "rate is those FLOPs over its p50 stage time (int8: the same operations, as int8 "
                "GOP/s), its share against the host peak of the arithmetic the stage runs in."
            ),
        ]
    return "\n".join(lines) + "\n"


def concepts_csv(result: ConceptsBenchResult) -> str:
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(["mode", "phrases", "repeat", *STAGES, "total_ms", "miou", "max_score_diff"])
    for row in result.rows:
        if not row.timed:
            writer.writerow(
                [row.mode, row.phrases, "", *[""] * len(STAGES), "", row.miou, row.max_score_diff]
            )
            continue
        for repeat, total in enumerate(row.totals_ms()):
            stages = [f"{row.stages_ms[s][repeat]:.3f}" for s in STAGES]
            writer.writerow(
                [
                    row.mode,
                    row.phrases,
                    repeat,
                    *stages,
                    f"{total:.3f}",
                    row.miou,
                    row.max_score_diff,
                ]
            )
    return out.getvalue()


def write_concepts_outputs(
    result: ConceptsBenchResult, out_dir: Path, name: str
) -> dict[str, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"md": out_dir / f"{name}.md", "csv": out_dir / f"{name}.csv"}
    paths["md"].write_text(concepts_markdown(result))
    paths["csv"].write_text(concepts_csv(result))
    return paths
