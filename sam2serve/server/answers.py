"""Large JSON answers, built and serialised off the event loop in short pieces.

An answer of many masks (a /v1/concepts request of 16 phrases x 100 instances on a large
image, as uncompressed RLE or polygons, is tens of MB of JSON) costs seconds to validate
and serialise. pydantic does each in one call that holds the GIL from start to end, so
moving that call to a worker thread alone does not help: the event loop (every other
request, /healthz included) still waits for the whole call. Here the answer is built in a
worker thread and serialised one list item at a time (``pieces``: the path of nested list
fields whose items are serialised apart, e.g. ``("concepts", "instances")``): each item
is one short call, and between two calls, every ``YIELD_EVERY_S`` of them, the event loop
gets the GIL. The bytes are the same as ``model.model_dump_json()``'s.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator, Sequence

from fastapi.responses import Response
from pydantic import BaseModel

from sam2serve.server.request_body import JSON_MEDIA


def dump_json(model: BaseModel, pieces: Sequence[str] = ()) -> str:
    """``model.model_dump_json()``, with the items of the list field ``pieces[0]`` (and,
    inside each, of ``pieces[1]``, ...) serialised one call each."""
    if not pieces:
        return model.model_dump_json()
    field, rest = pieces[0], pieces[1:]
    items = getattr(model, field)
    # A JSON string escapes every quote, so the key followed by an empty list appears once,
    # where the skeleton has the field.
    marker = f'"{field}":[]'
    skeleton = model.model_copy(update={field: []}).model_dump_json()
    if skeleton.count(marker) != 1:  # a field serialised another way: in one piece
        return model.model_dump_json()
    body = ",".join(_yielding(dump_json(item, rest) for item in items))
    return skeleton.replace(marker, f'"{field}":[{body}]')


# How long serialising may keep the GIL before it lets go: the event loop waits at most
# about this long. Letting go after every piece instead cost a click's small answer
# (1 object, 1-3 masks) several ms: getting the GIL back waits for whichever thread took it.
YIELD_EVERY_S = 0.002


def _yielding(pieces: Iterator[str]) -> Iterator[str]:
    """``pieces``, the GIL let go after a piece once ``YIELD_EVERY_S`` has passed since it
    last was: a thread waiting for it (the event loop's) gets it then, not after the
    interpreter's switch interval."""
    last = time.perf_counter()
    for piece in pieces:
        yield piece
        if time.perf_counter() - last >= YIELD_EVERY_S:
            time.sleep(0)
            last = time.perf_counter()


def dump_bytes(model: BaseModel, pieces: Sequence[str] = ()) -> bytes:
    return dump_json(model, pieces).encode()


async def json_answer(
    build: Callable[[], BaseModel],
    pieces: Sequence[str] = (),
    status: int = 200,
    *,
    inline: bool = False,
) -> Response:
    """The answer ``build()`` makes, built and serialised in a worker thread
    (:func:`dump_json`), as a JSON response; ``inline``: on the event loop, for an answer
    known to be small (a click's), where the hop to the thread and back would cost more."""
    if inline:
        return Response(dump_bytes(build(), pieces), status_code=status, media_type=JSON_MEDIA)
    body = await asyncio.to_thread(lambda: dump_bytes(build(), pieces))
    return Response(body, status_code=status, media_type=JSON_MEDIA)
