"""A task's concept prompts answered by SAM 3, as Label Studio regions; and, with
``--concept-clicks sam3`` (the default), its clicks and box prompts, answered by SAM 3's
tracker heads on the same encoding (:meth:`ConceptAnswerer.click`).

One job on the service's model worker per task (a bulk job for pre-annotation, a long
interactive one for a typed phrase; both let waiting clicks run between the detector's torch
operations, as /v1/concepts does): the image is encoded
once (the encoding kept in a byte-budgeted LRU by the image's content hash, so the next
phrase typed on it is a detector pass only), the phrases' text once, then every phrase runs
through the detector as one batch over that encoding, the batch cut only where its kept
full-size masks (instances x phrases x pixels) would pass ``MASK_BATCH_BYTES``;
phrases with exemplar boxes (rectangles labelled with their concept label) are batched
with the phrases of the same boxes only, converted from percent to the image's pixels once
its size is known. Per phrase, the instances above ``--concept-score-thresh`` are ranked
and at most ``--concept-max-instances`` kept (no more than the service's
``--max-concept-instances``) before any mask is upsampled; the non-empty ones, highest
scores first, are bit-packed (a bit per pixel) until they are written off the worker; each
becomes a region with its phrase's label and score.

The service's budgets bound it as they bound /v1/concepts on the same image (one formula,
:mod:`sam2serve.concepts.mask_budget`): the masks a task may hold are worked out from the
image's header and refused (413 ``over_decode_budget``) before anything is decoded when
they could never fit in ``max_decoded_bytes_in_flight``; the image is decoded within the
service's ``max_pixels`` and decode budget; the masks' bytes are held in that budget while
the detection runs and its regions are written. The regions are:

- BrushLabels: one brush region (Label Studio's RLE, :mod:`sam2serve.labelstudio.brush`);
- PolygonLabels: one polygon region per outer boundary of the mask
  (:func:`sam2serve.engine.formats.mask_to_polygons`: through the pixel edges' midpoints,
  holes left out; the largest ``MAX_POLYGONS`` kept, points on straight runs dropped), in
  percent of the image.
"""

from __future__ import annotations

import asyncio
import secrets
from dataclasses import dataclass
from typing import Any

import numpy as np

from sam2serve.concepts.engine import ConceptEncoding, ExemplarBox, Instance, text_rows
from sam2serve.concepts.mask_budget import DetectionMasks
from sam2serve.concepts.runtime import Concepts
from sam2serve.engine.formats import mask_to_polygons
from sam2serve.engine.rle import Rle
from sam2serve.labelstudio.brush import mask_to_brush_rle
from sam2serve.labelstudio.concept_prompts import ConceptPrompt
from sam2serve.labelstudio.context import ClickPrompt
from sam2serve.labelstudio.label_config import BRUSH
from sam2serve.labelstudio.options import LabelStudioOptions
from sam2serve.server.batching import JobContext
from sam2serve.server.errors import ApiError
from sam2serve.server.prompts import DecodedMasks, decode_objects
from sam2serve.server.service import RequestClock, Service
from sam2serve.server.uploads import probe_image

MiB = 1024 * 1024
# The most bytes of bool masks one detector batch may keep at worst: phrases per batch =
# this // (instances x height x width), at least one.
MASK_BATCH_BYTES = 256 * MiB
# What a refusal of the mask budget tells the operator and the annotator to change.
REMEDY = (
    "ask fewer labels or phrases at once, lower --concept-max-instances, use a smaller "
    "image, or raise --max-decoded-mib"
)
MAX_POLYGONS = 8  # outer boundaries of one instance written as polygon regions


@dataclass(frozen=True)
class _Kept:
    """An instance held between the worker and the writing of its regions: its mask
    bit-packed (eight times smaller than numpy's bool)."""

    bits: np.ndarray
    shape: tuple[int, int]
    box: tuple[float, float, float, float]
    score: float

    @classmethod
    def of(cls, instance: Instance) -> _Kept:
        shape = (int(instance.mask.shape[0]), int(instance.mask.shape[1]))
        return cls(np.packbits(instance.mask, axis=None), shape, instance.box, instance.score)

    def instance(self) -> Instance:
        count = self.shape[0] * self.shape[1]
        mask = np.unpackbits(self.bits, count=count).reshape(self.shape).astype(bool)
        return Instance(mask=mask, box=self.box, score=self.score)


class ConceptAnswerer:
    """SAM 3 bound to the backend's concept options. Image encodings live in the
    service's concept cache (``--concept-cache-mib``; the service and Label Studio share one
    SAM 3), under the key /v1/concepts uses for the same image bytes."""

    def __init__(self, concepts: Concepts, options: LabelStudioOptions) -> None:
        self.concepts = concepts
        self.options = options

    def identity(self) -> str:
        """The concept model in the model version: size and weights."""
        spec = self.concepts.spec
        weights = f"random-seed{spec.seed}" if spec.random_weights else "weights"
        return f"sam3-{spec.size}-{weights}"

    def max_instances(self, service: Service) -> int:
        """The instances kept per phrase: ``--concept-max-instances``, no more than the
        service's ``--max-concept-instances`` (/v1/concepts' bound) nor SAM 3's queries."""
        limit = service.concept_limits.max_concept_instances
        return min(self.options.concept_max_instances, limit, self.concepts.size.queries)

    def masks(self, prompt: ConceptPrompt, instances: int, size: tuple[int, int]) -> DetectionMasks:
        """What the masks of ``prompt`` on an image of ``size`` (height, width) hold at
        most: a detector batch's bool masks, and every phrase's kept ones packed."""
        height, width = size
        batch = batch_phrases(instances * height * width)
        unpacked = min(len(prompt.phrases), batch)
        return DetectionMasks(len(prompt.phrases), instances, height, width, unpacked)

    async def regions(
        self, service: Service, data: bytes, prompt: ConceptPrompt, *, bulk: bool
    ) -> list[dict[str, Any]]:
        """The regions of every phrase of ``prompt`` on the image ``data``."""
        if not prompt.phrases:
            return []
        images = service.concepts  # the service's: its cache, key and shared encodes
        if images is None:
            raise RuntimeError("Label Studio's concepts need the service's (--concepts)")
        clock = RequestClock()
        instances = self.max_instances(service)
        # From the header (nothing decoded; 413 past max_pixels): masks that could never fit
        # are refused before the image is decoded or encoded.
        width, height = await asyncio.to_thread(probe_image, data, service.limits.max_pixels)
        if width and height:
            self._check(service, self.masks(prompt, instances, (height, width)))
        # Cached (a phrase typed after another decodes nothing), joined, or decoded within
        # the service's budgets and encoded, as /v1/concepts does.
        encoding = (await images.resolve(data, None, clock, bulk=bulk)).encoding
        masks = self.masks(prompt, instances, (encoding.height, encoding.width))
        self._check(service, masks)  # a header Pillow could not probe
        reservation = await service.decoding.reserve(masks.nbytes, masks.describe())
        try:

            def run(context: JobContext) -> dict[str, list[_Kept]]:
                return self._detect(context, encoding, prompt, instances)

            # long (or bulk, pre-annotation): waiting clicks run between its torch operations
            found = await service.run_job("concepts", run, clock, bulk=bulk, long=not bulk)
            return await asyncio.to_thread(_regions, found, prompt, encoding.width, encoding.height)
        finally:
            reservation.release()

    async def click(self, service: Service, data: bytes, prompt: ClickPrompt) -> tuple[Rle, float]:
        """A click or box prompt on the image ``data`` answered by SAM 3's tracker heads over
        the image's SAM 3 encoding (the service's concept cache: the encoding concept
        prompts on the same image made or will use), as /v1/segment's ``"model": "sam3"``
        answers it: the prompt's mask (the best-scored of three for a single click) and its
        score, one interactive decode job."""
        images = service.concepts
        if images is None:
            raise RuntimeError("Label Studio's concepts need the service's (--concepts)")
        clock = RequestClock()
        image = await images.resolve(data, None, clock)
        height, width = image.size
        obj, multimask = prompt.in_pixels(width, height), prompt.single_click
        side = image.encoding.tracker
        if side is None:
            raise RuntimeError("SAM 3's tracker heads are not loaded")
        predictor = self.concepts.interactive

        def run(context: JobContext) -> DecodedMasks:
            return decode_objects(predictor, side, [obj], multimask, check=context.check)

        decoded = await service.run_job("decode", run, clock)
        images.cache.recount(image.key)  # the fast decoder keeps its per-image side with it
        scores = decoded.scores[0]
        best = max(range(len(scores)), key=scores.__getitem__)
        return decoded.rles[0][best], scores[best]

    @staticmethod
    def _check(service: Service, masks: DetectionMasks) -> None:
        """413 when ``masks`` could never fit in the service's decode budget."""
        refusal = masks.refusal(service.decoding.limit, REMEDY)
        if refusal is not None:
            raise ApiError(413, "over_decode_budget", refusal)

    def _detect(
        self,
        context: JobContext,
        encoding: ConceptEncoding,
        prompt: ConceptPrompt,
        instances: int,
    ) -> dict[str, list[_Kept]]:
        """On the model worker: the phrases in batches over the image's encoding, at most
        ``instances`` kept per phrase before their masks are upsampled."""
        phrases = prompt.phrases
        worst = instances * encoding.height * encoding.width
        text = self.concepts.encode_text(phrases)  # once, sliced per batch
        found: dict[str, list[_Kept]] = {}
        for indices, boxes in detector_batches(prompt, encoding.width, encoding.height, worst):
            context.check()
            batch = tuple(phrases[i] for i in indices)
            rows = text if len(batch) == len(phrases) else text_rows(text, indices)
            with context.between_ops():
                answers = self.concepts.detect(
                    encoding,
                    batch,
                    boxes,
                    self.options.concept_score_thresh,
                    text=rows,
                    max_instances=instances,
                )
            for phrase in batch:
                kept = [i for i in answers[phrase] if i.mask.any()]
                kept.sort(key=lambda instance: -instance.score)
                found[phrase] = [_Kept.of(i) for i in kept]
            del answers  # this batch's full masks, before the next batch makes its own
        return found


def batch_phrases(worst_bytes: int) -> int:
    """Phrases per detector batch when each phrase may keep ``worst_bytes`` of bool masks."""
    return max(1, MASK_BATCH_BYTES // max(1, worst_bytes))


def detector_batches(
    prompt: ConceptPrompt, width: int, height: int, worst_bytes: int
) -> list[tuple[list[int], tuple[ExemplarBox, ...]]]:
    """The phrases' detector batches as (phrase indices, exemplar boxes in pixels): the
    detector applies a batch's boxes to every phrase in it, so phrases are batched with
    those that have the same boxes (none, or one label's), and every batch is cut at
    :func:`batch_phrases` phrases."""
    per_batch = batch_phrases(worst_bytes)
    groups: dict[tuple, list[int]] = {}  # the phrases of each set of boxes, in order
    for i in range(len(prompt.phrases)):
        groups.setdefault(prompt.exemplars_of(i), []).append(i)
    batches: list[tuple[list[int], tuple[ExemplarBox, ...]]] = []
    for exemplars, indices in groups.items():
        boxes = tuple(ExemplarBox(e.box.in_pixels(width, height), e.positive) for e in exemplars)
        for start in range(0, len(indices), per_batch):
            batches.append((indices[start : start + per_batch], boxes))
    return batches


def _regions(
    found: dict[str, list[_Kept]], prompt: ConceptPrompt, width: int, height: int
) -> list[dict[str, Any]]:
    """Every instance as regions of the output tag, phrase by phrase, in score order."""
    regions: list[dict[str, Any]] = []
    for phrase, label in zip(prompt.phrases, prompt.labels, strict=True):
        for kept in found.get(phrase, []):
            regions.extend(instance_regions(kept.instance(), prompt, label, width, height))
    return regions


def instance_regions(
    instance: Instance, prompt: ConceptPrompt, label: str, width: int, height: int
) -> list[dict[str, Any]]:
    """One instance as a brush region, or as polygon regions (one per outer boundary)."""
    kind = prompt.output.kind
    base = {
        "from_name": prompt.output.name,
        "to_name": prompt.image_name,
        "type": kind,
        "original_width": width,
        "original_height": height,
        "image_rotation": 0,
        "score": float(instance.score),
        "readonly": False,
    }
    if kind == BRUSH:
        value = {"format": "rle", "rle": mask_to_brush_rle(instance.mask), "brushlabels": [label]}
        return [{"id": secrets.token_hex(5), **base, "value": value}]
    return [
        {
            "id": secrets.token_hex(5),
            **base,
            "value": {"points": points, "closed": True, "polygonlabels": [label]},
        }
        for points in polygons_percent(instance.mask)
    ]


def polygons_percent(mask: np.ndarray) -> list[list[list[float]]]:
    """The mask's outer boundaries, largest first (at most MAX_POLYGONS), as Label Studio's
    polygon points: ``[x, y]`` in percent of the image, the image's left edge at 0 (a
    pixel index ``c`` spans ``c`` to ``c + 1``). Points on a straight run are dropped (the
    boundary is unchanged: they lie exactly on it)."""
    height, width = mask.shape
    shapes = []
    for flat in mask_to_polygons(mask):
        xy = np.asarray(flat, dtype=np.float64).reshape(-1, 2)
        before, after = xy - np.roll(xy, 1, axis=0), np.roll(xy, -1, axis=0) - xy
        turns = before[:, 0] * after[:, 1] - before[:, 1] * after[:, 0] != 0
        corners = xy[turns]
        if len(corners) < 3:
            continue
        area = 0.5 * abs(
            float(np.dot(xy[:, 0], np.roll(xy[:, 1], -1)) - np.dot(xy[:, 1], np.roll(xy[:, 0], -1)))
        )
        shapes.append((area, corners))
    shapes.sort(key=lambda shape: -shape[0])
    scale = np.array([100.0 / width, 100.0 / height])
    return [
        np.round(np.clip((corners + 0.5) * scale, 0.0, 100.0), 4).tolist()
        for _, corners in shapes[:MAX_POLYGONS]
    ]


__all__ = [
    "ConceptAnswerer",
    "batch_phrases",
    "detector_batches",
    "instance_regions",
    "polygons_percent",
]
