"""From Label Studio's /predict request to brush regions, on the service's engine.

Every model step goes through the app's :class:`~sam2serve.server.service.Service`: the
image's embedding comes from its cache (by content hash; concurrent tasks' encodes are
batched by its model worker, and the same image asked twice is encoded once), clicks are
decoded as one interactive model job, automatic mask generation runs as a bulk job that
yields to clicks. The backend itself keeps no per-request state; what it remembers is
what Label Studio's /setup told it about each project (its address and a token).

Two kinds of request:

- interactive (``params.context`` has clicks or a box): the prompt's mask, one brush
  region with the model's score. A single click is ambiguous, so it is decoded with SAM's
  three candidates and the best-scored one answers; more clicks or a box give one mask.
- pre-annotation (no ``context``): what ``--preannotate`` says for every task (a centre
  click, AMG, or nothing). Whatever it is, each task's image is fetched and encoded, so
  its embedding is cached for the clicks that follow.
- with concepts (``--concepts``, SAM 3): pre-annotation answers every label name of the
  config's BrushLabels or PolygonLabels tag as a concept prompt, and an interaction holding
  a TextArea result answers its text, one holding rectangles labelled with a concept label
  their concepts refined by those exemplar boxes (``not <label>``: negative)
  (:mod:`sam2serve.labelstudio.concept_prompts`, :mod:`sam2serve.labelstudio.concept_predict`);
  clicks, and boxes labelled otherwise, are answered by SAM 3's tracker heads on the image's
  SAM 3 encoding (``--concept-clicks sam3``, the default: the model that found the regions
  refines them) or by SAM 2.1 (``--concept-clicks sam2``);
- a video interaction (``context`` of VideoRectangle keyframes): the objects tracked
  through the clip by SAM 2.1 (:mod:`sam2serve.labelstudio.video_predict`); with concepts,
  one holding a TextArea's phrase on the Video: every instance of it found and tracked by
  SAM 3's own video predictor (:mod:`sam2serve.labelstudio.concept_video`); a video
  project asked without either gets empty predictions (there is nothing to track).

A request for one task fails with its error (a 4xx naming the task and the reason); in a
request for several tasks (Label Studio pre-annotating a project), a task that fails gets
an empty prediction, so one broken image does not lose the others, and the request logs
one line counting its failed tasks per reason. A request holds at most
``max_predict_tasks`` tasks (413 past it), worked on ``max_concurrent_tasks`` at a time,
yielding to the event loop between tasks, so /health and clicks stay answered meanwhile.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import logging
import secrets
from collections.abc import Awaitable, Callable
from typing import Any

from sam2serve.engine.amg import MaskGenerator, MaskRecord
from sam2serve.engine.amg_params import AMGParams
from sam2serve.engine.prompts import FOREGROUND, Prompt
from sam2serve.engine.rle import Rle, rle_to_mask
from sam2serve.labelstudio.brush import mask_to_brush_rle
from sam2serve.labelstudio.concept_predict import ConceptAnswerer
from sam2serve.labelstudio.concept_prompts import (
    ConceptPrompt,
    context_prompts,
    label_prompts,
)
from sam2serve.labelstudio.concept_video import ConceptVideoTracker
from sam2serve.labelstudio.concept_video_prompt import is_video_text, video_text_prompt
from sam2serve.labelstudio.context import ClickPrompt, prompt_from_context
from sam2serve.labelstudio.images import ImageFetcher, LabelStudioAccess
from sam2serve.labelstudio.label_config import (
    ControlTag,
    LabelConfig,
    LabelConfigError,
    parse_label_config,
)
from sam2serve.labelstudio.options import LabelStudioOptions
from sam2serve.labelstudio.protocol import (
    Context,
    Prediction,
    PredictRequest,
    PredictResponse,
    SetupRequest,
    SetupResponse,
    Task,
    project_id,
)
from sam2serve.labelstudio.video_clip import video_sessions
from sam2serve.labelstudio.video_context import is_video_context, track_prompts
from sam2serve.labelstudio.video_predict import track_task
from sam2serve.server.batching import JobContext
from sam2serve.server.errors import ApiError
from sam2serve.server.prompts import DecodedMasks, decode_objects
from sam2serve.server.service import ImageState, RequestClock, Service

log = logging.getLogger("sam2serve.labelstudio")
# Projects whose /setup is remembered (the least recently connected forgotten first).
MAX_SETUP_PROJECTS = 1024


def check_task_count(tasks: int, limit: int) -> None:
    """413 ``too_many_tasks`` past ``max_predict_tasks``."""
    if tasks > limit:
        raise ApiError(
            413,
            "too_many_tasks",
            f"tasks: {tasks} tasks in one request; at most {limit} (max_predict_tasks, "
            "--max-predict-tasks): ask for predictions in smaller batches",
        )


class LabelStudioBackend:
    """Answers Label Studio's ML backend calls with the service's model."""

    def __init__(
        self,
        options: LabelStudioOptions,
        fetcher: ImageFetcher,
        concepts: ConceptAnswerer | None = None,
        concept_video: ConceptVideoTracker | None = None,
    ) -> None:
        self.options = options
        self.fetcher = fetcher
        # SAM 3 with its options and encoding cache (--concepts), else None.
        self.concepts = concepts
        # SAM 3's video predictor (--concepts with --video), else None.
        self.concept_video = concept_video
        # What /setup said per project id: Label Studio's address (only one the operator
        # allowed) and the owner's token; bounded.
        self._setup_access: collections.OrderedDict[str, LabelStudioAccess] = (
            collections.OrderedDict()
        )

    # ------------------------------------------------------------------ /setup
    def model_version(self, service: Service) -> str:
        """Names the answers: model, mode and weights. Label Studio skips tasks that already
        have a prediction of the current version, so other weights predict anew."""
        weights = service.weights
        if weights.get("file"):
            identity = str(weights["file"]).rsplit(".", 1)[0]
        elif weights.get("source") == "random":
            identity = f"random-seed{weights.get('seed')}"
        else:
            identity = str(weights.get("source"))
        version = f"sam2serve-{service.model_name}-{service.mode}-{identity}"
        return version if self.concepts is None else f"{version}+{self.concepts.identity()}"

    async def setup(self, body: SetupRequest, service: Service) -> SetupResponse:
        """Remember the project's token, and its address when the operator allowed that
        host (without --label-studio-url); check its config when it is sent."""
        if body.schema_:
            await asyncio.to_thread(_config, body.schema_, self.concepts is not None)
        key = project_id(body.project)
        hostname = body.hostname.rstrip("/") if body.hostname else None
        if (
            hostname
            and self.options.url is None
            and not self.fetcher.policy.names_allowed(hostname)
        ):
            log.warning(
                "/setup of project %s named Label Studio at %r, which the operator did not "
                "allow (--label-studio-url, --allow-fetch-host): not used",
                (key or "?")[:40],
                hostname[:200],
            )
            hostname = None
        if self.options.url is not None:
            hostname = None  # the operator's address is Label Studio's
        if key is not None and (hostname or body.access_token):
            self._setup_access[key] = LabelStudioAccess(hostname, body.access_token or None)
            self._setup_access.move_to_end(key)
            while len(self._setup_access) > MAX_SETUP_PROJECTS:
                self._setup_access.popitem(last=False)
        return SetupResponse(model_version=self.model_version(service))

    def access_for(self, project: str | None) -> LabelStudioAccess:
        """Where Label Studio's files are read, with which token: the operator's address
        with the operator's token (else the project's /setup token); without an operator
        address, the project's allowed /setup address with its own /setup token. The
        operator's token never goes to an address /setup named."""
        key = project_id(project)
        remembered = self._setup_access.get(key) if key is not None else None
        if self.options.url is not None:
            token = self.options.api_key or (remembered.token if remembered else None)
            return LabelStudioAccess(self.options.url, token)
        if remembered is not None and remembered.url is not None:
            return remembered
        return LabelStudioAccess()

    # ------------------------------------------------------------------ /predict
    async def predict(self, body: PredictRequest, service: Service, client: str) -> PredictResponse:
        check_task_count(len(body.tasks), service.limits.max_predict_tasks)
        config = await asyncio.to_thread(_config, body.label_config, self.concepts is not None)
        context = body.params.context
        version = self.model_version(service)
        if is_video_context(context):
            assert context is not None
            return await self._predict_video(body, config, context, service, client)
        if is_video_text(context, config):
            assert context is not None
            return await self._predict_video_text(body, config, context, service, client)
        if not config.images:  # a video project asking without keyframes: nothing to track
            empty = Prediction(result=[], score=None, model_version=version)
            return PredictResponse(results=[empty] * len(body.tasks), model_version=version)
        concept = self._concept_prompt(config, context, service)
        if concept is not None:
            return await self._predict_concepts(body, config, concept, service, client)
        prompt = prompt_from_context(context) if context is not None else None
        if prompt is not None and len(prompt.points) > service.limits.max_points_per_object:
            raise ApiError(
                422,
                "too_many_prompts",
                f"context.result: {len(prompt.points)} clicks; at most "
                f"{service.limits.max_points_per_object} per object (max_points_per_object)",
            )
        if context is not None and prompt is None:
            mode = "empty"  # an interaction without clicks (all removed): nothing to show
        else:
            mode = "click" if prompt is not None else self.options.preannotate
        access = self.access_for(body.project)

        async def regions_of(index: int, task: Task) -> list[dict[str, Any]]:
            return await self._task_regions(task, index, config, prompt, mode, service, access)

        slot = self._bulk_slot(mode, service, client)
        return await self._answer(body, regions_of, slot, version, client)

    async def _answer(
        self,
        body: PredictRequest,
        regions_of: Callable[[int, Task], Awaitable[list[dict[str, Any]]]],
        slot: contextlib.AbstractContextManager,
        version: str,
        client: str,
    ) -> PredictResponse:
        """Every task's regions as its prediction (a task of several that fails: empty),
        ``max_concurrent_tasks`` at a time, within ``slot``."""
        alone = len(body.tasks) == 1
        predictions: list[Prediction | None] = [None] * len(body.tasks)
        refused = _Refusals()

        async def one(index: int, task: Task) -> None:
            try:
                regions = await regions_of(index, task)
            except ApiError as exc:
                if alone:
                    raise
                refused.add(task, exc)
                regions = []
            scores = [r["score"] for r in regions]
            score = sum(scores) / len(scores) if scores else None
            predictions[index] = Prediction(result=regions, score=score, model_version=version)

        with slot:
            await _each(list(enumerate(body.tasks)), one, self.options.max_concurrent_tasks)
        refused.log(len(body.tasks), client)
        return PredictResponse(
            results=[p for p in predictions if p is not None], model_version=version
        )

    def _concept_prompt(
        self, config: LabelConfig, context: Context | None, service: Service
    ) -> ConceptPrompt | None:
        """With concepts: the label names (no context), or the TextArea's text and the
        exemplar boxes of rectangles labelled with a concept label (a context holding
        them); None for clicks and other boxes, and without concepts."""
        if self.concepts is None:
            return None
        limit = self.options.concept_max_labels
        if context is None:
            return label_prompts(config, limit)
        max_boxes = service.concept_limits.max_concept_boxes
        return context_prompts(context, config, limit, max_boxes)

    async def _predict_concepts(
        self,
        body: PredictRequest,
        config: LabelConfig,
        concept: ConceptPrompt,
        service: Service,
        client: str,
    ) -> PredictResponse:
        """Every task's instances of the phrases (pre-annotation holds a bulk slot)."""
        assert self.concepts is not None
        answerer = self.concepts
        access = self.access_for(body.project)
        bulk = body.params.context is None

        async def regions_of(index: int, task: Task) -> list[dict[str, Any]]:
            data = await self._task_image(task, index, config, concept.image_name, access)
            return await answerer.regions(service, data, concept, bulk=bulk)

        slot = service.bulk_slot(client) if bulk else contextlib.nullcontext()
        return await self._answer(body, regions_of, slot, self.model_version(service), client)

    async def _predict_video(
        self,
        body: PredictRequest,
        config: LabelConfig,
        context: Context,
        service: Service,
        client: str,
    ) -> PredictResponse:
        """The annotator's keyframes on a video task, tracked (video_predict)."""
        task, where = _one_video_task(body)
        regions = await track_task(
            task,
            where,
            config,
            track_prompts(context),
            service,
            self.fetcher,
            self.access_for(body.project),
            self.options,
            client,
        )
        version = self.model_version(service)
        prediction = Prediction(result=regions, score=None, model_version=version)
        return PredictResponse(results=[prediction], model_version=version)

    async def _predict_video_text(
        self,
        body: PredictRequest,
        config: LabelConfig,
        context: Context,
        service: Service,
        client: str,
    ) -> PredictResponse:
        """A phrase typed on a video task: its instances tracked by SAM 3 (concept_video)."""
        if self.concepts is None:
            raise ApiError(
                422,
                "concepts_disabled",
                "context.result: a text prompt on a video; this backend answers text prompts "
                "with SAM 3 only when started with --concepts (and --video for videos)",
            )
        if self.concept_video is None:
            video_sessions(service, "text prompts on a video")  # 422 video_disabled
            raise RuntimeError("SAM 3's video predictor is not loaded beside --video")
        task, where = _one_video_task(body)
        prompt = video_text_prompt(context, self.options.concept_max_labels)
        regions = await self.concept_video.regions(
            task,
            where,
            config,
            prompt,
            service,
            self.fetcher,
            self.access_for(body.project),
            client,
        )
        scores = [region["score"] for region in regions]
        version = self.model_version(service)
        prediction = Prediction(
            result=regions,
            score=sum(scores) / len(scores) if scores else None,
            model_version=version,
        )
        return PredictResponse(results=[prediction], model_version=version)

    @staticmethod
    def _bulk_slot(mode: str, service: Service, client: str) -> contextlib.AbstractContextManager:
        """AMG holds one of the client's bulk slots, as /v1/amg does."""
        return service.bulk_slot(client) if mode == "amg" else contextlib.nullcontext()

    async def _task_regions(
        self,
        task: Task,
        index: int,
        config: LabelConfig,
        prompt: ClickPrompt | None,
        mode: str,
        service: Service,
        access: LabelStudioAccess,
    ) -> list[dict[str, Any]]:
        if mode == "empty":
            return []
        wanted_image = prompt.image_name if prompt is not None else None
        try:
            brush = config.brush_for(wanted_image)
        except LabelConfigError as exc:
            raise ApiError(422, "invalid_label_config", str(exc)) from None
        image_name = config.image_of(brush, wanted_image)
        data = await self._task_image(task, index, config, image_name, access)
        clock = RequestClock()
        draw = _RegionMaker(
            brush, image_name, config.label_for(brush, prompt.label if prompt else None)
        )
        if mode == "amg":
            pixels, reservation = await service.decode(data)
            with reservation:
                image = await service.image_from_bytes(data, clock, pixels)
                records = await _amg(service, image, pixels, clock)
            return await asyncio.to_thread(
                lambda: [draw.region(r["segmentation"], r["predicted_iou"]) for r in records]
            )
        if mode == "click" and self.concepts is not None and self.options.concept_clicks == "sam3":
            assert prompt is not None  # SAM 3's tracker heads on its encoding of the image
            rle, score = await self.concepts.click(service, data, prompt)
            return [await asyncio.to_thread(draw.region, rle, score)]
        image = await service.image_from_bytes(data, clock)
        height, width = image.size
        if mode == "click":
            assert prompt is not None
            obj, multimask = prompt.in_pixels(width, height), prompt.single_click
        elif mode == "center":
            obj, multimask = Prompt(((width / 2, height / 2),), (FOREGROUND,)), True
        else:
            return []
        rle, score = await _best_mask(service, image, obj, multimask, clock)
        return [await asyncio.to_thread(draw.region, rle, score)]

    async def _task_image(
        self,
        task: Task,
        index: int,
        config: LabelConfig,
        image_name: str,
        access: LabelStudioAccess,
    ) -> bytes:
        """The bytes of the task's image shown by the Image tag ``image_name``."""
        where = f"tasks[{index}]" + (f" (task {task.id})" if task.id is not None else "")
        field = config.images[image_name]
        if field not in task.data:
            fields = ", ".join(sorted(map(str, task.data))[:10]) or "none"
            raise ApiError(
                422,
                "invalid_request",
                f"{where}.data: no field {field!r} (the Image tag {image_name!r} shows "
                f"${field}); the task's fields: {fields}",
            )
        return await self.fetcher.fetch(task.data[field], access, f"{where}.data.{field}")


def _one_video_task(body: PredictRequest) -> tuple[Task, str]:
    """The one task of a video interaction, and its place in the request for errors."""
    if len(body.tasks) != 1:
        raise ApiError(
            422,
            "invalid_request",
            f"tasks: {len(body.tasks)} tasks with one video interaction; an "
            "interaction is on one task",
        )
    task = body.tasks[0]
    return task, "tasks[0]" + (f" (task {task.id})" if task.id is not None else "")


async def _each(
    items: list[tuple[int, Task]],
    work: Callable[[int, Task], Awaitable[None]],
    concurrency: int,
) -> None:
    """``work`` on every item, ``concurrency`` at a time, yielding to the event loop after
    each: a task refused at once (no await that waits) must not hold the loop for the
    whole request. Workers pull items in turn; no coroutine per item is made ahead."""
    pending = iter(items)

    async def worker() -> None:
        for index, task in pending:
            await work(index, task)
            await asyncio.sleep(0)

    workers = [asyncio.create_task(worker()) for _ in range(min(concurrency, len(items)))]
    try:
        await asyncio.gather(*workers)
    finally:
        for running in workers:  # one failed (a lone task's error) or the client left
            running.cancel()
        await asyncio.gather(*workers, return_exceptions=True)


class _Refusals:
    """The tasks of one request that got no prediction, logged as one line per request
    (counts per error code, the first message of each), not one per task."""

    def __init__(self) -> None:
        self.counts: collections.Counter[str] = collections.Counter()
        self.first: dict[str, str] = {}

    def add(self, task: Task, exc: ApiError) -> None:
        self.counts[exc.code] += 1
        self.first.setdefault(exc.code, f"task {task.id}: {exc.message}"[:300])

    def log(self, tasks: int, client: str) -> None:
        if not self.counts:
            return
        log.warning(
            "/predict from %s: %d of %d tasks got no prediction (%s); first of each: %s",
            client[:64],
            sum(self.counts.values()),
            tasks,
            ", ".join(f"{code} {count}" for code, count in self.counts.most_common()),
            " | ".join(self.first[code] for code, _ in self.counts.most_common()),
        )


class _RegionMaker:
    """Brush regions of one tag, image and label (made off the event loop: encoding is a
    pass over the whole image)."""

    def __init__(self, brush: ControlTag, image_name: str, label: str) -> None:
        self.brush, self.image_name, self.label = brush, image_name, label

    def region(self, rle: Rle, score: float) -> dict[str, Any]:
        mask = rle_to_mask(rle)
        height, width = mask.shape
        return {
            "id": secrets.token_hex(5),
            "from_name": self.brush.name,
            "to_name": self.image_name,
            "type": "brushlabels",
            "original_width": width,
            "original_height": height,
            "image_rotation": 0,
            "value": {
                "format": "rle",
                "rle": mask_to_brush_rle(mask),
                "brushlabels": [self.label],
            },
            "score": float(score),
            "readonly": False,
        }


async def _best_mask(
    service: Service, image: ImageState, obj: Prompt, multimask: bool, clock: RequestClock
) -> tuple[Rle, float]:
    """The prompt's mask (the best-scored of SAM's three for a single click)."""

    def run(context: JobContext) -> DecodedMasks:
        return decode_objects(
            service.predictor, image.embedding, [obj], multimask, check=context.check
        )

    decoded = await service.run_job("decode", run, clock)
    scores = decoded.scores[0]
    best = max(range(len(scores)), key=scores.__getitem__)
    return decoded.rles[0][best], scores[best]


async def _amg(
    service: Service, image: ImageState, pixels: Any, clock: RequestClock
) -> list[MaskRecord]:
    """Every object of the image (AMG with Meta's defaults), as the service's bulk job."""
    params = AMGParams.from_dict({"output_mode": "uncompressed_rle"})
    generator = MaskGenerator(service.predictor, params)

    def run(context: JobContext) -> list[MaskRecord]:
        return generator.generate(
            pixels, embedding=image.embedding, progress=lambda done, total: context.check()
        )

    records: list[MaskRecord] = await service.run_job("amg", run, clock, bulk=True)
    return sorted(records, key=lambda r: -r["area"])


@functools.lru_cache(maxsize=32)
def _parsed(xml: str, concepts: bool) -> LabelConfig:
    return parse_label_config(xml, concepts)


def _config(xml: str, concepts: bool = False) -> LabelConfig:
    try:
        return _parsed(xml, concepts)
    except LabelConfigError as exc:
        raise ApiError(422, "invalid_label_config", str(exc)) from None


__all__ = ["LabelStudioBackend"]
