"""Stateless SAM2 image predictor: ``encode(images) -> Embedding``, then
``predict(embedding, prompts) -> Prediction`` with many prompts per decoder call.

Semantics follow Meta's ``SAM2ImagePredictor``: coordinates in the original image are
scaled to the 1024 input frame, a box is two corner points (labels 2 and 3) placed before
the clicks, a padding point is appended, ``multimask_output=False`` picks the single-mask
token unless it is unstable (dynamic multimask), masks are the logits upsampled to the
original size and thresholded at 0.0, and the returned low-res logits are clamped to +-32.

Nothing per request is stored on the Predictor, so one instance serves many threads.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import torch
import torch.nn.functional as F

from sam2serve.engine.image import load_image, preprocess
from sam2serve.engine.prompts import BOX_CORNER_LABELS, VALID_LABELS, PromptError
from sam2serve.engine.runtime_identity import RuntimeIdentity
from sam2serve.engine.tf32 import tf32_policy
from sam2serve.modeling.fast_mask_decoder import FastMaskDecoder, ImageSide
from sam2serve.modeling.sam2 import ImageFeatures, SAM2Image

LOW_RES_CLAMP = 32.0
# Prompts per decoder call: every prompt carries its own (4096 x 256) image keys after the
# first attention layer, ~25 MB of activations each in fp32, so chunks bound the memory.
DEFAULT_PROMPT_CHUNK = 64
# Bytes of full-resolution masks in flight while upsampling (float32 logits plus their
# bool masks): the upsampling runs in chunks of masks within this budget, however many
# prompts a call has and however large the image (one 36-megapixel mask is 180 MB).
DEFAULT_MASK_BYTES_BUDGET = 256 * 1024 * 1024
DECODERS = ("reference", "fast")
# Prompts an image needs before the fast decoder builds its per-image side (one product
# of the image keys with the decoder's stacked weights) for an embedding that has none.
# Once built, the side travels with the embedding, and every later decode of the image,
# a single click included, goes through the fast decoder.
FAST_DECODER_MIN_PROMPTS = 1
MULTIMASK_TOKENS = [1, 2, 3]
ALL_MASK_TOKENS = [0, 1, 2, 3]


class PromptDecoder(Protocol):
    """A prompt encoder + mask decoder that runs elsewhere (an ONNX Runtime session): for
    B prompts with points on ONE image, the low-res logits of all four mask tokens
    (B, 4, 256, 256) and their IoU (B, 4). The Predictor makes the multimask choice,
    filters and upsamples, as for its own decoders."""

    def __call__(
        self,
        image_embed: torch.Tensor,
        high_res_feats: tuple[torch.Tensor, torch.Tensor],
        coords: torch.Tensor,
        labels: torch.Tensor,
        mask_input: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor]: ...


@dataclass(frozen=True)
class Embedding:
    """The image side of SAM2 for a batch of images: a plain value, safe to cache and share."""

    image_embed: torch.Tensor  # (B, 256, 64, 64)
    high_res_feats: tuple[torch.Tensor, torch.Tensor]  # (B, 32, 256, 256), (B, 64, 128, 128)
    original_sizes: tuple[tuple[int, int], ...]  # (h, w) per image
    # Per-image work of the decoders that read this embedding (the fast decoder's image
    # side, keyed by the decoder), made on first use and kept with the value, so that a
    # click on a cached embedding costs only its own work. Not part of the value.
    derived: dict[Any, Any] = field(default_factory=dict, compare=False, repr=False)

    def __len__(self) -> int:
        return len(self.original_sizes)

    def __getitem__(self, index: int) -> Embedding:
        if not -len(self) <= index < len(self):
            raise IndexError(f"image index {index} out of range for a batch of {len(self)}")
        sl = slice(index, index + 1) if index != -1 else slice(-1, None)
        return Embedding(
            self.image_embed[sl],
            (self.high_res_feats[0][sl], self.high_res_feats[1][sl]),
            (self.original_sizes[index],),
        )

    @property
    def original_size(self) -> tuple[int, int]:
        if len(self) != 1:
            raise ValueError(f"this embedding holds {len(self)} images; index one first")
        return self.original_sizes[0]

    @property
    def nbytes(self) -> int:
        """Bytes held: the features and what the decoders derived from them."""
        tensors = (self.image_embed, *self.high_res_feats)
        own = sum(t.numel() * t.element_size() for t in tensors)
        derived: int = sum(side.nbytes for side in list(self.derived.values()))
        return own + derived


@dataclass(frozen=True)
class Prediction:
    """Masks for B prompts (objects) of one image, C candidates each (3 or 1)."""

    masks: torch.Tensor  # (B, C, H, W) bool, or float logits when return_logits
    iou_scores: torch.Tensor  # (B, C)
    low_res_logits: torch.Tensor  # (B, C, 256, 256), clamped to +-32

    def numpy(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        masks, iou_scores, low_res_logits = (
            t.float().cpu().numpy() if t.is_floating_point() else t.cpu().numpy()
            for t in (self.masks, self.iou_scores, self.low_res_logits)
        )
        return masks, iou_scores, low_res_logits


def _passing_rows(iou: torch.Tensor, min_iou: float | None) -> torch.Tensor:
    """Indices of the prompts with at least one mask whose IoU is above ``min_iou``."""
    if min_iou is None:
        return torch.arange(iou.shape[0], device=iou.device)
    return (iou > min_iou).any(dim=1).nonzero()[:, 0]


def _as_float_tensor(value: Any, name: str, device: torch.device) -> torch.Tensor:
    """``value`` as float32 on ``device``, checked finite. Host data (lists, arrays) is
    checked on the host and uploaded without a blocking copy; a tensor is checked where it
    is (on a device that is a host sync: the caller handed device data)."""
    if isinstance(value, torch.Tensor):
        tensor = value.to(device=device, dtype=torch.float32)
        if not torch.isfinite(tensor).all():
            raise PromptError(f"{name} contains NaN or infinite values")
        return tensor
    try:
        array = np.asarray(value, dtype=np.float32)
    except (TypeError, ValueError) as exc:
        raise PromptError(f"{name} must be numeric, got {value!r:.80}: {exc}") from None
    if not np.isfinite(array).all():
        raise PromptError(f"{name} contains NaN or infinite values")
    return torch.from_numpy(array).to(device, non_blocking=True)


def _bad_labels(point_labels: Any, labels: torch.Tensor) -> list[float]:
    """The values of ``labels`` that are no point label: looked up in the caller's host
    data when it is that (no host sync), else in the tensor."""
    if isinstance(point_labels, torch.Tensor):
        values = labels.unique().tolist()
    else:
        values = np.unique(np.asarray(point_labels, dtype=np.float32)).tolist()
    return [v for v in values if v not in VALID_LABELS]


@dataclass(frozen=True)
class DecoderContext:
    """What the decoder precomputes once per image (the fast decoder's image side); build
    it with :meth:`Predictor.decoder_context` and pass it to every decode of that image.

    The side is kept in the embedding (``Embedding.derived``), so every context of the
    same embedding value shares it; it is built on the first decode with at least
    ``fast_min_prompts`` prompts (or by :meth:`Predictor.encode`)."""

    embedding: Embedding
    fast_decoder: FastMaskDecoder | None = None
    prompt_encoder: Any = None
    fast_min_prompts: int = FAST_DECODER_MIN_PROMPTS

    @property
    def side(self) -> ImageSide:
        if self.fast_decoder is None:
            raise ValueError("this context has no fast decoder")
        side = self.embedding.derived.get(self.fast_decoder)
        if side is None:  # two threads may both build it: the same value, one is kept
            side = self.fast_decoder.prepare(
                self.embedding.image_embed,
                self.prompt_encoder.dense_positional_encoding(),
                self.prompt_encoder.no_mask_dense(),
                self.embedding.high_res_feats,
            )
            self.embedding.derived[self.fast_decoder] = side
        return side

    @property
    def has_side(self) -> bool:
        return self.fast_decoder in self.embedding.derived

    def use_fast(self, prompts: int) -> bool:
        """Whether ``prompts`` prompts (without mask inputs) go through the fast decoder."""
        if self.fast_decoder is None:
            return False
        return prompts >= self.fast_min_prompts or self.has_side


class Predictor:
    """Encode images and decode prompts with a :class:`SAM2Image`; holds no request state.

    ``decoder="fast"`` decodes prompts without a mask input through
    :class:`~sam2serve.modeling.fast_mask_decoder.FastMaskDecoder` (the same answers, ~3x fewer
    FLOPs; ``decoder_dtype`` bf16 for mode furious): its per-image side is built with the
    embedding (:meth:`encode`) or on the first decode of an image with at least
    ``fast_min_prompts`` prompts, then kept in the embedding; ``"reference"`` runs the
    module as Meta wrote it (batched, features broadcast).

    Everything that decides how it runs is given here, once: the image path
    (``image_encoder``), the decoders (``fast_decoder``, ``prompt_decoder``), ``runtime``
    (the ``sam2serve.runtime`` RuntimeSpec it was built for, carried for the surfaces that
    report it; None for a Predictor built by hand) and ``allow_tf32``: whether its CUDA
    fp32 work may run in TF32 where the process allows it; False (every mode but furious)
    keeps TF32 off for its calls whatever the process allows (:mod:`sam2serve.engine.tf32`).
    """

    def __init__(
        self,
        model: SAM2Image,
        mask_threshold: float = 0.0,
        prompt_chunk: int = DEFAULT_PROMPT_CHUNK,
        decoder: str = "reference",
        image_encoder: Callable[[torch.Tensor], ImageFeatures] | None = None,
        fast_min_prompts: int = FAST_DECODER_MIN_PROMPTS,
        decoder_dtype: torch.dtype = torch.float32,
        fast_decoder: FastMaskDecoder | None = None,
        mask_bytes_budget: int = DEFAULT_MASK_BYTES_BUDGET,
        prompt_decoder: PromptDecoder | None = None,
        *,
        runtime: RuntimeIdentity | None = None,
        allow_tf32: bool = False,
    ) -> None:
        if decoder not in DECODERS:
            raise ValueError(f"decoder must be one of {DECODERS}, got {decoder!r}")
        if fast_decoder is not None and decoder != "fast":
            raise ValueError(f"a fast decoder was given to a predictor with decoder {decoder!r}")
        if prompt_decoder is not None and decoder != "reference":
            raise ValueError("a prompt decoder replaces the model's: give decoder='reference'")
        self.model = model
        # The image path can run elsewhere (an ahead-of-time compiled artifact); by default
        # it is the model's own encode_image.
        self.image_encoder = model.encode_image if image_encoder is None else image_encoder
        self.mask_threshold = mask_threshold
        self.prompt_chunk = prompt_chunk
        self.decoder = decoder
        # The fast decoder can run elsewhere too (exported programs); by default it runs
        # eagerly on the model's mask decoder.
        if fast_decoder is None and decoder == "fast":
            fast_decoder = FastMaskDecoder(model.sam_mask_decoder, decoder_dtype)
        self.fast_decoder = fast_decoder
        # Prompts with points may be decoded elsewhere too (an ONNX Runtime session); a
        # mask input alone still runs the model's decoder.
        self.prompt_decoder = prompt_decoder
        self.fast_min_prompts = fast_min_prompts
        if mask_bytes_budget < 1:
            raise ValueError(f"mask_bytes_budget must be >= 1, got {mask_bytes_budget}")
        self.mask_bytes_budget = mask_bytes_budget
        self.runtime = runtime
        self.allow_tf32 = allow_tf32

    @property
    def device(self) -> torch.device:
        return self.model.device

    @property
    def dtype(self) -> torch.dtype:
        return self.model.no_mem_embed.dtype

    # ---------------------------------------------------------------- encode
    @torch.inference_mode()
    def encode(self, images: Any) -> Embedding:
        """One image (path, bytes, PIL image, HxWx3 array, or a uint8 HxWx3 tensor as the
        device decoder gives) or a list of them, in one call."""
        items = list(images) if isinstance(images, (list, tuple)) else [images]
        if not items:
            raise ValueError("encode() needs at least one image")
        arrays = [item if isinstance(item, torch.Tensor) else load_image(item) for item in items]
        batch = preprocess(arrays, self.model.image_size, device=self.device, dtype=self.dtype)
        return self.encode_preprocessed(batch, [a.shape[:2] for a in arrays])

    @torch.inference_mode()
    @tf32_policy
    def encode_preprocessed(
        self, batch: torch.Tensor, original_sizes: Sequence[tuple[int, int]]
    ) -> Embedding:
        """The embedding of preprocessed images; one image's comes with the fast decoder's
        image side, so that its first click does not wait for it."""
        features = self.image_encoder(batch)
        sizes = tuple((int(h), int(w)) for h, w in original_sizes)
        embedding = Embedding(features.image_embed, features.high_res_feats, sizes)
        if self.fast_decoder is not None and len(embedding) == 1:
            _ = self.decoder_context(embedding).side
        return embedding

    # ---------------------------------------------------------------- predict
    @torch.inference_mode()
    def predict(
        self,
        embedding: Embedding,
        point_coords: Any = None,
        point_labels: Any = None,
        boxes: Any = None,
        mask_input: Any = None,
        multimask_output: bool = True,
        return_logits: bool = False,
        normalize_coords: bool = True,
    ) -> Prediction:
        """Masks for one image's prompts, all of them batched through the decoder.

        point_coords (N, 2) for one object or (B, N, 2) for B objects, (x, y) in pixels of
        the original image (or in [0, 1] with ``normalize_coords=False`` meaning "already
        in the 1024 frame" as in Meta's predictor); point_labels (N,) / (B, N): 1 foreground,
        0 background; boxes (4,) or (B, 4) XYXY; mask_input (1, 256, 256) or (B, 1, 256, 256)
        low-res logits of a previous prediction.
        """
        low_res, iou = self.predict_low_res(
            embedding,
            point_coords,
            point_labels,
            boxes,
            mask_input,
            multimask_output,
            normalize_coords,
        )
        masks = self.upscale(low_res, embedding.original_size, return_logits)
        return Prediction(masks, iou, low_res.clamp(-LOW_RES_CLAMP, LOW_RES_CLAMP))

    @torch.inference_mode()
    def predict_low_res(
        self,
        embedding: Embedding,
        point_coords: Any = None,
        point_labels: Any = None,
        boxes: Any = None,
        mask_input: Any = None,
        multimask_output: bool = True,
        normalize_coords: bool = True,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`predict` up to the low-res logits (B, C, 256, 256), not clamped, and the
        IoU (B, C): for callers that upsample chunk by chunk (:meth:`upscale_chunks`)."""
        coords, labels = self.prepare_prompts(
            embedding.original_size, point_coords, point_labels, boxes, normalize_coords
        )
        masks_in = self.prepare_mask_input(mask_input, coords)
        return self.decode_low_res(embedding, coords, labels, masks_in, multimask_output)

    def decoder_context(self, embedding: Embedding) -> DecoderContext:
        """Per-image decoder state for ``embedding`` (one image); cheap in reference mode."""
        if len(embedding) != 1:
            raise ValueError(f"predict() takes the embedding of one image, got {len(embedding)}")
        return DecoderContext(
            embedding, self.fast_decoder, self.model.sam_prompt_encoder, self.fast_min_prompts
        )

    def decode_low_res(
        self,
        embedding: Embedding | DecoderContext,
        coords: torch.Tensor | None,
        labels: torch.Tensor | None,
        mask_input: torch.Tensor | None,
        multimask_output: bool,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Low-res logits (B, C, 256, 256) and IoU (B, C) for prompts in the 1024 frame,
        decoded in chunks of ``prompt_chunk`` prompts."""
        logits, iou, _ = self.decode_low_res_filtered(
            embedding, coords, labels, mask_input, multimask_output, min_iou=None
        )
        return logits, iou

    @torch.inference_mode()
    @tf32_policy
    def decode_low_res_filtered(
        self,
        embedding: Embedding | DecoderContext,
        coords: torch.Tensor | None,
        labels: torch.Tensor | None,
        mask_input: torch.Tensor | None,
        multimask_output: bool,
        min_iou: float | None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Like :meth:`decode_low_res`, but only the prompts with at least one returned mask
        whose predicted IoU exceeds ``min_iou`` get logits (the fast decoder then skips
        the upscaling of the others altogether). Returns (logits of the kept prompts,
        IoU of ALL prompts, indices of the kept prompts)."""
        if isinstance(embedding, DecoderContext):
            context = embedding
        else:
            context = self.decoder_context(embedding)
        if coords is not None:
            total = coords.shape[0]
        else:
            assert mask_input is not None, "a decode needs points or a mask input"
            total = mask_input.shape[0]
        # One mask input may serve every prompt; otherwise it is sliced with them.
        shared_mask = mask_input is not None and mask_input.shape[0] == 1
        fast = mask_input is None and context.use_fast(total)
        logits, ious, kept = [], [], []
        for start in range(0, total, self.prompt_chunk):
            chunk = slice(start, start + self.prompt_chunk)
            chunk_masks = mask_input if mask_input is None or shared_mask else mask_input[chunk]
            if fast:
                assert coords is not None and labels is not None  # fast: points, no mask input
                low, iou, rows = self._decode_fast(
                    context.side, coords[chunk], labels[chunk], multimask_output, min_iou
                )
            elif self.prompt_decoder is not None and coords is not None:
                assert labels is not None  # given with the points
                low, iou, rows = self._decode_external(
                    context.embedding,
                    coords[chunk],
                    labels[chunk],
                    chunk_masks,
                    multimask_output,
                    min_iou,
                )
            else:
                out = self.model.decode_masks(
                    context.embedding.image_embed,
                    context.embedding.high_res_feats,
                    None if coords is None else coords[chunk],
                    None if labels is None else labels[chunk],
                    chunk_masks,
                    multimask_output,
                )
                low, iou = out.low_res_logits, out.iou_scores
                rows = _passing_rows(iou, min_iou)
                low = low if min_iou is None else low[rows]
            logits.append(low)
            ious.append(iou)
            kept.append(rows + start)
        if len(logits) == 1:
            return logits[0], ious[0], kept[0]
        return torch.cat(logits), torch.cat(ious), torch.cat(kept)

    def _decode_fast(
        self,
        side: ImageSide,
        coords: torch.Tensor,
        labels: torch.Tensor,
        multimask_output: bool,
        min_iou: float | None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        sparse = self.model.sam_prompt_encoder.embed_points(coords, labels)
        decoder = self.model.sam_mask_decoder
        fast_decoder = self.fast_decoder
        assert fast_decoder is not None  # decoder "fast" always has one
        if multimask_output:
            keep = None if min_iou is None else lambda iou: _passing_rows(iou[:, 1:], min_iou)
            low, iou, rows = fast_decoder.forward(side, sparse, MULTIMASK_TOKENS, keep)
            return low, iou[:, 1:], rows
        # Single mask: all four tokens, then the dynamic multimask choice as in the decoder.
        low, iou, rows = fast_decoder.forward(side, sparse, ALL_MASK_TOKENS)
        low, iou = decoder.select_single_mask(low, iou)
        if min_iou is not None:
            rows = _passing_rows(iou, min_iou)
            low = low[rows]
        return low, iou, rows

    def _decode_external(
        self,
        embedding: Embedding,
        coords: torch.Tensor,
        labels: torch.Tensor,
        mask_input: torch.Tensor | None,
        multimask_output: bool,
        min_iou: float | None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        assert self.prompt_decoder is not None
        low, iou = self.prompt_decoder(
            embedding.image_embed, embedding.high_res_feats, coords, labels, mask_input
        )
        if multimask_output:
            low, iou = low[:, 1:], iou[:, 1:]
        else:
            low, iou = self.model.sam_mask_decoder.select_single_mask(low, iou)
        rows = _passing_rows(iou, min_iou)
        return (low if min_iou is None else low[rows]), iou, rows

    def upscale(
        self, low_res: torch.Tensor, size: tuple[int, int], return_logits: bool = False
    ) -> torch.Tensor:
        """Bilinear upsampling of (B, C, h, w) low-res logits straight to the original size;
        thresholded unless ``return_logits``. Done in chunks within ``mask_bytes_budget``,
        so only the bool masks stay in memory (see :meth:`upscale_chunks` to bound those
        too)."""
        batch, candidates = low_res.shape[:2]
        parts = [
            part for _, part in self.upscale_chunks(low_res.flatten(0, 1), size, return_logits)
        ]
        if not parts:  # no masks: an empty batch of the right shape
            dtype = low_res.dtype if return_logits else torch.bool
            return low_res.new_zeros((batch, candidates, *size), dtype=dtype)
        masks = parts[0] if len(parts) == 1 else torch.cat(parts)
        return masks.view(batch, candidates, *size)

    def masks_per_chunk(self, size: tuple[int, int]) -> int:
        """How many full-size masks one chunk may hold: float32 logits + bool masks."""
        height, width = size
        return max(1, self.mask_bytes_budget // (height * width * 5))

    def upscale_chunks(
        self, low_res: torch.Tensor, size: tuple[int, int], return_logits: bool = False
    ) -> Iterator[tuple[int, torch.Tensor]]:
        """(start, (n, H, W) masks) for (N, h, w) low-res logits, chunk by chunk within
        ``mask_bytes_budget``: bool masks, or float32 logits with ``return_logits``."""
        step = self.masks_per_chunk(size)
        for start in range(0, low_res.shape[0], step):
            up = F.interpolate(
                low_res[start : start + step, None].float(),
                size,
                mode="bilinear",
                align_corners=False,
            )[:, 0]
            yield start, (up if return_logits else up > self.mask_threshold)

    # ---------------------------------------------------------------- prompts
    def prepare_prompts(
        self,
        size: tuple[int, int],
        point_coords: Any,
        point_labels: Any,
        boxes: Any,
        normalize_coords: bool,
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """Validate prompts and merge boxes and points into (B, N, 2) coords in the 1024
        frame and (B, N) int labels, box corners first."""
        device = self.device
        coords = labels = None
        if point_coords is not None or point_labels is not None:
            if point_coords is None or point_labels is None:
                raise PromptError("point_coords and point_labels must be given together")
            coords = _as_float_tensor(point_coords, "point_coords", device)
            labels_f = _as_float_tensor(point_labels, "point_labels", device)
            if coords.ndim == 2:
                coords, labels_f = coords[None], labels_f[None]
            if coords.ndim != 3 or coords.shape[-1] != 2 or coords.shape[1] == 0:
                raise PromptError(
                    f"point_coords must have shape (N, 2) or (B, N, 2) with N >= 1, "
                    f"got {tuple(coords.shape)}"
                )
            if labels_f.shape != coords.shape[:2]:
                raise PromptError(
                    f"point_labels shape {tuple(labels_f.shape)} does not match point_coords "
                    f"{tuple(coords.shape)}: expected {tuple(coords.shape[:2])}"
                )
            bad = _bad_labels(point_labels, labels_f)
            if bad:
                raise PromptError(
                    f"point_labels must be 1 (foreground) or 0 (background) (or -1, 2, 3), "
                    f"got {bad}"
                )
            coords = self.to_input_frame(coords, size, normalize_coords)
            labels = labels_f.to(torch.int32)
        if boxes is not None:
            box = _as_float_tensor(boxes, "boxes", device)
            if box.ndim == 1:
                box = box[None]
            if box.ndim != 2 or box.shape[-1] != 4:
                raise PromptError(
                    f"boxes must have shape (4,) or (B, 4) as [x0, y0, x1, y1], "
                    f"got {tuple(box.shape)}"
                )
            corners = self.to_input_frame(box.reshape(-1, 2, 2), size, normalize_coords)
            # A box's corner labels, made on the device: no host copy (a sync).
            first, last = BOX_CORNER_LABELS
            corner_labels = torch.arange(first, last + 1, dtype=torch.int32, device=device)
            corner_labels = corner_labels.expand(corners.shape[0], 2)
            if coords is None:
                coords, labels = corners, corner_labels
            else:
                if corners.shape[0] != coords.shape[0]:
                    raise PromptError(
                        f"{corners.shape[0]} boxes but {coords.shape[0]} point groups: "
                        "give one box per point group"
                    )
                assert labels is not None  # given with the points
                coords = torch.cat([corners, coords], dim=1)
                labels = torch.cat([corner_labels, labels], dim=1)
        return coords, labels

    def to_input_frame(
        self, coords: torch.Tensor, size: tuple[int, int], normalize: bool
    ) -> torch.Tensor:
        coords = coords.clone()
        if normalize:
            h, w = size
            coords[..., 0] = coords[..., 0] / w
            coords[..., 1] = coords[..., 1] / h
        return coords * self.model.image_size

    def prepare_mask_input(
        self, mask_input: Any, coords: torch.Tensor | None
    ) -> torch.Tensor | None:
        if mask_input is None:
            if coords is None:
                raise PromptError("give at least one prompt: points, a box or a mask_input")
            return None
        masks = _as_float_tensor(mask_input, "mask_input", self.device)
        if masks.ndim == 3:
            masks = masks[None]
        side = 4 * self.model.config.embedding_size
        if masks.ndim != 4 or masks.shape[1:] != (1, side, side):
            raise PromptError(
                f"mask_input must have shape (1, {side}, {side}) or (B, 1, {side}, {side}) "
                f"(the low_res_logits of a previous prediction), got {tuple(masks.shape)}"
            )
        if coords is not None and masks.shape[0] not in (1, coords.shape[0]):
            raise PromptError(
                f"{masks.shape[0]} mask inputs for {coords.shape[0]} prompts: give one per "
                "prompt or one for all"
            )
        return masks.to(self.dtype)
