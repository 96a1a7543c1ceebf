"""Masks in the format a request asked for, encoded off the event loop.

One step every answer with masks takes (images, concepts, video frames, live frames):
polygons and PNGs cost, so the encoding runs in a worker thread, and its time is the
``format`` stage of the metrics.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any, Protocol

import torch

from sam2serve.engine.prompts import Prompt
from sam2serve.engine.rle import Rle, area_from_rle
from sam2serve.server import schemas
from sam2serve.server.cache import EmbeddingKey
from sam2serve.server.metrics import Metrics
from sam2serve.server.prompts import DecodedMasks


class Measured(Protocol):
    """What holds the app's metrics (the Service)."""

    @property
    def metrics(self) -> Metrics: ...


# An answer of at most this many runs in all, as uncompressed RLE (the engine's own, which
# formatting passes through), is formatted, built and serialised on the event loop: ~1 ms
# for a click's noisy mask of ~30,000 runs (bench/click_stages.py), less than a hop to a
# worker thread and back costs on a loaded host (bench/results/click_cpu_zen4_avx512bf16.md).
INLINE_RUNS = 50_000
INLINE_FORMATS = ("uncompressed_rle",)


def small_answer(rles: Sequence[Rle], mask_format: str) -> bool:
    """Whether the answer of ``rles`` in ``mask_format`` is small enough for the event loop."""
    return mask_format in INLINE_FORMATS and sum(len(rle["counts"]) for rle in rles) <= INLINE_RUNS


async def format_segmentations(rles: list[Rle], mask_format: str, service: Measured) -> list[Any]:
    """Masks in the requested format, encoded off the event loop (polygons and PNGs cost),
    or on it for a :func:`small_answer`."""
    started = time.perf_counter()

    def encode() -> list[Any]:
        return [schemas.encode_segmentation(rle, mask_format) for rle in rles]

    if small_answer(rles, mask_format):
        out = encode()
    else:
        out = await asyncio.to_thread(encode)
    service.metrics.stage_latency.labels("format").observe(time.perf_counter() - started)
    return out


def objects_out(
    decoded: DecodedMasks, mask_ids: list[list[str]], formatted: list[Any]
) -> list[schemas.ObjectOut]:
    """(In a worker thread.) One ObjectOut per prompt object, ``formatted`` the masks'
    segmentations in order."""
    segmentations = iter(formatted)
    return [
        schemas.ObjectOut(
            masks=[
                schemas.MaskOut(
                    mask_id=mask_ids[i][c],
                    score=decoded.scores[i][c],
                    bbox=decoded.boxes[i][c],
                    area=area_from_rle(rle),
                    segmentation=next(segmentations),
                )
                for c, rle in enumerate(rles)
            ]
        )
        for i, rles in enumerate(decoded.rles)
    ]


class MaskStore(Protocol):
    """Where a request's masks are kept for refinement (the Service's mask cache)."""

    def store_mask(self, image: EmbeddingKey, low_res_logits: torch.Tensor) -> str: ...

    def stored_mask(self, mask_id: str, image: EmbeddingKey, where: str) -> torch.Tensor: ...


def with_stored_masks(
    prompts: Sequence[Prompt],
    objects: Sequence[schemas.ObjectPrompt],
    image: EmbeddingKey,
    store: MaskStore,
) -> list[Prompt]:
    """Each object's prompt with the low-res mask its ``mask_id`` names (a 404/422 naming the
    object when the id is unknown or belongs to another image)."""
    return [
        prompt
        if obj.mask_id is None
        else prompt.with_mask(store.stored_mask(obj.mask_id, image, f"objects[{i}].mask_id"))
        for i, (prompt, obj) in enumerate(zip(prompts, objects, strict=True))
    ]


def store_masks(decoded: DecodedMasks, image: EmbeddingKey, store: MaskStore) -> list[list[str]]:
    """Each mask's low-res logits stored under a new mask_id (per object, per mask)."""
    return [
        [store.store_mask(image, decoded.low_res_logits[i][c : c + 1]) for c in range(len(rles))]
        for i, rles in enumerate(decoded.rles)
    ]
