"""Masks in the format a request asked for, encoded off the event loop.

One step every answer with masks takes (images, concepts, video frames, live frames):
polygons and PNGs cost, so the encoding runs in a worker thread, and its time is the
``format`` stage of the metrics.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Protocol

from sam2serve.engine.rle import Rle
from sam2serve.server import schemas
from sam2serve.server.metrics import Metrics


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
