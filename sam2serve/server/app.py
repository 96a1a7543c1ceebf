"""The FastAPI app: ``create_app(settings, predictor=None)``.

A thin shell over the engine. Each request is parsed and checked on the event loop,
images are decoded in a thread, and all model work goes through the :class:`ModelWorker`
(one thread, batched encodes, bounded queue). Embeddings are cached by content hash
(:mod:`sam2serve.server.cache`); concurrent requests for the same uncached image share one
encode. Every error a client can cause is a 4xx in the one error shape of
:mod:`sam2serve.server.errors`, and leaves the server and its caches as they were.

Endpoints: POST /v1/embeddings, /v1/segment, /v1/amg; GET /healthz, /readyz, /metrics;
OpenAPI at /docs. Request bodies are JSON (the image base64) or multipart/form-data (the
image as a file part named ``image``, the other fields as JSON in a part named
``request``).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import io
import json
import logging
import re
import secrets
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Annotated, Any, TypeVar

import numpy as np
import torch
from fastapi import APIRouter, Depends, FastAPI, Request, Security
from fastapi.middleware.cors import CORSMiddleware
from fastapi.openapi.utils import get_openapi
from fastapi.responses import Response
from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer
from PIL import Image
from pydantic import BaseModel, ValidationError
from pydantic.json_schema import models_json_schema
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from sam2serve.engine.amg import AMGParamError, AMGParams, MaskGenerator, finite_or_none
from sam2serve.engine.image import ImageError, load_image
from sam2serve.engine.masks import batched_mask_to_box, box_xyxy_to_xywh
from sam2serve.engine.predictor import Embedding, Predictor, PromptError
from sam2serve.engine.rle import Rle, area_from_rle, masks_to_rle
from sam2serve.server import schemas
from sam2serve.server.batching import (
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
from sam2serve.server.errors import (
    ApiError,
    error_body,
    install_error_handlers,
    validation_error,
)
from sam2serve.server.metrics import Metrics, RequestMetricsMiddleware
from sam2serve.server.settings import ServerSettings

log = logging.getLogger("sam2serve.server")

ENDPOINTS = ("/v1/embeddings", "/v1/segment", "/v1/amg", "/healthz", "/readyz", "/metrics")
JSON_MEDIA = "application/json"
MULTIPART_MEDIA = "multipart/form-data"
IMAGE_PART = "image"
REQUEST_PART = "request"
WARMUP_SIDE = 64
ACCEPTED_IMAGES = "JPEG, PNG, WebP, BMP, TIFF or another format Pillow reads"
_STREAM_REPR = re.compile(r" <_io\.BytesIO object at 0x[0-9a-fA-F]+>")

ModelT = TypeVar("ModelT", bound=BaseModel)


# --------------------------------------------------------------------------- the service


@dataclass
class _Flight:
    """An encode in progress that several requests for the same image may wait on."""

    handle: JobHandle
    task: asyncio.Task
    waiters: int = 0


@dataclass
class ImageState:
    """An image's embedding and what it cost this request."""

    key: EmbeddingKey
    embedding: Embedding
    cached: bool

    @property
    def size(self) -> tuple[int, int]:
        return self.embedding.original_size


@dataclass
class RequestClock:
    """Model time and queue time of one request, over its jobs."""

    queue_s: float = 0.0
    run_s: float = 0.0

    def add_job(self, timing: JobTiming) -> None:
        self.queue_s += timing.queue_s
        self.run_s += timing.run_s

    def timed(self) -> dict[str, float]:
        return {
            "inference_ms": round(self.run_s * 1000, 3),
            "queue_ms": round(self.queue_s * 1000, 3),
        }


class Service:
    """Everything one app shares between requests: model worker, caches, metrics."""

    def __init__(self, settings: ServerSettings, predictor: Predictor) -> None:
        self.settings = settings
        self.predictor = predictor
        self.model_name = predictor.model.config.name
        self.dtype_name = str(predictor.dtype).removeprefix("torch.")
        self.metrics = Metrics()
        self.cache = EmbeddingCache(settings.cache_bytes)
        self.masks = MaskCache(settings.mask_cache_bytes)
        self.worker = ModelWorker(
            predictor,
            max_batch_size=settings.max_batch_size,
            max_wait_s=settings.max_wait_ms / 1000,
            max_queue=settings.max_queue,
            on_batch=self.metrics.observe_batch,
        )
        self.metrics.watch(
            {"embeddings": self.cache.stats, "masks": self.masks.stats},
            lambda: self.worker.depth,
        )
        weights = getattr(predictor.model, "weights_info", None)
        self.weights = weights.as_dict() if weights is not None else {"source": "unknown"}
        self.metrics.model_info.info(
            {
                "model": self.model_name,
                "mode": settings.mode,
                "device": str(predictor.device),
                "dtype": self.dtype_name,
                "weights": str(self.weights.get("source")),
            }
        )
        self.ready = False
        self._flights: dict[EmbeddingKey, _Flight] = {}
        self._warmup_task: asyncio.Task | None = None

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        self.worker.start()
        if self.settings.warmup:
            self._warmup_task = asyncio.create_task(self._warm_up())
        else:
            self._set_ready()

    async def stop(self) -> None:
        if self._warmup_task is not None:
            self._warmup_task.cancel()
        await asyncio.to_thread(self.worker.stop, 30.0)

    def _set_ready(self) -> None:
        self.ready = True
        self.metrics.ready.set(1)

    async def _warm_up(self) -> None:
        """One encode and one decode, so the first request does not pay for lazy init."""

        def run(context: JobContext) -> None:
            pixels = np.full((WARMUP_SIDE, WARMUP_SIDE, 3), 128, dtype=np.uint8)
            embedding = self.predictor.encode(pixels)
            self.predictor.predict(
                embedding, point_coords=[[WARMUP_SIDE / 2] * 2], point_labels=[1]
            )

        try:
            await asyncio.wrap_future(self.worker.submit("warmup", run).future)
        except Exception:  # a failed warm-up leaves the server not ready
            log.exception("warm-up failed; /readyz stays 503")
            return
        self._set_ready()

    def key_for(self, image_id: str) -> EmbeddingKey:
        return EmbeddingKey(image_id, self.model_name, self.settings.mode, self.dtype_name)

    def retry_headers(self) -> dict[str, str]:
        return {"Retry-After": str(self.worker.retry_after_s())}

    # ------------------------------------------------------------------ model jobs
    async def run_job(self, kind: str, fn: Callable[[JobContext], Any], clock: RequestClock) -> Any:
        """Run ``fn`` on the model worker; a requester that gives up cancels the job."""
        handle = self._submit(lambda: self.worker.submit(kind, fn))
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

    def _submit(self, submit: Callable[[], JobHandle]) -> JobHandle:
        try:
            return submit()
        except QueueFull as exc:
            raise ApiError(
                503,
                "overloaded",
                f"the server is busy: {exc.depth} model jobs are waiting (max_queue "
                f"{self.settings.max_queue}); retry after {exc.retry_after_s} s",
                headers={"Retry-After": str(exc.retry_after_s)},
            ) from None
        except WorkerStopped as exc:
            raise ApiError(503, "shutting_down", str(exc)) from None

    # ------------------------------------------------------------------ embeddings
    def cached_image(self, image_id: str) -> ImageState:
        """The cached embedding of an image_id this server issued, or 404."""
        if not looks_like_image_id(image_id):
            raise ApiError(
                422,
                "invalid_request",
                f"image_id: expected the 64-character hex id a previous response returned, "
                f"got {image_id[:80]!r}",
            )
        key = self.key_for(image_id)
        embedding = self.cache.get(key)
        if embedding is None:
            raise ApiError(
                404,
                "unknown_image_id",
                f"image_id {image_id!r} is not in the embedding cache (evicted, or never "
                f"issued by this server for model {self.model_name!r}); send the image itself",
            )
        return ImageState(key, embedding, cached=True)

    async def image_from_bytes(
        self,
        data: bytes,
        clock: RequestClock,
        pixels: np.ndarray | None = None,
        check_size: Callable[[tuple[int, int]], None] | None = None,
    ) -> ImageState:
        """The embedding of an uploaded image: from the cache, from an encode already under
        way for the same bytes, or from a new (batched) encode.

        ``pixels``: the image already decoded, if the caller needed it anyway.
        ``check_size(size)``: the request's checks that need the image size, run before
        anything is encoded (and on the cached size otherwise).
        """
        key = self.key_for(image_id_of(data))
        embedding = self.cache.get(key)
        if embedding is not None:
            return self._checked(ImageState(key, embedding, cached=True), check_size)
        flight = self._flights.get(key)
        if flight is None:
            if pixels is None:
                pixels = await self.decode(data)
            if check_size is not None:
                check_size(pixels.shape[:2])
            if key in self.cache:  # another request finished it meanwhile
                return ImageState(key, self.cache.get(key), cached=True)
            flight = self._flights.get(key) or self._start_flight(key, pixels)
        flight.waiters += 1
        try:
            embedding, timing = await asyncio.shield(flight.task)
        except asyncio.CancelledError:
            if flight.waiters == 1 and not flight.task.done():
                # Nobody else wants it: drop the encode if it has not started (a started
                # one still finishes and is cached), and let new requests start afresh.
                flight.handle.cancel()
                self._flights.pop(key, None)
            current = asyncio.current_task()
            if current is not None and current.cancelling() == 0:  # the encode, not us
                raise ApiError(
                    503,
                    "cancelled",
                    "the shared encode of this image was dropped; retry",
                    headers=self.retry_headers(),
                ) from None
            raise
        except WorkerStopped as exc:
            raise ApiError(503, "shutting_down", str(exc)) from None
        finally:
            flight.waiters -= 1
        clock.add_job(timing)
        return self._checked(ImageState(key, embedding, cached=False), check_size)

    @staticmethod
    def _checked(
        image: ImageState, check_size: Callable[[tuple[int, int]], None] | None
    ) -> ImageState:
        if check_size is not None:
            check_size(image.size)
        return image

    async def decode(self, data: bytes) -> np.ndarray:
        started = time.perf_counter()
        pixels = await asyncio.to_thread(decode_image, data, self.settings.max_pixels)
        self.metrics.stage_latency.labels("decode_image").observe(time.perf_counter() - started)
        return pixels

    def _start_flight(self, key: EmbeddingKey, pixels: np.ndarray) -> _Flight:
        handle = self._submit(lambda: self.worker.submit_encode(pixels))

        async def finish() -> tuple[Embedding, JobTiming]:
            try:
                embedding, timing = await asyncio.wrap_future(handle.future)
                self.cache.put(key, embedding)  # even if every requester has timed out
                return embedding, timing
            finally:
                self._flights.pop(key, None)

        task = asyncio.create_task(finish())
        task.add_done_callback(_consume_exception)
        flight = _Flight(handle, task)
        self._flights[key] = flight
        return flight

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
            return self._checked(self.cached_image(image_id), check_size)
        assert data is not None
        return await self.image_from_bytes(data, clock, check_size=check_size)

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


def _consume_exception(task: asyncio.Task) -> None:
    """Mark a background task's exception as seen (its waiters got it, or there were none)."""
    if not task.cancelled():
        task.exception()


# --------------------------------------------------------------------------- input parsing


def decode_image(data: bytes, max_pixels: int) -> np.ndarray:
    """uint8 RGB pixels of an uploaded image; the pixel limit is checked from the header
    first, so a decompression bomb is refused before any pixel is decoded."""
    try:
        with Image.open(io.BytesIO(data)) as probe:
            width, height = probe.size
    except Image.DecompressionBombError as exc:
        raise ApiError(
            413,
            "too_many_pixels",
            f"image is too large to decode safely ({exc}); the limit is "
            f"{max_pixels} pixels (max_pixels)",
        ) from None
    except (OSError, SyntaxError, ValueError):  # unreadable: load_image says why, below
        width = height = 0
    if width * height > max_pixels:
        raise ApiError(
            413,
            "too_many_pixels",
            f"image is {width}x{height} = {width * height} pixels; the limit is "
            f"{max_pixels} pixels (max_pixels)",
        )
    try:
        return load_image(data, max_pixels=max_pixels)
    except ImageError as exc:
        message = _STREAM_REPR.sub("", str(exc))  # Pillow names our in-memory stream
        raise ApiError(400, "invalid_image", f"{message}; accepted: {ACCEPTED_IMAGES}") from None


def decode_base64_image(text: str, max_bytes: int) -> bytes:
    """The bytes of a base64 (or base64url, or data-URL) image; 413 past ``max_bytes``."""
    if text.startswith("data:"):
        header, comma, text = text.partition(",")
        if not comma or not header.endswith(";base64"):
            raise ApiError(
                400,
                "invalid_base64",
                "image: a data URL must look like 'data:image/png;base64,<data>'",
            )
    compact = "".join(text.split())
    if len(compact) // 4 * 3 > max_bytes + 3:
        raise ApiError(
            413,
            "upload_too_large",
            f"image: about {len(compact) // 4 * 3} bytes once decoded; the limit "
            f"is {max_bytes} bytes (max_upload_bytes)",
        )
    altchars = b"-_" if ("-" in compact or "_" in compact) else None
    try:
        data = base64.b64decode(compact, altchars=altchars, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ApiError(
            400,
            "invalid_base64",
            f"image: not valid base64 ({exc}); send the file's bytes base64-encoded "
            "(standard or URL-safe alphabet, padding included)",
        ) from None
    if not data:
        raise ApiError(400, "invalid_image", "image: the image is empty")
    if len(data) > max_bytes:
        raise ApiError(
            413,
            "upload_too_large",
            f"image: {len(data)} bytes; the limit is {max_bytes} bytes (max_upload_bytes)",
        )
    return data


async def parse_body(
    request: Request, model: type[ModelT], settings: ServerSettings
) -> tuple[ModelT, bytes | None]:
    """The request model and the image bytes, from a JSON or a multipart body."""
    media = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if media == JSON_MEDIA or media.endswith("+json"):
        raw = await request.body()
        try:
            data = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as exc:
            raise ApiError(
                400,
                "invalid_json",
                f"the request body is not valid JSON: {exc}",
            ) from None
        parsed = validate(model, data)
        image = getattr(parsed, "image", None)
        if image is None:
            return parsed, None
        return parsed, decode_base64_image(image, settings.max_upload_bytes)
    if media == MULTIPART_MEDIA:
        return await _parse_multipart(request, model, settings)
    raise ApiError(
        415,
        "unsupported_media_type",
        f"Content-Type {media or 'missing'!r} is not accepted; send application/json (image "
        f"base64) or multipart/form-data (file part '{IMAGE_PART}', JSON part "
        f"'{REQUEST_PART}')",
    )


async def _parse_multipart(
    request: Request, model: type[ModelT], settings: ServerSettings
) -> tuple[ModelT, bytes | None]:
    try:
        form = await request.form(max_files=1, max_fields=1, max_part_size=1024 * 1024)
    except StarletteHTTPException as exc:
        raise ApiError(
            400,
            "invalid_multipart",
            f"cannot parse the multipart body: "
            f"{exc.detail} (send at most one file part '{IMAGE_PART}' and one "
            f"field '{REQUEST_PART}')",
        ) from None
    try:
        unknown = sorted(set(form.keys()) - {IMAGE_PART, REQUEST_PART})
        if unknown:
            raise ApiError(
                400,
                "invalid_multipart",
                f"unknown multipart part(s) {', '.join(map(repr, unknown))}; accepted: "
                f"a file part '{IMAGE_PART}' and a JSON field '{REQUEST_PART}'",
            )
        fields = form.get(REQUEST_PART)
        data: Any = {}
        if fields is not None:
            if not isinstance(fields, str):
                raise ApiError(
                    400,
                    "invalid_multipart",
                    f"part '{REQUEST_PART}' must be a JSON text field, not a file",
                )
            try:
                data = json.loads(fields)
            except ValueError as exc:
                raise ApiError(
                    400, "invalid_json", f"part '{REQUEST_PART}' is not valid JSON: {exc}"
                ) from None
        if isinstance(data, dict) and "image" in data:
            raise ApiError(
                422,
                "invalid_request",
                f"image: with multipart, send the image only as the file part "
                f"'{IMAGE_PART}', not inside '{REQUEST_PART}'",
            )
        parsed = validate(model, data)
        upload = form.get(IMAGE_PART)
        if upload is None:
            return parsed, None
        if isinstance(upload, str):
            raise ApiError(
                400,
                "invalid_multipart",
                f"part '{IMAGE_PART}' must be a file (filename=...), not a text field",
            )
        image = await upload.read()
        if len(image) > settings.max_upload_bytes:
            raise ApiError(
                413,
                "upload_too_large",
                f"image: {len(image)} bytes; the limit is "
                f"{settings.max_upload_bytes} bytes (max_upload_bytes)",
            )
        if not image:
            raise ApiError(400, "invalid_image", "image: the uploaded file is empty")
        return parsed, image
    finally:
        await form.close()


def validate(model: type[ModelT], data: Any) -> ModelT:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise validation_error(exc, model) from None


# --------------------------------------------------------------------------- segment


@dataclass(frozen=True)
class DecodedMasks:
    """What the decoder job hands back: per object, per candidate."""

    rles: list[list[Rle]]
    scores: list[list[float]]
    boxes: list[list[list[float]]]  # XYWH
    low_res_logits: list[torch.Tensor]  # per object (C, 256, 256)


def check_prompt_counts(request: schemas.SegmentRequest, settings: ServerSettings) -> None:
    """The prompt limits, checked before any image work."""
    if len(request.objects) > settings.max_objects:
        raise ApiError(
            422,
            "too_many_prompts",
            f"objects: {len(request.objects)} objects; at most {settings.max_objects} per "
            "request (max_objects)",
        )
    for i, obj in enumerate(request.objects):
        if len(obj.points) > settings.max_points_per_object:
            raise ApiError(
                422,
                "too_many_prompts",
                f"objects[{i}].points: {len(obj.points)} points; at most "
                f"{settings.max_points_per_object} per object (max_points_per_object)",
            )


def check_prompt_bounds(request: schemas.SegmentRequest, size: tuple[int, int]) -> None:
    """Every point and box inside the image; the message names the object and the value."""
    height, width = size
    for i, obj in enumerate(request.objects):
        for j, point in enumerate(obj.points):
            if point.x > width or point.y > height:
                raise ApiError(
                    422,
                    "invalid_request",
                    f"objects[{i}].points[{j}]: ({point.x:g}, {point.y:g}) lies outside the "
                    f"{width}x{height} image; accepted: 0 <= x <= {width}, 0 <= y <= {height}",
                )
        if obj.box is not None:
            x0, y0, x1, y1 = obj.box
            if min(x0, y0) < 0 or x1 > width or y1 > height:
                raise ApiError(
                    422,
                    "invalid_request",
                    f"objects[{i}].box: {obj.box} is not inside the {width}x{height} image; "
                    f"accepted: 0 <= x0 <= x1 <= {width}, 0 <= y0 <= y1 <= {height}",
                )


def padded_prompts(objects: list[schemas.ObjectPrompt]) -> tuple[np.ndarray, np.ndarray]:
    """(B, N, 2) coords and (B, N) labels: box corners (labels 2, 3) then the clicks, each
    object padded to the longest with SAM's "not a point" label -1."""
    sequences = []
    for obj in objects:
        coords: list[tuple[float, float]] = []
        labels: list[int] = []
        if obj.box is not None:
            x0, y0, x1, y1 = obj.box
            coords += [(x0, y0), (x1, y1)]
            labels += [2, 3]
        coords += [(p.x, p.y) for p in obj.points]
        labels += [p.label for p in obj.points]
        sequences.append((coords, labels))
    longest = max(len(labels) for _, labels in sequences)
    all_coords = np.zeros((len(objects), longest, 2), dtype=np.float32)
    all_labels = np.full((len(objects), longest), -1, dtype=np.int32)
    for b, (coords, labels) in enumerate(sequences):
        all_coords[b, : len(coords)] = coords
        all_labels[b, : len(labels)] = labels
    return all_coords, all_labels


def decode_objects(
    predictor: Predictor,
    embedding: Embedding,
    objects: list[schemas.ObjectPrompt],
    mask_inputs: list[torch.Tensor | None],
    multimask_output: bool,
) -> DecodedMasks:
    """Masks for every object: one decoder call for all of them (two when only some
    objects carry a previous mask: the decoder takes a mask for all prompts or none)."""
    groups = [
        [i for i, m in enumerate(mask_inputs) if m is None],
        [i for i, m in enumerate(mask_inputs) if m is not None],
    ]
    n = len(objects)
    rles: list[list[Rle]] = [[] for _ in range(n)]
    scores: list[list[float]] = [[] for _ in range(n)]
    boxes: list[list[list[float]]] = [[] for _ in range(n)]
    low_res: list[torch.Tensor] = [torch.empty(0)] * n
    for group in (g for g in groups if g):
        coords, labels = padded_prompts([objects[i] for i in group])
        masks_in = None
        if mask_inputs[group[0]] is not None:
            masks_in = torch.stack([mask_inputs[i] for i in group])  # (B, 1, 256, 256)
        prediction = predictor.predict(
            embedding,
            point_coords=coords,
            point_labels=labels,
            mask_input=masks_in,
            multimask_output=multimask_output,
        )
        count, candidates = prediction.iou_scores.shape
        flat = prediction.masks.reshape(count * candidates, *prediction.masks.shape[2:])
        group_rles = masks_to_rle(flat)
        group_boxes = box_xyxy_to_xywh(batched_mask_to_box(flat)).float().cpu().tolist()
        group_scores = prediction.iou_scores.float().cpu().tolist()
        for row, index in enumerate(group):
            span = slice(row * candidates, (row + 1) * candidates)
            rles[index] = group_rles[span]
            boxes[index] = group_boxes[span]
            scores[index] = group_scores[row]
            low_res[index] = prediction.low_res_logits[row]
    return DecodedMasks(rles, scores, boxes, low_res)


# --------------------------------------------------------------------------- AMG


def amg_params(options: schemas.AMGOptions, settings: ServerSettings) -> AMGParams:
    values = options.model_dump()
    if values["point_grids"] is not None and "points_per_side" not in options.model_fields_set:
        values["points_per_side"] = None  # explicit grids replace the default grid
    try:
        params = AMGParams.from_dict({**values, "output_mode": "uncompressed_rle"})
    except AMGParamError as exc:
        raise ApiError(422, "invalid_request", f"params: {exc}") from None
    clicks = amg_clicks(params)
    if clicks > settings.max_amg_points:
        raise ApiError(
            422,
            "too_many_prompts",
            f"params: these AMG parameters decode {clicks} clicks over all crops; at most "
            f"{settings.max_amg_points} per request (max_amg_points): lower points_per_side "
            "or crop_n_layers",
        )
    return params


def amg_clicks(params: AMGParams) -> int:
    """Clicks AMG decodes: each layer's grid once per crop of that layer."""
    return sum(len(grid) * 4**layer for layer, grid in enumerate(params.layer_point_grids()))


# --------------------------------------------------------------------------- middleware


class BodyLimitMiddleware:
    """413 for bodies over ``limit`` bytes: at once from Content-Length, or as soon as a
    streamed body passes the limit (pure ASGI, so the body is never buffered whole here)."""

    def __init__(self, app: ASGIApp, limit: int, observe: Callable[[int, str], None]) -> None:
        self.app = app
        self.limit = limit
        self.observe = observe

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers", ())).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.limit:
            self.observe(413, "upload_too_large")
            body = json.dumps(error_body("upload_too_large", self._message(int(declared))))
            await send(
                {
                    "type": "http.response.start",
                    "status": 413,
                    "headers": [(b"content-type", b"application/json"), (b"connection", b"close")],
                }
            )
            await send({"type": "http.response.body", "body": body.encode()})
            return
        received = 0

        async def counting_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.limit:
                    raise ApiError(413, "upload_too_large", self._message(received))
            return message

        await self.app(scope, counting_receive, send)

    def _message(self, size: int) -> str:
        return (
            f"request body of {size} bytes or more is over the limit of {self.limit} bytes "
            f"(max_upload_bytes and base64 overhead); send a smaller image"
        )


# --------------------------------------------------------------------------- the app


def _json(model: BaseModel, status: int = 200) -> Response:
    return Response(model.model_dump_json(), status_code=status, media_type=JSON_MEDIA)


def _body_doc(model: type[BaseModel]) -> dict[str, Any]:
    """OpenAPI requestBody for an endpoint taking JSON or multipart."""
    ref = {"$ref": f"#/components/schemas/{model.__name__}"}
    multipart = {
        "type": "object",
        "properties": {
            IMAGE_PART: {"type": "string", "format": "binary", "description": "The image file."},
            REQUEST_PART: {
                "type": "string",
                "description": f"JSON of the other fields of {model.__name__} (without 'image').",
            },
        },
    }
    return {
        "requestBody": {
            "required": True,
            "content": {JSON_MEDIA: {"schema": ref}, MULTIPART_MEDIA: {"schema": multipart}},
        }
    }


ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    status: {"model": schemas.ErrorResponse, "description": description}
    for status, description in {
        400: "Malformed body, base64 or image",
        401: "Missing or wrong API key",
        404: "Unknown image_id or mask_id",
        413: "Upload or image too large",
        415: "Unsupported Content-Type",
        422: "A field has a bad value",
        503: "Overloaded, timed out or not ready (see Retry-After)",
    }.items()
}


API_KEY_HEADER = APIKeyHeader(
    name="X-API-Key", auto_error=False, description="The server's API key (when it has one)."
)
BEARER = HTTPBearer(auto_error=False, description="Authorization: Bearer <API key>.")


async def require_api_key(
    request: Request,
    key: Annotated[str | None, Security(API_KEY_HEADER)],
    credentials: Annotated[HTTPAuthorizationCredentials | None, Security(BEARER)],
) -> None:
    """401 unless the request carries the app's API key (when it has one)."""
    expected = request.app.state.service.settings.api_key
    if expected is None:
        return
    given = key if key is not None else (credentials.credentials if credentials else None)
    if given is None or not secrets.compare_digest(given.encode(), expected.encode()):
        raise ApiError(
            401,
            "unauthorized",
            "missing or wrong API key; send 'Authorization: Bearer <key>' or 'X-API-Key: <key>'",
            headers={"WWW-Authenticate": "Bearer"},
        )


def require_image(data: bytes | None, why: str = "") -> None:
    """422 naming the missing image and the two ways to send one."""
    if data is None:
        raise ApiError(
            422,
            "invalid_request",
            f"image: field required (base64 'image', or a multipart file part '{IMAGE_PART}')"
            + why,
        )


def create_app(settings: ServerSettings, predictor: Predictor | None = None) -> FastAPI:
    """The app for ``settings``; loads the model unless a ``predictor`` is given."""
    if predictor is None:
        from sam2serve.accel.modes import build_predictor

        predictor = build_predictor(
            settings.model,
            settings.mode,
            checkpoint=settings.checkpoint,
            random_weights=settings.random_weights,
            seed=settings.seed,
            device=settings.device,
            artifacts=settings.artifacts,
        )
    service = Service(settings, predictor)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await service.start()
        try:
            yield
        finally:
            await service.stop()

    app = FastAPI(
        title="sam2serve",
        summary="Segment Anything 2 on images over HTTP: embeddings, prompts, AMG.",
        version="0.1.0",
        lifespan=lifespan,
    )
    app.state.service = service
    install_error_handlers(app, service.metrics.observe_error)
    app.add_middleware(
        BodyLimitMiddleware, limit=settings.max_body_bytes, observe=service.metrics.observe_error
    )
    app.add_middleware(RequestMetricsMiddleware, metrics=service.metrics, endpoints=ENDPOINTS)
    if settings.cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=list(settings.cors_origins),
            allow_methods=["GET", "POST"],
            allow_headers=["Authorization", "X-API-Key", "Content-Type"],
        )

    auth = Depends(require_api_key)
    v1 = APIRouter(prefix="/v1", dependencies=[auth], responses=ERROR_RESPONSES)

    async def within_timeout(work: Callable[[], Any]) -> Any:
        try:
            async with asyncio.timeout(settings.request_timeout_s):
                return await work()
        except TimeoutError:
            raise ApiError(
                503,
                "timeout",
                f"the request did not finish within {settings.request_timeout_s:g} s "
                "(request_timeout_s); the server is busy, retry later",
                headers=service.retry_headers(),
            ) from None

    async def read(request: Request, model: type[ModelT]) -> tuple[ModelT, bytes | None]:
        started = time.perf_counter()
        parsed = await parse_body(request, model, settings)
        service.metrics.stage_latency.labels("read_body").observe(time.perf_counter() - started)
        return parsed

    def image_fields(image: ImageState) -> dict[str, Any]:
        height, width = image.size
        return {
            "image_id": image.key.image_id,
            "width": width,
            "height": height,
            "model": service.model_name,
            "cached": image.cached,
        }

    async def formatted(rles: list[Rle], mask_format: str) -> list[Any]:
        started = time.perf_counter()
        out = await asyncio.to_thread(
            lambda: [schemas.encode_segmentation(rle, mask_format) for rle in rles]
        )
        service.metrics.stage_latency.labels("format").observe(time.perf_counter() - started)
        return out

    @v1.post(
        "/embeddings",
        response_model=schemas.EmbeddingResponse,
        summary="Encode an image and cache its embedding",
        openapi_extra=_body_doc(schemas.EmbeddingRequest),
    )
    async def embeddings(request: Request) -> Response:
        async def work() -> Response:
            clock = RequestClock()
            _, data = await read(request, schemas.EmbeddingRequest)
            require_image(data)
            image = await service.image_from_bytes(data, clock)
            return _json(schemas.EmbeddingResponse(**image_fields(image), **clock.timed()))

        return await within_timeout(work)

    @v1.post(
        "/segment",
        response_model=schemas.SegmentResponse,
        summary="Masks for point / box / mask prompts, all objects in one decoder call",
        openapi_extra=_body_doc(schemas.SegmentRequest),
    )
    async def segment(request: Request) -> Response:
        async def work() -> Response:
            clock = RequestClock()
            body, data = await read(request, schemas.SegmentRequest)
            check_prompt_counts(body, settings)
            image = await service.resolve_image(
                data, body.image_id, clock, check_size=lambda size: check_prompt_bounds(body, size)
            )
            mask_inputs = [
                None
                if obj.mask_id is None
                else service.stored_mask(obj.mask_id, image.key, f"objects[{i}].mask_id")
                for i, obj in enumerate(body.objects)
            ]

            def run(context: JobContext) -> DecodedMasks:
                return decode_objects(
                    predictor, image.embedding, body.objects, mask_inputs, body.multimask_output
                )

            try:
                decoded = await service.run_job("decode", run, clock)
            except PromptError as exc:  # the checks above should leave none
                raise ApiError(422, "invalid_request", f"objects: {exc}") from None
            flat_rles = [rle for rles in decoded.rles for rle in rles]
            segmentations = iter(await formatted(flat_rles, body.mask_format))
            objects = []
            for i, rles in enumerate(decoded.rles):
                masks = []
                for c, rle in enumerate(rles):
                    mask_id = service.store_mask(image.key, decoded.low_res_logits[i][c : c + 1])
                    masks.append(
                        schemas.MaskOut(
                            mask_id=mask_id,
                            score=decoded.scores[i][c],
                            bbox=decoded.boxes[i][c],
                            area=area_from_rle(rle),
                            segmentation=next(segmentations),
                        )
                    )
                objects.append(schemas.ObjectOut(masks=masks))
            return _json(
                schemas.SegmentResponse(**image_fields(image), objects=objects, **clock.timed())
            )

        return await within_timeout(work)

    @v1.post(
        "/amg",
        response_model=schemas.AMGResponse,
        summary="Automatic mask generation: segment everything in the image",
        openapi_extra=_body_doc(schemas.AMGRequest),
    )
    async def amg(request: Request) -> Response:
        async def work() -> Response:
            clock = RequestClock()
            body, data = await read(request, schemas.AMGRequest)
            require_image(data, "; AMG needs the pixels, not an image_id")
            params = amg_params(body.params, settings)
            generator = MaskGenerator(predictor, **params.to_dict())
            pixels = await service.decode(data)
            image = await service.image_from_bytes(data, clock, pixels)

            def run(context: JobContext) -> list[dict[str, Any]]:
                return generator.generate(
                    pixels, embedding=image.embedding, progress=lambda done, total: context.check()
                )

            records = await service.run_job("amg", run, clock)
            segmentations = await formatted([r["segmentation"] for r in records], body.mask_format)
            masks = [
                schemas.AMGRecord(
                    **{
                        **record,
                        "segmentation": segmentation,
                        "stability_score": finite_or_none(record["stability_score"]),
                    }
                )
                for record, segmentation in zip(records, segmentations, strict=True)
            ]
            public = {
                k: v for k, v in params.to_dict().items() if k not in schemas.AMG_FIELDS_NOT_IN_API
            }
            return _json(
                schemas.AMGResponse(
                    **image_fields(image), params=public, masks=masks, **clock.timed()
                )
            )

        return await within_timeout(work)

    app.include_router(v1)

    @app.get("/healthz", response_model=schemas.Health, summary="The process is alive")
    async def healthz() -> schemas.Health:
        return schemas.Health()

    @app.get(
        "/readyz",
        response_model=schemas.Ready,
        responses={503: {"model": schemas.ErrorResponse, "description": "Not warm yet"}},
        summary="The model is loaded and warm",
    )
    async def readyz() -> schemas.Ready:
        if not service.ready:
            raise ApiError(
                503,
                "not_ready",
                "the model is warming up; retry shortly",
                headers={"Retry-After": "1"},
            )
        return schemas.Ready(
            model=service.model_name,
            mode=settings.mode,
            device=str(predictor.device),
            dtype=service.dtype_name,
            weights=service.weights,
        )

    @app.get("/metrics", dependencies=[auth], summary="Prometheus metrics", response_class=Response)
    async def metrics() -> Response:
        content, media_type = service.metrics.render()
        return Response(content, media_type=media_type)

    _document_request_models(app)
    return app


def _document_request_models(app: FastAPI) -> None:
    """Add the request models (read by hand, not by FastAPI) to the OpenAPI components."""
    request_models = (schemas.EmbeddingRequest, schemas.SegmentRequest, schemas.AMGRequest)

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            spec = get_openapi(
                title=app.title, version=app.version, summary=app.summary, routes=app.routes
            )
            _, definitions = models_json_schema(
                [(m, "validation") for m in request_models],
                ref_template="#/components/schemas/{model}",
            )
            components = spec.setdefault("components", {}).setdefault("schemas", {})
            for name, schema in definitions.get("$defs", {}).items():
                components.setdefault(name, schema)
            app.openapi_schema = spec
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


__all__ = ["Service", "create_app"]
