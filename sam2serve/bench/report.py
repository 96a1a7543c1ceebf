"""The benchmark's outputs: a CSV (every number), a Markdown report shaped like the
published tables (one row per mode, factors against the baseline of the same run) and a
PNG chart of where each mode's time goes. Drawn with Pillow only."""

from __future__ import annotations

import csv
import io
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from sam2serve.bench.machine import MachineInfo
from sam2serve.bench.metrics import Accuracy, LatencyStats
from sam2serve.bench.runner import BASELINE, BenchConfig, BenchResult, RunResult
from sam2serve.bench.variants import AMG_VARIANTS, DEFAULT_VARIANT
from sam2serve.engine.tasks import STAGES

__all__ = [
    "CSV_COLUMNS",
    "Bar",
    "RunHeader",
    "accuracy_columns",
    "bar_chart",
    "csv_text",
    "header_lines",
    "latency_columns",
    "markdown",
    "render_chart",
    "write_files",
    "write_outputs",
]

TASK_TITLES = {
    "amg": "AMG (automatic mask generation)",
    "sps": "SPS (single point segmentation)",
    "mps": "MPS (multi point segmentation)",
}
STAGE_TITLES = {
    "decode": "decode",
    "preprocess": "preprocess",
    "encode": "encode",
    "decode_masks": "decode masks",
    "postprocess": "postprocess",
    "rle": "RLE",
}
STAGE_COLOURS = {
    "decode": (141, 160, 203),
    "preprocess": (166, 216, 84),
    "encode": (252, 141, 98),
    "decode_masks": (102, 194, 165),
    "postprocess": (231, 138, 195),
    "rle": (255, 217, 47),
}
MACHINE_COLUMNS = ("cpu_isa", "torch_cpu_capability")
CSV_COLUMNS = (
    "task",
    "variant",
    "mode",
    "cache",
    "images",
    "first_iter_ms",
    "p50_ms",
    "p90_ms",
    "p99_ms",
    "mean_ms",
    "max_ms",
    "images_per_s",
    "ready_s",
    "peak_mem_mb",
    "masks_per_image",
    "miou",
    "fails",
    "compared_images",
    "compared_masks",
    "exact_masks",
    "p50_speedup",
    "p90_speedup",
    "mean_speedup",
    "first_iter_speedup",
    *(f"{stage}_ms" for stage in STAGES),
    "error",
    *MACHINE_COLUMNS,
)


def machine_columns(machine: MachineInfo) -> dict[str, object]:
    """The host's ISA on every CSV row: results of an AVX2-only and an AVX512-BF16 CPU of
    the same name differ 2x."""
    return {"cpu_isa": machine.cpu_isa, "torch_cpu_capability": machine.torch_cpu_capability}


def _baseline(result: BenchResult, task: str, variant: str = "") -> RunResult | None:
    """The baseline run that ``task`` (and its AMG ``variant``) is compared with."""
    for run in result.runs:
        if (
            run.task == task
            and run.variant == variant
            and run.mode == BASELINE
            and run.cache == "cold"
            and run.ok
        ):
            return run
    return None


def _panels(result: BenchResult) -> list[tuple[str, str]]:
    """(task, variant) in report order: each task of the run, AMG once per variant."""
    panels = []
    for task in result.config.tasks:
        variants = [""]
        if task == "amg":
            variants = list(dict.fromkeys(r.variant for r in result.runs if r.task == task))
        panels += [(task, variant) for variant in variants or [""]]
    return panels


def _panel_title(task: str, variant: str) -> str:
    if variant in ("", DEFAULT_VARIANT):
        return TASK_TITLES[task]
    return f"{TASK_TITLES[task]}, variant {variant}"


def _task_label(run: RunResult) -> str:
    return run.task if run.variant in ("", DEFAULT_VARIANT) else f"{run.task} {run.variant}"


class Timed(Protocol):
    """A run with latency statistics (an image task's or the video task's)."""

    stats: LatencyStats | None

    @property
    def ok(self) -> bool: ...


def _speedup(run: Timed, baseline: Timed | None, attribute: str) -> float | None:
    if baseline is None or not run.ok:
        return None
    value = getattr(run.stats, attribute)
    reference = getattr(baseline.stats, attribute)
    return reference / value if value > 0 else None


def _row(run: RunResult, baseline: RunResult | None) -> dict[str, object]:
    stats, accuracy = run.stats, run.accuracy
    row: dict[str, object] = dict.fromkeys(CSV_COLUMNS, "")
    row.update(
        task=run.task, variant=run.variant, mode=run.label, cache=run.cache, error=run.error or ""
    )
    if stats is not None:
        row.update(latency_columns(stats, "images", "first_iter_ms", "images_per_s"))
        row.update(
            ready_s=round(run.ready_s or 0.0, 3),
            peak_mem_mb=round(run.peak_mem_mb or 0.0, 1),
            masks_per_image=round(run.masks_per_image or 0.0, 3),
        )
        for column, attribute in (
            ("p50_speedup", "p50_ms"),
            ("p90_speedup", "p90_ms"),
            ("mean_speedup", "mean_ms"),
            ("first_iter_speedup", "first_ms"),
        ):
            factor = _speedup(run, baseline, attribute)
            row[column] = "" if factor is None else round(factor, 3)
        for stage in STAGES:
            row[f"{stage}_ms"] = round(run.stages_ms.get(stage, 0.0), 2)
    if accuracy is not None:
        row.update(accuracy_columns(accuracy, "compared_images"))
    return row


def latency_columns(stats: LatencyStats, count: str, first: str, rate: str) -> dict[str, object]:
    """A run's latency statistics as CSV cells (``count``, ``first`` and ``rate`` name the
    columns of the unit: images, or video frames)."""
    return {
        count: stats.images,
        first: round(stats.first_ms, 2),
        "p50_ms": round(stats.p50_ms, 2),
        "p90_ms": round(stats.p90_ms, 2),
        "p99_ms": round(stats.p99_ms, 2),
        "mean_ms": round(stats.mean_ms, 2),
        "max_ms": round(stats.max_ms, 2),
        rate: round(stats.images_per_s, 4),
    }


def accuracy_columns(accuracy: Accuracy, compared: str) -> dict[str, object]:
    """Agreement with the baseline as CSV cells (``compared``: the compared images' or
    frames' column)."""
    return {
        "miou": "" if accuracy.miou is None else round(accuracy.miou, 6),
        "fails": accuracy.fails,
        compared: accuracy.compared_images,
        "compared_masks": accuracy.masks,
        "exact_masks": accuracy.exact,
    }


def csv_text(result: BenchResult) -> str:
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=CSV_COLUMNS, lineterminator="\n")
    writer.writeheader()
    for run in result.runs:
        row = _row(run, _baseline(result, run.task, run.variant))
        writer.writerow(row | machine_columns(result.machine))
    return out.getvalue()


# --------------------------------------------------------------------------- markdown


def _ms(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 else f"{value:.1f}"


def _with_factor(text: str, factor: float | None) -> str:
    return text if factor is None else f"{text} ({factor:.2f}x)"


def _accuracy_cells(accuracy: Accuracy | None) -> list[str]:
    if accuracy is None:
        return ["", "", ""]
    miou = "n/a" if accuracy.miou is None else f"{accuracy.miou:.4f}"
    exact = f"{accuracy.exact}/{accuracy.masks}" if accuracy.masks else "-"
    return [miou, str(accuracy.fails), exact]


def _task_table(result: BenchResult, task: str, variant: str = "") -> list[str]:
    baseline = _baseline(result, task, variant)
    header = (
        "| mode | p50 ms | p90 ms | p99 ms | mean ms | max ms | first iter ms | images/s "
        "| start→ready s | peak mem MB | masks/img | mIoU | fails | exact masks |"
    )
    lines = [header, _separator(header)]
    for run in (r for r in result.runs if r.task == task and r.variant == variant):
        if not run.ok:
            lines.append(f"| {run.label} | {run.error} |" + " |" * (header.count("|") - 3))
            continue
        stats = run.stats
        assert stats is not None

        def factor(attribute: str, run: RunResult = run) -> float | None:
            return _speedup(run, baseline, attribute)

        throughput = None
        if baseline is not None and baseline.stats and baseline.stats.images_per_s > 0:
            throughput = stats.images_per_s / baseline.stats.images_per_s
        cells = [
            run.label,
            _with_factor(_ms(stats.p50_ms), factor("p50_ms")),
            _with_factor(_ms(stats.p90_ms), factor("p90_ms")),
            _ms(stats.p99_ms),
            _with_factor(_ms(stats.mean_ms), factor("mean_ms")),
            _ms(stats.max_ms),
            _with_factor(_ms(stats.first_ms), factor("first_ms")),
            _with_factor(f"{stats.images_per_s:.3g}", throughput),
            f"{run.ready_s:.1f}",
            f"{run.peak_mem_mb:,.0f}",
            f"{run.masks_per_image:.2f}",
            *_accuracy_cells(run.accuracy),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _separator(header: str) -> str:
    return "|" + "---|" * (header.count("|") - 1)


def _stage_table(result: BenchResult) -> list[str]:
    header = (
        "| task | mode | "
        + " | ".join(STAGE_TITLES[s] for s in STAGES)
        + " | sum | largest stage |"
    )
    lines = [header, _separator(header)]
    for run in result.runs:
        if not run.ok:
            continue
        total = sum(run.stages_ms.values())
        largest = max(STAGES, key=lambda s: run.stages_ms.get(s, 0.0))
        share = run.stages_ms[largest] / total if total > 0 else 0.0
        cells = [_task_label(run), run.label]
        cells += [_ms(run.stages_ms.get(stage, 0.0)) for stage in STAGES]
        cells += [_ms(total), f"{STAGE_TITLES[largest]} ({share:.0%})"]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _amg_parameters(result: BenchResult) -> str:
    from sam2serve.engine.amg import AMGParams

    params = result.config.amg_params
    defaults = AMGParams(output_mode=params.output_mode)
    changed = [
        f"{name}={getattr(params, name)!r}"
        for name in AMGParams.field_names()
        if name not in ("output_mode", "point_grids")
        and getattr(params, name) != getattr(defaults, name)
    ]
    if params.point_grids is not None:
        changed.append(f"point_grids=({sum(len(g) for g in params.point_grids)} points)")
    clicks = (
        f"{params.points_per_side}x{params.points_per_side} = {params.points_per_side**2} clicks"
        if params.points_per_side is not None
        else "explicit point grids"
    )
    text = f"{clicks} per image; "
    text += (
        ("changed from Meta's defaults: " + ", ".join(changed)) if changed else "Meta's defaults"
    )
    return text


class RunHeader(Protocol):
    """What every benchmark result says about its run (image and video tasks alike)."""

    config: BenchConfig
    machine: MachineInfo
    weights: str
    started: str
    duration_s: float
    load_start: tuple[float, float, float]
    load_end: tuple[float, float, float]


def header_lines(result: RunHeader, title: str) -> list[str]:
    """The report's title, then the command, date, machine, software, load and weights."""
    config, machine = result.config, result.machine
    device = machine.cuda_device if config.device == "cuda" else "CPU only"
    load = "{:.2f} {:.2f} {:.2f}"
    return [
        f"# {title}",
        "",
        f"- **command:** `{config.command}`",
        f"- **date:** {result.started} (the run took {result.duration_s / 60:.1f} min)",
        f"- **machine:** {machine.cpu} ({machine.cpu_isa}; torch CPU capability "
        f"{machine.torch_cpu_capability}), {machine.logical_cores} logical cores "
        f"(torch uses {machine.torch_threads} threads), "
        + (f"{machine.memory_gb:.0f} GiB RAM, " if machine.memory_gb else "")
        + f"{machine.os}; {device}",
        f"- **software:** Python {machine.python}, torch {machine.torch}"
        + (f", Meta's sam2 {machine.sam2} (mode reference)" if machine.sam2 else ""),
        (
            f"- **load average (1/5/15 min):** {load.format(*result.load_start)} at the "
            f"start, {load.format(*result.load_end)} at the end"
        ),
        f"- **weights:** {result.weights}",
    ]


def markdown(result: BenchResult, chart_name: str | None = None) -> str:
    config = result.config
    distinct = list(dict.fromkeys(image.name for image in result.images))
    sizes = ", ".join(
        f"{image.name} {image.width}x{image.height}"
        for image in {image.name: image for image in result.images}.values()
    )
    lines = [
        *header_lines(result, f"sam2serve bench: SAM 2.1 {config.model}, {config.device}"),
        (
            f"- **images:** {len(result.images)} = {len(distinct)} distinct image(s) cycled "
            f"({config.images}; {sizes})"
        ),
        f"- **AMG:** {_amg_parameters(result)}",
        (
            f"- **image decode:** --image-decode {config.image_decode} (each run's decode "
            "is in its notes)"
        ),
    ]
    for task, text in result.prompts.items():
        lines.append(f"- **{task.upper()} prompts:** {text}")
    for note in result.notes:
        lines.append(f"- **note:** {note}")
    lines += [
        "",
        "Latency is per image: decode + segmentation + RLE (reading the file excluded), in a "
        "fresh process per mode and task. The first image is reported on its own (*first "
        "iter*); p50 / p90 / p99 / mean / max are over the other images. images/s counts every "
        "image, the first included. Factors in parentheses are against the baseline of this "
        "run (higher is better). *start→ready*: process start to model ready. *peak mem*: "
        + ("max allocated on the GPU" if config.device == "cuda" else "max RSS of the process")
        + ". mIoU / fails / exact masks compare each mode's masks with the baseline's "
        "(AMG: an image fails when its mask count differs; masks paired in area order).",
    ]
    for task, variant in _panels(result):
        lines += ["", f"## {_panel_title(task, variant)}", ""]
        if variant not in ("", DEFAULT_VARIANT):
            explanation = (
                f"Variant {variant}: {AMG_VARIANTS[variant].help}. With random weights the "
                "default AMG keeps next to no masks, so its rows time the encoder and the "
                "decoder only; these rows carry the whole AMG workload. mIoU and fails compare "
                f"with the baseline's {variant} masks."
            )
            lines += [explanation, ""]
        lines += _task_table(result, task, variant)
        notes = sorted(
            {
                note
                for run in result.runs
                if run.task == task and run.variant == variant
                for note in run.notes
            }
        )
        lines += [f"\n_{note}._" for note in notes]
    lines += [
        "",
        "## Where the time goes",
        "",
        (
            "Mean ms per image over the steady-state images, by stage. *decode masks* is the "
            "prompt encoder and mask decoder; *postprocess* is everything else between the "
            "decoder and the RLE (upscaling, thresholds, stability scores, boxes, NMS)."
        ),
        "",
        *_stage_table(result),
    ]
    if chart_name:
        lines += ["", f"![latency by stage]({chart_name})"]
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- chart


def _font(size: int) -> Any:  # a Pillow font of either kind
    from PIL import ImageFont

    try:
        return ImageFont.load_default(size=size)
    except TypeError:  # Pillow < 10.1 has one bitmap size
        return ImageFont.load_default()


Colour = tuple[int, int, int]


@dataclass(frozen=True)
class Bar:
    """One row of a chart: its label, the bar's segments (value, colour) stacked from the
    left, and the text written after it; ``error`` rows show their text in red, no bar."""

    label: str
    segments: Sequence[tuple[float, Colour]]
    text: str
    error: bool = False


def bar_chart(
    title: str,
    legend: Sequence[tuple[str, Colour]],
    panels: Sequence[tuple[str, Sequence[Bar]]],
    right: int = 260,
) -> bytes:
    """PNG: a title, a legend, then one panel per (title, bars), each panel scaled to its
    longest bar."""
    from PIL import Image, ImageDraw

    width, left, bar, gap = 1100, 170, 24, 10
    title_font, font = _font(18), _font(14)
    top = 70 if legend else 50
    height = top + sum(50 + len(bars) * (bar + gap) for _, bars in panels) + 20
    image = Image.new("RGB", (width, height), "white")
    draw = ImageDraw.Draw(image)
    draw.text((left, 10), title, fill="black", font=title_font)
    x: float = left
    for name, colour in legend:
        draw.rectangle((x, 40, x + 14, 54), fill=colour)
        draw.text((x + 18, 40), name, fill="black", font=font)
        x += 24 + int(draw.textlength(name, font=font)) + 16
    y = top
    plot = width - left - right
    for panel_title, bars in panels:
        draw.text((10, y + 8), panel_title, fill="black", font=title_font)
        y += 40
        longest = max((sum(v for v, _ in b.segments) for b in bars if not b.error), default=0.0)
        scale = plot / longest if longest > 0 else 0.0
        for row in bars:
            draw.text((10, y + 4), row.label, fill="black", font=font)
            if row.error:
                draw.text((left, y + 4), row.text, fill=(160, 0, 0), font=font)
                y += bar + gap
                continue
            x = float(left)
            for value, colour in row.segments:
                length = value * scale
                if length > 0:
                    draw.rectangle((x, y, x + length, y + bar), fill=colour)
                x += length
            draw.text((x + 8, y + 4), row.text, fill="black", font=font)
            y += bar + gap
        y += 10
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()


def render_chart(result: BenchResult) -> bytes:
    """PNG: one panel per task, one stacked bar per mode (mean ms by stage), the p50 and
    its factor against the baseline written beside it."""

    def bar(run: RunResult, baseline: RunResult | None) -> Bar:
        if not run.ok or run.stats is None:
            return Bar(run.label, (), run.error or "failed", error=True)
        segments = [(run.stages_ms.get(stage, 0.0), STAGE_COLOURS[stage]) for stage in STAGES]
        factor = _speedup(run, baseline, "p50_ms")
        text = f"p50 {run.stats.p50_ms:.0f} ms" + (
            f"  ({factor:.2f}x)" if factor is not None else ""
        )
        return Bar(run.label, segments, text)

    config = result.config
    panels = [
        (
            _panel_title(task, variant),
            [
                bar(r, _baseline(result, task, variant))
                for r in result.runs
                if r.task == task and r.variant == variant
            ],
        )
        for task, variant in _panels(result)
    ]
    return bar_chart(
        f"sam2serve bench: SAM 2.1 {config.model} on {config.device}, "
        f"{len(result.images)} images - mean ms per image by stage",
        [(STAGE_TITLES[stage], STAGE_COLOURS[stage]) for stage in STAGES],
        panels,
    )


def write_outputs(result: BenchResult, out_dir: Path, name: str) -> dict[str, Path]:
    """``<name>.csv``, ``<name>.md`` and ``<name>.png`` in ``out_dir``."""
    return write_files(
        out_dir,
        name,
        lambda: csv_text(result),
        lambda chart: markdown(result, chart),
        lambda: render_chart(result),
    )


def write_files(
    out_dir: Path,
    name: str,
    make_csv: Callable[[], str],
    make_markdown: Callable[[str], str],
    make_chart: Callable[[], bytes],
) -> dict[str, Path]:
    """``<name>.csv``, ``<name>.md`` (given the chart's file name) and ``<name>.png``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {kind: out_dir / f"{name}.{kind}" for kind in ("csv", "md", "png")}
    writers: Sequence[tuple[str, Callable[[], str | bytes]]] = (
        ("csv", make_csv),
        ("md", lambda: make_markdown(paths["png"].name)),
        ("png", make_chart),
    )
    for kind, make in writers:
        content = make()
        if isinstance(content, bytes):
            paths[kind].write_bytes(content)
        else:
            paths[kind].write_text(content, encoding="utf-8")
    return paths
