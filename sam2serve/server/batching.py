"""The model worker: one thread that runs every piece of model work, batching encodes.

The event loop never runs the model. Handlers submit jobs to a bounded queue and await
their futures; the worker thread takes them in order. Encoders are registered by kind
(:meth:`ModelWorker.add_encoder`: SAM 2's ``encode`` always, SAM 3's concept encode with
``--concepts``): an encode job at the head of the queue waits up to ``max_wait_s``
(measured from when it was queued) for more encode jobs of its kind, then up to that
encoder's ``max_batch`` images go through ONE call of it. If a batch's call fails, its
images are encoded again one at a time, so an image that cannot be encoded fails only its
own job. Other jobs (mask decoding, AMG, warm-up) run one at a time. The model is used by
this one thread only, and the predictor holds no request state, so requests cannot see
each other's data.

Two queues keep one client's bulk work from starving everyone's clicks: *interactive*
jobs (encodes, mask decoding) and *bulk* jobs (AMG). The worker takes interactive jobs
first, and a running bulk job hands the thread back at every checkpoint
(:meth:`JobContext.check`, between AMG decoder batches): whatever interactive jobs are
waiting run there and then, on the same thread, before the bulk job goes on. So a click
waits for at most one AMG batch, not for a whole AMG.

Between the two, *long* interactive jobs (SAM 3's concept encodes and detections, a video
concept seed's detection: seconds of one model call each) wait in the interactive queue,
in order, but yield at their checkpoints: ``check()`` calls, and every torch operation of
the parts they run inside :meth:`JobContext.between_ops` (a thread-local torch function
mode): waiting *short* interactive jobs (clicks, SAM 2 encodes) run there and then. A job only ever yields to jobs of a higher rank (bulk < long <
short), so nesting is at most two deep and a long job never waits inside another long one.
The long job's own operations run unchanged and in order, so its results are the same
bits as when nothing interleaves.

When a queue is full (``max_queue`` interactive, ``max_bulk_queue`` bulk jobs waiting),
:meth:`ModelWorker.submit` raises :class:`QueueFull` at once (the service answers 503
with Retry-After) instead of letting latency grow without bound. A job whose requester
gave up is removed from the queue (:meth:`JobHandle.cancel`); a running job is told
through :attr:`JobContext.cancelled`, which long jobs check between decoder batches.
After a job, when nothing waits, ``on_idle`` runs (the service returns freed memory to
the operating system there).
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Collection, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch.overrides import TorchFunctionMode

from sam2serve.engine.predictor import Embedding, Predictor

log = logging.getLogger("sam2serve.server")

ENCODE = "encode"
# Exponential moving average weight of the latest job's run time (for Retry-After).
_EWMA_WEIGHT = 0.2
MAX_RETRY_AFTER_S = 60


class QueueFull(Exception):
    """The model queue is full; try again after ``retry_after_s`` seconds."""

    def __init__(self, depth: int, retry_after_s: int) -> None:
        super().__init__(f"{depth} model jobs are already waiting")
        self.depth = depth
        self.retry_after_s = retry_after_s


class JobCancelled(Exception):
    """Raised inside a job that noticed its requester has gone away."""


class WorkerStopped(RuntimeError):
    """The worker was stopped before the job ran (the server is shutting down)."""


@dataclass(frozen=True)
class JobTiming:
    """Where a job's time went: waiting in the queue, then running (its batch's run)."""

    queue_s: float
    run_s: float
    batch_size: int = 1


@dataclass
class JobContext:
    """Handed to a job's function: lets a long job stop early when nobody waits for it,
    and (a bulk or long job) let waiting interactive jobs run at its checkpoints."""

    cancelled: threading.Event = field(default_factory=threading.Event)
    yield_to: Callable[[], None] | None = None

    def check(self) -> None:
        """A checkpoint: raise :class:`JobCancelled` if the requester has gone; otherwise
        run the interactive jobs waiting meanwhile (bulk and long jobs only)."""
        if self.cancelled.is_set():
            raise JobCancelled("the request was abandoned (timeout or disconnect)")
        if self.yield_to is not None:
            self.yield_to()

    def between_ops(self) -> TorchFunctionMode:
        """A context in which every torch operation of this thread is a checkpoint: one
        model call of seconds (SAM 3's detector) lets waiting clicks run between its
        operations, each of which runs as it would have (same inputs, same order)."""
        return _CheckBetweenOps(self.check)


class _CheckBetweenOps(TorchFunctionMode):
    """Calls ``check`` before each torch operation. Torch pops the mode while it is in
    ``__torch_function__``, so the jobs ``check`` runs are not intercepted themselves; the
    mode stack is per thread, so other threads are not either."""

    def __init__(self, check: Callable[[], None]) -> None:
        super().__init__()
        self._check = check

    def __torch_function__(
        self,
        func: Callable[..., Any],
        types: Collection[type],
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
    ) -> Any:
        self._check()
        return func(*args, **(kwargs or {}))


# One result per image, in order; called on the worker thread with 1..max_batch images.
EncodeFn = Callable[[list[np.ndarray]], list[Any]]


# Who yields to whom: a job's checkpoints run waiting jobs of a higher rank only.
BULK_RANK, LONG_RANK, SHORT_RANK = 0, 1, 2


@dataclass(frozen=True)
class Encoder:
    """A kind of encode job the worker batches; a ``long`` one yields between its torch
    operations to waiting short jobs."""

    encode: EncodeFn
    max_batch: int
    long: bool = False


@dataclass(frozen=True)
class _Failed:
    """One image's error when its batch was encoded again one image at a time."""

    error: Exception


@dataclass(eq=False)
class _Job:
    kind: str
    future: Future[tuple[Any, JobTiming]]
    enqueued: float
    context: JobContext
    fn: Callable[[JobContext], Any] | None = None
    pixels: np.ndarray | None = None
    bulk: bool = False
    rank: int = SHORT_RANK


def _pixels_of(job: _Job) -> np.ndarray:
    """An encode job's image (every encode job is submitted with one)."""
    if job.pixels is None:
        raise RuntimeError(f"a {job.kind} encode job without an image")
    return job.pixels


class JobHandle:
    """A queued job: its future resolves to ``(result, JobTiming)``."""

    def __init__(self, worker: ModelWorker, job: _Job) -> None:
        self._worker = worker
        self._job = job

    @property
    def future(self) -> Future[tuple[Any, JobTiming]]:
        return self._job.future

    def cancel(self) -> None:
        """Drop the job if it has not started; otherwise ask it to stop early."""
        self._worker._cancel(self._job)


# Called after each batch: kind, batch size, per-job queue seconds, run seconds.
BatchObserver = Callable[[str, int, list[float], float], None]
INTERACTIVE, BULK = "interactive", "bulk"


class ModelWorker:
    """One thread running model jobs from a bounded queue, encodes batched together.
    ``max_batch_size`` bounds SAM 2's encodes (kind ``encode``); other encoders bring
    their own bound (:meth:`add_encoder`)."""

    def __init__(
        self,
        predictor: Predictor,
        *,
        max_batch_size: int = 4,
        max_wait_s: float = 0.01,
        max_queue: int = 32,
        max_bulk_queue: int = 8,
        on_batch: BatchObserver | None = None,
        on_cancel: Callable[[str], None] | None = None,
        on_idle: Callable[[], object] | None = None,
    ) -> None:
        if max_batch_size < 1 or max_queue < 1 or max_bulk_queue < 1 or max_wait_s < 0:
            raise ValueError(
                "max_batch_size, max_queue and max_bulk_queue must be >= 1, max_wait_s >= 0"
            )
        self.predictor = predictor
        self.max_batch_size = max_batch_size
        self.max_wait_s = max_wait_s
        self.max_queue = max_queue
        self.max_bulk_queue = max_bulk_queue
        self._on_batch = on_batch
        self._on_cancel = on_cancel
        self._on_idle = on_idle
        self._pending: deque[_Job] = deque()  # interactive
        self._bulk: deque[_Job] = deque()
        self._cond = threading.Condition()
        self._stopping = False
        self._busy = False
        self._mean_run_s = 1.0  # a prior until the first job has run
        self._thread: threading.Thread | None = None
        self._encoders: dict[str, Encoder] = {}
        self.add_encoder(ENCODE, self._encode_embeddings, max_batch_size)

    def add_encoder(
        self, kind: str, encode: EncodeFn, max_batch: int, *, long: bool = False
    ) -> None:
        """Batch the encode jobs of ``kind`` (:meth:`submit_encode`): those waiting together
        go through one ``encode(images)`` call of at most ``max_batch`` images, which must
        return one result per image, in order. ``long``: the call yields to waiting short
        jobs between its torch operations."""
        if max_batch < 1:
            raise ValueError(f"max_batch of encoder {kind!r} must be >= 1; got {max_batch}")
        with self._cond:
            if kind in self._encoders:
                raise ValueError(f"an encoder of kind {kind!r} is already registered")
            self._encoders[kind] = Encoder(encode, max_batch, long)

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._loop, name="sam2serve-model", daemon=True)
        self._thread.start()

    def stop(self, timeout: float | None = None) -> None:
        """Fail every waiting job, let the running one finish, and end the thread."""
        with self._cond:
            self._stopping = True
            pending = [*self._pending, *self._bulk]
            self._pending.clear()
            self._bulk.clear()
            self._cond.notify_all()
        for job in pending:
            if job.future.set_running_or_notify_cancel():
                job.future.set_exception(WorkerStopped("the server is shutting down"))
        if self._thread is not None:
            self._thread.join(timeout)

    # ------------------------------------------------------------------ submitting
    def submit_encode(
        self, pixels: np.ndarray, kind: str = ENCODE, *, bulk: bool = False
    ) -> JobHandle:
        """Encode one uint8 (H, W, 3) image with the encoder of ``kind`` (SAM 2's by
        default); resolves to ``(its result, JobTiming)``. A ``bulk`` encode waits in the
        bulk queue and is batched only with bulk encodes of its kind."""
        encoder = self._encoders.get(kind)
        if encoder is None:
            raise ValueError(f"no encoder of kind {kind!r} is registered")
        return self._submit(kind, pixels=pixels, bulk=bulk, long=encoder.long)

    def submit(
        self,
        kind: str,
        fn: Callable[[JobContext], Any],
        *,
        bulk: bool = False,
        long: bool = False,
    ) -> JobHandle:
        """Run ``fn(context)`` alone on the worker; resolves to ``(result, JobTiming)``.
        A ``bulk`` job waits in the bulk queue and yields to interactive jobs at its
        checkpoints (``context.check()``). A ``long`` job waits in the interactive queue
        and yields to waiting short jobs at its checkpoints: ``context.check()``, and every
        torch operation inside ``with context.between_ops():`` (where the job chooses;
        a long encoder's calls are inside it whole)."""
        if kind in self._encoders:
            raise ValueError(f"{kind!r} is an encoder's kind: use submit_encode")
        return self._submit(kind, fn=fn, bulk=bulk, long=long)

    def _submit(self, kind: str, *, long: bool = False, **payload: Any) -> JobHandle:
        job = _Job(kind, Future(), time.monotonic(), JobContext(), **payload)
        if job.bulk:
            job.rank = BULK_RANK
        elif long:
            job.rank = LONG_RANK
        if job.rank != SHORT_RANK:
            rank = job.rank
            job.context.yield_to = lambda: self._serve_above(rank)
        queue, limit = (
            (self._bulk, self.max_bulk_queue) if job.bulk else (self._pending, self.max_queue)
        )
        with self._cond:
            if self._stopping:
                raise WorkerStopped("the server is shutting down")
            if len(queue) >= limit:
                raise QueueFull(len(queue), self._retry_after_locked())
            queue.append(job)
            self._cond.notify_all()
        return JobHandle(self, job)

    def _cancel(self, job: _Job) -> None:
        with self._cond:
            try:
                (self._bulk if job.bulk else self._pending).remove(job)
                dropped = True
            except ValueError:
                dropped = False  # already taken by the worker (or finished)
        job.context.cancelled.set()
        job.future.cancel()  # succeeds only if the job has not started
        if dropped:
            self._cancelled(job.kind)

    def _cancelled(self, kind: str) -> None:
        if self._on_cancel is not None:
            try:
                self._on_cancel(kind)
            except Exception:  # metrics must never fail a job
                log.exception("cancel observer failed")

    # ------------------------------------------------------------------ state
    @property
    def depth(self) -> int:
        """Jobs waiting to run in both queues (not counting the one running)."""
        with self._cond:
            return len(self._pending) + len(self._bulk)

    def depths(self) -> dict[str, int]:
        """Jobs waiting, per queue."""
        with self._cond:
            return {INTERACTIVE: len(self._pending), BULK: len(self._bulk)}

    @property
    def busy(self) -> bool:
        return self._busy

    def retry_after_s(self) -> int:
        with self._cond:
            return self._retry_after_locked()

    def _retry_after_locked(self) -> int:
        """Seconds until the queue has likely drained: jobs ahead times the mean run time."""
        estimate = (len(self._pending) + len(self._bulk) + 1) * self._mean_run_s
        return int(min(MAX_RETRY_AFTER_S, max(1, math.ceil(estimate))))

    # ------------------------------------------------------------------ the thread
    def _loop(self) -> None:
        while True:
            batch = self._next_batch()
            if batch is None:
                return
            self._run_live(batch)
            # Nothing of the finished jobs may outlive them here: while the worker waits
            # for the next job, a closed video session's state (its frames) or an image's
            # pixels must not stay reachable from this frame.
            del batch
            if self._on_idle is not None and not self.depth:
                try:
                    self._on_idle()
                except Exception:
                    log.exception("idle hook failed")

    def _run_live(self, batch: list[_Job]) -> None:
        live = [job for job in batch if job.future.set_running_or_notify_cancel()]
        try:
            if live:
                self._run(live)
        finally:
            _let_go(batch)
            live.clear()

    def _next_batch(self) -> list[_Job] | None:
        with self._cond:
            while not self._pending and not self._bulk and not self._stopping:
                self._cond.wait()
            if self._stopping:
                return None
            if not self._pending:  # bulk encodes join whatever of their kind waits now
                batch = [self._bulk.popleft()]
                self._take_encodes(batch, self._bulk)
                return batch
            head = self._pending.popleft()
            batch = [head]
            encoder = self._encoders.get(head.kind)
            if encoder is None or encoder.max_batch == 1:
                return batch
            deadline = head.enqueued + self.max_wait_s
            while True:
                self._take_encodes(batch, self._pending)
                remaining = deadline - time.monotonic()
                if len(batch) >= encoder.max_batch or remaining <= 0 or self._stopping:
                    return batch
                self._cond.wait(remaining)

    def _serve_above(self, rank: int) -> None:
        """(On the worker thread, inside a bulk or long job of ``rank``.) Run the
        interactive jobs of a higher rank waiting now, in order, encodes batched as usual
        but without waiting for more to join."""
        while self._pending:  # a cheap look first: this runs between torch operations
            with self._cond:
                batch = self._take_above(rank)
            if not batch:
                return
            self._run_live(batch)

    def _take_above(self, rank: int) -> list[_Job]:
        """(Holding the lock.) The first waiting interactive job of a higher rank than
        ``rank`` and the encodes batched with it; empty if none (or stopping)."""
        head = next((job for job in self._pending if job.rank > rank), None)
        if head is None or self._stopping:
            return []
        self._pending.remove(head)
        batch = [head]
        self._take_encodes(batch, self._pending)
        return batch

    def _take_encodes(self, batch: list[_Job], queue: deque[_Job]) -> None:
        """Move encode jobs of the batch's kind waiting in ``queue`` into ``batch``, up to
        its encoder's ``max_batch`` (keeping other jobs' order); nothing for other jobs."""
        encoder = self._encoders.get(batch[0].kind)
        if encoder is None:
            return
        for job in [j for j in queue if j.kind == batch[0].kind]:
            if len(batch) >= encoder.max_batch:
                return
            queue.remove(job)
            batch.append(job)

    def _run(self, jobs: list[_Job]) -> None:
        started = time.monotonic()
        queue_s = [started - job.enqueued for job in jobs]
        was_busy, self._busy = self._busy, True
        head = jobs[0]
        try:
            encoder = self._encoders.get(head.kind)
            if encoder is not None:
                with self._checkpointed(encoder, head):
                    results: list[Any] = self._encode(encoder, jobs)
            else:
                assert head.fn is not None
                results = [head.fn(head.context)]
        except BaseException as exc:  # every waiter must hear of the failure
            if isinstance(exc, JobCancelled):
                self._cancelled(jobs[0].kind)
            self._finish(jobs[0].kind, len(jobs), queue_s, time.monotonic() - started)
            _fail(jobs, exc)
            # The error's traceback holds this frame: without the jobs (their futures hold
            # the error, their closures sessions and images) there is no cycle that only
            # a garbage collection would free.
            del jobs, head
            if not isinstance(exc, Exception):
                raise
            return
        finally:
            self._busy = was_busy
        run_s = time.monotonic() - started
        # Observed before the waiters resume, so metrics already count what they answer.
        self._finish(jobs[0].kind, len(jobs), queue_s, run_s)
        for job, result, waited in zip(jobs, results, queue_s, strict=True):
            if isinstance(result, _Failed):
                job.future.set_exception(result.error)
            else:
                job.future.set_result((result, JobTiming(waited, run_s, len(jobs))))

    @staticmethod
    def _checkpointed(encoder: Encoder, head: _Job) -> contextlib.AbstractContextManager[Any]:
        """A long encoder's torch operations as checkpoints (nothing for others). They
        only yield: one requester that leaves must not fail the others' images."""
        if not encoder.long or head.rank != LONG_RANK:
            return contextlib.nullcontext()
        return JobContext(yield_to=head.context.yield_to).between_ops()

    def _encode(self, encoder: Encoder, jobs: list[_Job]) -> list[Any]:
        """One call for the batch; if it fails, each image alone (its error, or result)."""
        images = [_pixels_of(job) for job in jobs]
        try:
            results = encoder.encode(images)
        except Exception:
            if len(jobs) == 1:
                raise
            log.warning(
                "a batch of %d %s jobs failed; encoding its images one at a time",
                len(jobs),
                jobs[0].kind,
                exc_info=True,
            )
            return [self._encode_alone(encoder, image) for image in images]
        if len(results) != len(jobs):
            raise RuntimeError(
                f"the {jobs[0].kind} encoder returned {len(results)} results for {len(jobs)} images"
            )
        return results

    @staticmethod
    def _encode_alone(encoder: Encoder, image: np.ndarray) -> Any:
        try:
            (result,) = encoder.encode([image])
        except Exception as exc:  # noqa: BLE001 - handed to the image's job, not lost
            return _Failed(exc)
        return result

    def _encode_embeddings(self, images: list[np.ndarray]) -> list[Embedding]:
        """SAM 2's encoder: one Embedding per image, each owning its tensors."""
        embedding = self.predictor.encode(images)
        if embedding.image_embed.is_cuda:  # time the encode, not its launch
            torch.cuda.synchronize(embedding.image_embed.device)
        if len(images) == 1:
            return [embedding]
        # Indexing gives views of the batch tensors; copies let each image's entry be
        # cached and freed on its own (and make Embedding.nbytes its true footprint).
        return [_own_copy(embedding[i]) for i in range(len(images))]

    def _finish(self, kind: str, size: int, queue_s: list[float], run_s: float) -> None:
        with self._cond:
            per_job = run_s / size if kind in self._encoders else run_s
            self._mean_run_s += _EWMA_WEIGHT * (per_job - self._mean_run_s)
        if self._on_batch is not None:
            try:
                self._on_batch(kind, size, queue_s, run_s)
            except Exception:  # metrics must never fail a job
                log.exception("batch observer failed")


def _fail(jobs: list[_Job], exc: BaseException) -> None:
    for job in jobs:
        job.future.set_exception(exc)


def _let_go(batch: list[_Job]) -> None:
    """Drop what a finished batch held. A JobHandle may outlive its job (its closure holds
    a session, its pixels an image); and a failed job's traceback keeps the worker's frames
    that ran it (through each frame's caller), so those must not hold the jobs either:
    their futures hold the error, a cycle only a garbage collection would free."""
    for job in batch:
        job.fn, job.pixels = None, None
    batch.clear()


def _own_copy(embedding: Embedding) -> Embedding:
    return Embedding(
        embedding.image_embed.clone(),
        (embedding.high_res_feats[0].clone(), embedding.high_res_feats[1].clone()),
        embedding.original_sizes,
    )
