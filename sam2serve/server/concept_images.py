"""SAM 3 beside SAM 2.1 in one service: images' concept encodings, cached, and detection.

:class:`ConceptImages` is what /v1/concepts asks of the service when it runs with
``--concepts``: an image's SAM 3 encoding (from a byte-budgeted LRU keyed like the SAM 2
embeddings, by the image's content hash, so its ``image_id`` is the one /v1/embeddings and
/v1/segment use), and the detection of phrases on it. Uploads go through the service's own
decoding (``max_pixels`` checked from the header, the bytes reserved in the decode budget)
and every model call through its model worker (the bounded interactive queue, cancelled
when the client goes), so concept requests are bounded like every other model work.
Concurrent requests for the same uncached image share one encode (a flight,
:mod:`sam2serve.server.flight`); those for different images are batched: the worker's
``concepts_encode`` encoder takes up to ``max_concept_batch_size`` images waiting together
(within ``max_wait_ms``) through one ``Concepts.encode`` call, each image's pixels held in
the decode budget until its batch has run. The masks a detection will hold are reserved in
the decode budget before it runs: concurrent requests cannot multiply that memory either.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch

from sam2serve.concepts.engine import ConceptEncoding, ExemplarBox, Instance
from sam2serve.concepts.mask_budget import DetectionMasks
from sam2serve.concepts.runtime import Concepts
from sam2serve.engine.rle import Rle, masks_to_rle
from sam2serve.server.batching import JobContext, JobHandle, JobTiming, ModelWorker, WorkerStopped
from sam2serve.server.cache import ByteLRU, EmbeddingKey, image_id_of, looks_like_image_id
from sam2serve.server.concept_tracks import ConceptVideo
from sam2serve.server.decode_budget import DecodeBudget, Reservation
from sam2serve.server.errors import ApiError
from sam2serve.server.flight import Flight, Flights
from sam2serve.server.request_clock import RequestClock
from sam2serve.server.settings_groups import ConceptSettings

MiB = 1024 * 1024
log = logging.getLogger("sam2serve.server")

ENCODE_JOB = "concepts_encode"
DETECT_JOB = "concepts_detect"
WARM_UP_SIDE = 64


class ImageWork(Protocol):
    """What concept images need of the service they serve in (the Service): its decoding
    of uploads within the decode budget, and its model worker's jobs."""

    @property
    def worker(self) -> ModelWorker: ...

    @property
    def decoding(self) -> DecodeBudget: ...

    def shared_work_dropped(self) -> ApiError: ...

    async def decode(self, data: bytes, for_encoder: bool = False) -> tuple[Any, Reservation]: ...

    def submit_encode(
        self, pixels: np.ndarray, kind: str = ..., *, bulk: bool = False
    ) -> JobHandle: ...

    async def run_job(
        self,
        kind: str,
        fn: Callable[[JobContext], Any],
        clock: RequestClock,
        *,
        bulk: bool = False,
        long: bool = False,
    ) -> Any: ...


class ConceptCache(ByteLRU[EmbeddingKey, ConceptEncoding]):
    """SAM 3 encodings of single images, sized by :attr:`ConceptEncoding.nbytes`."""

    def __init__(self, budget: int) -> None:
        super().__init__(budget, lambda encoding: encoding.nbytes)


@dataclass
class ConceptImage:
    """An image's SAM 3 encoding and whether this request found it cached."""

    key: EmbeddingKey
    encoding: ConceptEncoding
    cached: bool

    @property
    def size(self) -> tuple[int, int]:
        return self.encoding.height, self.encoding.width


@dataclass(frozen=True)
class DetectedConcept:
    """One phrase's instances, highest score first, as RLEs (the masks already dropped)."""

    phrase: str
    scores: list[float]
    rles: list[Rle]


class ConceptImages:
    """The concept model of a service, its encoding cache, and its two model jobs."""

    def __init__(
        self, service: ImageWork, concepts: Concepts, limits: ConceptSettings, cache_bytes: int
    ) -> None:
        self.service = service
        self.concepts = concepts
        # The bounds of concept requests (phrases, boxes, instances), read by the routes.
        self.limits = limits
        spec = concepts.spec
        self.model_name = "sam3" if spec.size == "full" else f"sam3-{spec.size}"
        self.dtype_name = str(next(concepts.model.parameters()).dtype).removeprefix("torch.")
        self.cache = ConceptCache(cache_bytes)
        # SAM 3's own video predictor (POST /v1/videos/{id}/concepts/track): its tracker is
        # loaded by the first run.
        self.video = ConceptVideo(concepts)
        # Encodes under way, by image: concurrent requests for one image share one.
        self.flights: Flights[EmbeddingKey, tuple[ConceptEncoding, JobTiming]] = Flights(
            service.shared_work_dropped
        )
        # SAM 3's calls take seconds: long jobs, which let clicks run between their torch
        # operations (server/batching.py), their results unchanged.
        service.worker.add_encoder(
            ENCODE_JOB,
            self._encode_batch,
            limits.max_concept_batch_size,
            long=True,
        )

    @property
    def queries(self) -> int:
        """The most instances one phrase can have (SAM 3's detector queries)."""
        return self.concepts.size.queries

    def warm_up(self) -> None:
        """One encode and one detection (on the model thread, in the service's warm-up), so
        the first request does not pay for lazy initialisation."""
        encoding = self.concepts.encode([np.zeros((WARM_UP_SIDE, WARM_UP_SIDE, 3), np.uint8)])
        self.concepts.detect(encoding[0], ["object"], (), 1.0, max_instances=1)

    def key_for(self, image_id: str) -> EmbeddingKey:
        return EmbeddingKey(image_id, self.model_name, "concepts", self.dtype_name)

    def _encode_batch(self, images: list[np.ndarray]) -> list[ConceptEncoding]:
        """(On the model worker.) The images' encodings from one encoder call, each owning
        its tensors: a batch's are views of the batch's, which would keep the whole batch
        alive behind one cached entry and under-count it in the cache's budget."""
        encodings = self.concepts.encode(images)
        if len(images) == 1:
            return encodings
        return [encoding.owned() for encoding in encodings]

    async def resolve(
        self,
        data: bytes | None,
        image_id: str | None,
        clock: RequestClock,
        check_size: Callable[[tuple[int, int]], None] | None = None,
        *,
        bulk: bool = False,
    ) -> ConceptImage:
        """The image's encoding: by ``image_id`` from the cache (else 404), or from the
        uploaded bytes (cached, else decoded within the service's budgets and encoded on
        the model worker, as a bulk job with ``bulk``). ``check_size(size)`` runs before
        anything is encoded."""
        if (data is None) == (image_id is None):
            raise ApiError(
                422,
                "invalid_request",
                "give exactly one of: the image (base64 'image' field, or a multipart file "
                "part named 'image') or an 'image_id' from a previous response",
            )
        if image_id is not None:
            image = self._cached(image_id)
        else:
            assert data is not None
            image = await self._from_bytes(data, clock, check_size, bulk)
        if check_size is not None:
            check_size(image.size)
        return image

    def _cached(self, image_id: str) -> ConceptImage:
        if not looks_like_image_id(image_id):  # the schema's pattern checks it first
            raise ApiError(422, "invalid_request", f"image_id: not an id, {image_id[:80]!r}")
        key = self.key_for(image_id)
        encoding = self.cache.get(key)
        if encoding is None:
            raise ApiError(
                404,
                "unknown_image_id",
                f"image_id {image_id!r} has no SAM 3 encoding in the concept cache (evicted, "
                "or the image was only sent to /v1/embeddings or /v1/segment); send the "
                "image itself",
            )
        return ConceptImage(key, encoding, cached=True)

    async def _from_bytes(
        self,
        data: bytes,
        clock: RequestClock,
        check_size: Callable[[tuple[int, int]], None] | None,
        bulk: bool = False,
    ) -> ConceptImage:
        """From the cache, from an encode of the same bytes already under way (shared), or
        decoded (its size checked) and encoded on the model worker (batched with other
        images' encodes waiting then)."""
        key = self.key_for(image_id_of(data))
        encoding = self.cache.get(key)
        if encoding is not None:
            return ConceptImage(key, encoding, cached=True)
        flight = self.flights.get(key)
        if flight is None:
            pixels, reservation = await self.service.decode(data)
            handed_on = False  # the reservation, to the flight that releases it
            try:
                if check_size is not None:
                    check_size(pixels.shape[:2])
                encoding = self.cache.get(key)  # finished by another request meanwhile
                flight = self.flights.get(key)
                if encoding is None and flight is None:
                    # The pixels' bytes stay reserved until the encode ends.
                    flight = self._start_flight(key, pixels, reservation, bulk)
                    handed_on = True
            finally:
                if not handed_on:
                    reservation.release()
            if encoding is not None:
                return ConceptImage(key, encoding, cached=True)
        assert flight is not None
        try:
            encoding, timing = await self.flights.wait(key, flight)
        except WorkerStopped as exc:
            raise ApiError(503, "shutting_down", str(exc)) from None
        clock.add_job(timing)
        return ConceptImage(key, encoding, cached=False)

    def _start_flight(
        self, key: EmbeddingKey, pixels: np.ndarray, reservation: Reservation, bulk: bool
    ) -> Flight[tuple[ConceptEncoding, JobTiming]]:
        """Queue the image's encode (503 when the queue is full) as the key's flight, which
        releases ``reservation`` when the encode has ended."""
        handle = self.service.submit_encode(pixels, ENCODE_JOB, bulk=bulk)
        size = (int(pixels.shape[1]), int(pixels.shape[0]))

        async def finish() -> tuple[ConceptEncoding, JobTiming]:
            try:
                encoding, timing = await asyncio.wrap_future(handle.future)
            except (asyncio.CancelledError, WorkerStopped):
                raise
            except Exception as exc:  # the encoder failed on this image (not on others)
                log.error("SAM 3 could not encode image %s", key.image_id, exc_info=exc)
                raise ApiError(
                    500,
                    "encode_failed",
                    f"SAM 3 could not encode this {size[0]}x{size[1]} image "
                    f"({type(exc).__name__}); it has been logged",
                ) from None
            finally:
                reservation.release()
            self.cache.put(key, encoding)  # even if every requester has gone meanwhile
            return encoding, timing

        # Abandoned by every requester: the encode is dropped if it has not started (a
        # started one still finishes and is cached); new requests start afresh.
        return self.flights.start(key, finish(), abandon=handle.cancel)

    def masks(self, phrases: int, max_instances: int, size: tuple[int, int]) -> DetectionMasks:
        """A detection's masks: every phrase's kept bool masks, plus one phrase's upsampling
        and RLE copies (:mod:`sam2serve.concepts.mask_budget`, shared with Label Studio)."""
        return DetectionMasks.of(phrases, max_instances, self.queries, size)

    def mask_bytes(self, phrases: int, max_instances: int, size: tuple[int, int]) -> int:
        """What a detection's masks hold at most (:meth:`masks`)."""
        return self.masks(phrases, max_instances, size).nbytes

    def check_mask_budget(self, phrases: int, max_instances: int, size: tuple[int, int]) -> None:
        """413 before any model work when a detection's masks alone could never fit in the
        decode budget (one that fits waits for room in :meth:`detect`)."""
        refusal = self.masks(phrases, max_instances, size).refusal(
            self.service.decoding.limit,
            "send fewer phrases, a lower max_instances or a smaller image",
        )
        if refusal is not None:
            raise ApiError(413, "over_decode_budget", refusal)

    def _masks_what(self, phrases: int, max_instances: int, size: tuple[int, int]) -> str:
        return self.masks(phrases, max_instances, size).describe()

    async def detect(
        self,
        image: ConceptImage,
        phrases: Sequence[str],
        boxes: Sequence[ExemplarBox],
        score_thresh: float,
        max_instances: int,
        clock: RequestClock,
    ) -> list[DetectedConcept]:
        """Every phrase on the image in one detector job (a long one: clicks run between
        its torch operations); the masks become RLEs off the event loop, and their bytes
        are held in the decode budget until then."""
        reservation = await self.service.decoding.reserve(
            self.mask_bytes(len(phrases), max_instances, image.size),
            self._masks_what(len(phrases), max_instances, image.size),
        )
        try:

            def run(context: JobContext) -> dict[str, list[Instance]]:
                with context.between_ops():  # clicks run between its operations
                    return self.concepts.detect(
                        image.encoding, phrases, boxes, score_thresh, max_instances=max_instances
                    )

            found = await self.service.run_job(DETECT_JOB, run, clock, long=True)
            return await asyncio.to_thread(_as_rles, found, image.size)
        finally:
            reservation.release()


def _as_rles(found: dict[str, list[Instance]], size: tuple[int, int]) -> list[DetectedConcept]:
    out = []
    for phrase, instances in found.items():
        ranked = sorted(instances, key=lambda inst: -inst.score)  # stable: query order on ties
        if ranked:
            masks = torch.from_numpy(np.stack([inst.mask for inst in ranked]))
        else:
            masks = torch.zeros((0, *size), dtype=torch.bool)
        rles = masks_to_rle(masks)
        out.append(DetectedConcept(phrase, [inst.score for inst in ranked], rles))
    return out
