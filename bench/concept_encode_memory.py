"""Peak memory of one SAM 3 concept encode of 1 vs N images (CPU): what a batch of
``--max-concept-batch-size`` images costs the service.

    python bench/concept_encode_memory.py --size tiny --batches 1 2 --repeats 3 \\
        --out bench/results/concept_encode_memory_cpu_zen4.md

Random weights (seeded; Meta's are gated): the memory depends on the shapes, not the
values. Each image is resized to SAM 3's input size whatever its own, so the photo does
not matter either. One warm-up encode first (of the largest batch, or of
``--warmup-images``: lazy initialisation), then per repeat and batch size: freed memory handed back to the system (malloc_trim), the
process's peak resident size reset (``/proc/self/clear_refs``, Linux), one encode, and
its peak minus the resident size before it. That is the encode's working memory plus its
output (the FPN features the service then caches), reported apart.
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import skimage.data
import torch

MiB = 1024 * 1024


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def _cpu_name() -> str:
    with open("/proc/cpuinfo") as cpuinfo:
        for line in cpuinfo:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.machine()


def _reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as clear:
        clear.write("5")  # resets VmHWM to the current resident size


def _images(count: int) -> list[np.ndarray]:
    photos = [skimage.data.chelsea(), skimage.data.coffee(), skimage.data.astronaut()]
    return [np.ascontiguousarray(photos[i % len(photos)]) for i in range(count)]


def measure(concepts, batch: int) -> tuple[float, float, float]:
    """(peak over the resident size before, output bytes, seconds) of one encode."""
    from sam2serve.server.memory import release_free_memory

    images = _images(batch)
    gc.collect()
    release_free_memory()
    before = _status_kib("VmRSS")
    _reset_peak()
    started = time.perf_counter()
    encodings = concepts.encode(images)
    seconds = time.perf_counter() - started
    peak = _status_kib("VmHWM")
    output = sum(encoding.nbytes for encoding in encodings)
    del encodings
    return (peak - before) * 1024 / MiB, output / MiB, seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=("tiny", "full"), default="tiny")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--warmup-images", type=int, default=None, help="default: the largest batch"
    )
    parser.add_argument("--label", default="")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()

    from sam2serve.concepts.runtime import ConceptsSpec, load_concepts

    load_start = os.getloadavg()
    started = time.perf_counter()
    concepts = load_concepts(ConceptsSpec(random_weights=True, size=args.size, seed=0))
    load_s = time.perf_counter() - started
    side = concepts.size.image_size
    concepts.encode(_images(args.warmup_images or max(args.batches)))  # lazy initialisation
    resident_mib = _status_kib("VmRSS") / 1024

    rows: dict[int, list[tuple[float, float, float]]] = {b: [] for b in args.batches}
    for _ in range(args.repeats):
        for batch in args.batches:
            rows[batch].append(measure(concepts, batch))
    load_end = os.getloadavg()

    command = "python bench/concept_encode_memory.py " + " ".join(sys.argv[1:])
    lines = [
        f"# SAM 3 concept encode, peak memory by batch size ({args.size}, {side} px){args.label}",
        "",
        f"- **command:** `{command}`",
        f"- **date:** {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
        (
            f"- **host:** CPU, {os.cpu_count()} cores, {_cpu_name()}, torch "
            f"{torch.__version__}, {torch.get_num_threads()} threads, fp32; shared with other "
            "jobs (see the load)"
        ),
        "- **load average (1/5/15 min):** "
        + " ".join(f"{x:.2f}" for x in load_start)
        + " at the start, "
        + " ".join(f"{x:.2f}" for x in load_end)
        + " at the end",
        (
            f"- **model:** random weights (seed 0), loaded in {load_s:.1f} s; resident after "
            f"loading and one warm-up encode: {resident_mib:,.0f} MiB"
        ),
        "",
        (
            "| images | peak over resident before, MiB (max of repeats) | per image, MiB "
            "| of which output features, MiB | encode s (median) |"
        ),
        "|---|---|---|---|---|",
    ]
    for batch in args.batches:
        peak = max(r[0] for r in rows[batch])
        output = rows[batch][0][1]
        seconds = statistics.median(r[2] for r in rows[batch])
        lines.append(
            f"| {batch} | {peak:,.0f} | {peak / batch:,.0f} | {output:,.0f} | {seconds:.2f} |"
        )
    lines.append("")
    lines.append(
        "Each repeat's peaks (MiB): "
        + "; ".join(
            f"{b} image(s): " + ", ".join(f"{r[0]:,.0f}" for r in rows[b]) for b in args.batches
        )
    )
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        with args.out.open("a") as out:
            out.write(text + "\n")


if __name__ == "__main__":
    main()
