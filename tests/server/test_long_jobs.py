"""Long interactive jobs on the model worker (issue 36): SAM 3's encodes, detections and
video concept seeds take seconds of one model call each; clicks queued meanwhile run
between the long job's torch operations, and the long job's answer is the same bits."""

from __future__ import annotations

import gc
import threading
import weakref

import numpy as np
import pytest
import torch

from sam2serve.server.batching import JobCancelled, ModelWorker

WAIT_S = 30  # an upper bound on waiting for the worker thread; never asserted as a time


class NoPredictor:
    """The worker's SAM 2 encoder is not used here."""

    def encode(self, images):  # pragma: no cover - never called
        raise AssertionError("no SAM 2 encode in these tests")


@pytest.fixture
def worker():
    worker = ModelWorker(NoPredictor(), max_wait_s=0.0)
    worker.start()
    yield worker
    worker.stop(5)


def chain(x: torch.Tensor, steps: int) -> torch.Tensor:
    """A stand-in model call: many small torch operations in a row."""
    for _ in range(steps):
        x = torch.tanh(x @ x.T * 0.01) + x
    return x


def test_a_click_queued_during_a_long_job_runs_between_its_operations(worker):
    order: list[str] = []
    started, click_queued = threading.Event(), threading.Event()
    x = torch.randn(8, 8, generator=torch.Generator().manual_seed(0))

    def long_job(context):
        with context.between_ops():
            started.set()
            assert click_queued.wait(WAIT_S)
            out = chain(x, 50)
        order.append("long")
        return out

    handle = worker.submit("concepts_detect", long_job, long=True)
    assert started.wait(WAIT_S)
    click = worker.submit("decode", lambda context: order.append("click") or "clicked")
    click_queued.set()
    assert click.future.result(WAIT_S)[0] == "clicked"
    result, _ = handle.future.result(WAIT_S)
    assert order == ["click", "long"]  # the click did not wait for the whole call
    torch.testing.assert_close(result, chain(x, 50), rtol=0, atol=0)  # the same bits


def test_a_long_job_does_not_yield_to_another_long_job(worker):
    """Only short jobs run at a long job's checkpoints: a second long job waits its turn
    (else a click behind it would wait for both)."""
    order: list[str] = []
    started, queued = threading.Event(), threading.Event()

    def first(context):
        with context.between_ops():
            started.set()
            assert queued.wait(WAIT_S)
            chain(torch.ones(4, 4), 20)
        order.append("first")

    def second(context):
        with context.between_ops():
            chain(torch.ones(4, 4), 20)
        order.append("second")

    a = worker.submit("concepts_detect", first, long=True)
    assert started.wait(WAIT_S)
    b = worker.submit("concepts_detect", second, long=True)
    click = worker.submit("decode", lambda context: order.append("click"))
    queued.set()
    for handle in (a, b, click):
        handle.future.result(WAIT_S)
    assert order == ["click", "first", "second"]


def test_a_bulk_job_yields_to_long_and_short_jobs_and_a_long_one_to_clicks_in_it(worker):
    order: list[str] = []
    started, queued = threading.Event(), threading.Event()
    nested_click_queued = threading.Event()

    def bulk(context):
        started.set()
        assert queued.wait(WAIT_S)
        context.check()  # runs the long job (and the click queued inside it)
        order.append("bulk")

    def long_job(context):
        with context.between_ops():
            worker.submit("decode", lambda c: order.append("click"))
            nested_click_queued.set()
            chain(torch.ones(4, 4), 5)
        order.append("long")

    amg = worker.submit("amg", bulk, bulk=True)
    assert started.wait(WAIT_S)
    detect = worker.submit("concepts_detect", long_job, long=True)
    queued.set()
    detect.future.result(WAIT_S)
    amg.future.result(WAIT_S)
    assert nested_click_queued.is_set()
    assert order == ["click", "long", "bulk"]


def test_operations_outside_between_ops_and_on_other_threads_are_not_checkpoints(worker):
    checks: list[int] = []

    def long_job(context):
        context_check = context.check

        def counting() -> None:
            checks.append(1)
            context_check()

        context.check = counting  # type: ignore[method-assign]
        chain(torch.ones(2, 2), 3)  # outside: no checkpoint
        other = threading.Thread(target=lambda: chain(torch.ones(2, 2), 3))
        with context.between_ops():
            other.start()
            other.join()
            torch.ones(1) + 1  # two operations: ones, add
        return len(checks)

    count, _ = worker.submit("concepts_detect", long_job, long=True).future.result(WAIT_S)
    assert count == 2


def test_a_long_job_whose_client_left_stops_at_its_next_operation(worker):
    started, cancelled = threading.Event(), threading.Event()

    def long_job(context):
        with context.between_ops():
            started.set()
            assert cancelled.wait(WAIT_S)
            chain(torch.ones(2, 2), 1000)
        raise AssertionError("not stopped")

    handle = worker.submit("concepts_detect", long_job, long=True)
    assert started.wait(WAIT_S)
    handle.cancel()
    cancelled.set()
    with pytest.raises(JobCancelled):
        handle.future.result(WAIT_S)


def test_a_long_encoder_yields_between_operations_and_batches_as_before(worker):
    order: list[str] = []
    started, queued = threading.Event(), threading.Event()

    def encode(images):
        started.set()
        assert queued.wait(WAIT_S)
        out = [chain(torch.full((3, 3), float(image[0, 0, 0])), 10) for image in images]
        order.append(f"encode x{len(images)}")
        return out

    worker.add_encoder("concepts_encode", encode, 2, long=True)
    first = worker.submit_encode(np.zeros((2, 2, 3), np.uint8), "concepts_encode")
    assert started.wait(WAIT_S)
    click = worker.submit("decode", lambda context: order.append("click"))
    queued.set()
    click.future.result(WAIT_S)
    first.future.result(WAIT_S)
    assert order == ["click", "encode x1"]


def test_a_failed_job_keeps_nothing_it_held_alive(worker):
    """A job's error holds the worker's frame in its traceback: not its closure's state."""

    class Session:
        frames = np.zeros((4, 4, 3), np.uint8)

    session = Session()
    ref = weakref.ref(session)

    def failing(context, held=session):
        raise ValueError(f"refused ({held.frames.shape})")

    handle = worker.submit("video_prompt", failing)
    with pytest.raises(ValueError):
        handle.future.result(WAIT_S)
    # The worker has let go of the job once it has run the next one.
    worker.submit("decode", lambda context: None).future.result(WAIT_S)
    del session, failing, handle
    was_enabled = gc.isenabled()
    gc.disable()  # freed by reference counting alone, not by a later collection
    try:
        assert ref() is None
    finally:
        if was_enabled:
            gc.enable()
