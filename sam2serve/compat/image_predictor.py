"""Meta's ``SAM2ImagePredictor`` API on the stateless engine.

``set_image`` / ``set_image_batch`` encode and keep the embedding on this object;
``predict`` / ``predict_batch`` decode prompts against it and return numpy arrays with
Meta's shapes and dtypes. The state lives here, in the compatible object, because that
is Meta's API; the engine Predictor underneath holds none, so one engine (one model) can
serve many compatible predictors, and :attr:`SAM2ImagePredictor.embedding` hands the
current embedding to the stateless API (``engine.predict(embedding, ...)``), while
:meth:`SAM2ImagePredictor.set_embedding` takes one from it (or from a cache).

Meta's behaviour kept on purpose: masks come back as float32 0/1 arrays (or logits with
``return_logits``), squeezed when there is one prompt (``(C, H, W)``, else
``(B, C, H, W)``); low-res logits are clamped to +-32; ``predict`` after
``set_image_batch`` answers for the last image of the batch. Differences: a prompt the
model cannot take (a bad label, mismatched shapes, no prompt at all) raises a
``PromptError`` naming it instead of an assertion or an accidental answer; holes and
sprinkles (``max_hole_area``, ``max_sprinkle_area``) are removed on every device (Meta's
CUDA kernel skips them, with a warning, where it cannot run).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from sam2serve.compat.build import engine_predictor, load_predictor
from sam2serve.engine.predictor import LOW_RES_CLAMP, Embedding, Predictor

__all__ = ["SAM2ImagePredictor", "remove_holes_and_sprinkles"]

_NO_IMAGE = "An image must be set with .set_image(...) before mask prediction."
_NO_BATCH = "An image batch must be set with .set_image_batch(...) before predict_batch."
# Logits written into filled holes and removed sprinkles, as in Meta's post-processing.
_FILL_LOGIT = 10.0


def _small_components(masks: np.ndarray, max_area: float) -> np.ndarray:
    """Pixels of 8-connected components of at most ``max_area`` pixels, per (h, w) mask."""
    from scipy import ndimage

    small = np.zeros_like(masks)
    structure = np.ones((3, 3), dtype=bool)
    for index, mask in enumerate(masks):
        labels, count = ndimage.label(mask, structure=structure)
        if count == 0:
            continue
        areas = np.bincount(labels.ravel())
        areas[0] = 0  # not a component
        small[index] = (labels > 0) & (areas[labels] <= max_area)
    return small


def remove_holes_and_sprinkles(
    low_res: torch.Tensor, threshold: float, max_hole_area: float, max_sprinkle_area: float
) -> torch.Tensor:
    """Meta's ``SAM2Transforms.postprocess_masks`` clean-up of (B, C, h, w) low-res logits:
    background components of at most ``max_hole_area`` pixels become foreground (logit
    ``threshold + 10``), then foreground components of at most ``max_sprinkle_area``
    pixels (found in the logits as they were) become background (``threshold - 10``)."""
    if max_hole_area <= 0 and max_sprinkle_area <= 0:
        return low_res
    logits = low_res.float()
    flat = logits.flatten(0, 1).cpu().numpy()
    if max_hole_area > 0:
        holes = _small_components(flat <= threshold, max_hole_area)
        holes_t = torch.from_numpy(holes).to(logits.device).view_as(logits)
        logits = torch.where(holes_t, torch.full_like(logits, threshold + _FILL_LOGIT), logits)
    if max_sprinkle_area > 0:
        sprinkles = _small_components(flat > threshold, max_sprinkle_area)
        sprinkles_t = torch.from_numpy(sprinkles).to(logits.device).view_as(logits)
        logits = torch.where(sprinkles_t, torch.full_like(logits, threshold - _FILL_LOGIT), logits)
    return logits


def _numpy(tensor: torch.Tensor) -> np.ndarray:
    """Meta's ``.squeeze(0).float().cpu().numpy()``."""
    return tensor.squeeze(0).float().cpu().numpy()


class SAM2ImagePredictor:
    """Drop-in for ``sam2.sam2_image_predictor.SAM2ImagePredictor``.

    ``SAM2ImagePredictor(model)`` takes one of our models (``build_sam2``,
    ``sam2serve.load_model``), an engine ``Predictor`` (shared, never changed) or another
    compatible predictor; ``SAM2ImagePredictor.from_pretrained("tiny")`` loads one.
    """

    def __init__(
        self,
        sam_model: Any,
        mask_threshold: float = 0.0,
        max_hole_area: float = 0.0,
        max_sprinkle_area: float = 0.0,
        **kwargs: Any,
    ) -> None:
        if kwargs:
            raise TypeError(
                f"SAM2ImagePredictor got unexpected arguments: {', '.join(sorted(kwargs))}"
            )
        self.engine: Predictor = engine_predictor(sam_model)
        self.model = self.engine.model
        self.mask_threshold = float(mask_threshold)
        self.max_hole_area = max_hole_area
        self.max_sprinkle_area = max_sprinkle_area
        self.reset_predictor()

    @classmethod
    def from_pretrained(
        cls,
        model_id: str = "tiny",
        *,
        checkpoint: str | None = None,
        random_weights: bool = False,
        seed: int = 0,
        device: str | None = None,
        mode: str = "fast",
        backend: str = "eager",
        **kwargs: Any,
    ) -> SAM2ImagePredictor:
        """A predictor for ``model_id``: a size (``"tiny"``), a SAM 2.1 Hugging Face id
        (``"facebook/sam2.1-hiera-tiny"``) or one of Meta's config files; with its official
        checkpoint (cache or download), a given ``checkpoint`` or seeded random weights,
        on ``device`` (default: CUDA if there is a GPU) in ``mode`` (baseline, fast,
        furious). ``kwargs`` go to the constructor (``mask_threshold``, ...)."""
        engine = load_predictor(
            model_id,
            checkpoint=checkpoint,
            random_weights=random_weights,
            seed=seed,
            device=device,
            mode=mode,
            backend=backend,
        )
        return cls(engine, **kwargs)

    # ---------------------------------------------------------------- state
    @property
    def device(self) -> torch.device:
        return self.engine.device

    @property
    def embedding(self) -> Embedding:
        """The current image(s)' embedding, for the stateless API."""
        if self._embedding is None:
            raise RuntimeError(_NO_IMAGE)
        return self._embedding

    @property
    def _features(self) -> dict[str, Any] | None:
        """Meta's feature dict (image_embed with no_mem_embed added, high_res_feats)."""
        if self._embedding is None:
            return None
        return {
            "image_embed": self._embedding.image_embed,
            "high_res_feats": list(self._embedding.high_res_feats),
        }

    def reset_predictor(self) -> None:
        """Forget the image(s): Meta's state variables back to their start."""
        self._embedding: Embedding | None = None
        self._orig_hw: list[tuple[int, int]] | None = None
        self._is_image_set = False
        self._is_batch = False

    def set_image(self, image: Any) -> None:
        """Encode one image: an (H, W, 3) uint8 RGB array or a PIL image (also a path or
        encoded bytes)."""
        self.reset_predictor()
        self._set(self.engine.encode(image), batch=False)

    def set_image_batch(self, image_list: list[Any]) -> None:
        """Encode a list of images in one encoder call, for :meth:`predict_batch`."""
        if not isinstance(image_list, list) or not image_list:
            raise TypeError(
                f"image_list must be a non-empty list of images, got {type(image_list).__name__}"
            )
        self.reset_predictor()
        self._set(self.engine.encode(image_list), batch=True)

    def set_embedding(self, embedding: Embedding) -> None:
        """Use an embedding computed elsewhere (``engine.encode``, a cache): one image
        acts as :meth:`set_image`, several as :meth:`set_image_batch`. Not in Meta's API."""
        if not isinstance(embedding, Embedding):
            raise TypeError(f"expected an Embedding, got {type(embedding).__name__}")
        self.reset_predictor()
        self._set(embedding, batch=len(embedding) > 1)

    def _set(self, embedding: Embedding, batch: bool) -> None:
        self._embedding = embedding
        self._orig_hw = list(embedding.original_sizes)
        self._is_image_set = True
        self._is_batch = batch

    def get_image_embedding(self) -> torch.Tensor:
        """The image embedding(s), (B, 256, 64, 64): a torch tensor, as Meta's."""
        if self._embedding is None:
            raise RuntimeError(
                "An image must be set with .set_image(...) to generate an embedding."
            )
        return self._embedding.image_embed

    # ---------------------------------------------------------------- predict
    def predict(
        self,
        point_coords: Any = None,
        point_labels: Any = None,
        box: Any = None,
        mask_input: Any = None,
        multimask_output: bool = True,
        return_logits: bool = False,
        normalize_coords: bool = True,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Masks for prompts on the current image: (masks, iou_predictions,
        low_res_masks), shaped (C, H, W), (C,), (C, 256, 256) for one prompt and with a
        leading B for B prompts. Coordinates in pixels (or in [0, 1] with
        ``normalize_coords=False``); ``box`` XYXY; ``mask_input`` a previous prediction's
        low-res logits (1, 256, 256) or (B, 1, 256, 256)."""
        if self._embedding is None:
            raise RuntimeError(_NO_IMAGE)
        return self._predict_image(
            -1,  # Meta's img_idx: after set_image_batch, the last image
            point_coords,
            point_labels,
            box,
            mask_input,
            multimask_output,
            return_logits,
            normalize_coords,
        )

    def predict_batch(
        self,
        point_coords_batch: list[Any] | None = None,
        point_labels_batch: list[Any] | None = None,
        box_batch: list[Any] | None = None,
        mask_input_batch: list[Any] | None = None,
        multimask_output: bool = True,
        return_logits: bool = False,
        normalize_coords: bool = True,
    ) -> tuple[list[np.ndarray], list[np.ndarray], list[np.ndarray]]:
        """:meth:`predict` for every image of :meth:`set_image_batch`, the i-th prompts
        of each list for the i-th image; lists of masks, IoU predictions and logits."""
        if self._embedding is None or not self._is_batch:
            raise RuntimeError(_NO_BATCH)
        masks, ious, low_res = [], [], []
        for index in range(len(self._embedding)):

            def pick(values: list[Any] | None, i: int = index) -> Any:
                return None if values is None else values[i]

            out = self._predict_image(
                index,
                pick(point_coords_batch),
                pick(point_labels_batch),
                pick(box_batch),
                pick(mask_input_batch),
                multimask_output,
                return_logits,
                normalize_coords,
            )
            masks.append(out[0])
            ious.append(out[1])
            low_res.append(out[2])
        return masks, ious, low_res

    @torch.inference_mode()
    def _predict_image(
        self,
        index: int,
        point_coords: Any,
        point_labels: Any,
        box: Any,
        mask_input: Any,
        multimask_output: bool,
        return_logits: bool,
        normalize_coords: bool,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        assert self._embedding is not None
        embedding = self._embedding[index]
        low_res, iou = self.engine.predict_low_res(
            embedding,
            point_coords,
            point_labels,
            box,
            mask_input,
            multimask_output,
            normalize_coords,
        )
        cleaned = remove_holes_and_sprinkles(
            low_res, self.mask_threshold, self.max_hole_area, self.max_sprinkle_area
        )
        masks = self.engine.upscale(cleaned, embedding.original_size, return_logits=True)
        if not return_logits:
            masks = masks > self.mask_threshold
        low_res = low_res.clamp(-LOW_RES_CLAMP, LOW_RES_CLAMP)
        return _numpy(masks), _numpy(iou), _numpy(low_res)
