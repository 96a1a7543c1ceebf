"""A Server-Sent Events response that ends its source as soon as the response ends.

Starlette's StreamingResponse stops iterating when a send fails, but leaves the generator
suspended (asyncio closes it whenever it is garbage collected, and whatever the generator
waits on is left pending until then), and under ASGI 2.4 it notices a client that left
only at the next send. :class:`EventStream` watches the connection while it streams: when
the client disconnects (or every event is sent, or a send fails) it closes the generator
at once and calls ``on_close`` (which stops the work that feeds it). So a client that
hangs up right after the headers leaves no task pending, no outcome unretrieved and no
traceback in the log.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, Callable

from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

log = logging.getLogger("sam2serve.server")

EVENT_STREAM = "text/event-stream"


class EventStream(StreamingResponse):
    def __init__(self, events: AsyncGenerator[bytes, None], on_close: Callable[[], None]) -> None:
        super().__init__(
            events,
            media_type=EVENT_STREAM,
            headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
        )
        self._events = events
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        streaming = asyncio.ensure_future(self.stream_response(send))
        watching = asyncio.ensure_future(_disconnected(receive))
        try:
            await asyncio.wait({streaming, watching}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (streaming, watching):
                task.cancel()
            outcomes = await asyncio.gather(streaming, watching, return_exceptions=True)
            await self._events.aclose()
            self._on_close()
        failure = outcomes[0]
        if isinstance(failure, OSError):  # a send to a connection that has gone
            log.info("the client of an event stream went away")
        elif isinstance(failure, Exception):
            raise failure


async def _disconnected(receive: Receive) -> None:
    """Returns when the client has closed the connection (the request body is read)."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return
        await asyncio.sleep(0.05)  # a server that answers an exhausted body with empty chunks


__all__ = ["EVENT_STREAM", "EventStream"]
