"""Keep-all AMG (pred_iou_thresh = stability_score_thresh = 0) on one skimage photo: the
case where nearly every decoded mask is run-length encoded (issue 28, item 6).

    python bench/amg_keepall.py --points-per-side 32 --repeats 3 --out bench/results/X.md

Random tiny weights (seed 7, written as an official-shaped checkpoint): the masks are
noisy, so their RLEs are long, which is the work being measured. Prints and writes the
per-image wall time (median of --repeats, after one warm-up) and the share spent
run-length encoding (every call into engine.rle, profiled in a separate pass)."""

from __future__ import annotations

import argparse
import cProfile
import os
import platform
import pstats
import statistics
import sys
import tempfile
import time
from pathlib import Path

import skimage.data
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--points-per-side", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--image", default="astronaut")
    parser.add_argument("--label", default="")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()

    from oracle import write_official_like_checkpoint

    from sam2serve.checkpoint import load_model
    from sam2serve.engine.amg import MaskGenerator
    from sam2serve.engine.predictor import Predictor

    path = Path(tempfile.mkdtemp()) / "sam2.1_hiera_tiny.pt"
    model = load_model("tiny", checkpoint=write_official_like_checkpoint("tiny", 7, path))
    image = getattr(skimage.data, args.image)()
    if image.ndim == 2:
        image = image[:, :, None].repeat(3, axis=2)
    generator = MaskGenerator(
        Predictor(model),
        points_per_side=args.points_per_side,
        pred_iou_thresh=0.0,
        stability_score_thresh=0.0,
        output_mode="coco_rle",
    )
    load_start = os.getloadavg()
    for _ in range(args.warmup):
        generator.generate(image)
    times = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        records = generator.generate(image)
        times.append((time.perf_counter() - start) * 1000)
    profile = cProfile.Profile()
    profile.enable()
    generator.generate(image)
    profile.disable()
    stats = pstats.Stats(profile)
    total = stats.total_tt  # type: ignore[attr-defined]
    rle_ms = 0.0
    for (filename, _, name), (_, _, _, cumulative, _) in stats.stats.items():
        in_rle = filename.endswith(os.path.join("engine", "rle.py"))
        if in_rle and name in ("masks_to_rle", "masks_to_runs", "coco", "areas"):
            rle_ms += cumulative * 1000
    lines = [
        f"# AMG keep-all, tiny, {args.points_per_side}x{args.points_per_side} clicks {args.label}",
        "",
        (
            f"- **command:** `python bench/amg_keepall.py --points-per-side {args.points_per_side} "
            f"--repeats {args.repeats} --warmup {args.warmup} --image {args.image}`"
        ),
        f"- **date:** {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
        (
            f"- **host:** CPU, {os.cpu_count()} cores, Intel Xeon AVX-512 + VNNI (no bf16), "
            f"{platform.processor() or platform.machine()}, torch {torch.__version__}, "
            f"{torch.get_num_threads()} threads; shared with other jobs"
        ),
        (
            f"- **load average (1/5/15 min):** {' '.join(f'{v:.2f}' for v in load_start)} at the "
            f"start, {' '.join(f'{v:.2f}' for v in os.getloadavg())} at the end"
        ),
        (
            f"- **image:** skimage.data.{args.image} {image.shape[1]}x{image.shape[0]}; "
            f"{len(records)} masks kept; random weights (seed 7)"
        ),
        "",
        "| per image | ms |",
        "|---|---|",
        f"| wall, median of {args.repeats} | {statistics.median(times):,.0f} |",
        f"| wall, each | {', '.join(f'{t:,.0f}' for t in times)} |",
        f"| RLE (engine.rle entry points, cumulative, under cProfile) | {rle_ms:,.0f} |",
        f"| whole generate under cProfile | {total * 1000:,.0f} |",
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
