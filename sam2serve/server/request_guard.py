"""Run a request's work until it finishes, times out, or its client goes away.

Once the body is read, the only thing a client can still send is a disconnect. The work
runs as a task beside a watcher of the connection: if the client hangs up first, the work
is cancelled (its model job is dropped from the queue, or told to stop at its next
checkpoint: between decoder chunks, between AMG batches) and the request ends as
:class:`~sam2serve.server.errors.ClientGone` instead of running on for nobody.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import TypeVar

from starlette.requests import Request

from sam2serve.server.errors import ApiError, ClientGone

T = TypeVar("T")


async def run_guarded(
    request: Request,
    work: Callable[[], Awaitable[T]],
    timeout_s: float,
    retry_headers: Callable[[], dict[str, str]],
) -> T:
    """``await work()`` within ``timeout_s`` (then 503 "timeout"), cancelled as soon as the
    client disconnects (then :class:`ClientGone`). Call it after the body has been read."""
    task = asyncio.ensure_future(work())
    watcher = asyncio.ensure_future(_disconnected(request))
    try:
        done, _ = await asyncio.wait(
            {task, watcher}, timeout=timeout_s, return_when="FIRST_COMPLETED"
        )
    except asyncio.CancelledError:
        await _cancel(task)
        raise
    finally:
        watcher.cancel()
    if task in done:
        return task.result()
    await _cancel(task)
    if watcher in done and not watcher.cancelled():
        raise ClientGone("processing")
    raise ApiError(
        503,
        "timeout",
        f"the request did not finish within {timeout_s:g} s (request_timeout_s); the server "
        "is busy, retry later",
        headers=retry_headers(),
    )


async def _disconnected(request: Request) -> None:
    """Returns when the client has closed the connection (the body is already read, so
    the only message left is the disconnect)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return
        # Servers that answer an exhausted body with empty chunks instead of waiting:
        # poll gently rather than spin.
        await asyncio.sleep(0.05)


async def _cancel(task: asyncio.Future) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await task
