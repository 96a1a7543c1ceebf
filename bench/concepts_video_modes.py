"""Per-frame cost of SAM 3's video predictor by stage, per concept mode, and the memory a
clip holds (issue 39, deliverable 4).

    nice -n 10 python bench/concepts_video_modes.py --size full --frames 4 \\
        --modes baseline,furious,int8 --long-size tiny --long-frames 60 \\
        --out bench/results/concepts_video_modes_full_cpu_zen4.md

Each mode runs in its own fresh process (the model loaded in that mode in place, as
``track --text --mode`` loads it: no second copy in memory): SAM 3 of ``--size`` with
seeded random weights (the cost depends on the shapes, not the values; Meta's weights are
gated), one phrase, the sample clip (``sam2serve.samples.sample_clip``) at 320x240,
detections kept above 0 and new objects from 0.2 (random weights score about 0.25, so an
instance or two is found and tracked), hot-start delay 0 (every frame's answer yielded at
once; the cost of a frame is the same). Per frame: the seconds of each stage
(``VideoState.stage_seconds``: detector = ViT + both necks + DETR + NMS; tracker = track
steps + memory encoding + new objects; association = matching, hot start, occlusion,
outputs), the objects tracked, the process's resident size, and the records and tensor
bytes the clip's state holds. Frame 0 also runs Meta's ``add_prompt`` step (a second
detector pass on it), so the per-mode means are over frames 1..N-1.

``--long-frames``: a longer clip at ``--long-size`` (baseline): resident size and the
state's records after frame 5 and after the last, which stay bounded (``bounded=True``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

MiB = 1024 * 1024
STAGES = ("detector", "tracker", "association")


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def _held(state: Any) -> tuple[int, int]:
    """The records the clip's state holds (all groups, conditioning and tracked frames) and
    their tensors' bytes."""
    import torch

    records, size = 0, 0
    for group in state.groups:
        for record in (*group.cond.values(), *group.non_cond.values()):
            records += 1
            for value in vars(record).values():
                if isinstance(value, torch.Tensor):
                    size += value.numel() * value.element_size()
    return records, size


def worker(
    size: str, mode: str, frames: int, threads: int | None, max_objects: int
) -> dict[str, Any]:
    import torch

    from sam2serve.concepts.runtime import ConceptsSpec
    from sam2serve.concepts.video_association import VideoThresholds
    from sam2serve.runtime.concepts import (
        load_concepts_in_mode,
        stage_precisions,
        tracker_precisions,
        video_predictor_in_mode,
    )
    from sam2serve.samples import sample_clip

    if threads:
        torch.set_num_threads(threads)
    start = time.perf_counter()
    concepts = load_concepts_in_mode(ConceptsSpec(random_weights=True, size=size), mode)
    th = VideoThresholds(score=0.0, new_det=0.2, hotstart_delay=0, max_objects=max_objects)
    predictor = video_predictor_in_mode(concepts, th, mode=mode)
    load_s = time.perf_counter() - start
    clip, _ = sample_clip(num_frames=frames, size=(240, 320))
    state = predictor.start(frames, 240, 320, "red disc")
    rows = []
    before = dict(state.stage_seconds)
    for result in predictor.run(state, clip):
        now = dict(state.stage_seconds)
        records, held = _held(state)
        rows.append(
            {
                "frame": result.frame,
                **{k: now[k] - before[k] for k in STAGES},
                "objects": len(state.obj_ids),
                "shown": len(result.obj_ids),
                "rss_mib": _status_kib("VmRSS") / 1024,
                "records": records,
                "held_mib": held / MiB,
            }
        )
        before = now
        print(f"{mode}: frame {result.frame}: {json.dumps(rows[-1])}", file=sys.stderr, flush=True)
    return {
        "mode": mode,
        "size": size,
        "threads": torch.get_num_threads(),
        "max_objects": max_objects,
        "load_s": load_s,
        "precisions": {
            **stage_precisions(concepts, mode),
            **{
                f"tracker {k}": v
                for k, v in tracker_precisions(predictor.neck, predictor.tracker).items()
            },
        },
        "frames": rows,
        "peak_rss_mib": _status_kib("VmHWM") / 1024,
    }


def _run_worker(
    args: argparse.Namespace, size: str, mode: str, frames: int, max_objects: int = 10000
) -> dict[str, Any]:
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as handle:
        out = handle.name
    command = [sys.executable, __file__, "--worker", mode, "--size", size]
    command += ["--frames", str(frames), "--json", out, "--max-objects", str(max_objects)]
    if args.threads:
        command += ["--threads", str(args.threads)]
    subprocess.run(command, check=True)
    result: dict[str, Any] = json.loads(Path(out).read_text())
    os.unlink(out)
    return result


def _mean(rows: list[dict[str, Any]], key: str) -> float:
    later = rows[1:] or rows
    return sum(r[key] for r in later) / len(later)


def markdown(
    results: list[dict[str, Any]], long: dict[str, Any] | None, meta: dict[str, str]
) -> str:
    lines = [
        "# SAM 3 video predictor: per-frame cost by stage, per concept mode",
        "",
        f"- command: `{meta['command']}`",
        f"- host: {meta['host']}",
        f"- load average at start / end: {meta['load_start']} / {meta['load_end']}",
        f"- date: {meta['date']}",
        (
            "- SAM 3 with seeded random weights, 1 phrase, the sample clip at 320x240, "
            "detections above 0, new objects from 0.2, hot-start delay 0; seconds per frame "
            "(`VideoState.stage_seconds`); frame 0 includes Meta's add_prompt step (a second "
            "detector pass); means over frames 1..N-1"
        ),
        (
            "- shares of the host's peak are not computed: no FLOP count of the tracker "
            "stage (the detector stage is the image path's `bench --task concepts` encode + "
            "detector)"
        ),
        "",
        "## Per mode",
        "",
        (
            "| mode | precisions | frames | detector s/frame | tracker s/frame | association "
            "s/frame | total s/frame | vs baseline | peak RSS GiB |"
        ),
        "|---|---|---|---|---|---|---|---|---|",
    ]
    base_total = None
    for r in results:
        total = sum(_mean(r["frames"], k) for k in STAGES)
        if r["mode"] == "baseline":
            base_total = total
        ratio = f"{base_total / total:.2f}x" if base_total else "-"
        prec = ", ".join(f"{k} {v}" for k, v in r["precisions"].items())
        lines.append(
            f"| {r['mode']} | {prec} | {len(r['frames'])} | {_mean(r['frames'], 'detector'):.1f} "
            f"| {_mean(r['frames'], 'tracker'):.2f} | {_mean(r['frames'], 'association'):.3f} "
            f"| {total:.1f} | {ratio} | {r['peak_rss_mib'] / 1024:.2f} |"
        )
    lines += [
        "",
        "## Per frame",
        "",
        (
            "| mode | frame | objects tracked | detector s | tracker s | association s | RSS MiB "
            "| state records | state tensors MiB |"
        ),
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        for f in r["frames"]:
            lines.append(
                f"| {r['mode']} | {f['frame']} | {f['objects']} | {f['detector']:.1f} "
                f"| {f['tracker']:.2f} | {f['association']:.3f} | {f['rss_mib']:.0f} "
                f"| {f['records']} | {f['held_mib']:.1f} |"
            )
    if long is not None:
        rows = long["frames"]
        fifth = rows[min(5, len(rows) - 1)]
        last = rows[-1]
        lines += [
            "",
            (
                f"## Memory on a longer clip ({long['size']}, {long['mode']}, {len(rows)} "
                f"frames, at most {long['max_objects']} objects)"
            ),
            "",
            "| after frame | objects tracked | RSS MiB | state records | state tensors MiB |",
            "|---|---|---|---|---|",
        ]
        for f in (fifth, rows[len(rows) // 2], last):
            lines.append(
                f"| {f['frame']} | {f['objects']} | {f['rss_mib']:.0f} | {f['records']} "
                f"| {f['held_mib']:.2f} |"
            )
        lines.append(f"\npeak RSS {long['peak_rss_mib']:.0f} MiB")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", default="full", choices=("full", "tiny"))
    parser.add_argument("--modes", default="baseline,furious,int8")
    parser.add_argument("--frames", type=int, default=4)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--long-size", default="tiny", choices=("full", "tiny"))
    parser.add_argument("--long-frames", type=int, default=0)
    parser.add_argument("--long-max-objects", type=int, default=3)
    parser.add_argument("--max-objects", type=int, default=10000, help=argparse.SUPPRESS)
    parser.add_argument(
        "--host", default="CPU, 2 cores, AMD EPYC Zen 4 avx512_bf16, loaded by other helpers"
    )
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--json", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        Path(args.json).write_text(
            json.dumps(worker(args.size, args.worker, args.frames, args.threads, args.max_objects))
        )
        return
    meta = {
        "command": "python " + " ".join(sys.argv),
        "host": f"{args.host} ({platform.processor() or platform.machine()})",
        "load_start": " ".join(f"{v:.1f}" for v in os.getloadavg()),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    results = []
    long = None
    for mode in (m.strip() for m in args.modes.split(",") if m.strip()):
        results.append(_run_worker(args, args.size, mode, args.frames))
        meta["load_end"] = " ".join(f"{v:.1f}" for v in os.getloadavg())
        if args.out:  # each finished mode on disk
            args.out.write_text(markdown(results, long, meta))
    if args.long_frames:
        long = _run_worker(
            args, args.long_size, "baseline", args.long_frames, args.long_max_objects
        )
    meta["load_end"] = " ".join(f"{v:.1f}" for v in os.getloadavg())
    text = markdown(results, long, meta)
    if args.out:
        args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
