"""``--task concepts-video``'s outputs: a Markdown report (command, machine, load, the
per-mode and per-frame tables) and a JSON file of every number."""

from __future__ import annotations

import json
from pathlib import Path

from sam2serve.bench.concepts_video import SAM2, SAM3, STAGES, ConceptsVideoResult, VideoRow
from sam2serve.runtime.concepts import CONCEPT_MODES

__all__ = ["concepts_video_markdown", "write_concepts_video_outputs"]


def _load(load: tuple[float, float, float]) -> str:
    return "{:.2f} {:.2f} {:.2f}".format(*load)


def _seconds(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _header(result: ConceptsVideoResult) -> list[str]:
    config, machine = result.config, result.machine
    spec = config.spec
    weights = (
        f"seeded random (seed {spec.seed}), size {spec.size}"
        if spec.random_weights
        else f"SAM 3 ({spec.size}) from {spec.weights or 'the cache'}"
    )
    th = result.thresholds
    lines = [
        "# SAM 3 video predictor: per-frame cost by stage, per mode",
        "",
        f"- **command:** `{config.command}` (niceness {result.niceness})",
        f"- **date:** {result.started} (the run took {result.duration_s / 60:.1f} min)",
        f"- **machine:** {machine.cpu} ({machine.cpu_isa}; torch CPU capability "
        f"{machine.torch_cpu_capability}), {machine.logical_cores} logical cores"
        + (f", {machine.memory_gb:.0f} GiB RAM" if machine.memory_gb else "")
        + f"; {spec.device}; torch {machine.torch}",
        (
            f"- **load average (1/5/15 min):** {_load(result.load_start)} at the start, "
            f"{_load(result.load_end)} at the end (per row below)"
        ),
        f"- **weights:** {weights}",
        f"- **clip:** {result.clip}",
        (
            f"- **prompt:** the phrase {config.phrase!r} on frame 0, forward to the last frame; "
            f"detections kept above {th['score']:g}, new objects from {th['new_det']:g}, at "
            f"most {th['max_objects']} object(s), hot-start delay 0 (each frame answered when "
            "done, so its cost is its own)"
        ),
        (
            "- **stages** (`VideoState.stage_seconds`): detector = ViT + both necks + DETR + "
            "NMS; tracker = track steps + memory encoding + new objects; association = "
            "matching, hot start, occlusion, outputs. Frame 0 also runs Meta's add_prompt "
            "step (a second detector pass), so means are over frames 1..N-1"
        ),
    ]
    if config.sam2_model is not None:
        lines.append(
            f"- **SAM 2.1 rows:** SAM 2.1 {config.sam2_model}'s tracker in the same mode "
            f"({'checkpoint ' + config.sam2_checkpoint if config.sam2_checkpoint else 'seeded random weights'}), "
            "as many objects as the SAM 3 row ended with, prompted on frame 0 (clicks and a "
            "box, as `--task video`): what `track --text --tracker sam2.1` costs per frame "
            "after its one detector pass; its frame step is not split by stage"
        )
    lines.append(
        "- **modes:** "
        + "; ".join(f"{m}: {CONCEPT_MODES[m]}" for m in dict.fromkeys(r.mode for r in result.rows))
    )
    lines += [f"- note: {note}" for note in result.notes]
    return lines


def _baseline_seconds(result: ConceptsVideoResult) -> float | None:
    row = next((r for r in result.rows if r.model == SAM3 and r.mode == "baseline" and r.ok), None)
    return None if row is None else row.seconds_per_frame()


def _mode_row(row: VideoRow, baseline: float | None) -> list[str]:
    cells = [row.label, ", ".join(f"{k} {v}" for k, v in row.precisions.items()) or "-"]
    if not row.ok:
        return cells + [row.error or "no frames", *[""] * 9]
    seconds = row.seconds_per_frame()
    factor = f"{baseline / seconds:.2f}x" if baseline and seconds > 0 else "-"
    return cells + [
        str(len(row.frames)),
        str(row.objects()),
        *(_seconds(row.stage_mean(stage), 3 if stage == "association" else 2) for stage in STAGES),
        _seconds(seconds),
        f"{row.frames_per_s():.3g}",
        factor,
        _seconds(None if row.peak_rss_mib is None else row.peak_rss_mib / 1024),
        f"{row.load_start[0]:.2f} → {row.load_end[0]:.2f}",
    ]


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(cells) + " |" for cells in rows]


def _frame_rows(result: ConceptsVideoResult) -> list[list[str]]:
    rows = []
    for row in result.rows:
        for f in row.frames:
            rows.append(
                [
                    row.label,
                    str(f.frame),
                    str(f.objects),
                    str(f.shown),
                    *(
                        _seconds(f.stages.get(stage), 3 if stage == "association" else 2)
                        for stage in STAGES
                    ),
                    _seconds(f.seconds),
                    _seconds(f.rss_mib, 0),
                    "-" if f.records is None else str(f.records),
                    _seconds(f.held_mib),
                ]
            )
    return rows


def concepts_video_markdown(result: ConceptsVideoResult) -> str:
    baseline = _baseline_seconds(result)
    lines = _header(result)
    lines += ["", "## Per mode (seconds per frame, means over frames 1..N-1)", ""]
    lines += _table(
        [
            "row",
            "precisions",
            "frames",
            "objects tracked (last frame)",
            *(f"{stage} s/frame" for stage in STAGES),
            "total s/frame",
            "frames/s",
            "vs SAM 3 baseline",
            "peak RSS GiB",
            "load start → end",
        ],
        [_mode_row(row, baseline) for row in result.rows],
    )
    done = {row.mode for row in result.rows if row.model == SAM3}
    missing = [m for m in dict.fromkeys(result.config.modes) if m not in done]
    if missing:
        lines += ["", f"Not finished: the run stopped before {', '.join(missing)}."]
    if any(row.model == SAM2 for row in result.rows):
        lines += [
            "",
            (
                "A SAM 2.1 row's total is its whole frame step (image encoder, memory "
                "attention, decoder, memory encoder); SAM 3's adds its detector on every "
                "frame, which is what finds new instances."
            ),
        ]
    lines += ["", "## Per frame", ""]
    lines += _table(
        [
            "row",
            "frame",
            "objects tracked",
            "objects shown",
            *(f"{stage} s" for stage in STAGES),
            "frame s",
            "RSS MiB",
            "state records",
            "state tensors MiB",
        ],
        _frame_rows(result),
    )
    lines += [
        "",
        (
            "Peak RSS includes the model as built before its mode converted it (float32). "
            "State records and tensors: what the clip's state holds for its objects after "
            "the frame (SAM 3's is bounded: it keeps what its memory selection can still "
            "read, so it levels off on long clips; SAM 2.1's rows keep every tracked frame, "
            "`track`'s default retention `exact`)."
        ),
    ]
    return "\n".join(lines) + "\n"


def write_concepts_video_outputs(
    result: ConceptsVideoResult, out_dir: Path, name: str
) -> dict[str, Path]:
    """``NAME.md`` and ``NAME.json`` in ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"md": out_dir / f"{name}.md", "json": out_dir / f"{name}.json"}
    paths["md"].write_text(concepts_video_markdown(result), encoding="utf-8")
    paths["json"].write_text(json.dumps(result.as_dict(), indent=1) + "\n", encoding="utf-8")
    return paths
