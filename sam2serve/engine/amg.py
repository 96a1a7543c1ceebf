"""Automatic mask generation (AMG): prompt SAM2 with a grid of points, keep the good masks.

Parameters, defaults, record fields and record order are those of Meta's
``SAM2AutomaticMaskGenerator``; the pipeline is the same too:

    for each crop (the whole image, then 2^i x 2^i overlapping crops per extra layer):
        encode the crop once
        for each batch of ``points_per_batch`` grid points (in crop pixels):
            decode one foreground click per point (3 masks each, or 1)
            [use_m2m: decode again with the same click and the mask's low-res logits]
            keep masks with predicted IoU > pred_iou_thresh
            upsample logits to the crop size; keep stability >= stability_score_thresh
            threshold, box, drop masks cut off by a crop edge, pad to the image, RLE
        box NMS within the crop (box_nms_thresh, by predicted IoU)
    box NMS across crops (crop_nms_thresh, smaller crops win)
    [min_mask_region_area: fill small holes, drop small islands, NMS again]

What differs from Meta's code, and why:

- The predicted-IoU filter runs *before* upsampling. It only reads the IoU head, so the
  result is identical, and masks it drops are never upsampled to full size.
- Upsampling, the stability score and thresholding run per chunk of masks, so only the
  boolean masks of a batch are alive at full size, never all of its float logits.
- ``min_mask_region_area`` is applied to the final full-resolution masks with SciPy (the
  clean-up SAM 1's generator runs, which Meta's SAM2 class still carries as
  ``postprocess_small_regions``). Meta's SAM2 generator instead hands the area to its
  predictor, which edits low-res logits with a CUDA-only kernel and silently skips it
  elsewhere; here the clean-up really runs, on any device.
- Ties in NMS scores keep their input order (engine.nms sorts stably). Across crops all
  masks of one crop tie (score 1 / crop area), as do all cleaned or all untouched masks
  after ``min_mask_region_area``; torchvision orders such ties by torch's unstable sort,
  so Meta's record order there is an accident of the sort algorithm, and ours is the
  order of the step before (decreasing predicted IoU within a crop).
- Unknown keyword arguments are an error instead of being ignored, and every parameter
  is validated with a message that names the bad value.

Nothing about one image is stored on the generator: ``generate`` is safe to call from
several threads that share one :class:`MaskGenerator` (and so one model).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypedDict

import numpy as np
import torch

from sam2serve.engine.amg_params import OUTPUT_MODES, AMGParamError, AMGParams, OutputMode
from sam2serve.engine.formats import encode_mask
from sam2serve.engine.image import ImageSource, load_image
from sam2serve.engine.masks import (
    batched_mask_to_box,
    box_xyxy_to_xywh,
    calculate_stability_score,
    generate_crop_boxes,
    is_box_near_crop_edge,
    remove_small_regions,
    uncrop_boxes_xyxy,
    uncrop_masks,
    uncrop_points,
)
from sam2serve.engine.nms import batched_nms, box_area
from sam2serve.engine.predictor import LOW_RES_CLAMP, DecoderContext, Embedding, Predictor
from sam2serve.engine.rle import Runs, masks_to_runs, rle_to_mask

__all__ = [
    "OUTPUT_MODES",
    "AMGParamError",
    "AMGParams",
    "MaskGenerator",
    "MaskRecord",
    "OutputMode",
    "Progress",
    "finite_or_none",
]

# Turns (N, H, W) bool masks into their RLEs, packed (engine.rle.Runs).
RleEncoder = Callable[[torch.Tensor], Runs]
# progress(done, total): decoder batches finished so far and in all, over all crops.
Progress = Callable[[int, int], None]


class MaskRecord(TypedDict):
    """One generated mask, with the keys and value types of Meta's generator."""

    segmentation: Any  # in output_mode (engine.formats): (H, W) bool array, RLE dict, ...
    area: int  # pixels in the mask
    bbox: list[float]  # XYWH around the mask
    predicted_iou: float  # the model's own estimate of the mask's quality
    point_coords: list[list[float]]  # [[x, y]]: the click that produced the mask
    stability_score: float  # IoU of the mask thresholded at +- stability_score_offset
    crop_box: list[float]  # XYWH of the crop the mask was found in


LOW_RES_SIDE = 256  # the decoder's low-res logits are 256 x 256


def finite_or_none(value: float) -> float | None:
    """JSON has no NaN: an empty mask's stability score (0/0, NaN as in Meta's records)
    is written as null by the CLI and the server."""
    return value if math.isfinite(value) else None


# --------------------------------------------------------------------------- mask sets


@dataclass(frozen=True)
class _Masks:
    """Masks kept so far, in image coordinates: RLEs on the host, packed in two numpy
    arrays (a keep-all run has thousands of masks of ~10^4 runs each: Python lists of
    their counts cost most of its time), the rest on the device.

    Meta's ``MaskData`` reduced to the fields AMG needs; every tensor has one row per RLE.
    """

    runs: Runs
    boxes: torch.Tensor  # (N, 4) int64 XYXY, inclusive max, image frame
    iou_preds: torch.Tensor  # (N,) float32
    stability_scores: torch.Tensor  # (N,) float32
    points: torch.Tensor  # (N, 2) float32, the click, image frame
    crop_boxes: torch.Tensor  # (N, 4) int64 XYXY of the crop the mask came from

    def __len__(self) -> int:
        return len(self.runs)

    @staticmethod
    def empty(device: torch.device, size: tuple[int, int]) -> _Masks:
        def zeros(*shape: int, dtype: torch.dtype) -> torch.Tensor:
            return torch.zeros(shape, dtype=dtype, device=device)

        return _Masks(
            Runs.empty(size),
            zeros(0, 4, dtype=torch.int64),
            zeros(0, dtype=torch.float32),
            zeros(0, dtype=torch.float32),
            zeros(0, 2, dtype=torch.float32),
            zeros(0, 4, dtype=torch.int64),
        )

    def select(self, index: torch.Tensor) -> _Masks:
        """The masks at ``index`` (int64 positions, in that order): the positions cross
        to the host once, for the RLEs."""
        return _Masks(
            self.runs.select(index.cpu().numpy()),
            self.boxes[index],
            self.iou_preds[index],
            self.stability_scores[index],
            self.points[index],
            self.crop_boxes[index],
        )

    @staticmethod
    def concat(parts: Sequence[_Masks], device: torch.device, size: tuple[int, int]) -> _Masks:
        if not parts:
            return _Masks.empty(device, size)
        if len(parts) == 1:
            return parts[0]
        return _Masks(
            Runs.concat([part.runs for part in parts], size),
            *(
                torch.cat([getattr(p, name) for p in parts])
                for name in ("boxes", "iou_preds", "stability_scores", "points", "crop_boxes")
            ),
        )


def _nms(boxes: torch.Tensor, scores: torch.Tensor, threshold: float) -> torch.Tensor:
    """Greedy box NMS over all masks as one category, as Meta calls it."""
    return batched_nms(boxes.float(), scores, torch.zeros_like(boxes[:, 0]), threshold)


def _rows_equal_to(values: Sequence[int], n_rows: int, device: torch.device) -> torch.Tensor:
    """(n_rows, len(values)) int64, every row ``values``: filled with Python scalars on the
    device, since a tensor made from ``values`` would be a host-to-device copy (a sync)."""
    rows = torch.empty((n_rows, len(values)), dtype=torch.int64, device=device)
    for column, value in enumerate(values):
        rows[:, column] = value
    return rows


def _batches(n_items: int, batch_size: int) -> Iterator[slice]:
    for start in range(0, n_items, batch_size):
        yield slice(start, start + batch_size)


# --------------------------------------------------------------------------- generator


class MaskGenerator:
    """Segment everything in an image with a :class:`Predictor` and AMG parameters.

    ``MaskGenerator(predictor, points_per_side=16, output_mode="coco_rle")`` or
    ``MaskGenerator(predictor, AMGParams.from_dict(config))``; keyword arguments override
    the fields of ``params``. The generator holds only the predictor and the parameters.
    """

    def __init__(
        self,
        predictor: Predictor,
        params: AMGParams | None = None,
        *,
        rle: RleEncoder = masks_to_runs,
        **overrides: Any,
    ) -> None:
        if params is not None and not isinstance(params, AMGParams):
            raise AMGParamError(
                f"params must be an AMGParams (or give the parameters as keyword "
                f"arguments), got {type(params).__name__}"
            )
        self.predictor = predictor
        # How each batch's kept masks become RLE (batched by default; callers may time it
        # or encode one mask at a time, as the reference does).
        self._rle = rle
        self.params = (params or AMGParams()).replace(**overrides)
        self._layer_grids = self.params.layer_point_grids()  # derived from params only

    @torch.inference_mode()
    def generate(
        self,
        image: ImageSource,
        *,
        embedding: Embedding | None = None,
        progress: Progress | None = None,
    ) -> list[MaskRecord]:
        """Mask records for ``image`` (a path, encoded bytes, a PIL image or an array).

        ``embedding``: the image's embedding if already computed (e.g. cached); it is
        used for the whole-image crop instead of encoding again. ``progress(done, total)``
        is called after each decoder batch.

        Records come in Meta's order: smaller crops first, then by decreasing predicted
        IoU within a crop; with ``min_mask_region_area``, masks the clean-up left alone
        come before those it changed.
        """
        pixels = load_image(image)
        if embedding is not None and (
            len(embedding) != 1 or embedding.original_size != pixels.shape[:2]
        ):
            raise ValueError(
                f"embedding is for {list(embedding.original_sizes)} but the image is "
                f"{pixels.shape[:2]}: pass the embedding of this one image"
            )
        masks = self._generate_masks(pixels, embedding, progress)
        if self.params.min_mask_region_area > 0:
            masks = self._remove_small_regions(masks)
        return self._records(masks)

    # ------------------------------------------------------------------ pipeline
    def _generate_masks(
        self, image: np.ndarray, embedding: Embedding | None, progress: Progress | None
    ) -> _Masks:
        p = self.params
        height, width = image.shape[:2]
        crop_boxes, layer_idxs = generate_crop_boxes(
            (height, width), p.crop_n_layers, p.crop_overlap_ratio
        )
        batch_size = self._batch_size((height, width))
        n_batches = [math.ceil(len(self._layer_grids[layer]) / batch_size) for layer in layer_idxs]
        ticker = _Ticker(progress, sum(n_batches))
        parts = []
        for crop_box, layer in zip(crop_boxes, layer_idxs, strict=True):
            whole_image = crop_box == [0, 0, width, height]
            crop_embedding = embedding if whole_image else None
            parts.append(
                self._process_crop(image, crop_box, layer, crop_embedding, batch_size, ticker)
            )
        masks = _Masks.concat(parts, self.predictor.device, (height, width))
        if len(crop_boxes) > 1 and len(masks):
            # Duplicates between crops: prefer the mask from the smaller crop, which saw
            # the object at a higher resolution.
            keep = _nms(masks.boxes, 1 / box_area(masks.crop_boxes), p.crop_nms_thresh)
            masks = masks.select(keep)
        return masks

    def _process_crop(
        self,
        image: np.ndarray,
        crop_box: list[int],
        layer: int,
        embedding: Embedding | None,
        batch_size: int,
        ticker: _Ticker,
    ) -> _Masks:
        x0, y0, x1, y1 = crop_box
        crop = image[y0:y1, x0:x1]
        crop_size = (crop.shape[0], crop.shape[1])
        if embedding is None:
            embedding = self.predictor.encode(crop)
        # Grid scaled to crop pixels in float64, then float32 for the model, as Meta does.
        grid = self._layer_grids[layer] * np.array(crop_size[::-1], dtype=np.float64)
        # One upload per crop, not blocking the host (pinned on CUDA).
        host = torch.from_numpy(grid.astype(np.float32))
        device = torch.device(self.predictor.device)
        if device.type == "cuda":
            host = host.pin_memory()
        points = host.to(device, non_blocking=True)
        # The decoder's per-image work (the fast decoder's image side) is done once per crop.
        context = self.predictor.decoder_context(embedding)
        parts = []
        for batch in _batches(len(points), batch_size):
            parts.append(
                self._process_batch(context, points[batch], crop_box, crop_size, image.shape[:2])
            )
            ticker.tick()
        masks = _Masks.concat(parts, self.predictor.device, image.shape[:2])
        if not len(masks):
            return masks
        return masks.select(_nms(masks.boxes, masks.iou_preds, self.params.box_nms_thresh))

    def _batch_size(self, image_size: tuple[int, int]) -> int:
        """Clicks decoded together: ``points_per_batch``, or fewer when their masks (each
        batch holds them all, as float32 low-res logits and then as bool masks at image
        size, before filtering) would not fit in the predictor's ``mask_bytes_budget``.
        Masks are independent of their batch, so the records are the same either way."""
        masks_per_click = 3 if self.params.multimask_output else 1
        height, width = image_size
        per_mask = height * width + 4 * LOW_RES_SIDE**2
        fit = self.predictor.mask_bytes_budget // (masks_per_click * per_mask)
        return max(1, min(self.params.points_per_batch, fit))

    def _process_batch(
        self,
        context: DecoderContext,
        points: torch.Tensor,
        crop_box: list[int],
        crop_size: tuple[int, int],
        image_size: tuple[int, int],
    ) -> _Masks:
        """Masks for one batch of clicks (crop pixels), filtered, in image coordinates."""
        p = self.params
        predictor = self.predictor
        coords = predictor.to_input_frame(points[:, None, :], crop_size, normalize=True)
        labels = torch.ones(coords.shape[:2], dtype=torch.int32, device=coords.device)
        # Prompts none of whose masks can pass the predicted-IoU filter get no logits at
        # all (the fast decoder skips their upscaling); m2m re-scores, so it sees them all.
        min_iou = p.pred_iou_thresh if p.pred_iou_thresh > 0.0 and not p.use_m2m else None
        low_res, iou_preds, rows = predictor.decode_low_res_filtered(
            context, coords, labels, None, p.multimask_output, min_iou
        )
        iou_preds, points = iou_preds[rows], points[rows]
        # One row per mask from here on; each mask remembers its click.
        points = points.repeat_interleave(low_res.shape[1], dim=0)
        low_res, iou_preds = low_res.flatten(0, 1), iou_preds.flatten(0, 1)
        if p.use_m2m:
            low_res, iou_preds = self._refine(context, points, low_res, crop_size)
        iou_preds = iou_preds.float()

        # Filters select rows with index tensors, one host sync each: the predicted-IoU
        # filter before upscaling (the masks it drops are never upsampled), then the
        # stability and crop-edge filters together (the boxes of masks the stability
        # filter drops are computed too: cheaper than a sync on a GPU, and per-mask, so
        # the kept records are the same).
        if p.pred_iou_thresh > 0.0:
            index = (iou_preds > p.pred_iou_thresh).nonzero()[:, 0]
            low_res, iou_preds, points = low_res[index], iou_preds[index], points[index]
        masks, stability = self._upscale(low_res, crop_size)
        boxes = batched_mask_to_box(masks)
        # A box touching a crop edge that is not an image edge is likely a cut-off object.
        height, width = image_size
        keep = ~is_box_near_crop_edge(boxes, crop_box, [0, 0, width, height])
        if p.stability_score_thresh > 0.0:
            keep &= stability >= p.stability_score_thresh
        index = keep.nonzero()[:, 0]
        masks, boxes, iou_preds, points, stability = (
            t[index] for t in (masks, boxes, iou_preds, points, stability)
        )

        runs = self._rle(uncrop_masks(masks, crop_box, height, width))
        return _Masks(
            runs,
            uncrop_boxes_xyxy(boxes, crop_box),
            iou_preds,
            stability,
            uncrop_points(points, crop_box),
            _rows_equal_to(crop_box, len(runs), boxes.device),
        )

    def _refine(
        self,
        context: DecoderContext,
        points: torch.Tensor,
        low_res: torch.Tensor,
        crop_size: tuple[int, int],
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """use_m2m: decode each mask's click again with the mask's (clamped) low-res
        logits as the mask prompt, single-mask output, as Meta's ``refine_with_m2m``."""
        coords = self.predictor.to_input_frame(points[:, None, :], crop_size, normalize=True)
        labels = torch.ones(coords.shape[:2], dtype=torch.int32, device=coords.device)
        mask_input = low_res.clamp(-LOW_RES_CLAMP, LOW_RES_CLAMP)[:, None]
        refined, iou_preds = [], []
        for batch in _batches(len(points), self.params.points_per_batch):
            logits, iou = self.predictor.decode_low_res(
                context, coords[batch], labels[batch], mask_input[batch], False
            )
            refined.append(logits[:, 0])
            iou_preds.append(iou[:, 0])
        return torch.cat(refined), torch.cat(iou_preds)

    def _upscale(
        self, low_res: torch.Tensor, crop_size: tuple[int, int]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Bool masks at crop size and their stability scores from (N, 256, 256) logits.

        Logits are upsampled straight to the crop size, as Meta does, one chunk at a time
        (the predictor's mask byte budget): only a chunk's float logits and the batch's
        bool masks are ever alive.
        """
        p = self.params
        masks, stability = [], []
        for _, logits in self.predictor.upscale_chunks(low_res, crop_size, return_logits=True):
            stability.append(
                calculate_stability_score(
                    logits, p.mask_threshold, p.stability_score_offset
                ).float()
            )
            masks.append(logits > p.mask_threshold)
        if not masks:
            device = low_res.device
            return (
                torch.zeros((0, *crop_size), dtype=torch.bool, device=device),
                torch.zeros(0, dtype=torch.float32, device=device),
            )
        return torch.cat(masks), torch.cat(stability)

    def _remove_small_regions(self, masks: _Masks) -> _Masks:
        """Fill holes, then drop islands, smaller than min_mask_region_area; then NMS with
        masks that needed no change preferred (SAM 1's ``postprocess_small_regions``)."""
        if not len(masks):
            return masks
        area = self.params.min_mask_region_area
        changed_rows, cleaned = [], []
        for row in range(len(masks)):
            mask, filled = remove_small_regions(
                rle_to_mask(masks.runs.rle(row)), area, mode="holes"
            )
            mask, dropped = remove_small_regions(mask, area, mode="islands")
            if filled or dropped:
                changed_rows.append(row)
                cleaned.append(mask)
        device = masks.boxes.device
        runs, boxes = masks.runs, masks.boxes.clone()
        unchanged = torch.ones(len(masks), dtype=torch.float32, device=device)
        if changed_rows:
            new_masks = torch.from_numpy(np.stack(cleaned)).to(device)
            rows = torch.tensor(changed_rows, dtype=torch.int64, device=device)
            boxes[rows] = batched_mask_to_box(new_masks)
            unchanged[rows] = 0.0
            # Row i of the result: the cleaned mask where it changed, else the old one.
            positions = np.arange(len(masks))
            positions[changed_rows] = len(masks) + np.arange(len(changed_rows))
            joined = Runs.concat([runs, masks_to_runs(new_masks)], runs.size)
            runs = joined.select(positions)
        nms_thresh = max(self.params.box_nms_thresh, self.params.crop_nms_thresh)
        keep = _nms(boxes, unchanged, nms_thresh)
        updated = dataclasses.replace(masks, runs=runs, boxes=boxes)
        return updated.select(keep)

    def _records(self, masks: _Masks) -> list[MaskRecord]:
        """Meta's record dicts; the per-mask tensors cross to the host here, once each.
        COCO strings and areas are made for all masks in one numpy pass each."""
        mode = self.params.output_mode
        if mode == "coco_rle":
            segmentations = masks.runs.coco()
        else:
            segmentations = [encode_mask(masks.runs.rle(i), mode) for i in range(len(masks))]
        areas = masks.runs.areas().tolist()
        # Meta moves everything to float32 numpy before writing records, so boxes and
        # crop boxes are lists of floats; the same values here. The fields cross to the
        # host as one float64 table (float32 values are exact in float64): one transfer.
        table = torch.cat(
            [
                box_xyxy_to_xywh(masks.boxes).float(),
                box_xyxy_to_xywh(masks.crop_boxes).float(),
                masks.points.float(),
                masks.iou_preds.float()[:, None],
                masks.stability_scores.float()[:, None],
            ],
            dim=1,
        )
        rows = table.double().cpu().tolist()
        return [
            MaskRecord(
                segmentation=segmentations[i],
                area=areas[i],
                bbox=row[0:4],
                predicted_iou=row[10],
                point_coords=[row[8:10]],
                stability_score=row[11],
                crop_box=row[4:8],
            )
            for i, row in enumerate(rows)
        ]


class _Ticker:
    """Counts finished decoder batches for the optional progress callback."""

    def __init__(self, progress: Progress | None, total: int) -> None:
        self.progress, self.total, self.done = progress, total, 0

    def tick(self) -> None:
        self.done += 1
        if self.progress is not None:
            self.progress(self.done, self.total)
