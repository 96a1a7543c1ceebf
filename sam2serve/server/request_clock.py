"""What one request's model jobs cost: their time in the worker's queues and running.

Every route that runs model work keeps a :class:`RequestClock` and answers with its
``inference_ms`` and ``queue_ms``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypedDict

from sam2serve.server.batching import JobTiming


class Timed(TypedDict):
    """The timing fields of an answer."""

    inference_ms: float
    queue_ms: float


@dataclass
class RequestClock:
    """Model time and queue time of one request, over its jobs."""

    queue_s: float = 0.0
    run_s: float = 0.0

    def add_job(self, timing: JobTiming) -> None:
        self.queue_s += timing.queue_s
        self.run_s += timing.run_s

    def timed(self) -> Timed:
        return {
            "inference_ms": round(self.run_s * 1000, 3),
            "queue_ms": round(self.queue_s * 1000, 3),
        }


__all__ = ["RequestClock", "Timed"]
