"""SAM2 mask decoder: output tokens + prompt tokens through the two-way transformer, then
hypernetwork MLPs dot the upscaled image features into mask logits.

SAM2 adds to SAM1: an object-score token and head (is there an object at all), and the
stride-4 and stride-8 encoder features mixed into the upscaling path.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

import torch
from torch import nn

from sam2serve.modeling.common import MLP, LayerNorm2d
from sam2serve.modeling.transformer import TwoWayTransformer


@dataclass
class DecoderOutput:
    low_res_logits: torch.Tensor  # (B, C, 256, 256), C = 3 with multimask else 1
    iou_scores: torch.Tensor  # (B, C)
    object_score_logits: torch.Tensor  # (B, 1)


class MaskDecoder(nn.Module):
    def __init__(
        self,
        transformer_dim: int = 256,
        num_multimask_outputs: int = 3,
        iou_head_depth: int = 3,
        iou_head_hidden_dim: int = 256,
        dynamic_multimask_stability_delta: float = 0.05,
        dynamic_multimask_stability_thresh: float = 0.98,
    ) -> None:
        super().__init__()
        self.transformer = TwoWayTransformer(embedding_dim=transformer_dim)
        self.num_mask_tokens = num_multimask_outputs + 1
        self.iou_token = nn.Embedding(1, transformer_dim)
        self.mask_tokens = nn.Embedding(self.num_mask_tokens, transformer_dim)
        self.obj_score_token = nn.Embedding(1, transformer_dim)
        self.output_upscaling = nn.Sequential(
            nn.ConvTranspose2d(transformer_dim, transformer_dim // 4, kernel_size=2, stride=2),
            LayerNorm2d(transformer_dim // 4),
            nn.GELU(),
            nn.ConvTranspose2d(transformer_dim // 4, transformer_dim // 8, kernel_size=2, stride=2),
            nn.GELU(),
        )
        # Projections of the stride-4 / stride-8 encoder features; applied once per image
        # at encode time (see SAM2Image.encode_image), not per prompt.
        self.conv_s0 = nn.Conv2d(transformer_dim, transformer_dim // 8, kernel_size=1)
        self.conv_s1 = nn.Conv2d(transformer_dim, transformer_dim // 4, kernel_size=1)
        self.output_hypernetworks_mlps = nn.ModuleList(
            MLP(transformer_dim, transformer_dim, transformer_dim // 8, 3)
            for _ in range(self.num_mask_tokens)
        )
        self.iou_prediction_head = MLP(
            transformer_dim,
            iou_head_hidden_dim,
            self.num_mask_tokens,
            iou_head_depth,
            sigmoid_output=True,
        )
        self.pred_obj_score_head = MLP(transformer_dim, transformer_dim, 1, 3)
        self.stability_delta = dynamic_multimask_stability_delta
        self.stability_thresh = dynamic_multimask_stability_thresh

    def upscaling(
        self,
    ) -> tuple[nn.ConvTranspose2d, LayerNorm2d, nn.GELU, nn.ConvTranspose2d, nn.GELU]:
        """``output_upscaling``'s five modules, typed (``nn.Sequential`` hands them out as
        plain modules)."""
        return cast(
            tuple[nn.ConvTranspose2d, LayerNorm2d, nn.GELU, nn.ConvTranspose2d, nn.GELU],
            tuple(self.output_upscaling),
        )

    def forward(
        self,
        image_embed: torch.Tensor,
        image_pe: torch.Tensor,
        sparse_embeddings: torch.Tensor,
        dense_embeddings: torch.Tensor,
        high_res_feats: tuple[torch.Tensor, torch.Tensor],
        multimask_output: bool,
    ) -> DecoderOutput:
        """image_embed (1, C, 64, 64) of ONE image; sparse (B, N, C) for B prompts;
        dense (1 or B, C, 64, 64); high_res_feats of the same image, (1, C/8, 256, 256) and
        (1, C/4, 128, 128). The image side is broadcast over the B prompts, never copied.
        """
        logits, iou, object_score = self.predict_all_masks(
            image_embed, image_pe, sparse_embeddings, dense_embeddings, high_res_feats
        )
        if multimask_output:
            return DecoderOutput(logits[:, 1:], iou[:, 1:], object_score)
        logits, iou = self.select_single_mask(logits, iou)
        return DecoderOutput(logits, iou, object_score)

    def predict_all_masks(
        self,
        image_embed: torch.Tensor,
        image_pe: torch.Tensor,
        sparse_embeddings: torch.Tensor,
        dense_embeddings: torch.Tensor,
        high_res_feats: tuple[torch.Tensor, torch.Tensor],
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Logits of all four mask tokens (B, 4, 256, 256), IoU (B, 4), object score (B, 1)."""
        b = sparse_embeddings.shape[0]
        output_tokens = torch.cat(
            [self.obj_score_token.weight, self.iou_token.weight, self.mask_tokens.weight], dim=0
        )
        tokens = torch.cat([output_tokens.unsqueeze(0).expand(b, -1, -1), sparse_embeddings], dim=1)
        src = image_embed + dense_embeddings
        hs, keys = self.transformer(src, image_pe, tokens)
        object_token_out = hs[:, 0]
        iou_token_out = hs[:, 1]
        mask_tokens_out = hs[:, 2 : 2 + self.num_mask_tokens]

        _, c, h, w = src.shape
        src = keys.transpose(1, 2).reshape(b, c, h, w)
        dc1, ln1, act1, dc2, act2 = self.output_upscaling
        feat_s0, feat_s1 = high_res_feats
        upscaled = act1(ln1(dc1(src) + feat_s1))
        upscaled = act2(dc2(upscaled) + feat_s0)

        hyper_in = torch.stack(
            [mlp(mask_tokens_out[:, i]) for i, mlp in enumerate(self.output_hypernetworks_mlps)],
            dim=1,
        )
        _, cu, hu, wu = upscaled.shape
        logits = (hyper_in @ upscaled.reshape(b, cu, hu * wu)).reshape(b, -1, hu, wu)
        iou = self.iou_prediction_head(iou_token_out)
        object_score = self.pred_obj_score_head(object_token_out)
        return logits, iou, object_score

    def stability_scores(self, logits: torch.Tensor) -> torch.Tensor:
        """IoU of the masks thresholded at +delta and -delta (1.0 for an empty union)."""
        flat = logits.flatten(-2)
        inter = (flat > self.stability_delta).sum(-1).float()
        union = (flat > -self.stability_delta).sum(-1).float()
        return torch.where(union > 0, inter / union, 1.0)

    def select_single_mask(
        self, logits: torch.Tensor, iou: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Dynamic multimask: keep the single-mask token's output when it is stable,
        otherwise fall back to the multimask output with the highest predicted IoU."""
        multi_logits, multi_iou = logits[:, 1:], iou[:, 1:]
        best = multi_iou.argmax(dim=-1)
        rows = torch.arange(best.shape[0], device=best.device)
        best_logits = multi_logits[rows, best].unsqueeze(1)
        best_iou = multi_iou[rows, best].unsqueeze(1)
        single_logits, single_iou = logits[:, :1], iou[:, :1]
        stable = self.stability_scores(single_logits) >= self.stability_thresh  # (B, 1)
        out_logits = torch.where(stable[..., None, None], single_logits, best_logits)
        out_iou = torch.where(stable, single_iou, best_iou)
        return out_logits, out_iou
