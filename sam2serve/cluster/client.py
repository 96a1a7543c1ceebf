"""A client that survives a replica going away: it retries the service's requests.

Every endpoint is idempotent (an answer depends only on the request; a repeated upload
only hits the embedding cache), so a request that got no answer, a 5xx from the proxy
(a replica died with it in flight) or a 503 from back-pressure is sent again. A
``Retry-After`` header sets the wait; otherwise the wait doubles from ``backoff_s``.
"""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

RETRY_STATUSES = frozenset({500, 502, 503, 504})


@dataclass
class Answer:
    """The final answer to one request, after retries."""

    response: httpx.Response | None  # None: no answer at all, even after retries
    attempts: int
    started: float  # time.perf_counter() of the first attempt
    finished: float
    statuses: list[int | str] = field(default_factory=list)  # one per attempt

    @property
    def ok(self) -> bool:
        return self.response is not None and self.response.status_code == 200

    @property
    def elapsed_ms(self) -> float:
        return (self.finished - self.started) * 1000


def _retry_after_s(response: httpx.Response, default: float, cap: float) -> float:
    value = response.headers.get("retry-after", "")
    try:
        seconds = float(value)
    except ValueError:
        return default
    return min(cap, seconds) if math.isfinite(seconds) and seconds >= 0 else default


async def post_with_retries(
    client: httpx.AsyncClient,
    url: str,
    *,
    json: dict[str, Any],
    headers: dict[str, str] | None = None,
    max_attempts: int = 6,
    backoff_s: float = 0.5,
    max_wait_s: float = 10.0,
) -> Answer:
    """POST ``json`` to ``url``, retrying lost requests, 5xx and back-pressure."""
    started = time.perf_counter()
    statuses: list[int | str] = []
    response: httpx.Response | None = None
    wait = backoff_s
    for attempt in range(1, max_attempts + 1):
        try:
            response = await client.post(url, json=json, headers=headers)
        except httpx.TransportError as exc:
            response = None
            statuses.append(type(exc).__name__)
        else:
            statuses.append(response.status_code)
            if response.status_code not in RETRY_STATUSES:
                break
        if attempt == max_attempts:
            break
        delay = wait if response is None else _retry_after_s(response, wait, max_wait_s)
        await asyncio.sleep(delay)
        wait = min(max_wait_s, wait * 2)
    return Answer(response, len(statuses), started, time.perf_counter(), statuses)
