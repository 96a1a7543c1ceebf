"""The decoded bytes of every upload in flight, bounded for the whole process.

A request's own limits (``max_pixels``, ``max_video_frames``, ``max_video_session_bytes``)
bound one upload; :class:`DecodeBudget` bounds them together. Before decoding anything a
request reserves what its decoded form will take, worked out from the image header or the
video's stream metadata (:mod:`sam2serve.server.uploads`, :mod:`sam2serve.engine.video_io`),
and gives the bytes back once nothing of its holds them any more: an image's pixels after
its encode, a video's frames once its session holds them (the session limits count them
from then on), a mask or COCO runs once read. A request that alone needs more than the
whole budget is refused at once (413); one that does not fit now waits its turn, first
come first served, and gets 503 with Retry-After if no room comes within its wait. So N
concurrent uploads cannot multiply memory: together they stay within the budget.

Reservations are taken and given back on the event loop (the decoding itself runs in
worker threads, between the two).
"""

from __future__ import annotations

import asyncio
import collections
import math
from dataclasses import dataclass
from typing import Self

from sam2serve.server.errors import ApiError

MiB = 1024 * 1024
# What decoding one image holds at its peak, per pixel: Pillow's decoded image (RGB is
# stored as 4 bytes a pixel), a transposed copy for an EXIF orientation, and the uint8 RGB
# array the engine takes (3).
IMAGE_DECODE_BYTES_PER_PIXEL = 11
RGB_BYTES_PER_PIXEL = 3
# FFmpeg's own frames while a video decodes (reference frames, a GIF's canvas, the frame
# being converted to RGB), counted as this many 4-byte-per-pixel frames.
VIDEO_DECODER_FRAMES = 6


def image_decode_bytes(width: int, height: int) -> int:
    """Bytes an image of this size holds while it is decoded."""
    return width * height * IMAGE_DECODE_BYTES_PER_PIXEL


def video_decode_bytes(frames: int, width: int, height: int) -> int:
    """Bytes ``frames`` RGB frames of this size hold, with the decoder's working frames."""
    pixels = width * height
    return frames * pixels * RGB_BYTES_PER_PIXEL + VIDEO_DECODER_FRAMES * pixels * 4


@dataclass
class Reservation:
    """Bytes held in a :class:`DecodeBudget` until :meth:`release` (idempotent)."""

    budget: DecodeBudget | None
    nbytes: int

    def shrink(self, nbytes: int) -> None:
        """Keep only ``nbytes`` of the reservation (what is still held after decoding)."""
        if self.budget is not None and nbytes < self.nbytes:
            self.budget._give_back(self.nbytes - nbytes)
            self.nbytes = nbytes

    def release(self) -> None:
        if self.budget is not None:
            budget, self.budget = self.budget, None
            budget._give_back(self.nbytes)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


class DecodeBudget:
    """At most ``limit`` bytes reserved at once; waiters served in arrival order."""

    def __init__(self, limit: int, wait_s: float) -> None:
        self.limit = limit
        self.wait_s = wait_s
        self.held = 0
        self._waiters: collections.deque[tuple[int, asyncio.Future[None]]] = collections.deque()

    @property
    def waiting(self) -> int:
        return sum(1 for _, future in self._waiters if not future.done())

    async def reserve(self, nbytes: int, what: str) -> Reservation:
        """Reserve ``nbytes`` for ``what`` (named in errors): 413 if it can never fit, 503
        if it does not fit within ``wait_s``."""
        nbytes = max(0, int(nbytes))
        if nbytes > self.limit:
            raise ApiError(
                413,
                "over_decode_budget",
                f"{what}: decoding it would take {nbytes / MiB:,.0f} MiB, more than this "
                f"server decodes at once ({self.limit / MiB:,.0f} MiB, "
                "max_decoded_bytes_in_flight); send fewer or smaller frames or pixels",
            )
        if not self._waiters and self.held + nbytes <= self.limit:
            self.held += nbytes
            return Reservation(self, nbytes)
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append((nbytes, future))
        try:
            async with asyncio.timeout(self.wait_s):
                await future
        except (TimeoutError, asyncio.CancelledError) as exc:
            granted = future.done() and not future.cancelled()
            future.cancel()
            if granted:  # the bytes came just as the wait ended: give them back
                self._give_back(nbytes)
            else:
                self._wake()  # a large waiter leaving may let smaller ones in
            if isinstance(exc, TimeoutError):
                raise ApiError(
                    503,
                    "busy_decoding",
                    f"{what}: the server is decoding {self.held / MiB:,.0f} MiB of other "
                    f"uploads (max_decoded_bytes_in_flight {self.limit / MiB:,.0f} MiB) and "
                    f"no room came within {self.wait_s:g} s; retry later",
                    headers={"Retry-After": str(max(1, math.ceil(self.wait_s / 4)))},
                ) from None
            raise
        return Reservation(self, nbytes)

    def _give_back(self, nbytes: int) -> None:
        self.held = max(0, self.held - nbytes)
        self._wake()

    def _wake(self) -> None:
        while self._waiters:
            nbytes, future = self._waiters[0]
            if future.done():
                self._waiters.popleft()
                continue
            if self.held + nbytes > self.limit:
                return
            self._waiters.popleft()
            self.held += nbytes
            future.set_result(None)


__all__ = [
    "DecodeBudget",
    "Reservation",
    "image_decode_bytes",
    "video_decode_bytes",
]
