"""Masks in the format a request asked for, encoded off the event loop.

One step every answer with masks takes (images, concepts, video frames, live frames):
polygons and PNGs cost, so the encoding runs in a worker thread, and its time is the
``format`` stage of the metrics.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Protocol

from sam2serve.engine.rle import Rle, area_from_rle
from sam2serve.server import schemas
from sam2serve.server.metrics import Metrics
from sam2serve.server.prompts import DecodedMasks


class Measured(Protocol):
    """What holds the app's metrics (the Service)."""

    @property
    def metrics(self) -> Metrics: ...


async def format_segmentations(rles: list[Rle], mask_format: str, service: Measured) -> list[Any]:
    """Masks in the requested format, encoded off the event loop (polygons and PNGs cost)."""
    started = time.perf_counter()
    out = await asyncio.to_thread(
        lambda: [schemas.encode_segmentation(rle, mask_format) for rle in rles]
    )
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
