"""Concept segmentation: images x noun phrases (+ exemplar boxes) -> every instance.

Stateless per call. Each image is encoded once; all its phrases run through the detector as
one batch over that encoding (the vision features are expanded, not recomputed). The
post-processing is Meta's (``sam3.model.sam3_image_processor.Sam3Processor``):
score = sigmoid(class logit) * sigmoid(presence logit), kept when > ``score_thresh``; boxes
scaled to the image; mask logits resized bilinearly to the image, sigmoid, > 0.5.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

CONTEXT_LENGTH = 32  # Meta's VETextEncoder context
VISUAL_PHRASE = "visual"  # Meta's text stand-in when only exemplar boxes are given
DEFAULT_SCORE_THRESH = 0.5  # Meta's Sam3Processor confidence_threshold
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


def load_tokenizer(directory) -> Tokenize:
    """CLIP BPE from ``vocab.json`` + ``merges.txt`` (the files beside the weights)."""
    from transformers import CLIPTokenizer

    tokenizer = CLIPTokenizer(
        vocab=str(directory / "vocab.json"), merges=str(directory / "merges.txt")
    )
    return lambda phrase: list(tokenizer(phrase)["input_ids"])


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


def preprocess(
    images: Sequence[np.ndarray], size: int, device: torch.device | str = "cpu"
) -> Tensor:
    """uint8 RGB (H, W, 3) images -> (B, 3, size, size) in [-1, 1] on ``device``, resized as
    Meta's processor does (bilinear, antialiased, on the uint8 image). Each image crosses
    to the device as uint8 and is resized and normalised there."""
    out = []
    for image in images:
        host = torch.from_numpy(np.ascontiguousarray(image.transpose(2, 0, 1)))[None]
        chw = host.to(device, non_blocking=True)
        if tuple(chw.shape[-2:]) != (size, size):
            chw = F.interpolate(
                chw, size=(size, size), mode="bilinear", align_corners=False, antialias=True
            )
        out.append((chw.float() / 255.0 - 0.5) / 0.5)
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


def _select(vision, index: int, count: int):
    """Image ``index`` of a batched vision output, expanded to ``count`` prompts (a view)."""

    def pick(tensors):
        return tuple(t[index : index + 1].expand(count, *t.shape[1:]) for t in tensors)

    return type(vision)(
        fpn_hidden_states=pick(vision.fpn_hidden_states),
        fpn_position_encoding=pick(vision.fpn_position_encoding),
    )


def postprocess(outputs, height: int, width: int, score_thresh: float) -> list[list[Instance]]:
    """Meta's Sam3Processor._forward_grounding rule, per prompt of the batch (on the
    outputs' device; each prompt's kept masks, boxes and scores cross to the host once)."""
    probs = outputs.pred_logits.sigmoid() * outputs.presence_logits.sigmoid()
    device = probs.device
    scale = torch.tensor([width, height, width, height], dtype=torch.float32, device=device)
    result = []
    for row in range(probs.shape[0]):
        keep = probs[row] > score_thresh
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
        masks, boxes, scores = masks.cpu().numpy(), boxes.cpu().tolist(), scores.cpu().tolist()
        result.append(
            [
                Instance(mask=m, box=tuple(b), score=float(sc))
                for m, b, sc in zip(masks, boxes, scores, strict=True)
            ]
        )
    return result


@torch.inference_mode()
def segment_concepts(
    model: torch.nn.Module,
    tokenize: Tokenize,
    images: Sequence[np.ndarray],
    phrases: Sequence[str],
    boxes: Sequence[ExemplarBox] = (),
    score_thresh: float = DEFAULT_SCORE_THRESH,
) -> list[dict[str, list[Instance]]]:
    """Per image, per phrase, the instances above ``score_thresh``. Exemplar boxes (image
    pixels, applied to every image) refine every phrase; with boxes and no phrase the
    phrase is Meta's stand-in ``"visual"``."""
    if not images:
        return []
    for image in images:
        if image.ndim != 3 or image.shape[2] != 3 or image.dtype != np.uint8:
            raise ValueError(f"images must be uint8 (H, W, 3); got {image.dtype} {image.shape}")
    phrases = list(phrases) or ([VISUAL_PHRASE] if boxes else [])
    if not phrases:
        raise ValueError("give at least one phrase or one exemplar box")
    if not 0.0 <= score_thresh <= 1.0:
        raise ValueError(f"score_thresh must be in [0, 1]; got {score_thresh}")
    size = model.config.vision_config.backbone_config.image_size
    device = next(model.parameters()).device
    vision = model.get_vision_features(pixel_values=preprocess(images, size, device))
    ids, attention = (t.to(device) for t in token_batch(tokenize, phrases))
    text = model.get_text_features(input_ids=ids, attention_mask=attention, return_dict=True)
    results = []
    for index, image in enumerate(images):
        height, width = image.shape[:2]
        if boxes:
            box_t, label_t = _boxes_tensor(boxes, width, height)
        else:
            # Meta runs the exemplar encoder even with no box (its output then is the class
            # token alone); transformers skips it when no box is given. One padding box
            # (label PADDING, masked out) makes transformers run it as Meta does.
            box_t = torch.tensor([[[0.5, 0.5, 1.0, 1.0]]])
            label_t = torch.tensor([[PADDING]])
        box_t, label_t = box_t.to(device), label_t.to(device)
        extra = {
            "input_boxes": box_t.expand(len(phrases), -1, -1),
            "input_boxes_labels": label_t.expand(len(phrases), -1),
        }
        outputs = model(
            vision_embeds=_select(vision, index, len(phrases)),
            text_embeds=text,
            attention_mask=attention,
            **extra,
        )
        per_prompt = postprocess(outputs, height, width, score_thresh)
        results.append(dict(zip(phrases, per_prompt, strict=True)))
    return results
