"""The request body's limits, as ASGI middleware: its size, the time it may take, and
the memory a large one leaves behind."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Mapping

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from sam2serve.server.errors import ApiError, error_body
from sam2serve.server.memory import release_free_memory

# After a request whose body was at least this large, the allocator's free pages are given
# back to the system: glibc keeps the pages of freed large buffers (the body, its text,
# its parse) for reuse, so without this a burst of large bodies would stay resident until
# the next model job trims them.
TRIM_AFTER_BYTES = 4 * 1024 * 1024


class BodyLimitMiddleware:
    """413 for bodies over ``limit`` bytes: at once from Content-Length, or as soon as a
    streamed body passes the limit (pure ASGI, so the body is never buffered whole here).
    408 for a body that has not arrived whole ``timeout_s`` after the request started (a
    slow or stalled client holds a connection and a buffer, never the server).

    ``path_limits`` gives some paths a limit of their own: ``{path: (bytes, setting)}``,
    the setting named in the 413's message (a video upload is larger than an image).
    Every route of the app is under one of them."""

    def __init__(
        self,
        app: ASGIApp,
        limit: int,
        observe: Callable[[int, str], None],
        timeout_s: float = 60.0,
        path_limits: Mapping[str, tuple[int, str]] | None = None,
    ) -> None:
        self.app = app
        self.limit = limit
        self.observe = observe
        self.timeout_s = timeout_s
        self.path_limits = dict(path_limits or {})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit, setting = self.path_limits.get(
            scope.get("path", ""), (self.limit, "max_upload_bytes and base64 overhead")
        )
        declared = dict(scope.get("headers", ())).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            self.observe(413, "upload_too_large")
            message = _message(int(declared), limit, setting)
            body = json.dumps(error_body("upload_too_large", message)).encode()
            await send(
                {
                    "type": "http.response.start",
                    "status": 413,
                    "headers": [
                        (b"content-type", b"application/json"),
                        (b"content-length", str(len(body)).encode()),
                        (b"connection", b"close"),
                    ],
                }
            )
            await send({"type": "http.response.body", "body": body})
            return
        received = 0
        body_done = False
        deadline = asyncio.get_running_loop().time() + self.timeout_s

        async def counting_receive() -> Message:
            nonlocal received, body_done
            if body_done:  # after the body only a disconnect can come: no deadline
                return await receive()
            try:
                async with asyncio.timeout_at(deadline):
                    message = await receive()
            except TimeoutError:
                raise ApiError(
                    408,
                    "body_timeout",
                    f"the request body did not arrive within {self.timeout_s:g} s "
                    f"(body_timeout_s; {received} bytes came); send it faster or smaller",
                    headers={"Connection": "close"},
                ) from None
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise ApiError(413, "upload_too_large", _message(received, limit, setting))
                body_done = not message.get("more_body", False)
            return message

        try:
            await self.app(scope, counting_receive, send)
        finally:
            if received >= TRIM_AFTER_BYTES:
                await asyncio.shield(asyncio.to_thread(release_free_memory))


def _message(size: int, limit: int, setting: str) -> str:
    return (
        f"request body of {size} bytes or more is over the limit of {limit} bytes "
        f"({setting}); send a smaller upload"
    )
