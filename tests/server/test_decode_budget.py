"""DecodeBudget on its own: reservations in arrival order, the refusals, and no bytes lost
when a waiter gives up or is cancelled."""

from __future__ import annotations

import asyncio

import pytest

from sam2serve.server.decode_budget import DecodeBudget
from sam2serve.server.errors import ApiError


def run(coroutine):
    return asyncio.run(coroutine)


def test_waiters_are_served_in_arrival_order_and_bytes_come_back():
    async def scenario() -> list[str]:
        budget = DecodeBudget(100, wait_s=5)
        order: list[str] = []
        held = await budget.reserve(80, "a")

        async def take(name: str, nbytes: int) -> None:
            reservation = await budget.reserve(nbytes, name)
            order.append(name)
            await asyncio.sleep(0.01)
            reservation.release()

        big = asyncio.create_task(take("big", 90))
        await asyncio.sleep(0.01)
        small = asyncio.create_task(take("small", 10))  # fits now, but arrives after big
        await asyncio.sleep(0.01)
        assert order == [] and budget.waiting == 2
        held.shrink(30)  # decoded: only the pixels stay
        held.release()
        await asyncio.gather(big, small)
        assert budget.held == 0
        return order

    assert run(scenario()) == ["big", "small"]


def test_too_large_alone_is_413_and_no_room_in_time_is_503():
    async def scenario() -> None:
        budget = DecodeBudget(100, wait_s=0.05)
        with pytest.raises(ApiError) as alone:
            await budget.reserve(101, "image")
        assert alone.value.status == 413 and alone.value.code == "over_decode_budget"
        held = await budget.reserve(60, "a")
        with pytest.raises(ApiError) as busy:
            await budget.reserve(50, "b")
        assert busy.value.status == 503 and busy.value.code == "busy_decoding"
        assert "Retry-After" in (busy.value.headers or {})
        held.release()
        assert budget.held == 0 and budget.waiting == 0
        (await budget.reserve(100, "c")).release()

    run(scenario())


def test_a_cancelled_waiter_leaves_nothing_held():
    async def scenario() -> None:
        budget = DecodeBudget(100, wait_s=5)
        held = await budget.reserve(100, "a")
        waiter = asyncio.create_task(budget.reserve(50, "b"))
        await asyncio.sleep(0.01)
        held.release()  # grants the waiter its bytes...
        waiter.cancel()  # ...which it never takes
        with pytest.raises(asyncio.CancelledError):
            await waiter
        assert budget.held == 0 and budget.waiting == 0

    run(scenario())
