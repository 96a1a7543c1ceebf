"""Concept segmentation: images x noun phrases (+ exemplar boxes) -> every instance.

Stateless per call. Each image is encoded once; all its phrases run through the detector as
one batch over that encoding (the vision features are expanded, not recomputed). The
post-processing is Meta's (``sam3.model.sam3_image_processor.Sam3Processor``):
score = sigmoid(class logit) * sigmoid(presence logit), kept when > ``score_thresh``; boxes
scaled to the image; mask logits resized bilinearly to the image, sigmoid, > 0.5.
"""

from __future__ import annotations

import platform
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from sam2serve.concepts.phrases import META_SCORE_THRESH, VISUAL_PHRASE
from sam2serve.engine.predictor import Embedding

if TYPE_CHECKING:
    from transformers import Sam3Model
    from transformers.modeling_outputs import BaseModelOutputWithPooling
    from transformers.models.sam3.modeling_sam3 import (
        Sam3ImageSegmentationOutput,
        Sam3VisionEncoderOutput,
    )

    from sam2serve.concepts.tracker_heads import TrackerHeads

CONTEXT_LENGTH = 32  # Meta's VETextEncoder context
DEFAULT_SCORE_THRESH = META_SCORE_THRESH  # Meta's Sam3Processor confidence_threshold
PADDING = -10  # transformers' label for a padding exemplar box


@dataclass(frozen=True)
class ExemplarBox:
    xyxy: tuple[float, float, float, float]  # image pixels
    positive: bool = True


@dataclass(frozen=True)
class Instance:
    mask: np.ndarray  # bool (H, W)
    box: tuple[float, float, float, float]  # xyxy, image pixels
    score: float


Tokenize = Callable[[str], list[int]]  # phrase -> ids with start and end tokens
# What encode_text gives the detector: (ids, attention mask, the text encoder's output).
TextEncoding = tuple[Tensor, Tensor, "BaseModelOutputWithPooling"]


def module_dtype(module: torch.nn.Module) -> torch.dtype:
    """The dtype ``module`` computes in: that of its first floating parameter (a mode may
    run the parts of the model in different precisions: :mod:`sam2serve.runtime.concepts`)."""
    for parameter in module.parameters():
        if parameter.is_floating_point():
            return parameter.dtype
    return torch.float32


def token_batch(tokenize: Tokenize, phrases: Sequence[str]) -> tuple[Tensor, Tensor]:
    """Meta's rule: [start] + tokens + [end], cut to 32 with the end token kept, padded with 0;
    the attention mask is ``ids != 0``."""
    ids = torch.zeros((len(phrases), CONTEXT_LENGTH), dtype=torch.long)
    for row, phrase in enumerate(phrases):
        tokens = tokenize(phrase)
        if len(tokens) > CONTEXT_LENGTH:
            tokens = tokens[: CONTEXT_LENGTH - 1] + [tokens[-1]]
        ids[row, : len(tokens)] = torch.tensor(tokens)
    return ids, (ids != 0).long()


def meta_resizes_uint8(device: torch.device | str) -> bool:
    """Whether Meta's processor resizes the uint8 image with torch's uint8 kernel on
    ``device``. Its ``v2.Resize`` (torchvision 0.28's ``resize_image``) does so on the CPU
    only, and there only where torch's CPU capability is ``AVX2`` or ``AVX512`` or the
    machine is ARM (``_do_native_uint8_resize_on_cpu``): elsewhere (an x86 CPU without
    AVX2, CUDA, which has no uint8 antialiased kernel) it resizes in float32 and rounds
    back to uint8. The two differ by one level in up to a fifth of the resized values."""
    if torch.device(device).type != "cpu":
        return False
    capability = torch.backends.cpu.get_cpu_capability()
    return capability in ("AVX2", "AVX512") or platform.machine() in ("aarch64", "arm64")


def _resize(chw: Tensor, size: int) -> Tensor:
    """uint8 (1, 3, H, W) -> uint8 (1, 3, size, size), bilinear, antialiased, on its device,
    as Meta's processor resizes on that device (:func:`meta_resizes_uint8`)."""
    if meta_resizes_uint8(chw.device):
        return F.interpolate(
            chw, size=(size, size), mode="bilinear", align_corners=False, antialias=True
        )
    resized = F.interpolate(
        chw.float(), size=(size, size), mode="bilinear", align_corners=False, antialias=True
    )
    return resized.round_().to(torch.uint8)


def preprocess(
    images: Sequence[np.ndarray], size: int, device: torch.device | str = "cpu"
) -> Tensor:
    """uint8 RGB (H, W, 3) images -> (B, 3, size, size) in [-1, 1] on ``device``, as Meta's
    processor makes them on that device: resized bilinearly with antialiasing
    (:func:`_resize`), then ``x * (1 / 255)``, then ``(x - 0.5) / 0.5``, in float32. Each
    image crosses to the device as uint8 and is resized and normalised there."""
    out = []
    for image in images:
        host = torch.from_numpy(np.ascontiguousarray(image.transpose(2, 0, 1)))[None]
        chw = host.to(device, non_blocking=True)
        if tuple(chw.shape[-2:]) != (size, size):
            chw = _resize(chw, size)
        out.append((chw.float().mul_(1.0 / 255.0) - 0.5) / 0.5)
    return torch.cat(out)


def _boxes_tensor(boxes: Sequence[ExemplarBox], width: int, height: int) -> tuple[Tensor, Tensor]:
    """Exemplars -> normalized (cx, cy, w, h) (1, K, 4) and labels (1, K) (1 positive)."""
    rows = []
    for box in boxes:
        x1, y1, x2, y2 = box.xyxy
        rows.append(
            [(x1 + x2) / 2 / width, (y1 + y2) / 2 / height, (x2 - x1) / width, (y2 - y1) / height]
        )
    labels = [1 if b.positive else 0 for b in boxes]
    return torch.tensor([rows], dtype=torch.float32), torch.tensor([labels], dtype=torch.long)


@dataclass(frozen=True)
class ConceptEncoding:
    """One image's SAM 3 vision features (batch of one, on the model's device) and its
    size: what the detector needs to answer any phrase on that image, cacheable. With the
    tracker heads loaded, ``tracker`` is the image side of SAM 3's interactive path (the
    sam2 neck's levels, projected: :mod:`sam2serve.concepts.interactive`), made by the
    same backbone pass."""

    fpn_hidden_states: tuple[Tensor, ...]
    fpn_position_encoding: tuple[Tensor, ...]
    height: int
    width: int
    tracker: Embedding | None = None

    @property
    def nbytes(self) -> int:
        tensors = (*self.fpn_hidden_states, *self.fpn_position_encoding)
        own = sum(t.numel() * t.element_size() for t in tensors)
        return own + (self.tracker.nbytes if self.tracker is not None else 0)

    def owned(self) -> ConceptEncoding:
        """A copy owning its tensors (a batch's encodings are views of the batch's)."""
        tracker = self.tracker
        if tracker is not None:
            tracker = Embedding(
                tracker.image_embed.clone(),
                (tracker.high_res_feats[0].clone(), tracker.high_res_feats[1].clone()),
                tracker.original_sizes,
            )
        return ConceptEncoding(
            tuple(t.clone() for t in self.fpn_hidden_states),
            tuple(t.clone() for t in self.fpn_position_encoding),
            self.height,
            self.width,
            tracker,
        )

    def expanded(self, count: int) -> Sam3VisionEncoderOutput:
        """transformers' vision output for ``count`` prompts over this image (views)."""
        from transformers.models.sam3.modeling_sam3 import Sam3VisionEncoderOutput

        def grow(tensors: tuple[Tensor, ...]) -> tuple[Tensor, ...]:
            return tuple(t.expand(count, *t.shape[1:]) for t in tensors)

        return Sam3VisionEncoderOutput(
            fpn_hidden_states=grow(self.fpn_hidden_states),
            fpn_position_encoding=grow(self.fpn_position_encoding),
        )


def postprocess(
    outputs: Sam3ImageSegmentationOutput,
    height: int,
    width: int,
    score_thresh: float,
    max_instances: int | None = None,
) -> list[list[Instance]]:
    """Meta's Sam3Processor._forward_grounding rule, per prompt of the batch (on the
    outputs' device; each prompt's kept masks, boxes and scores cross to the host once).
    ``max_instances``: keep only that many per prompt, highest scores first, before any
    mask is upsampled (a service's bound on memory; None: Meta's, every query above the
    threshold in query order)."""
    assert outputs.pred_logits is not None and outputs.presence_logits is not None
    assert outputs.pred_boxes is not None and outputs.pred_masks is not None
    # fp32 from here on, whatever the detector computed in (a bf16 sigmoid keeps ~3 digits).
    probs = outputs.pred_logits.float().sigmoid() * outputs.presence_logits.float().sigmoid()
    device = probs.device
    scale = torch.tensor([width, height, width, height], dtype=torch.float32, device=device)
    result = []
    for row in range(probs.shape[0]):
        keep = probs[row] > score_thresh
        if max_instances is not None:
            ranked = torch.where(keep, probs[row], -1.0).argsort(descending=True, stable=True)
            keep = ranked[: min(max_instances, int(keep.sum()))]
        scores = probs[row][keep]
        boxes = outputs.pred_boxes[row][keep].float() * scale
        logits = outputs.pred_masks[row][keep].float()
        if len(scores):
            masks = (
                F.interpolate(
                    logits[:, None], (height, width), mode="bilinear", align_corners=False
                ).sigmoid()[:, 0]
                > 0.5
            )
        else:
            masks = torch.zeros((0, height, width), dtype=torch.bool, device=device)
        host_masks, host_boxes = masks.cpu().numpy(), boxes.cpu().tolist()
        host_scores = scores.cpu().tolist()
        result.append(
            [
                Instance(mask=m, box=(b[0], b[1], b[2], b[3]), score=float(sc))
                for m, b, sc in zip(host_masks, host_boxes, host_scores, strict=True)
            ]
        )
    return result


def _check_images(images: Sequence[np.ndarray]) -> None:
    for image in images:
        if image.ndim != 3 or image.shape[2] != 3 or image.dtype != np.uint8:
            raise ValueError(f"images must be uint8 (H, W, 3); got {image.dtype} {image.shape}")


@torch.inference_mode()
def encode_images(
    model: Sam3Model, images: Sequence[np.ndarray], tracker: TrackerHeads | None = None
) -> list[ConceptEncoding]:
    """Every image through the vision backbone in one batch; one encoding per image. With
    ``tracker``, each encoding also holds the interactive path's image side, from the same
    ViT pass through the sam2 neck."""
    _check_images(images)
    if not images:
        return []
    vision = model.get_vision_features(pixel_values=model_pixels(model, images))
    encodings = split_encodings(vision, images)
    if tracker is None:
        return encodings
    sizes = tuple((e.height, e.width) for e in encodings)
    side = tracker.embedding(tracker.neck_levels(vision.last_hidden_state), sizes)
    return [replace(e, tracker=side[i]) for i, e in enumerate(encodings)]


def model_pixels(model: Sam3Model, images: Sequence[np.ndarray]) -> Tensor:
    """``images`` preprocessed for ``model``: its input size, on its device, in the dtype its
    ViT computes in."""
    # transformers types a nested config loosely (dict | config | None): read as declared.
    vision_config: Any = model.config.vision_config
    size: int = vision_config.backbone_config.image_size
    device = next(model.parameters()).device
    return preprocess(images, size, device).to(module_dtype(model.vision_encoder.backbone))


def split_encodings(
    vision: Sam3VisionEncoderOutput, images: Sequence[np.ndarray]
) -> list[ConceptEncoding]:
    """A batch's vision output -> one encoding per image (views, no copy)."""
    return [
        ConceptEncoding(
            fpn_hidden_states=tuple(t[i : i + 1] for t in vision.fpn_hidden_states),
            fpn_position_encoding=tuple(t[i : i + 1] for t in vision.fpn_position_encoding),
            height=int(image.shape[0]),
            width=int(image.shape[1]),
        )
        for i, image in enumerate(images)
    ]


def _prompt_phrases(phrases: Sequence[str], boxes: Sequence[ExemplarBox]) -> list[str]:
    phrases = list(phrases) or ([VISUAL_PHRASE] if boxes else [])
    if not phrases:
        raise ValueError("give at least one phrase or one exemplar box")
    return phrases


@torch.inference_mode()
def detect(
    model: Sam3Model,
    tokenize: Tokenize,
    encoding: ConceptEncoding,
    phrases: Sequence[str],
    boxes: Sequence[ExemplarBox] = (),
    score_thresh: float = DEFAULT_SCORE_THRESH,
    text: TextEncoding | None = None,
    max_instances: int | None = None,
) -> dict[str, list[Instance]]:
    """Every phrase of one encoded image as one batch through the detector. Exemplar boxes
    (image pixels) refine every phrase; with boxes and no phrase the phrase is Meta's
    stand-in ``"visual"``. ``text`` is ``(ids, mask, features)`` already computed for
    exactly these phrases (so many images share one text encoding). ``max_instances``: at
    most that many per phrase, highest scores first (:func:`postprocess`)."""
    phrases = _prompt_phrases(phrases, boxes)
    if not 0.0 <= score_thresh <= 1.0:
        raise ValueError(f"score_thresh must be in [0, 1]; got {score_thresh}")
    text = text if text is not None else encode_text(model, tokenize, phrases)
    outputs = run_detector(model, encoding, len(phrases), boxes, text)
    per_prompt = postprocess(outputs, encoding.height, encoding.width, score_thresh, max_instances)
    return dict(zip(phrases, per_prompt, strict=True))


@torch.inference_mode()
def run_detector(
    model: Sam3Model,
    encoding: ConceptEncoding,
    prompts: int,
    boxes: Sequence[ExemplarBox],
    text: TextEncoding,
) -> Sam3ImageSegmentationOutput:
    """The detector and its heads (geometry/exemplar encoder, DETR encoder and decoder,
    mask decoder, scoring) for ``prompts`` text prompts over one encoding: raw outputs."""
    device = next(model.parameters()).device
    _ids, attention, features = text
    height, width = encoding.height, encoding.width
    if boxes:
        box_t, label_t = _boxes_tensor(boxes, width, height)
    else:
        # Meta runs the exemplar encoder even with no box (its output then is the class
        # token alone); transformers skips it when no box is given. One padding box
        # (label PADDING, masked out) makes transformers run it as Meta does.
        box_t = torch.tensor([[[0.5, 0.5, 1.0, 1.0]]])
        label_t = torch.tensor([[PADDING]])
    box_t, label_t = box_t.to(device, module_dtype(model.geometry_encoder)), label_t.to(device)
    outputs: Sam3ImageSegmentationOutput = model(
        vision_embeds=encoding.expanded(prompts),
        text_embeds=features,
        attention_mask=attention,
        input_boxes=box_t.expand(prompts, -1, -1),
        input_boxes_labels=label_t.expand(prompts, -1),
    )
    return outputs


@torch.inference_mode()
def encode_text(model: Sam3Model, tokenize: Tokenize, phrases: Sequence[str]) -> TextEncoding:
    """(ids, attention mask, text features) of ``phrases`` on the model's device."""
    device = next(model.parameters()).device
    ids, attention = (t.to(device) for t in token_batch(tokenize, phrases))
    text = model.get_text_features(input_ids=ids, attention_mask=attention, return_dict=True)
    # return_dict=True: the output object, never transformers' plain tuple
    text = cast("BaseModelOutputWithPooling", text)
    return ids, attention, text


@torch.inference_mode()
def segment_concepts(
    model: Sam3Model,
    tokenize: Tokenize,
    images: Sequence[np.ndarray],
    phrases: Sequence[str],
    boxes: Sequence[ExemplarBox] = (),
    score_thresh: float = DEFAULT_SCORE_THRESH,
) -> list[dict[str, list[Instance]]]:
    """Per image, per phrase, the instances above ``score_thresh``: all images encoded in
    one batch, the phrases encoded once, each image's phrases one detector batch."""
    _check_images(images)
    if not images:
        return []
    phrases = _prompt_phrases(phrases, boxes)
    if not 0.0 <= score_thresh <= 1.0:
        raise ValueError(f"score_thresh must be in [0, 1]; got {score_thresh}")
    text = encode_text(model, tokenize, phrases)
    return [
        detect(model, tokenize, encoding, phrases, boxes, score_thresh, text=text)
        for encoding in encode_images(model, images)
    ]


def text_rows(text: TextEncoding, rows: Sequence[int]) -> TextEncoding:
    """The ``(ids, mask, features)`` of :func:`encode_text` for the phrases at ``rows`` only
    (a phrase list's subset answers from the one encoding of the whole list)."""
    import copy

    ids, attention, features = text
    index = torch.as_tensor(list(rows), dtype=torch.long, device=ids.device)
    picked = copy.copy(features)
    for name, value in features.items():  # the output's fields (last_hidden_state, ...)
        picked[name] = value.index_select(0, index) if isinstance(value, Tensor) else value
    # Sam3Model.get_text_features sets pooler_output (what the detector reads) as an
    # attribute, outside the output's fields.
    assert features.pooler_output is not None  # set by Sam3Model.get_text_features
    picked.pooler_output = features.pooler_output.index_select(0, index)
    return ids.index_select(0, index), attention.index_select(0, index), picked
