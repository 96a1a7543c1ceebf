"""What one app shares between requests, and how a request reaches the model.

:class:`Service` owns the model worker (one thread, batched encodes, bounded queue), the
embedding and mask caches and the metrics. Embeddings are cached by content hash
(:mod:`sam2serve.server.cache`); concurrent requests for the same uncached image share one
encode (a flight, :mod:`sam2serve.server.flight`). With a persistent store
(``store.location``, :mod:`sam2serve.store`) an embedding comes from memory, else
the store, else an encode, and every encode is written through to the store before it is
answered, so any replica that shares the store can answer the image's ``image_id`` without
encoding it again. A client that gives up cancels its model jobs; every failure a client
can see is an :class:`~sam2serve.server.errors.ApiError`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import PurePath
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from sam2serve.engine.decode_choice import image_decoder
from sam2serve.engine.predictor import Embedding, Predictor
from sam2serve.runtime.warmup import warm_up
from sam2serve.server.batching import (
    BULK,
    ENCODE,
    INTERACTIVE,
    JobCancelled,
    JobContext,
    JobHandle,
    JobTiming,
    ModelWorker,
    QueueFull,
    WorkerStopped,
)
from sam2serve.server.cache import (
    EmbeddingCache,
    EmbeddingKey,
    MaskCache,
    StoredMask,
    image_id_of,
    looks_like_image_id,
)
from sam2serve.server.concept_images import ConceptImages
from sam2serve.server.decode_budget import DecodeBudget, Reservation, image_decode_bytes
from sam2serve.server.errors import ApiError
from sam2serve.server.flight import Flight, Flights
from sam2serve.server.image_folder import FolderIndex
from sam2serve.server.memory import IdleRelease, release_free_memory
from sam2serve.server.metrics import Metrics
from sam2serve.server.request_clock import RequestClock
from sam2serve.server.settings_groups import (
    BatchingSettings,
    CacheSettings,
    ConceptSettings,
    LimitSettings,
    RuntimeSettings,
    StoreSettings,
)
from sam2serve.server.uploads import decode_image, probe_image
from sam2serve.server.video_sessions import VideoSessions
from sam2serve.store.embedding_store import EmbeddingStore
from sam2serve.store.identity import StoreIdentity, embedding_dtype, weights_identity
from sam2serve.store.location import StoreError

if TYPE_CHECKING:
    from sam2serve.concepts.runtime import Concepts

log = logging.getLogger("sam2serve.server")
# Longest a request waits for room in the decode budget (less if request_timeout_s is).
MAX_DECODE_WAIT_S = 30.0


@dataclass
class ImageState:
    """An image's embedding and what it cost this request."""

    key: EmbeddingKey
    embedding: Embedding
    cached: bool

    @property
    def size(self) -> tuple[int, int]:
        return self.embedding.original_size


class Service:
    """Everything one app shares between requests: model worker, caches, metrics."""

    def __init__(
        self,
        predictor: Predictor,
        *,
        runtime: RuntimeSettings,
        limits: LimitSettings,
        batching: BatchingSettings,
        caches: CacheSettings,
        store: StoreSettings,
        videos: VideoSessions | None = None,
        folder: FolderIndex | None = None,
        concepts: Concepts | None = None,
        concept_limits: ConceptSettings = ConceptSettings(),  # noqa: B008 - frozen
    ) -> None:
        """``runtime``: the mode (the caches' keys), the warm-up and the image decoding;
        ``limits``: what every request is held to (the routes read them here too);
        ``videos``, ``folder``, ``concepts``: the video sessions, the page's image folder and
        SAM 3 of this server, each None when it has none; ``concept_limits``: the bounds of
        concept requests (Label Studio's read them without ``concepts`` too)."""
        self.limits = limits
        self.concept_limits = concept_limits
        self.mode = runtime.mode
        self.warmup = runtime.warmup
        self.batching = batching
        self.predictor = predictor
        self.model_name = predictor.model.config.name
        # What the mode computes in (furious: its reduced precision), else the heads' dtype.
        self.dtype_name = embedding_dtype(predictor)
        self.metrics = Metrics()
        self.cache = EmbeddingCache(caches.cache_bytes)
        self.store = _open_store(store, runtime, predictor, self.model_name, self.dtype_name)
        self.masks = MaskCache(caches.mask_cache_bytes)
        # Decoded bytes of every upload in flight (images, videos, masks, COCO runs).
        self.decoding = DecodeBudget(
            limits.max_decoded_bytes_in_flight,
            wait_s=min(limits.request_timeout_s, MAX_DECODE_WAIT_S),
        )
        self.metrics.watch_decoding(lambda: self.decoding.held, lambda: self.decoding.waiting)
        # How images for the encoder are decoded (runtime.image_decode), chosen once.
        self.image_decoder = image_decoder(runtime.image_decode, predictor.device)
        log.info("image decode: %s", self.image_decoder.describe())
        self.worker = ModelWorker(
            predictor,
            max_batch_size=batching.max_batch_size,
            max_wait_s=batching.max_wait_ms / 1000,
            max_queue=batching.max_queue,
            max_bulk_queue=batching.max_bulk_queue,
            on_batch=self.metrics.observe_batch,
            on_cancel=self.metrics.observe_cancel,
            on_idle=IdleRelease(),
        )
        # SAM 3 beside SAM 2.1 (serve --concepts): None when this server has no concept
        # model (/v1/concepts answers 404 "concepts_disabled").
        self.concepts: ConceptImages | None = None
        cache_stats = {"embeddings": self.cache.stats, "masks": self.masks.stats}
        if concepts is not None:
            self.concepts = ConceptImages(
                self, concepts, concept_limits, caches.concept_cache_bytes
            )
            cache_stats["concepts"] = self.concepts.cache.stats
        self.metrics.watch(
            cache_stats,
            self.worker.depths,
            {INTERACTIVE: batching.max_queue, BULK: batching.max_bulk_queue},
        )
        weights = getattr(predictor.model, "weights_info", None)
        self.weights = _public_weights(weights.as_dict() if weights is not None else {})
        identity = predictor.runtime
        self.backend = identity.backend if identity is not None and identity.backend else "custom"
        self.metrics.model_info.info(
            {
                "model": self.model_name,
                "mode": self.mode,
                "backend": self.backend,
                "device": str(predictor.device),
                "dtype": self.dtype_name,
                "threads": str(torch.get_num_threads()),
                "weights": str(self.weights.get("source")),
            }
        )
        # Video tracking sessions (serve --video): None when this server does not track.
        self.videos = videos
        if videos is not None:
            self.metrics.watch_videos(videos)
        # The image folder the annotation page browses (serve --images), or None.
        self.folder = folder
        self.ready = False
        self._bulk_jobs: dict[str, int] = {}  # per client: bulk jobs queued or running
        # Encodes under way, by image: concurrent requests for one image share one.
        self.flights: Flights[EmbeddingKey, tuple[Embedding, JobTiming]] = Flights(
            self.shared_work_dropped
        )
        self._warmup_task: asyncio.Task[None] | None = None
        self._reaper_task: asyncio.Task[None] | None = None

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        self.worker.start()
        if self.warmup:
            self._warmup_task = asyncio.create_task(self._warm_up())
        else:
            self._set_ready()
        if self.videos is not None:
            self._reaper_task = asyncio.create_task(self._reap_sessions(self.videos))

    async def stop(self) -> None:
        for task in (self._warmup_task, self._reaper_task):
            if task is not None:
                task.cancel()
        await asyncio.to_thread(self.worker.stop, 30.0)
        if self.folder is not None:
            self.folder.close()

    async def _reap_sessions(self, videos: VideoSessions) -> None:
        """Close idle video sessions even when no request comes to notice them."""
        interval = min(30.0, max(0.05, videos.limits.idle_s / 4))
        while True:
            await asyncio.sleep(interval)
            if videos.reap():  # freed now; their pages given back off the event loop
                await asyncio.to_thread(release_free_memory)

    def _set_ready(self) -> None:
        self.ready = True
        self.metrics.ready.set(1)

    async def _warm_up(self) -> None:
        """Every path a request takes, once, so the first request does not pay for lazy init."""

        def run(context: JobContext) -> None:
            warm_up(self.predictor)
            if self.concepts is not None:
                self.concepts.warm_up()

        try:
            await asyncio.wrap_future(self.worker.submit("warmup", run).future)
        except Exception:  # a failed warm-up leaves the server not ready
            log.exception("warm-up failed; /readyz stays 503")
            return
        self._set_ready()

    def key_for(self, image_id: str) -> EmbeddingKey:
        return EmbeddingKey(image_id, self.model_name, self.mode, self.dtype_name)

    def retry_headers(self) -> dict[str, str]:
        return {"Retry-After": str(self.worker.retry_after_s())}

    def shared_work_dropped(self) -> ApiError:
        """What a request gets when the shared encode it waited on was dropped."""
        return ApiError(
            503,
            "cancelled",
            "the shared encode of this image was dropped; retry",
            headers=self.retry_headers(),
        )

    # ------------------------------------------------------------------ model jobs
    async def run_job(
        self,
        kind: str,
        fn: Callable[[JobContext], Any],
        clock: RequestClock,
        *,
        bulk: bool = False,
        long: bool = False,
    ) -> Any:
        """Run ``fn`` on the model worker; a requester that gives up cancels the job.
        ``bulk`` jobs (AMG) wait in the bulk queue and yield to clicks at checkpoints;
        ``long`` ones (SAM 3's) wait in the interactive queue and yield to clicks between
        their torch operations (:class:`~sam2serve.server.batching.ModelWorker`)."""
        handle = self.submit_job(kind, fn, bulk=bulk, long=long)
        try:
            result, timing = await asyncio.wrap_future(handle.future)
        except asyncio.CancelledError:
            handle.cancel()
            raise
        except JobCancelled as exc:  # only if the job saw a cancel this request did not ask
            raise ApiError(503, "cancelled", str(exc), headers=self.retry_headers()) from None
        except WorkerStopped as exc:
            raise ApiError(503, "shutting_down", str(exc)) from None
        clock.add_job(timing)
        return result

    @contextlib.contextmanager
    def bulk_slot(self, client: str) -> Iterator[None]:
        """Hold one of ``client``'s ``max_bulk_jobs_per_client`` bulk slots (else 429)."""
        held = self._bulk_jobs.get(client, 0)
        if held >= self.batching.max_bulk_jobs_per_client:
            raise ApiError(
                429,
                "too_many_bulk_jobs",
                f"this client already has {held} AMG requests queued or running; at most "
                f"{self.batching.max_bulk_jobs_per_client} per client "
                "(max_bulk_jobs_per_client): wait for one to finish",
                headers=self.retry_headers(),
            )
        self._bulk_jobs[client] = held + 1
        try:
            yield
        finally:
            remaining = self._bulk_jobs[client] - 1
            if remaining:
                self._bulk_jobs[client] = remaining
            else:
                del self._bulk_jobs[client]

    def submit_job(
        self, kind: str, fn: Callable[[JobContext], Any], *, bulk: bool = False, long: bool = False
    ) -> JobHandle:
        """Queue ``fn`` on the model worker (503 if its queue is full); its handle."""
        return self._submit(lambda: self.worker.submit(kind, fn, bulk=bulk, long=long))

    def submit_encode(
        self, pixels: np.ndarray, kind: str = ENCODE, *, bulk: bool = False
    ) -> JobHandle:
        """Queue an encode of ``pixels`` by the worker's encoder of ``kind``, batched with
        others of its kind (503 if its queue is full); its handle."""
        return self._submit(lambda: self.worker.submit_encode(pixels, kind, bulk=bulk))

    def _submit(self, submit: Callable[[], JobHandle]) -> JobHandle:
        try:
            return submit()
        except QueueFull as exc:
            raise ApiError(
                503,
                "overloaded",
                f"the server is busy: {exc.depth} model jobs are waiting in this queue "
                f"(max_queue {self.batching.max_queue} for clicks and encodes, max_bulk_queue "
                f"{self.batching.max_bulk_queue} for AMG); retry after {exc.retry_after_s} s",
                headers={"Retry-After": str(exc.retry_after_s)},
            ) from None
        except WorkerStopped as exc:
            raise ApiError(503, "shutting_down", str(exc)) from None

    # ------------------------------------------------------------------ embeddings
    async def cached_image(self, image_id: str) -> ImageState:
        """The embedding of an image_id from the memory cache, else from the store (where
        another replica or 'sam2serve embed' put it), or 404."""
        if not looks_like_image_id(image_id):
            raise ApiError(
                422,
                "invalid_request",
                f"image_id: expected the 64-character hex id a previous response returned, "
                f"got {image_id[:80]!r}",
            )
        key = self.key_for(image_id)
        embedding = self.cache.get(key)
        if embedding is None and self.store is not None:
            embedding = await self._from_store(key)
        if embedding is None:
            where = "the embedding cache" + (" or the store" if self.store is not None else "")
            raise ApiError(
                404,
                "unknown_image_id",
                f"image_id {image_id!r} is not in {where} (evicted, or never "
                f"issued by this server for model {self.model_name!r}); send the image itself",
            )
        return ImageState(key, embedding, cached=True)

    async def _from_store(self, key: EmbeddingKey) -> Embedding | None:
        """The stored embedding (then cached in memory), or None: missing, damaged, or the
        store unreachable (logged; the request goes on as a miss)."""
        assert self.store is not None
        started = time.perf_counter()
        try:
            embedding = await asyncio.to_thread(self.store.get, key.image_id, self.predictor.device)
        except OSError:
            log.warning("cannot read the embedding store; treated as a miss", exc_info=True)
            return None
        self.metrics.stage_latency.labels("store_read").observe(time.perf_counter() - started)
        if embedding is not None:
            self.cache.put(key, embedding)
        return embedding

    async def _write_through(self, key: EmbeddingKey, embedding: Embedding) -> None:
        """Put a new embedding in the store; a failure is logged, never the request's."""
        if self.store is None:
            return
        started = time.perf_counter()
        try:
            await asyncio.to_thread(self.store.put, key.image_id, embedding)
        except Exception:  # the answer is ready; the store is only a cache
            log.warning("cannot write to the embedding store", exc_info=True)
            return
        self.metrics.stage_latency.labels("store_write").observe(time.perf_counter() - started)

    async def image_from_bytes(
        self,
        data: bytes,
        clock: RequestClock,
        pixels: np.ndarray | None = None,
        check_size: Callable[[tuple[int, int]], None] | None = None,
    ) -> ImageState:
        """The embedding of an uploaded image: from the cache, from an encode already under
        way for the same bytes, from the store, or from a new (batched) encode.

        ``pixels``: the image already decoded, if the caller needed it anyway.
        ``check_size(size)``: the request's checks that need the image size, run before
        anything is encoded (and on the cached size otherwise).
        """
        key = self.key_for(image_id_of(data))
        embedding = self.cache.get(key)
        if embedding is not None:
            return self._checked(ImageState(key, embedding, cached=True), check_size)
        flight = self.flights.get(key)
        if flight is None and self.store is not None:
            embedding = await self._from_store(key)
            if embedding is not None:
                return self._checked(ImageState(key, embedding, cached=True), check_size)
            flight = self.flights.get(key)  # one may have started while we read
        if flight is None:
            reservation = None
            if pixels is None:
                pixels, reservation = await self.decode(data, for_encoder=True)
            with contextlib.ExitStack() as held:
                if reservation is not None:
                    held.callback(reservation.release)
                if check_size is not None:
                    check_size(pixels.shape[:2])
                if key in self.cache:  # another request finished it meanwhile
                    finished = self.cache.get(key)
                    if finished is not None:
                        return ImageState(key, finished, cached=True)
                flight = self.flights.get(key)
                if flight is None:  # the pixels' bytes are held until the encode ends
                    flight = self._start_flight(key, pixels, reservation)
                    held.pop_all()
        try:
            embedding, timing = await self.flights.wait(key, flight)
        except WorkerStopped as exc:
            raise ApiError(503, "shutting_down", str(exc)) from None
        clock.add_job(timing)
        return self._checked(ImageState(key, embedding, cached=False), check_size)

    @staticmethod
    def _checked(
        image: ImageState, check_size: Callable[[tuple[int, int]], None] | None
    ) -> ImageState:
        if check_size is not None:
            check_size(image.size)
        return image

    async def decode(self, data: bytes, for_encoder: bool = False) -> tuple[Any, Reservation]:
        """The image's pixels and their bytes reserved in the decode budget (reserved from
        the header before decoding, then only what the pixels hold): release it when they
        are no longer needed. ``for_encoder``: pixels only the encoder reads, decoded as
        runtime.image_decode says (maybe a tensor on the device); else a host
        array."""
        started = time.perf_counter()
        max_pixels = self.limits.max_pixels
        width, height = await asyncio.to_thread(probe_image, data, max_pixels)
        reservation = await self.decoding.reserve(
            image_decode_bytes(width, height), f"image of {width}x{height}"
        )
        try:
            decoder = self.image_decoder if for_encoder else None
            pixels = await asyncio.to_thread(decode_image, data, max_pixels, decoder)
        except BaseException:
            reservation.release()
            raise
        reservation.shrink(pixels.nbytes)
        self.metrics.stage_latency.labels("decode_image").observe(time.perf_counter() - started)
        return pixels, reservation

    def _start_flight(
        self, key: EmbeddingKey, pixels: np.ndarray, reservation: Reservation | None
    ) -> Flight[tuple[Embedding, JobTiming]]:
        handle = self.submit_encode(pixels)

        async def finish() -> tuple[Embedding, JobTiming]:
            try:
                embedding, timing = await asyncio.wrap_future(handle.future)
                self.cache.put(key, embedding)  # even if every requester has timed out
                # Stored before it is answered: a replica sharing the store can then serve
                # the image_id this response gives (a write is ms, an encode seconds).
                await self._write_through(key, embedding)
                return embedding, timing
            finally:
                if reservation is not None:
                    reservation.release()

        # Abandoned by every requester: the encode is dropped if it has not started (a
        # started one still finishes and is cached); new requests start afresh.
        return self.flights.start(key, finish(), abandon=handle.cancel)

    async def resolve_image(
        self,
        data: bytes | None,
        image_id: str | None,
        clock: RequestClock,
        check_size: Callable[[tuple[int, int]], None] | None = None,
    ) -> ImageState:
        if (data is None) == (image_id is None):
            raise ApiError(
                422,
                "invalid_request",
                "give exactly one of: the image (base64 'image' field, or a multipart file "
                "part named 'image') or an 'image_id' from a previous response",
            )
        if image_id is not None:
            return self._checked(await self.cached_image(image_id), check_size)
        assert data is not None
        return await self.image_from_bytes(data, clock, check_size=check_size)

    def recount(self, image: ImageState) -> None:
        """Count again what a cached embedding holds after a model job used it: the fast
        decoder keeps its per-image side with the embedding (tens of MiB), which the cache
        must count against its budget."""
        self.cache.recount(image.key)

    # ------------------------------------------------------------------ masks by reference
    def store_mask(self, image: EmbeddingKey, low_res_logits: torch.Tensor) -> str:
        mask_id = secrets.token_urlsafe(16)
        self.masks.put(mask_id, StoredMask(image, low_res_logits.clone()))
        return mask_id

    def stored_mask(self, mask_id: str, image: EmbeddingKey, where: str) -> torch.Tensor:
        stored = self.masks.get(mask_id)
        if stored is None:
            raise ApiError(
                404,
                "unknown_mask_id",
                f"{where}: mask_id {mask_id[:80]!r} is not in the mask cache (evicted, or "
                "never issued); send the object's prompts without it",
            )
        if stored.image != image:
            raise ApiError(
                422,
                "invalid_request",
                f"{where}: mask_id {mask_id!r} belongs to another image; a mask can only "
                "refine prompts on the image it was predicted for",
            )
        return stored.low_res_logits


def _public_weights(weights: dict[str, Any]) -> dict[str, Any]:
    """Where the weights came from, as /readyz shows it to anyone: the checkpoint's file
    name, never its path on this machine."""
    path = weights.get("path")
    return {
        "source": str(weights.get("source", "unknown")),
        "file": None if path is None else PurePath(str(path)).name,
        "seed": weights.get("seed"),
    }


def _open_store(
    store: StoreSettings,
    runtime: RuntimeSettings,
    predictor: Predictor,
    model_name: str,
    dtype_name: str,
) -> EmbeddingStore | None:
    """The persistent store at ``store.location`` for this runtime, or None."""
    if store.location is None:
        return None
    weights_info = getattr(predictor.model, "weights_info", None)
    try:
        weights = weights_identity(weights_info, runtime.artifacts)
    except (OSError, ValueError) as exc:
        raise StoreError(f"store {store.location!r}: {exc}") from None
    identity = StoreIdentity(model_name, runtime.mode, dtype_name, weights, store.dtype)
    return EmbeddingStore(store.location, identity)


__all__ = ["MAX_DECODE_WAIT_S", "ImageState", "RequestClock", "Service"]
