"""The model worker on its own, with a predictor stand-in that records its calls."""

from __future__ import annotations

import threading
import time
from concurrent.futures import wait

import numpy as np
import pytest
import torch

from sam2serve.engine.predictor import Embedding
from sam2serve.server.batching import JobCancelled, ModelWorker, QueueFull, WorkerStopped


class RecordingPredictor:
    """encode() returns embeddings whose image_embed holds the image's first pixel, so each
    result can be traced back to its image; it blocks while ``gate`` is closed."""

    def __init__(self) -> None:
        self.batches: list[int] = []
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()

    def encode(self, images):
        self.entered.set()
        assert self.gate.wait(timeout=30)
        self.batches.append(len(images))
        marks = torch.tensor([float(image[0, 0, 0]) for image in images])
        return Embedding(
            marks.reshape(-1, 1, 1, 1).expand(-1, 2, 2, 2).clone(),
            (torch.zeros(len(images), 1, 4, 4), torch.zeros(len(images), 1, 2, 2)),
            tuple(image.shape[:2] for image in images),
        )


def image(mark: int) -> np.ndarray:
    return np.full((4, 6, 3), mark, dtype=np.uint8)


@pytest.fixture
def predictor():
    return RecordingPredictor()


def make_worker(predictor, **kwargs) -> ModelWorker:
    worker = ModelWorker(predictor, **kwargs)
    worker.start()
    return worker


def test_encodes_queued_together_run_as_one_batch(predictor):
    predictor.gate.clear()
    worker = make_worker(predictor, max_batch_size=4, max_wait_s=0.0)
    try:
        first = worker.submit_encode(image(1))
        assert predictor.entered.wait(5)  # the first runs alone; the next three queue up
        others = [worker.submit_encode(image(mark)) for mark in (2, 3, 4)]
        predictor.gate.set()
        results = [h.future.result(timeout=10) for h in [first, *others]]
    finally:
        worker.stop()
    assert predictor.batches == [1, 3]
    for mark, (embedding, timing) in zip((1, 2, 3, 4), results, strict=True):
        assert len(embedding) == 1 and embedding.original_size == (4, 6)
        assert float(embedding.image_embed.flatten()[0]) == mark  # each gets its own image
        assert timing.batch_size == (1 if mark == 1 else 3)


def test_batch_members_are_independent_copies(predictor):
    predictor.gate.clear()
    worker = make_worker(predictor, max_batch_size=2, max_wait_s=0.0)
    try:
        worker.submit_encode(image(9))
        assert predictor.entered.wait(5)
        handles = [worker.submit_encode(image(m)) for m in (1, 2)]
        predictor.gate.set()
        embeddings = [h.future.result(timeout=10)[0] for h in handles]
    finally:
        worker.stop()
    # Each cached entry owns exactly its bytes (no view into the whole batch).
    assert all(e.image_embed.untyped_storage().nbytes() == e.image_embed.nbytes for e in embeddings)


def test_first_encode_waits_for_company_up_to_max_wait(predictor):
    worker = make_worker(predictor, max_batch_size=2, max_wait_s=5.0)
    try:
        first = worker.submit_encode(image(1))
        second = worker.submit_encode(image(2))
        wait([first.future, second.future], timeout=10)
    finally:
        worker.stop()
    assert predictor.batches == [2]  # a full batch does not wait out max_wait


def test_other_jobs_run_alone_in_order(predictor):
    worker = make_worker(predictor, max_batch_size=4, max_wait_s=0.0)
    order: list[str] = []
    try:
        handles = [
            worker.submit(f"job{i}", lambda ctx, i=i: order.append(f"job{i}") or i)
            for i in range(3)
        ]
        results = [h.future.result(timeout=10)[0] for h in handles]
    finally:
        worker.stop()
    assert results == [0, 1, 2] and order == ["job0", "job1", "job2"]


def test_full_queue_refuses_with_retry_after(predictor):
    predictor.gate.clear()
    worker = make_worker(predictor, max_batch_size=1, max_queue=1)
    try:
        running = worker.submit_encode(image(1))
        assert predictor.entered.wait(5)
        queued = worker.submit_encode(image(2))
        with pytest.raises(QueueFull) as refused:
            worker.submit_encode(image(3))
        assert refused.value.retry_after_s >= 1 and refused.value.depth == 1
        predictor.gate.set()
        assert running.future.result(timeout=10) and queued.future.result(timeout=10)
    finally:
        worker.stop()


def test_cancel_removes_a_waiting_job(predictor):
    predictor.gate.clear()
    worker = make_worker(predictor, max_batch_size=1)
    try:
        worker.submit_encode(image(1))
        assert predictor.entered.wait(5)
        dropped = worker.submit_encode(image(2))
        assert worker.depth == 1
        dropped.cancel()
        assert worker.depth == 0 and dropped.future.cancelled()
        predictor.gate.set()
        kept = worker.submit_encode(image(3))
        kept.future.result(timeout=10)
    finally:
        worker.stop()
    assert predictor.batches == [1, 1]  # the cancelled image was never encoded


def test_cancel_tells_a_running_job(predictor):
    worker = make_worker(predictor)
    started = threading.Event()

    def long_job(context):
        started.set()
        for _ in range(500):
            context.check()
            time.sleep(0.01)
        return "finished"

    try:
        handle = worker.submit("amg", long_job)
        assert started.wait(5)
        handle.cancel()
        with pytest.raises(JobCancelled):
            handle.future.result(timeout=10)
    finally:
        worker.stop()


def test_a_failing_job_fails_only_its_waiters(predictor):
    worker = make_worker(predictor)
    try:
        failing = worker.submit("decode", lambda ctx: 1 / 0)
        with pytest.raises(ZeroDivisionError):
            failing.future.result(timeout=10)
        assert worker.submit("decode", lambda ctx: "ok").future.result(timeout=10)[0] == "ok"
    finally:
        worker.stop()


def test_stop_fails_waiting_jobs(predictor):
    predictor.gate.clear()
    worker = make_worker(predictor, max_batch_size=1)
    worker.submit_encode(image(1))
    assert predictor.entered.wait(5)
    waiting = worker.submit_encode(image(2))
    threading.Timer(0.2, predictor.gate.set).start()
    worker.stop(timeout=10)
    with pytest.raises(WorkerStopped):
        waiting.future.result(timeout=1)
    with pytest.raises(WorkerStopped):
        worker.submit_encode(image(3))


def test_clicks_run_inside_a_bulk_job_at_its_checkpoints(predictor):
    """A bulk job (AMG) yields the thread to interactive jobs at every checkpoint: a click
    queued during it runs before the bulk job's next step, not after the whole job."""
    order: list[str] = []
    step_started = threading.Event()
    click_queued = threading.Event()
    worker = make_worker(predictor)
    try:

        def bulk(context):
            for step in range(3):
                order.append(f"bulk{step}")
                step_started.set()
                assert click_queued.wait(5)
                context.check()
            return "bulk done"

        amg = worker.submit("amg", bulk, bulk=True)
        assert step_started.wait(5)
        click = worker.submit("decode", lambda context: order.append("click") or "click done")
        assert worker.depths() == {"interactive": 1, "bulk": 0}
        click_queued.set()
        assert click.future.result(5)[0] == "click done"
        assert amg.future.result(5)[0] == "bulk done"
        assert order == ["bulk0", "click", "bulk1", "bulk2"]
    finally:
        worker.stop(5)


def test_waiting_clicks_go_before_waiting_bulk_jobs(predictor):
    predictor.gate.clear()
    order: list[str] = []
    worker = make_worker(predictor, max_batch_size=1, max_bulk_queue=1)
    try:
        first = worker.submit_encode(image(1))
        assert predictor.entered.wait(5)  # the worker is busy; both below wait
        amg = worker.submit("amg", lambda context: order.append("amg"), bulk=True)
        click = worker.submit("decode", lambda context: order.append("click"))
        with pytest.raises(QueueFull):  # the bulk queue has its own bound
            worker.submit("amg", lambda context: None, bulk=True)
        predictor.gate.set()
        wait([first.future, amg.future, click.future], timeout=5)
        assert order == ["click", "amg"]
    finally:
        worker.stop(5)


def test_cancelled_jobs_are_reported_queued_or_running(predictor):
    cancelled: list[str] = []
    running = threading.Event()
    worker = make_worker(predictor, on_cancel=cancelled.append)
    try:

        def long_job(context):
            running.set()
            for _ in range(500):
                time.sleep(0.01)
                context.check()

        amg = worker.submit("amg", long_job, bulk=True)
        assert running.wait(5)
        queued = worker.submit("amg", lambda context: None, bulk=True)
        queued.cancel()  # dropped from the queue
        amg.cancel()  # stopped at its next checkpoint
        with pytest.raises(JobCancelled):
            amg.future.result(5)
        assert queued.future.cancelled()
        assert sorted(cancelled) == ["amg", "amg"]
    finally:
        worker.stop(5)


def test_idle_hook_runs_when_the_queues_are_empty(predictor):
    idle = threading.Event()
    worker = make_worker(predictor, on_idle=idle.set)
    try:
        worker.submit_encode(image(1)).future.result(5)
        assert idle.wait(5)
    finally:
        worker.stop(5)


class RecordingEncoder:
    """A second encoder kind: each image's result is its first pixel; images whose first
    pixel is in ``failing`` make any call that holds them fail."""

    def __init__(self, failing: tuple[int, ...] = ()) -> None:
        self.batches: list[list[int]] = []
        self.failing = failing

    def __call__(self, images):
        marks = [int(image[0, 0, 0]) for image in images]
        self.batches.append(marks)
        bad = [m for m in marks if m in self.failing]
        if bad:
            raise ValueError(f"cannot encode image {bad[0]}")
        return [f"encoding {m}" for m in marks]


def test_an_encoder_kind_batches_its_own_jobs_up_to_its_own_bound(predictor):
    predictor.gate.clear()
    concepts = RecordingEncoder()
    worker = ModelWorker(predictor, max_batch_size=4, max_wait_s=0.0)
    worker.add_encoder("concepts_encode", concepts, max_batch=2)
    worker.start()
    try:
        blocker = worker.submit_encode(image(9))  # SAM 2's; the rest queue behind it
        assert predictor.entered.wait(5)
        sam3 = [worker.submit_encode(image(m), "concepts_encode") for m in (1, 2, 3)]
        sam2 = [worker.submit_encode(image(m)) for m in (4, 5)]
        predictor.gate.set()
        answers = [h.future.result(timeout=10) for h in sam3]
        embeddings = [h.future.result(timeout=10)[0] for h in sam2]
        blocker.future.result(timeout=10)
    finally:
        worker.stop()
    assert concepts.batches == [[1, 2], [3]]  # max_batch 2; never mixed with SAM 2's
    assert predictor.batches == [1, 2]
    assert [result for result, _ in answers] == ["encoding 1", "encoding 2", "encoding 3"]
    assert [timing.batch_size for _, timing in answers] == [2, 2, 1]
    assert [float(e.image_embed.flatten()[0]) for e in embeddings] == [4.0, 5.0]


def test_a_failing_image_fails_only_its_own_job(predictor):
    predictor.gate.clear()
    concepts = RecordingEncoder(failing=(2,))
    worker = ModelWorker(predictor, max_wait_s=0.0)
    worker.add_encoder("concepts_encode", concepts, max_batch=4)
    worker.start()
    try:
        worker.submit_encode(image(9))
        assert predictor.entered.wait(5)
        handles = [worker.submit_encode(image(m), "concepts_encode") for m in (1, 2, 3)]
        predictor.gate.set()
        with pytest.raises(ValueError, match="cannot encode image 2"):
            handles[1].future.result(timeout=10)
        good = [handles[i].future.result(timeout=10)[0] for i in (0, 2)]
    finally:
        worker.stop()
    # the batch failed, then each image alone: only image 2's job sees the error
    assert concepts.batches == [[1, 2, 3], [1], [2], [3]]
    assert good == ["encoding 1", "encoding 3"]


def test_bulk_encodes_batch_only_with_bulk_encodes_of_their_kind(predictor):
    predictor.gate.clear()
    concepts = RecordingEncoder()
    worker = ModelWorker(predictor, max_wait_s=0.0)
    worker.add_encoder("concepts_encode", concepts, max_batch=4)
    worker.start()
    try:
        worker.submit_encode(image(9))
        assert predictor.entered.wait(5)
        bulk = [worker.submit_encode(image(m), "concepts_encode", bulk=True) for m in (1, 2)]
        click = worker.submit_encode(image(3), "concepts_encode")
        assert worker.depths() == {"interactive": 1, "bulk": 2}
        predictor.gate.set()
        for handle in [*bulk, click]:
            handle.future.result(timeout=10)
    finally:
        worker.stop()
    assert concepts.batches == [[3], [1, 2]]  # the click first, alone; then the bulk two


def test_encoder_kinds_are_checked(predictor):
    worker = ModelWorker(predictor)
    worker.add_encoder("concepts_encode", RecordingEncoder(), max_batch=1)
    with pytest.raises(ValueError, match="already registered"):
        worker.add_encoder("concepts_encode", RecordingEncoder(), max_batch=1)
    with pytest.raises(ValueError, match="max_batch"):
        worker.add_encoder("other", RecordingEncoder(), max_batch=0)
    with pytest.raises(ValueError, match="no encoder of kind 'nope'"):
        worker.submit_encode(image(1), "nope")
    with pytest.raises(ValueError, match="submit_encode"):
        worker.submit("concepts_encode", lambda context: None)
