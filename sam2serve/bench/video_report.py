"""The video task's outputs: a CSV (every number), a Markdown report (one table per object
count, one row per mode, factors against the baseline of the same run) and a PNG chart of
the per-frame latency. The header and the file writing are the image report's."""

from __future__ import annotations

import csv
import io
from pathlib import Path

from sam2serve.bench.report import (
    MACHINE_COLUMNS,
    Bar,
    _accuracy_cells,
    _ms,
    _separator,
    _speedup,
    _with_factor,
    accuracy_columns,
    bar_chart,
    header_lines,
    latency_columns,
    machine_columns,
    write_files,
)
from sam2serve.bench.runner import BASELINE, REFERENCE
from sam2serve.bench.video import Prompt, VideoBenchResult, VideoRun
from sam2serve.runtime.modes import MODES

__all__ = ["VIDEO_CSV_COLUMNS", "video_csv_text", "video_markdown", "write_video_outputs"]

VIDEO_CSV_COLUMNS = (
    "objects",
    "mode",
    "dtype",
    "objects_per_call",
    "frames",
    "first_frame_ms",
    "p50_ms",
    "p90_ms",
    "p99_ms",
    "mean_ms",
    "max_ms",
    "frames_per_s",
    "first_masks_ms",
    "init_ms",
    "prompt_ms",
    "ready_s",
    "held_kib_per_frame",
    "frames_mib",
    "peak_mem_mb",
    "miou",
    "fails",
    "compared_frames",
    "compared_masks",
    "exact_masks",
    "truth_miou",
    "p50_speedup",
    "p90_speedup",
    "frames_per_s_speedup",
    "error",
    *MACHINE_COLUMNS,
)
BAR_COLOUR = (102, 194, 165)


def _baseline(result: VideoBenchResult, objects: int) -> VideoRun | None:
    return next(
        (r for r in result.runs if r.objects == objects and r.mode == BASELINE and r.ok), None
    )


def _scenarios(result: VideoBenchResult) -> list[int]:
    return list(dict.fromkeys(run.objects for run in result.runs))


def _scenario_title(objects: int) -> str:
    return f"{objects} object{'s' if objects != 1 else ''}"


def _throughput_factor(run: VideoRun, baseline: VideoRun | None) -> float | None:
    if baseline is None or baseline.stats is None or run.stats is None:
        return None
    return run.stats.images_per_s / baseline.stats.images_per_s


def _row(run: VideoRun, baseline: VideoRun | None) -> dict[str, object]:
    row: dict[str, object] = dict.fromkeys(VIDEO_CSV_COLUMNS, "")
    row.update(
        objects=run.objects,
        mode=run.mode,
        dtype=run.dtype,
        objects_per_call="" if run.objects_per_call is None else run.objects_per_call,
        error=run.error or "",
    )
    stats = run.stats
    if stats is not None:
        held = run.held_bytes_per_frame
        row.update(latency_columns(stats, "frames", "first_frame_ms", "frames_per_s"))
        row.update(
            first_masks_ms=round(run.first_masks_ms or 0.0, 2),
            init_ms=round(run.init_ms or 0.0, 2),
            prompt_ms=round(run.prompt_ms or 0.0, 2),
            ready_s=round(run.ready_s or 0.0, 3),
            held_kib_per_frame="" if held is None else round(held / 2**10, 1),
            frames_mib=round((run.frames_bytes or 0) / 2**20, 2),
            peak_mem_mb=round(run.peak_mem_mb or 0.0, 1),
        )
        for column, factor in (
            ("p50_speedup", _speedup(run, baseline, "p50_ms")),
            ("p90_speedup", _speedup(run, baseline, "p90_ms")),
            ("frames_per_s_speedup", _throughput_factor(run, baseline)),
        ):
            row[column] = "" if factor is None else round(factor, 3)
    if run.accuracy is not None:
        row.update(accuracy_columns(run.accuracy, "compared_frames"))
    if run.truth is not None and run.truth.miou is not None:
        row["truth_miou"] = round(run.truth.miou, 6)
    return row


def video_csv_text(result: VideoBenchResult) -> str:
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=VIDEO_CSV_COLUMNS, lineterminator="\n")
    writer.writeheader()
    for run in result.runs:
        writer.writerow(_row(run, _baseline(result, run.objects)) | machine_columns(result.machine))
    return out.getvalue()


# --------------------------------------------------------------------------- markdown


def _prompt_text(prompt: Prompt) -> str:
    if prompt["box"] is not None:
        return "a box [" + ", ".join(f"{v:.0f}" for v in prompt["box"]) + "]"
    x, y = prompt["points"][0]
    return f"a click ({x:.0f}, {y:.0f})"


def _table(result: VideoBenchResult, objects: int) -> list[str]:
    baseline = _baseline(result, objects)
    truth = result.clip.truth is not None
    header = (
        "| mode | dtype | objects/call | frames/s | frame p50 ms | frame p90 ms | first frame ms | first masks ms "
        "| start→ready s | held KiB/frame | frames MiB | peak mem MB | mIoU | fails "
        "| exact masks |" + (" mIoU vs truth |" if truth else "")
    )
    lines = [header, _separator(header)]
    for run in (r for r in result.runs if r.objects == objects):
        if not run.ok:
            lines.append(f"| {run.mode} | {run.error} |" + " |" * (header.count("|") - 3))
            continue
        stats = run.stats
        assert stats is not None
        held = run.held_bytes_per_frame or 0.0
        cells = [
            run.mode,
            run.dtype,
            "-" if run.objects_per_call is None else str(run.objects_per_call),
            _with_factor(f"{stats.images_per_s:.3g}", _throughput_factor(run, baseline)),
            _with_factor(_ms(stats.p50_ms), _speedup(run, baseline, "p50_ms")),
            _with_factor(_ms(stats.p90_ms), _speedup(run, baseline, "p90_ms")),
            _ms(stats.first_ms),
            _ms(run.first_masks_ms or 0.0),
            f"{run.ready_s:.1f}",
            f"{held / 2**10:,.0f}",
            f"{(run.frames_bytes or 0) / 2**20:,.1f}",
            f"{run.peak_mem_mb:,.0f}",
            *_accuracy_cells(run.accuracy),
        ]
        if truth:
            miou = run.truth.miou if run.truth is not None else None
            cells.append("n/a" if miou is None else f"{miou:.4f}")
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _mode_lines(result: VideoBenchResult) -> list[str]:
    """What each row computes; furious's dtype as it resolved on this device."""
    lines = []
    for mode in dict.fromkeys(run.mode for run in result.runs):
        if mode == REFERENCE:
            text = (
                "Meta's SAM2VideoPredictor (build_sam2_video_predictor, its own loader) on the "
                "same checkpoint, reading the same JPEG folder, in fp32"
            )
        else:
            base = mode.partition("+")[0]
            text = MODES[base].video_description or ""
            dtypes = {run.dtype for run in result.runs if run.mode == mode and run.ok}
            if MODES[base].reduced_precision_memory_attention and dtypes == {"float32"}:
                text += (
                    f"; here it resolved to float32 ({result.config.device} without native "
                    "bf16), so it computes what baseline computes: the row a user gets here"
                )
        lines.append(f"- **{mode}:** {text}")
    return lines


def video_markdown(result: VideoBenchResult, chart_name: str | None = None) -> str:
    config, clip = result.config, result.clip
    lines = header_lines(
        result, f"sam2serve bench --task video: SAM 2.1 {config.model}, {config.device}"
    )
    lines.append(f"- **clip:** {clip.source}")
    for objects, prompts in result.prompts.items():
        described = "; ".join(
            f"object {obj_id}: {_prompt_text(prompt)}" for obj_id, prompt in prompts.items()
        )
        lines.append(f"- **{objects} object(s), prompts on frame 0:** {described}")
    lines += [f"- **note:** {note}" for note in result.notes]
    lines += [
        "",
        "Every row is a fresh process: it reads the clip, adds every object's prompt on frame "
        "0, then propagates forward once. *first masks*: from reading the clip to the "
        "prompts' masks (frame 0's encoding included: Meta's init_state encodes it, ours "
        "when the first prompt needs it). A frame's latency is the time from asking for it to its masks "
        "(encoding, memory attention, heads, memory encoding; turning masks into RLE is not "
        "timed). *first frame*: the prompted frame, whose masks exist already (the prompts' "
        "memories are encoded then); p50 / p90 are over the tracked frames; frames/s counts "
        "every frame of the propagation. *objects/call*: how many objects one frame step "
        "batches (ours: the tracker's objects_per_call, chosen per host class by "
        "sam2serve.runtime.auto_table; Meta's steps each object alone). "
        "*held KiB/frame*: what the tracker keeps per "
        "frame for all objects of the row (memories, masks, object pointers), grown with "
        "the video; *frames MiB*: the frames it holds (ours: the uint8 pixels; Meta: each "
        "frame at 1024x1024 in float32). *peak mem*: "
        + ("max allocated on the GPU" if config.device == "cuda" else "max RSS of the process")
        + ". mIoU / fails / exact masks compare each row's masks with the baseline's, frame "
        "by frame and object by object"
        + (
            "; *mIoU vs truth* with the sample clip's true masks (the disc and the square"
            + (", meaningless with random weights" if config.random_weights else "")
            + ")."
            if clip.truth is not None
            else "."
        ),
        "",
        "Rows:",
        "",
        *_mode_lines(result),
    ]
    for objects in _scenarios(result):
        lines += ["", f"## {_scenario_title(objects)}", ""]
        lines += _table(result, objects)
    if chart_name:
        lines += ["", f"![per-frame latency]({chart_name})"]
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- chart


def render_video_chart(result: VideoBenchResult) -> bytes:
    """PNG: one panel per object count, one bar per mode (mean ms per tracked frame), its
    p50 / p90 and frames/s written beside it."""

    def bar(run: VideoRun) -> Bar:
        if not run.ok or run.stats is None:
            return Bar(run.mode, (), run.error or "failed", error=True)
        stats = run.stats
        text = (
            f"p50 {stats.p50_ms:.0f} / p90 {stats.p90_ms:.0f} ms, {stats.images_per_s:.3g} frames/s"
        )
        return Bar(run.mode, [(stats.mean_ms, BAR_COLOUR)], text)

    config = result.config
    panels = [
        (_scenario_title(n), [bar(run) for run in result.runs if run.objects == n])
        for n in _scenarios(result)
    ]
    return bar_chart(
        f"sam2serve bench --task video: SAM 2.1 {config.model} on {config.device}, "
        f"{result.clip.num_frames} frames - mean ms per tracked frame",
        (),
        panels,
        right=330,
    )


def write_video_outputs(result: VideoBenchResult, out_dir: Path, name: str) -> dict[str, Path]:
    """``<name>.csv``, ``<name>.md`` and ``<name>.png`` in ``out_dir``."""
    return write_files(
        out_dir,
        name,
        lambda: video_csv_text(result),
        lambda chart: video_markdown(result, chart),
        lambda: render_video_chart(result),
    )
