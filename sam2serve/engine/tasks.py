"""The three tasks of the SAM2 experiment as library functions: ``amg``, ``sps``, ``mps``.

Each takes an image (a path, encoded bytes, a PIL image or an array), runs one task and
returns records whose ``segmentation`` is COCO RLE (``{"size": [h, w], "counts": str}``):

- ``amg(generator, image)``: automatic mask generation, Meta's records in Meta's order;
- ``sps(predictor, image, prompt)``: single point segmentation, the best of 3 masks;
- ``mps(predictor, image, prompts)``: every prompt on its own, the best of 3 each.

A prompt is a :class:`~sam2serve.engine.prompts.Prompt` or its JSON form: a click
``[x, y]`` (a foreground point: the experiment's prompts) or an object ``{"points": [[x,
y], ...], "labels": [1, 0, ...], "box": [x0, y0, x1, y1]}`` (labels default to 1, the box is
optional, so is every point when there is a box). The prompts of one image are decoded
together, as :func:`~sam2serve.engine.prompts.prompt_arrays` lays them out (box corners
first, each prompt padded with SAM's "not a point"), as the service's /v1/segment does.

Point records hold ``segmentation``, ``area``, ``bbox`` (XYWH as Meta writes it),
``predicted_iou`` and ``point_coords`` (the prompt's clicks); an object's records add
``point_labels`` and ``box``. The CLI, the benchmark and the server all call these, so a
task means the same thing everywhere.

How a task runs follows the execution mode's flags (see :mod:`sam2serve.runtime.modes`;
any object with the attributes of :class:`TaskFlags` will do, a ``Mode`` included):

- ``batch_prompts=False`` is the reference way: one prompt per decoder call, all three
  candidate masks upscaled to the image, the best picked afterwards (Meta's predictor).
  ``True`` decodes every prompt of the image together and upscales only the best mask of
  each prompt: the same masks, since the choice reads only the IoU head.
- ``batch_rle=False`` converts masks to RLE one at a time, one host transfer per mask, as
  Meta's ``mask_to_rle_pytorch`` does; ``True`` converts a batch with one transfer. AMG
  honours it too (:func:`rle_encoder`), so ``run --mode baseline`` is the bench's baseline.

Timing is opt-in: pass a :class:`StageTimer` and each stage's wall time is added to it
(decode, preprocess, encode, decode_masks, postprocess, rle). Stages nest exclusively: a
stage opened inside another pauses the outer one, so the stages always sum to the whole.
On CUDA the timer synchronises at stage boundaries; without a timer nothing synchronises.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch

from sam2serve.engine.amg import AMGParams, MaskGenerator, RleEncoder
from sam2serve.engine.image import ImageSource, load_image, preprocess
from sam2serve.engine.masks import batched_mask_to_box, box_xyxy_to_xywh
from sam2serve.engine.predictor import Embedding, Predictor
from sam2serve.engine.prompts import Prompt, as_prompt, prompt_arrays
from sam2serve.engine.rle import (
    Rle,
    Runs,
    area_from_rle,
    coco_to_rle,
    masks_to_coco,
    masks_to_rle,
    masks_to_runs,
    rle_to_coco,
)
from sam2serve.engine.rle import rle_to_mask as _rle_to_mask

__all__ = [
    "DEFAULT_FLAGS",
    "STAGES",
    "TASKS",
    "StageTimer",
    "TaskFlags",
    "TaskOptions",
    "amg",
    "decode",
    "encode",
    "mask_generator",
    "mps",
    "prompt_point",
    "prompt_points",
    "records_to_rle",
    "sps",
]

TASKS = ("amg", "sps", "mps")
# Stages of one image, in pipeline order.
STAGES = ("decode", "preprocess", "encode", "decode_masks", "postprocess", "rle")
Record = dict[str, Any]
# A Prompt, or its JSON form: a click [x, y] or an object {"points", "labels", "box"}.
PromptLike = Prompt | Sequence[float] | Mapping[str, Any]


class TaskFlags(Protocol):
    """What the tasks read from a mode (``sam2serve.runtime.modes.Mode`` has these)."""

    @property
    def batch_prompts(self) -> bool: ...

    @property
    def batch_rle(self) -> bool: ...


@dataclass(frozen=True)
class TaskOptions:
    """Task flags on their own, for callers without a Mode; the default is the fast way."""

    batch_prompts: bool = True
    batch_rle: bool = True


DEFAULT_FLAGS = TaskOptions()


# --------------------------------------------------------------------------- timing


class StageTimer:
    """Wall time per stage of one image, in milliseconds (``time.perf_counter``).

    ``with timer.stage("encode"): ...`` adds the block's time to ``ms["encode"]``. A stage
    opened inside another is exclusive: the outer stage stops counting until it closes.
    ``sync`` runs at every boundary (``torch.cuda.synchronize`` for a CUDA device), so
    asynchronous device work lands in the stage that queued it.
    """

    def __init__(self, device: torch.device | str | None = None) -> None:
        self.ms: dict[str, float] = dict.fromkeys(STAGES, 0.0)
        self._open: list[str] = []
        self._since = 0.0
        device = torch.device(device) if device is not None else None
        self._sync: Callable[[], None] = (
            (lambda: torch.cuda.synchronize(device))
            if device is not None and device.type == "cuda"
            else (lambda: None)
        )

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        if name not in self.ms:
            raise ValueError(f"unknown stage {name!r}; expected one of {', '.join(STAGES)}")
        self._switch()
        self._open.append(name)
        try:
            yield
        finally:
            self._switch()
            self._open.pop()

    def _switch(self) -> None:
        """Close the running interval: its time goes to the innermost open stage."""
        self._sync()
        now = time.perf_counter()
        if self._open:
            self.ms[self._open[-1]] += (now - self._since) * 1000
        self._since = now

    @property
    def total_ms(self) -> float:
        return sum(self.ms.values())

    def as_dict(self, digits: int = 3) -> dict[str, float]:
        return {f"{name}_ms": round(value, digits) for name, value in self.ms.items()}


def _stage(timer: StageTimer | None, name: str) -> AbstractContextManager[None]:
    return timer.stage(name) if timer is not None else nullcontext()


class _TimedPredictor:
    """A Predictor seen through a timer: the calls AMG makes land in their stages.

    Everything else is delegated untouched, so whatever the generator does besides
    encoding crops and decoding prompts counts as post-processing.
    """

    def __init__(self, predictor: Predictor, timer: StageTimer) -> None:
        self._predictor = predictor
        self._timer = timer

    def __getattr__(self, name: str) -> Any:
        return getattr(self._predictor, name)

    def _timed(self, stage: str, method: str, *args: Any, **kwargs: Any) -> Any:
        with self._timer.stage(stage):
            return getattr(self._predictor, method)(*args, **kwargs)

    def encode(self, *args: Any, **kwargs: Any) -> Any:  # the crops of crop_n_layers > 0
        return self._timed("encode", "encode", *args, **kwargs)

    def decoder_context(self, *args: Any, **kwargs: Any) -> Any:
        return self._timed("decode_masks", "decoder_context", *args, **kwargs)

    def decode_low_res(self, *args: Any, **kwargs: Any) -> Any:
        return self._timed("decode_masks", "decode_low_res", *args, **kwargs)

    def decode_low_res_filtered(self, *args: Any, **kwargs: Any) -> Any:
        return self._timed("decode_masks", "decode_low_res_filtered", *args, **kwargs)


# --------------------------------------------------------------------------- common steps


def decode(image: ImageSource | torch.Tensor, timer: StageTimer | None = None) -> Any:
    """uint8 RGB (H, W, 3) pixels of ``image`` (an array passes through, and so does a
    tensor: pixels decoded on the device, engine.device_decode)."""
    if isinstance(image, torch.Tensor):
        return image
    with _stage(timer, "decode"):
        return load_image(image)


def encode(predictor: Predictor, pixels: np.ndarray, timer: StageTimer | None = None) -> Embedding:
    """The embedding of one decoded image: preprocessing and the image encoder, timed apart."""
    with _stage(timer, "preprocess"):
        batch = preprocess(
            [pixels], predictor.model.image_size, device=predictor.device, dtype=predictor.dtype
        )
    with _stage(timer, "encode"):
        return predictor.encode_preprocessed(batch, [pixels.shape[:2]])


def _embedding_for(
    predictor: Predictor,
    pixels: np.ndarray,
    embedding: Embedding | None,
    timer: StageTimer | None,
) -> Embedding:
    if embedding is None:
        return encode(predictor, pixels, timer)
    if len(embedding) != 1 or embedding.original_size != pixels.shape[:2]:
        raise ValueError(
            f"embedding is for {list(embedding.original_sizes)} but the image is "
            f"{pixels.shape[:2]}: pass the embedding of this one image"
        )
    return embedding


# --------------------------------------------------------------------------- amg


def _amg_params(params: AMGParams) -> AMGParams:
    return params if params.output_mode == "coco_rle" else params.replace(output_mode="coco_rle")


def rle_encoder(batch_rle: bool, timer: StageTimer | None = None) -> RleEncoder:
    """How AMG turns a batch's masks into RLE: batched (one host sync) or one mask at a
    time (the reference's way), timed as the ``rle`` stage when there is a timer."""

    def encode(masks: torch.Tensor) -> Runs:
        with _stage(timer, "rle"):
            if batch_rle:
                return masks_to_runs(masks)
            size = (masks.shape[1], masks.shape[2])
            return Runs.concat([masks_to_runs(mask[None]) for mask in masks], size)

    return encode


def mask_generator(
    predictor: Predictor, params: AMGParams | None = None, flags: TaskFlags = DEFAULT_FLAGS
) -> MaskGenerator:
    """The generator :func:`amg` runs for these flags: COCO RLE output, RLE batched or not
    as the mode says. Build it once per predictor and reuse it."""
    params = _amg_params(params or AMGParams())
    return MaskGenerator(predictor, params, rle=rle_encoder(flags.batch_rle))


@torch.inference_mode()
def amg(
    generator: MaskGenerator,
    image: ImageSource,
    *,
    flags: TaskFlags = DEFAULT_FLAGS,
    timer: StageTimer | None = None,
    embedding: Embedding | None = None,
) -> list[Record]:
    """Automatic mask generation: Meta's records (COCO RLE), in Meta's order.

    The whole-image embedding is computed here (or taken from ``embedding``); everything
    the generator does after it is timed as post-processing, except the decoder calls
    (``decode_masks``) and the encoding of extra crops (``encode``).
    """
    params = _amg_params(generator.params)
    if params is not generator.params:
        generator = MaskGenerator(generator.predictor, params, rle=rle_encoder(flags.batch_rle))
    pixels = decode(image, timer)
    embedding = _embedding_for(generator.predictor, pixels, embedding, timer)
    if timer is not None:  # a generator of this call's own, its work in their stages
        timed = _TimedPredictor(generator.predictor, timer)
        encode = rle_encoder(flags.batch_rle, timer)
        generator = MaskGenerator(timed, params, rle=encode)  # type: ignore[arg-type]  # a Predictor's timed stand-in: forwards what the generator calls
    with _stage(timer, "postprocess"):
        records = generator.generate(pixels, embedding=embedding)
    return [dict(record) for record in records]


# --------------------------------------------------------------------------- sps / mps


def _prompt_tensors(
    prompts: Sequence[Prompt], device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    coords, labels = prompt_arrays(prompts)
    return torch.as_tensor(coords, device=device), torch.as_tensor(labels, device=device)


def _prompt_fields(prompt: Prompt) -> dict[str, Any]:
    """What a record says about its prompt: the clicks (and an object's labels and box); a
    bare click keeps the original record."""
    fields = prompt.as_json()
    if prompt.bare_click:
        return {"point_coords": fields["points"]}
    return {
        "point_coords": fields["points"],
        "point_labels": fields["labels"],
        "box": fields["box"],
    }


def _best_masks_batched(
    predictor: Predictor,
    embedding: Embedding,
    coords: torch.Tensor,
    labels: torch.Tensor,
    timer: StageTimer | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """All prompts in one decode; only each prompt's best mask is upscaled."""
    size = embedding.original_size
    with _stage(timer, "decode_masks"):
        low_res, iou = predictor.decode_low_res(embedding, coords, labels, None, True)
    with _stage(timer, "postprocess"):
        best = iou.argmax(dim=1)
        rows = torch.arange(iou.shape[0], device=iou.device)
        masks = predictor.upscale(low_res[rows, best][:, None], size)[:, 0]
        return masks, iou[rows, best]


def _best_masks_one_by_one(
    predictor: Predictor,
    embedding: Embedding,
    coords: torch.Tensor,
    labels: torch.Tensor,
    timer: StageTimer | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The reference way: one decoder call per prompt, all 3 masks upscaled, best kept."""
    size = embedding.original_size
    masks, scores = [], []
    for row in range(coords.shape[0]):
        one = slice(row, row + 1)
        with _stage(timer, "decode_masks"):
            low_res, iou = predictor.decode_low_res(embedding, coords[one], labels[one], None, True)
        with _stage(timer, "postprocess"):
            candidates = predictor.upscale(low_res, size)[0]  # (3, H, W)
            best = iou[0].argmax()
            masks.append(candidates[best])
            scores.append(iou[0, best])
    return torch.stack(masks), torch.stack(scores)


def _point_records(
    predictor: Predictor,
    pixels: np.ndarray,
    prompts: Sequence[Prompt],
    flags: TaskFlags,
    timer: StageTimer | None,
    embedding: Embedding | None,
) -> list[Record]:
    embedding = _embedding_for(predictor, pixels, embedding, timer)
    if len(prompts) == 0:
        return []
    coords, labels = _prompt_tensors(prompts, predictor.device)
    with _stage(timer, "decode_masks"):
        coords = predictor.to_input_frame(coords, embedding.original_size, normalize=True)
    best = _best_masks_batched if flags.batch_prompts else _best_masks_one_by_one
    masks, scores = best(predictor, embedding, coords, labels, timer)
    with _stage(timer, "postprocess"):
        boxes = box_xyxy_to_xywh(batched_mask_to_box(masks)).float().cpu().tolist()
        ious = scores.float().cpu().tolist()
    with _stage(timer, "rle"):
        if flags.batch_rle:  # the whole batch to COCO strings, no list of counts between
            segmentations, areas = masks_to_coco(masks)
        else:  # one transfer per mask, as Meta's mask_to_rle_pytorch
            rles = [masks_to_rle(mask[None])[0] for mask in masks]
            segmentations = [rle_to_coco(rle) for rle in rles]
            areas = [area_from_rle(rle) for rle in rles]
    return [
        {
            "segmentation": segmentation,
            "area": area,
            "bbox": box,
            "predicted_iou": iou,
            **_prompt_fields(prompt),
        }
        for segmentation, area, box, iou, prompt in zip(
            segmentations, areas, boxes, ious, prompts, strict=True
        )
    ]


@torch.inference_mode()
def sps(
    predictor: Predictor,
    image: ImageSource,
    prompt: PromptLike,
    *,
    flags: TaskFlags = DEFAULT_FLAGS,
    timer: StageTimer | None = None,
    embedding: Embedding | None = None,
) -> list[Record]:
    """Single point segmentation: one record, the best of 3 masks for ``prompt`` (a click
    [x, y] in image pixels, or an object with clicks, labels and a box)."""
    checked = as_prompt(prompt)
    pixels = decode(image, timer)
    return _point_records(predictor, pixels, [checked], flags, timer, embedding)


@torch.inference_mode()
def mps(
    predictor: Predictor,
    image: ImageSource,
    prompts: Sequence[PromptLike],
    *,
    flags: TaskFlags = DEFAULT_FLAGS,
    timer: StageTimer | None = None,
    embedding: Embedding | None = None,
) -> list[Record]:
    """Multi point segmentation: one record per prompt (a click or an object), all of
    them decoded together."""
    checked = [as_prompt(prompt) for prompt in prompts]
    pixels = decode(image, timer)
    return _point_records(predictor, pixels, checked, flags, timer, embedding)


# --------------------------------------------------------------------------- prompts


def prompt_point(mask: np.ndarray) -> list[float] | None:
    """A point inside ``mask``: its centroid if inside, else the point farthest from the
    edge (maximum of the distance transform). None for an empty mask.

    Points are pixel coordinates (x = column, y = row), as the predictor takes them.
    """
    rows, cols = np.nonzero(mask)
    if rows.size == 0:
        return None
    cx, cy = float(cols.mean()), float(rows.mean())
    if mask[round(cy), round(cx)]:
        return [round(cx, 2), round(cy, 2)]
    from scipy import ndimage

    # Padding makes the image border count as outside, so the point keeps off it too.
    distance = ndimage.distance_transform_edt(np.pad(mask, 1))[1:-1, 1:-1]
    row, col = np.unravel_index(int(np.argmax(distance)), distance.shape)
    return [float(col), float(row)]


def records_to_rle(records: Sequence[Record]) -> list[Rle]:
    """Uncompressed RLEs of records whose segmentation is COCO RLE."""
    return [coco_to_rle(record["segmentation"]) for record in records]


def prompt_points(records: Sequence[Record]) -> list[list[float]]:
    """The experiment's prompts from AMG records: one point per non-empty mask, largest
    mask first (ties keep record order). SPS takes the first, MPS all of them."""
    ordered = sorted(records, key=lambda record: -int(record["area"]))
    points = []
    for record in ordered:
        point = prompt_point(_rle_to_mask(coco_to_rle(record["segmentation"])))
        if point is not None:
            points.append(point)
    return points
