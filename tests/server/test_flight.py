"""Flights on their own: concurrent requests for a key share one computation, its error
reaches every waiter, one waiter giving up leaves the others' work alone, and the last
one abandons it."""

from __future__ import annotations

import asyncio

import pytest

from sam2serve.server.flight import Flights


class Dropped(Exception):
    pass


def run(coroutine):
    return asyncio.run(coroutine)


def flights() -> Flights[str, int]:
    return Flights(lambda: Dropped("the shared work was dropped"))


async def join(table: Flights[str, int], key: str, work, started: list[str]) -> int:
    """What a request does: join the key's flight, or start it."""
    flight = table.get(key)
    if flight is None:
        started.append(key)
        flight = table.start(key, work())
    return await table.wait(key, flight)


def test_concurrent_waiters_share_one_computation():
    async def scenario() -> None:
        table = flights()
        gate = asyncio.Event()
        started: list[str] = []

        async def work() -> int:
            await gate.wait()
            return 42

        waiters = [asyncio.create_task(join(table, "a", work, started)) for _ in range(4)]
        await asyncio.sleep(0.01)
        assert started == ["a"] and len(table) == 1
        assert table.get("a").waiters == 4
        gate.set()
        assert await asyncio.gather(*waiters) == [42] * 4
        assert len(table) == 0  # landed: the next request starts afresh (or finds a cache)

    run(scenario())


def test_an_error_reaches_every_waiter_and_is_not_left_unretrieved():
    async def scenario() -> None:
        table = flights()
        gate = asyncio.Event()
        started: list[str] = []

        async def work() -> int:
            await gate.wait()
            raise ValueError("bad image")

        waiters = [asyncio.create_task(join(table, "a", work, started)) for _ in range(3)]
        await asyncio.sleep(0.01)
        gate.set()
        results = await asyncio.gather(*waiters, return_exceptions=True)
        assert [type(r) for r in results] == [ValueError] * 3 and started == ["a"]
        assert len(table) == 0

    loop_errors: list[dict] = []

    async def watched() -> None:
        asyncio.get_running_loop().set_exception_handler(lambda _, ctx: loop_errors.append(ctx))
        await scenario()

    run(watched())
    assert loop_errors == []  # no "Task exception was never retrieved"


def test_one_waiter_giving_up_does_not_cancel_the_work_of_the_others():
    async def scenario() -> None:
        table = flights()
        gate = asyncio.Event()
        runs: list[str] = []
        abandoned: list[str] = []

        async def work() -> int:
            runs.append("ran")
            await gate.wait()
            return 7

        flight = table.start("a", work(), abandon=lambda: abandoned.append("a"))
        leaving = asyncio.create_task(table.wait("a", flight))
        staying = asyncio.create_task(table.wait("a", flight))
        await asyncio.sleep(0.01)
        leaving.cancel()
        with pytest.raises(asyncio.CancelledError):
            await leaving
        assert not flight.task.cancelled() and abandoned == []
        assert table.get("a") is flight and flight.waiters == 1
        gate.set()
        assert await staying == 7 and runs == ["ran"]

    run(scenario())


def test_the_last_waiter_giving_up_abandons_the_flight():
    async def scenario() -> None:
        table = flights()
        gate = asyncio.Event()

        async def work() -> int:
            await gate.wait()
            return 1

        flight = table.start("a", work())  # default abandon: cancel the work
        waiter = asyncio.create_task(table.wait("a", flight))
        await asyncio.sleep(0.01)
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        assert table.get("a") is None  # a new request starts afresh at once
        await asyncio.sleep(0)
        assert flight.task.cancelled()
        again = table.start("a", work())
        gate.set()
        assert await table.wait("a", again) == 1

    run(scenario())


def test_an_abandoned_flight_that_lands_late_leaves_the_newer_one_alone():
    async def scenario() -> None:
        table = flights()
        first_gate, second_gate = asyncio.Event(), asyncio.Event()

        async def work(gate: asyncio.Event, value: int) -> int:
            await gate.wait()
            return value

        # abandon does not stop it (a model job already running finishes)
        old = table.start("a", work(first_gate, 1), abandon=lambda: None)
        waiter = asyncio.create_task(table.wait("a", old))
        await asyncio.sleep(0.01)
        waiter.cancel()
        await asyncio.gather(waiter, return_exceptions=True)
        new = table.start("a", work(second_gate, 2))
        first_gate.set()
        assert await old.task == 1
        assert table.get("a") is new  # the old one's landing did not remove it
        second_gate.set()
        assert await table.wait("a", new) == 2

    run(scenario())


def test_work_dropped_under_a_waiter_is_the_dropped_error():
    async def scenario() -> None:
        table = flights()

        async def work() -> int:
            await asyncio.Event().wait()
            return 0

        flight = table.start("a", work())
        waiter = asyncio.create_task(table.wait("a", flight))
        await asyncio.sleep(0.01)
        flight.task.cancel()  # e.g. its queued model job was dropped
        with pytest.raises(Dropped):
            await waiter

    run(scenario())


def test_a_second_flight_for_a_key_under_way_is_refused():
    async def scenario() -> None:
        table = flights()

        async def work() -> int:
            return 0

        flight = table.start("a", work())
        second = work()
        with pytest.raises(RuntimeError, match="already under way"):
            table.start("a", second)
        assert await table.wait("a", flight) == 0

    run(scenario())
