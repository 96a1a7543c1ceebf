"""From a request's prompts to the engine: limits, bounds, and the decoder inputs.

For /v1/segment: the prompt counts (checked before any image work), the objects as the
engine's :class:`~sam2serve.engine.prompts.Prompt` values, every point and box inside the
image (or a video's frame), and the objects decoded in as few decoder calls as the engine
allows. For /v1/amg: the AMG parameters, and the number of clicks they would decode.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import torch

from sam2serve.engine.amg import AMGParamError, AMGParams
from sam2serve.engine.masks import batched_mask_to_box, box_xyxy_to_xywh
from sam2serve.engine.predictor import LOW_RES_CLAMP, Embedding, Predictor
from sam2serve.engine.prompts import Prompt, PromptError, prompt_arrays
from sam2serve.engine.rle import Rle, masks_to_rle
from sam2serve.server import schemas
from sam2serve.server.errors import ApiError
from sam2serve.server.settings_groups import LimitSettings

# A decode of at most this many objects on a CPU runs on one intra-op thread: a click's
# decoder is ~700 small operations, and waking a second thread for each cost more than it
# shared on 2 cores (Zen 4, loaded and quiet: bench/results/click_cpu_zen4_avx512bf16.md).
CLICK_OBJECTS = 4


@contextlib.contextmanager
def click_threads(device: torch.device, objects: int) -> Iterator[None]:
    """One intra-op thread for the decode of ``objects`` objects on ``device`` when it is a
    click's (a CPU, at most :data:`CLICK_OBJECTS`); the process's count again after. The
    count is the process's: run this on the model worker, the one thread that runs the
    model (decodes and encodes never overlap there)."""
    threads = torch.get_num_threads()
    if device.type != "cpu" or objects > CLICK_OBJECTS or threads == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


@dataclass(frozen=True)
class DecodedMasks:
    """What the decoder job hands back: per object, per candidate."""

    rles: list[list[Rle]]
    scores: list[list[float]]
    boxes: list[list[list[float]]]  # XYWH
    low_res_logits: list[torch.Tensor]  # per object (C, 256, 256)


def check_prompt_counts(request: schemas.SegmentRequest, limits: LimitSettings) -> None:
    """The prompt limits, checked before any image work."""
    if len(request.objects) > limits.max_objects:
        raise ApiError(
            422,
            "too_many_prompts",
            f"objects: {len(request.objects)} objects; at most {limits.max_objects} per "
            "request (max_objects)",
        )
    for i, obj in enumerate(request.objects):
        if len(obj.points) > limits.max_points_per_object:
            raise ApiError(
                422,
                "too_many_prompts",
                f"objects[{i}].points: {len(obj.points)} points; at most "
                f"{limits.max_points_per_object} per object (max_points_per_object)",
            )


def check_inside(
    prompt: Prompt, size: tuple[int, int], where: str | None = None, what: str = "image"
) -> None:
    """422 unless every point and the box of ``prompt`` lie inside an image (or ``what``)
    of ``size`` (height, width); the message names the point or box (after ``where``, the
    prompt's place in the request), its value and what is accepted."""
    height, width = size
    try:
        prompt.check_inside(width, height, what)
    except PromptError as exc:
        message = str(exc) if where is None else exc.at(where, ".")
        raise ApiError(422, "invalid_request", message) from None


def check_objects_inside(prompts: Sequence[Prompt], size: tuple[int, int]) -> None:
    """Every object's points and box inside the image; the message names the object."""
    for i, prompt in enumerate(prompts):
        check_inside(prompt, size, f"objects[{i}]")


def decode_objects(
    predictor: Predictor,
    embedding: Embedding,
    prompts: Sequence[Prompt],
    multimask_output: bool,
    check: Callable[[], None] = lambda: None,
    best_only: bool = False,
) -> DecodedMasks:
    """Masks for every object: one decoder call for all of them (two when only some
    carry a previous mask, ``Prompt.mask_input``: the decoder takes a mask for all prompts
    or none). ``best_only``: keep each object's highest-scoring candidate, before any
    upsampling.

    The full-size masks are made, encoded as RLE and dropped chunk by chunk (the
    predictor's mask byte budget), so memory does not grow with objects x image size;
    ``check()`` runs between chunks (it raises when the client has gone). A click's
    decode runs on one intra-op thread (:func:`click_threads`)."""
    with click_threads(predictor.device, len(prompts)):
        return _decode_objects(predictor, embedding, prompts, multimask_output, check, best_only)


def _decode_objects(
    predictor: Predictor,
    embedding: Embedding,
    prompts: Sequence[Prompt],
    multimask_output: bool,
    check: Callable[[], None],
    best_only: bool,
) -> DecodedMasks:
    groups = [
        [i for i, p in enumerate(prompts) if p.mask_input is None],
        [i for i, p in enumerate(prompts) if p.mask_input is not None],
    ]
    n = len(prompts)
    rles: list[list[Rle]] = [[] for _ in range(n)]
    scores: list[list[float]] = [[] for _ in range(n)]
    boxes: list[list[list[float]]] = [[] for _ in range(n)]
    low_res: list[torch.Tensor] = [torch.empty(0)] * n
    for group in (g for g in groups if g):
        coords, labels = prompt_arrays([prompts[i] for i in group])
        masks_in = None
        if prompts[group[0]].mask_input is not None:
            masks_in = torch.stack([prompts[i].mask_input for i in group])  # (B, 1, 256, 256)
        logits, iou = predictor.predict_low_res(
            embedding,
            point_coords=coords,
            point_labels=labels,
            mask_input=masks_in,
            multimask_output=multimask_output,
        )
        if best_only and iou.shape[1] > 1:
            best = iou.argmax(dim=1)
            rows = torch.arange(iou.shape[0], device=iou.device)
            logits, iou = logits[rows, best][:, None], iou[rows, best][:, None]
        candidates = iou.shape[1]
        group_rles: list[Rle] = []
        group_boxes: list[list[float]] = []
        for _, masks in predictor.upscale_chunks(logits.flatten(0, 1), embedding.original_size):
            check()
            group_rles += masks_to_rle(masks)
            group_boxes += box_xyxy_to_xywh(batched_mask_to_box(masks)).float().cpu().tolist()
        group_scores = iou.float().cpu().tolist()
        clamped = logits.clamp(-LOW_RES_CLAMP, LOW_RES_CLAMP)
        for row, index in enumerate(group):
            span = slice(row * candidates, (row + 1) * candidates)
            rles[index] = group_rles[span]
            boxes[index] = group_boxes[span]
            scores[index] = group_scores[row]
            low_res[index] = clamped[row]
    return DecodedMasks(rles, scores, boxes, low_res)


def amg_params(options: schemas.AMGOptions, limits: LimitSettings) -> AMGParams:
    values = options.model_dump()
    if values["point_grids"] is not None and "points_per_side" not in options.model_fields_set:
        values["points_per_side"] = None  # explicit grids replace the default grid
    try:
        params = AMGParams.from_dict({**values, "output_mode": "uncompressed_rle"})
    except AMGParamError as exc:
        raise ApiError(422, "invalid_request", f"params: {exc}") from None
    # Counted, not built: the grids are made only once the request is within the limits.
    crops = params.crop_count()
    if crops > limits.max_amg_crops:
        raise ApiError(
            422,
            "too_many_crops",
            f"params.crop_n_layers: {params.crop_n_layers} crop layers encode {crops} crops; at "
            f"most {limits.max_amg_crops} per request (max_amg_crops): lower crop_n_layers",
        )
    clicks = params.click_count()
    if clicks > limits.max_amg_points:
        raise ApiError(
            422,
            "too_many_prompts",
            f"params: these AMG parameters decode {clicks} clicks over all crops; at most "
            f"{limits.max_amg_points} per request (max_amg_points): lower points_per_side "
            "or crop_n_layers",
        )
    return params
