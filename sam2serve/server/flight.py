"""Single-flight: concurrent requests for the same key share one computation.

The service encodes an uploaded image once however many requests send it at the same time:
the first starts a :class:`Flight` (a task computing the value, e.g. waiting on a model
job), the others find it by key and wait on the same task. What every user of it must
get right is here, once:

- A waiter that gives up (timeout, disconnect) stops waiting; the shared task is shielded
  from its cancellation, so the other waiters still get the value.
- When the last waiter gives up before the value is ready, the flight is *abandoned*: it
  leaves the table at once (a new request for the key starts afresh) and its ``abandon``
  hook runs (the service drops its queued model job there; a job already running still
  finishes and is cached).
- An error of the computation reaches every waiter; nobody's error is left unretrieved.
- A waiter whose shared task was cancelled while it itself was not (the work was dropped
  under it) gets the ``dropped()`` error instead of a bare ``CancelledError``.

All of it runs on the event loop (no locks: nothing here awaits between a lookup and the
table's update).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")


@dataclass(eq=False)
class Flight(Generic[V]):
    """A computation under way that every request for its key waits on."""

    abandon: Callable[[], object]
    task: asyncio.Task[V] = field(init=False)
    waiters: int = 0


class Flights(Generic[K, V]):
    """The flights under way, by key. ``dropped()`` is the error a waiter gets when the
    shared work was cancelled while the waiter was not."""

    def __init__(self, dropped: Callable[[], BaseException]) -> None:
        self._dropped = dropped
        self._flights: dict[K, Flight[V]] = {}

    def get(self, key: K) -> Flight[V] | None:
        return self._flights.get(key)

    def __len__(self) -> int:
        return len(self._flights)

    def start(
        self,
        key: K,
        work: Coroutine[Any, Any, V],
        abandon: Callable[[], object] | None = None,
    ) -> Flight[V]:
        """Run ``work`` as the key's flight (the caller checked that none is under way).
        ``abandon`` runs when every waiter has given up before it finished (default:
        cancel the work)."""
        if key in self._flights:
            work.close()
            raise RuntimeError(f"a flight for {key!r} is already under way")
        flight: Flight[V] = Flight(abandon or (lambda: flight.task.cancel()))
        flight.task = asyncio.create_task(self._fly(key, flight, work))
        flight.task.add_done_callback(_consume_exception)
        self._flights[key] = flight
        return flight

    async def _fly(self, key: K, flight: Flight[V], work: Coroutine[Any, Any, V]) -> V:
        try:
            return await work
        finally:  # landed: the next request for the key finds the value where it is kept
            self._forget(key, flight)

    def _forget(self, key: K, flight: Flight[V]) -> None:
        if self._flights.get(key) is flight:  # not a newer flight of the same key
            del self._flights[key]

    def _abandon(self, key: K, flight: Flight[V]) -> None:
        self._forget(key, flight)
        flight.abandon()

    async def wait(self, key: K, flight: Flight[V]) -> V:
        """The flight's value (or its error), shared with every other waiter."""
        flight.waiters += 1
        try:
            return await asyncio.shield(flight.task)
        except asyncio.CancelledError:
            if flight.waiters == 1 and not flight.task.done():
                self._abandon(key, flight)  # nobody else waits for it
            current = asyncio.current_task()
            if current is not None and current.cancelling() == 0:  # the work, not us
                raise self._dropped() from None
            raise
        finally:
            flight.waiters -= 1


def _consume_exception(task: asyncio.Task[Any]) -> None:
    """Mark a flight's error as seen (its waiters got it, or there were none)."""
    if not task.cancelled():
        task.exception()
