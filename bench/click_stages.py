"""Where a click's time goes, stage by stage, in one process (no HTTP): CPU time per stage.

The stages of POST /v1/segment for one point (multimask; the best candidate only, as the
page asks, or ``--all-masks``), after the embedding is cached: the prompt's arrays, the
decoder (``Predictor.predict_low_res``), choosing the best candidate, upsampling to the
image size and thresholding, RLE, boxes and scores to the host, then what the route does
after the model job: the wire format, the response model and its JSON. Each stage's
median over ``--n`` clicks of its thread CPU time (robust against other processes' load)
and wall time. ``--batch 64 --coco`` is MPS's post-processing (64 clicks, COCO strings).

    python bench/click_stages.py --mode fast --threads 1 --n 50
    python bench/click_stages.py --mode furious --batch 64 --coco --n 5
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import time
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from PIL import Image

from sam2serve.engine.masks import batched_mask_to_box, box_xyxy_to_xywh
from sam2serve.engine.predictor import LOW_RES_CLAMP
from sam2serve.engine.prompts import Prompt, prompt_arrays
from sam2serve.engine.rle import area_from_rle, masks_to_coco, masks_to_rle
from sam2serve.runtime.build import build_predictor
from sam2serve.runtime.spec import RuntimeSpec, WeightsSource
from sam2serve.samples import load_sample
from sam2serve.server import schemas
from sam2serve.server.answers import dump_bytes


class Stages:
    """Thread CPU and wall milliseconds per named stage, one sample per ``stage`` block."""

    def __init__(self) -> None:
        self.cpu: dict[str, list[float]] = defaultdict(list)
        self.wall: dict[str, list[float]] = defaultdict(list)

    @contextlib.contextmanager
    def stage(self, name: str) -> Iterator[None]:
        cpu, wall = time.thread_time(), time.perf_counter()
        yield
        self.cpu[name].append((time.thread_time() - cpu) * 1000)
        self.wall[name].append((time.perf_counter() - wall) * 1000)

    def table(self) -> str:
        rows = ["| stage | CPU ms (median) | wall ms (median) |", "| --- | ---: | ---: |"]
        for name, cpu in self.cpu.items():
            wall = statistics.median(self.wall[name])
            rows.append(f"| {name} | {statistics.median(cpu):.2f} | {wall:.2f} |")
        return "\n".join(rows)


def _answer(
    size: tuple[int, int], candidates: int, scores: list[list[float]], boxes: list[Any],
    areas: list[int], segmentations: list[Any],
) -> bytes:  # fmt: skip
    """The /v1/segment answer's JSON for these masks (object-major), as the route makes it."""
    height, width = size
    objects = [
        schemas.ObjectOut(
            masks=[
                schemas.MaskOut(
                    mask_id="x" * 22,
                    score=row_scores[c],
                    bbox=boxes[b * candidates + c],
                    area=areas[b * candidates + c],
                    segmentation=segmentations[b * candidates + c],
                )
                for c in range(candidates)
            ]
        )
        for b, row_scores in enumerate(scores)
    ]
    response = schemas.SegmentResponse(
        image_id="0" * 64, width=width, height=height, model="tiny", cached=True,
        inference_ms=1.0, queue_ms=0.0, objects=objects,
    )  # fmt: skip
    return dump_bytes(response, ("objects", "masks"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", default="fast")
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--n", type=int, default=50)
    parser.add_argument("--batch", type=int, default=1, help="clicks decoded together")
    parser.add_argument("--sample", default="astronaut")
    parser.add_argument("--size", default=None, help="resize the photo to WxH first")
    parser.add_argument("--all-masks", action="store_true")
    parser.add_argument(
        "--coco", action="store_true", help="RLE as COCO strings (MPS's), not uncompressed"
    )
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    spec = RuntimeSpec(model=args.model, mode=args.mode, threads=args.threads)
    predictor = build_predictor(spec, WeightsSource(random_weights=True))
    image = load_sample(args.sample)
    if args.size:
        width, height = (int(v) for v in args.size.lower().split("x"))
        image = np.asarray(Image.fromarray(image).resize((width, height), Image.BILINEAR))
    size = image.shape[:2]
    embedding = predictor.encode(image)
    rng = np.random.default_rng(0)
    stages = Stages()
    runs_per_mask: list[float] = []
    for i in range(args.n + 3):
        if i == 3:  # three untimed warm-ups
            stages = Stages()
        points = rng.uniform(0.05, 0.95, (args.batch, 2)) * (size[1], size[0])
        prompts = [Prompt.from_arrays([(float(x), float(y))], [1]) for x, y in points]
        with stages.stage("= model job"), torch.inference_mode():
            with stages.stage("prompt arrays"):
                coords, labels = prompt_arrays(prompts)
            with stages.stage("decoder (predict_low_res)"):
                logits, iou = predictor.predict_low_res(
                    embedding, point_coords=coords, point_labels=labels, multimask_output=True
                )
            if not args.all_masks:
                with stages.stage("best candidate"):
                    pick = iou.argmax(dim=1)
                    rows = torch.arange(iou.shape[0])
                    logits, iou = logits[rows, pick][:, None], iou[rows, pick][:, None]
            rles: list[Any] = []
            areas: list[int] = []
            boxes: list[Any] = []
            with stages.stage("upsample + threshold"):
                chunks = [m for _, m in predictor.upscale_chunks(logits.flatten(0, 1), size)]
            for masks in chunks:
                if args.coco:
                    with stages.stage("RLE (COCO strings)"):
                        cocos, chunk_areas = masks_to_coco(masks)
                    rles += cocos
                    areas += chunk_areas
                else:
                    with stages.stage("RLE"):
                        chunk_rles = masks_to_rle(masks)
                    rles += chunk_rles
                    areas += [area_from_rle(rle) for rle in chunk_rles]
                    runs_per_mask += [len(rle["counts"]) for rle in chunk_rles]
                with stages.stage("boxes"):
                    boxes += box_xyxy_to_xywh(batched_mask_to_box(masks)).float().tolist()
            with stages.stage("scores + clamp"):
                scores = iou.float().tolist()
                logits.clamp(-LOW_RES_CLAMP, LOW_RES_CLAMP)
        with stages.stage("wire format"):
            wire = "coco_rle" if args.coco else "uncompressed_rle"
            segmentations = [
                rle if args.coco else schemas.encode_segmentation(rle, wire) for rle in rles
            ]
        with stages.stage("response model + JSON"):
            _answer(size, iou.shape[1], scores, boxes, areas, segmentations)
    runs = f", ~{statistics.mean(runs_per_mask):.0f} runs per mask" if runs_per_mask else ""
    print(
        f"click stages, {args.model} {args.mode}, {size[1]}x{size[0]}, {args.batch} click(s), "
        f"{'3 masks' if args.all_masks else 'best mask'} each, {args.threads} thread(s), "
        f"n={args.n}, load average {os.getloadavg()[0]:.2f}{runs}"
    )
    print(stages.table())


if __name__ == "__main__":
    main()
