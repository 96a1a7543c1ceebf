"""A lossless fast path for the SAM2 mask decoder: the same function, ~4x fewer FLOPs.

Why it can be exact: in the two-way transformer the 4096 image keys start out identical
for every prompt of an image (``K``), and each prompt only ever changes them by
(a) image-to-token attention outputs, which are *low rank*: position i receives
``sum_{h,t} alpha[h, t, i] * Wo_h v[h, t]`` — 8 heads x T tokens vectors, and
(b) LayerNorm, which per position subtracts the channel mean and rescales, then applies a
fixed channel gain ``gamma`` and bias ``beta``: a fixed linear map of the centred keys.
So the keys of every prompt stay in the symbolic form

    keys_i = s_i * (L K_i + sum_r coef[r, i] * V_r)

with a per-position scale ``s`` (the product of the LayerNorms' 1/std), a weights-only
linear map ``L`` fixed per layer (the product of the LayerNorms' centring and gains), and
per prompt a low-rank part: coefficient rows ``coef`` (positions last; each attention
appends rows) and their vectors ``V``. Any linear map W of the keys is then
``s * (W L K + (V W^T)^T coef)``: every ``W L K`` is a weights-only matrix times ``K``,
so the whole per-image side is ONE matrix product, computed once per image; per prompt
only rank-R products remain. Attention scores against a few token vectors never need the
4096 x 256 keys, and LayerNorm moments come from Gram matrices of the centred vectors
(centred, so that no ``mean^2`` cancels against ``E[x^2]``). A LayerNorm rescales ``s``
(4096 numbers per prompt), centres and scales the vectors (``V <- (V - mean) * gamma``,
R x 256 numbers), and adds one row (``beta``, coefficient 1/s); no coefficient row
changes. Only the upscaling convolutions after the transformer see dense per-prompt
tensors.

Products against the image side are one matrix product per head for all prompts of a call
(``(B*T, dh) @ (dh, 4096)``); products with the low-rank part are one per prompt, in the
decoder's ``dtype`` (bf16 in mode furious on hosts with native bf16, with the token side's
MLPs; the positions' scales, the vectors, the LayerNorm statistics and the
softmax statistics stay fp32). The queries of the attention after a LayerNorm are known
before it, so their low-rank scores share the LayerNorm's product with the coefficient
rows (one product per prompt reads them for both).

Used when a prompt has no mask input (AMG, clicks, boxes); mask inputs make the image
side per-prompt from the start, and those go through the reference decoder.

Over 500 lines on purpose: it is one derivation (keys kept symbolic through every layer)
and its code, which read best together; split, each half would explain the other.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import cast

import torch
import torch.nn.functional as F
from torch import nn

from sam2serve.modeling.common import MLP
from sam2serve.modeling.mask_decoder import MaskDecoder
from sam2serve.modeling.transformer import Attention, TwoWayAttentionBlock

FP32 = torch.float32
# Prompts upscaled together on a CPU: each carries ~8 MB of activations (fp32) through the
# upscaling, so more than two at a time leave the cache (the transformer's per-prompt
# tensors are smaller: it takes larger chunks). A GPU upscales a chunk at once.
UPSCALE_CHUNK_CPU = 2
# Token-side linear layers with at most this many weights stay fp32 in a reduced-precision
# decoder (:meth:`FastMaskDecoder.reduced`).
SMALL_LINEAR = 256 * 512


def heads_first(x: torch.Tensor) -> torch.Tensor:
    """(B, H, T, D) -> (H, B*T, D): the layout of products against the shared image side
    (one matrix product per head for all prompts). A view for one prompt, a copy else."""
    b, h, t, d = x.shape
    return x.transpose(0, 1).reshape(h, b * t, d)


def prompts_first(x: torch.Tensor, batch: int) -> torch.Tensor:
    """(H, B*T, D) -> (B, H, T, D), a view (strided: elementwise consumers take it as is)."""
    h, bt, d = x.shape
    return x.view(h, batch, bt // batch, d).transpose(0, 1)


def gelu_(x: torch.Tensor, act: torch.nn.GELU) -> torch.Tensor:
    """``act(x)`` in place: the upscaling's activations are the largest per-prompt tensors,
    and a fresh output for each would be one more pass over memory."""
    out: torch.Tensor = torch.ops.aten.gelu_(x, approximate=act.approximate)
    return out


def _tokens_at(tokens: torch.Tensor, positions: list[int]) -> torch.Tensor:
    """``tokens[:, positions]`` (B, len(positions), C) without a list index: indexing with
    a Python list copies it to the device first, which on a GPU waits for the stream (a
    host sync per prompt chunk); a contiguous run is a view, anything else a stack."""
    first, last = positions[0], positions[-1]
    if positions == list(range(first, last + 1)):
        return tokens[:, first : last + 1]
    return torch.stack([tokens[:, i] for i in positions], dim=1)


def merge_heads(x: torch.Tensor) -> torch.Tensor:
    """(B, H, N, dh) -> (B, N, H*dh)."""
    b, h, n, d = x.shape
    return x.transpose(1, 2).reshape(b, n, h * d)


def key_rows(weight: torch.Tensor, queries: torch.Tensor) -> torch.Tensor:
    """(B, H*T, C): ``W_h^T q[b, h, t]`` for queries (B, H, T, dh) of a projection ``weight``
    (H*dh, C): the row vectors whose dot products with the keys are the scores."""
    b, h, t, d = queries.shape
    per_head = weight.view(h, d, -1)
    return torch.einsum("bhtd,hdc->bhtc", queries, per_head).reshape(b, h * t, -1)


# --------------------------------------------------------------------------- image side


@dataclass
class SidePlan:
    """Weights-only: which linear maps of ``K`` the prompts read, stacked so that the
    per-image side is one product ``weight @ K``, and the LayerNorms' gains.

    Block names: ``layer{l}.t2i.k`` / ``.v``, ``layer{l}.i2t.q``, ``final.k`` / ``.v``
    (the attention projections of ``L K``), ``layer{l}.norm4.cross.<family>`` and
    ``.cross.const`` (``V_r . (M L K)`` for the LayerNorm's cross terms, through the
    families' head structure); apart, ``upscale``: the first transposed convolution of
    the final keys, which the upscaling reads channels-last."""

    weight: torch.Tensor  # (rows, C)
    rows: dict[str, slice]
    upscale: torch.Tensor  # (4 * 64, C), rows (sub-pixel, channel)
    norm_gains: list[torch.Tensor]  # gamma of each layer's norm4, (C,)
    # Model constants: projections of the positional encoding P (added to layer 0's
    # blocks, kept apart for later layers, whose scores scale the image part by s).
    pe_weight: torch.Tensor  # (rows_pe, C)
    pe_rows: dict[str, slice]
    pe_bias: torch.Tensor  # (rows_pe,)


def side_plan(decoder: MaskDecoder) -> SidePlan:
    """Walks the transformer with the same bookkeeping as :class:`FastMaskDecoder` (the
    keys' map L, each family's map since it was added, the constant rows), recording the
    maps of ``K`` each stage will read."""
    transformer = decoder.transformer
    weight = decoder.iou_token.weight
    channels = weight.shape[1]
    eye = torch.eye(channels, dtype=FP32, device=weight.device)
    centring = eye - 1.0 / channels  # M: x -> x - mean(x) over channels
    keys_map = eye  # L
    # name -> (Wo (C, H*dh), the map applied to the family's vectors since it was added)
    families: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    consts = weight.new_zeros((0, channels))  # constant rows' vectors, in row order
    blocks: list[tuple[str, torch.Tensor]] = []
    pe_blocks: list[tuple[str, torch.Tensor, torch.Tensor | None]] = []
    norm_gains: list[torch.Tensor] = []
    for index, layer in enumerate(transformer.blocks()):
        name = f"layer{index}"
        t2i, i2t = layer.cross_attn_token_to_image, layer.cross_attn_image_to_token
        blocks += [
            (f"{name}.t2i.k", t2i.k_proj.weight @ keys_map),
            (f"{name}.t2i.v", t2i.v_proj.weight @ keys_map),
            (f"{name}.i2t.q", i2t.q_proj.weight @ keys_map),
        ]
        pe_blocks += [(f"{name}.t2i.k", t2i.k_proj.weight, None)]
        pe_blocks += [(f"{name}.i2t.q", i2t.q_proj.weight, i2t.q_proj.bias)]
        families[f"{name}.i2t"] = (i2t.out_proj.weight, eye)
        # The out_proj bias has coefficient 1/s: a new row in the first layer, else added
        # to the previous LayerNorm's beta row, whose coefficient is the same 1/s.
        if index == 0:
            consts = torch.cat([consts, i2t.out_proj.bias[None]])
        else:
            consts = torch.cat([consts[:-1], (consts[-1] + i2t.out_proj.bias)[None]])
        # (M v) . (M L K) = v^T M L K: M is symmetric and idempotent.
        centred = centring @ keys_map
        for family, (out_weight, since) in families.items():
            blocks.append((f"{name}.norm4.cross.{family}", out_weight.T @ since.T @ centred))
        blocks.append((f"{name}.norm4.cross.const", consts @ centred))
        norm_gains.append(layer.norm4.weight)
        norm = centring * layer.norm4.weight[:, None]  # diag(gamma) M
        keys_map = norm @ keys_map
        families = {f: (w, norm @ since) for f, (w, since) in families.items()}
        consts = torch.cat([consts @ norm.T, layer.norm4.bias[None]])
    final = transformer.final_attn_token_to_image
    dc1 = decoder.upscaling()[0]
    w1 = dc1.weight.permute(2, 3, 1, 0).reshape(-1, channels)  # rows (sub-pixel, channel)
    blocks += [
        ("final.k", final.k_proj.weight @ keys_map),
        ("final.v", final.v_proj.weight @ keys_map),
    ]
    pe_blocks += [("final.k", final.k_proj.weight, None)]
    rows, start = {}, 0
    for block_name, matrix in blocks:
        rows[block_name] = slice(start, start + matrix.shape[0])
        start += matrix.shape[0]
    pe_rows, start = {}, 0
    for block_name, matrix, _ in pe_blocks:
        pe_rows[block_name] = slice(start, start + matrix.shape[0])
        start += matrix.shape[0]
    pe_bias = torch.cat([weight.new_zeros(m.shape[0]) if b is None else b for _, m, b in pe_blocks])
    return SidePlan(
        torch.cat([m for _, m in blocks]).contiguous(),
        rows,
        (w1 @ keys_map).contiguous(),
        norm_gains,
        torch.cat([m for _, m, _ in pe_blocks]).contiguous(),
        pe_rows,
        pe_bias,
    )


@dataclass
class ImageSide:
    """Per-image tensors shared by every prompt, positions last; named so that they can
    cross exported-program boundaries as a flat list.

    - ``proj`` (rows, N): the plan's maps of ``K`` (layer 0's attention blocks with the
      positional encoding's projection added), in the decoder's dtype;
    - ``up`` (N, 4 * 64): the plan's ``upscale`` map of ``K``, channels last, as the
      upscaling reads it;
    - ``pe`` (rows_pe, N): projections of the positional encoding (+ bias), a model constant;
    - ``stats`` (depth, N) fp32: per LayerNorm, the sum of squares of the centred ``L K``;
    - ``s1`` (1, N, 4 * 64), ``s0`` (1, 4N, 4 * 32): the high-res features plus the transposed
      convolutions' biases in the channels-last "parent pixel, then sub-pixel" order of
      :meth:`FastMaskDecoder.upscale`."""

    tensors: dict[str, torch.Tensor]
    size: tuple[int, int]
    plan: SidePlan = field(repr=False)

    def block(self, name: str) -> torch.Tensor:
        return self.tensors["proj"][self.plan.rows[name]]

    def pe_block(self, name: str) -> torch.Tensor:
        return self.tensors["pe"][self.plan.pe_rows[name]]

    def norm_stats(self, layer: int) -> torch.Tensor:
        """(N,): ``|M L K|^2`` at layer ``layer``'s norm4 (C times the keys' variance)."""
        return self.tensors["stats"][layer]

    @property
    def nbytes(self) -> int:
        """Bytes of this image's own tensors (``pe`` is shared by every image)."""
        own = [t for name, t in self.tensors.items() if name != "pe"]
        return sum(t.numel() * t.element_size() for t in own)


# --------------------------------------------------------------------------- prompt side


@dataclass
class FamilyRows:
    """The rows one image-to-token attention added. Its probabilities sum to 1 over the T
    tokens, so the last token's is implied: ``coef[start : start + H*(T-1)]`` are the
    others' (divided by s), with vectors ``Wo_h (v_ht - v_h,last)`` (mapped by every
    LayerNorm since), and the last token's vectors ``Wo_h v_h,last`` join the ``anchor``
    row (coefficient 1/s). The LayerNorm cross terms go through the head structure, so
    the values are kept."""

    name: str
    start: int
    anchor: int
    values: torch.Tensor  # (B, H, T, dh), the last token's included


@dataclass
class SymbolicKeys:
    """``keys_i = s_i * (L K_i + sum_r coef[r, i] V_r)`` for a chunk of B prompts."""

    scale: torch.Tensor | None  # (B, 1, N) fp32; None: identically 1 (before any LayerNorm)
    # (B, rows, N) in the decoder's dtype, contiguous (a batched product reads it whole):
    # a row >= rank is zeros, reserved for the LayerNorm that follows an attention.
    coef: torch.Tensor
    rank: int
    vecs: torch.Tensor  # (B, rank, C) fp32
    layer: int  # which LayerNorm's map applies (the plan's stage)
    families: list[FamilyRows]
    # Runs [start, stop) of the rows whose vectors are constants (biases, betas).
    const_rows: list[tuple[int, int]]
    ones_row: int | None  # the row whose coefficient is 1/s (bias rows join it)
    # The scale in the decoder's dtype, for elementwise products with its tensors.
    scale_cast: torch.Tensor | None = None

    def select(self, index: torch.Tensor) -> SymbolicKeys:
        """The keys of the prompts at ``index``."""
        families = [FamilyRows(f.name, f.start, f.anchor, f.values[index]) for f in self.families]
        return SymbolicKeys(
            None if self.scale is None else self.scale[index],
            self.coef[index],
            self.rank,
            self.vecs[index],
            self.layer,
            families,
            self.const_rows,
            self.ones_row,
            None if self.scale_cast is None else self.scale_cast[index],
        )

    def scale_in_dtype(self) -> torch.Tensor:
        """``scale_cast``, which the keys have from the first LayerNorm on."""
        assert self.scale_cast is not None, "the keys have no scale before a LayerNorm"
        return self.scale_cast

    def final(self) -> FinalKeys:
        scale = self.scale
        if scale is None:
            scale = self.vecs.new_ones((self.coef.shape[0], 1, self.coef.shape[2]))
        return FinalKeys(scale, self.coef, self.vecs)


@dataclass
class FinalKeys:
    """The image keys after the transformer, as the upscaling reads them:
    ``scale * (L K + coef^T vecs)``, L K's projection being the side's ``up`` tensor."""

    scale: torch.Tensor  # (B, 1, N) fp32
    coef: torch.Tensor  # (B, R, N)
    vecs: torch.Tensor  # (B, R, C) fp32

    def select(self, index: torch.Tensor) -> FinalKeys:
        return FinalKeys(self.scale[index], self.coef[index], self.vecs[index])

    def slice(self, start: int, stop: int) -> FinalKeys:
        return FinalKeys(self.scale[start:stop], self.coef[start:stop], self.vecs[start:stop])


@dataclass
class Queries:
    """An attention's queries to the image keys, (B, H, T, dh) with the softmax scale
    folded in, and, when the LayerNorm before the attention computed it in its product,
    the low-rank part of their scores ``(V W^T q) . coef`` (B, H*T, N), in the decoder's
    dtype (without the LayerNorm's beta row: constant over positions, the softmax drops
    it)."""

    heads: torch.Tensor
    low_rank: torch.Tensor | None = None


class FastMaskDecoder:
    """Computes ``MaskDecoder.predict_all_masks`` for prompts without a mask input.

    ``dtype``: what the per-prompt products, the image side and the token side's MLPs
    are stored and multiplied in (fp32: mode fast, equal to the reference up to
    float reassociation; bf16: mode furious on devices that run it natively)."""

    source = "eager"

    def __init__(self, decoder: MaskDecoder, dtype: torch.dtype = FP32) -> None:
        self.decoder = decoder
        self.transformer = decoder.transformer
        self.dtype = dtype
        with torch.no_grad():
            self.plan = side_plan(decoder)
        # The positional encoding's projections, per dtype (a model constant).
        self._pe: dict[torch.dtype, torch.Tensor] = {}
        # Linear layers' weights and biases in ``dtype``, cast on first use.
        self._cast: dict[nn.Linear, tuple[torch.Tensor, torch.Tensor]] = {}
        # The upscaling's pixel order -> raster order, per size and device.
        self._raster: dict[tuple[tuple[int, int], torch.device], torch.Tensor] = {}

    # ------------------------------------------------------------------ image side
    def prepare(
        self,
        image_embed: torch.Tensor,
        image_pe: torch.Tensor,
        no_mask_dense: torch.Tensor,
        high_res_feats: tuple[torch.Tensor, torch.Tensor],
    ) -> ImageSide:
        """The per-image side: one product of the plan's stacked weights with the keys (and
        the upscaling's block, channels last, as it reads it)."""
        plan, dtype = self.plan, self.dtype
        keys = (image_embed[:1] + no_mask_dense).flatten(2)[0].float()  # (C, N)
        proj = (plan.weight.to(dtype) @ keys.to(dtype)).float()
        up = keys.T.to(dtype) @ plan.upscale.T.to(dtype)  # (N, 4 * 64)
        pe = self.pe_projections(image_pe)
        for name in ("layer0.t2i.k", "layer0.i2t.q"):  # s is 1 there: K and P share scores
            proj[plan.rows[name]] += pe[plan.pe_rows[name]]
        # |M L K|^2 per LayerNorm: L K is K through the earlier LayerNorms' centring and gains.
        stats, mapped = [], keys
        for gain in plan.norm_gains:
            mapped = mapped - mapped.mean(0)
            stats.append(mapped.pow(2).sum(0))
            mapped = mapped * gain[:, None]
        h, w = image_embed.shape[-2:]
        s1, s0 = self.upscaling_features(high_res_feats, (h, w))
        tensors = {
            "proj": proj.to(dtype),
            "up": up,
            "pe": self.pe_projections(image_pe, dtype),
            "stats": torch.stack(stats),
            "s1": s1,
            "s0": s0,
        }
        return ImageSide(tensors, (h, w), plan)

    def pe_projections(self, image_pe: torch.Tensor, dtype: torch.dtype = FP32) -> torch.Tensor:
        """The positional encoding's projections (+ bias) (rows_pe, N): a model constant
        (``image_pe`` is the prompt encoder's dense encoding), computed once per dtype and
        shared by every image's side."""
        if dtype not in self._pe:
            if FP32 not in self._pe:
                pe = image_pe[0].flatten(1).float()
                self._pe[FP32] = torch.addmm(self.plan.pe_bias[:, None], self.plan.pe_weight, pe)
            self._pe[dtype] = self._pe[FP32].to(dtype)
        return self._pe[dtype]

    def upscaling_features(
        self, high_res_feats: tuple[torch.Tensor, torch.Tensor], size: tuple[int, int]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The high-res features plus the transposed convolutions' biases, channels-last in
        "parent pixel, then sub-pixel" order: s1 (1, N, 4 * 64), s0 (1, 4N, 4 * 32)."""
        dc1, _, _, dc2, _ = self.decoder.upscaling()
        assert dc1.bias is not None and dc2.bias is not None  # both convolutions have a bias
        feat_s0, feat_s1 = high_res_feats
        h, w = size
        c1, c0 = feat_s1.shape[1], feat_s0.shape[1]
        # feat_s1 pixel (2i + di, 2j + dj) -> [i * w + j, di * 2 + dj, c]
        s1 = feat_s1[:1].reshape(c1, h, 2, w, 2).permute(1, 3, 2, 4, 0)
        s1 = (s1.reshape(1, h * w, 4, c1) + dc1.bias).reshape(1, h * w, 4 * c1)
        # feat_s0 pixel (4i + 2di + ei, 4j + 2dj + ej) -> [(i, j, di, dj, ei, ej), c]
        s0 = feat_s0[:1].reshape(c0, h, 2, 2, w, 2, 2).permute(1, 4, 2, 5, 3, 6, 0)
        s0 = (s0.reshape(1, h * w * 16, c0) + dc2.bias).reshape(1, h * w * 4, 4 * c0)
        return s1.to(self.dtype).contiguous(), s0.to(self.dtype).contiguous()

    # ------------------------------------------------------------------ token side
    def reduced(self, layer: nn.Linear) -> bool:
        """Whether ``layer``'s product runs in the decoder's reduced dtype: only the large
        ones (the MLPs' 256 x 2048). A token-side product of 256 x 256 or less costs its
        call more than its arithmetic, and oneDNN's bf16 call measured 1.1-6x fp32's for
        1-64 rows on Zen 4 (the casts of its input and output included)."""
        return self.dtype != FP32 and layer.weight.numel() > SMALL_LINEAR

    def linear(self, layer: nn.Linear, x: torch.Tensor) -> torch.Tensor:
        """``layer(x)``, the product in the decoder's dtype where :meth:`reduced`; the
        result fp32 (the tokens' residual stream and norms stay fp32)."""
        if not self.reduced(layer):
            out: torch.Tensor = layer(x)
            return out
        return F.linear(x.to(self.dtype), *self._weights(layer)).float()

    def _weights(self, layer: nn.Linear) -> tuple[torch.Tensor, torch.Tensor]:
        cast = self._cast.get(layer)
        if cast is None:  # two threads may both cast: the same values, one is kept
            cast = self._cast[layer] = (layer.weight.to(self.dtype), layer.bias.to(self.dtype))
        return cast

    def mlp(self, mlp: MLP, x: torch.Tensor) -> torch.Tensor:
        """``mlp(x)``, each layer's product as :meth:`linear`'s (the hidden activations of
        a reduced layer in the decoder's dtype); the result fp32."""
        layers = [cast(nn.Linear, layer) for layer in mlp.layers]
        if not any(self.reduced(layer) for layer in layers):
            out: torch.Tensor = mlp(x)
            return out
        for index, layer in enumerate(layers):
            if self.reduced(layer):
                x = F.linear(x.to(self.dtype), *self._weights(layer))
            else:
                x = layer(x.float())
            if index < len(layers) - 1:
                x = mlp.act(x)
        return x.float()

    def attention(
        self, attn: Attention, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> torch.Tensor:
        """``attn(q, k, v)`` among the tokens of each prompt (B, T, C)."""
        q, k, v = (
            self.linear(attn.q_proj, q),
            self.linear(attn.k_proj, k),
            self.linear(attn.v_proj, v),
        )
        out = F.scaled_dot_product_attention(attn._heads(q), attn._heads(k), attn._heads(v))
        return self.linear(attn.out_proj, merge_heads(out))

    def self_attention(
        self, layer: TwoWayAttentionBlock, queries: torch.Tensor, query_pe: torch.Tensor
    ) -> torch.Tensor:
        """A block's token self-attention and its norm."""
        if layer.skip_first_layer_pe:
            queries = self.attention(layer.self_attn, queries, queries, queries)
        else:
            q = queries + query_pe
            queries = queries + self.attention(layer.self_attn, q, q, queries)
        normed: torch.Tensor = layer.norm1(queries)
        return normed

    def image_queries(self, attn: Attention, x: torch.Tensor) -> torch.Tensor:
        """(B, H, T, dh): a token-to-image attention's queries of the token states ``x``
        (positional encoding added), the softmax scale folded in (T rows rather than the
        4096 scores)."""
        q = self.linear(attn.q_proj, x)
        b, t, c = q.shape
        q = q * (1.0 / math.sqrt(c // attn.num_heads))
        return q.view(b, t, attn.num_heads, -1).transpose(1, 2)

    # ------------------------------------------------------------------ symbolic algebra
    def low_rank_scores(
        self, keys: SymbolicKeys, weight: torch.Tensor, queries: torch.Tensor
    ) -> torch.Tensor:
        """(B, H*T, N): ``(V W_h^T q[b, h, t]) . coef``, one product per prompt."""
        small = key_rows(weight, queries) @ keys.vecs.transpose(1, 2)  # (B, H*T, R)
        return torch.bmm(small.to(self.dtype), keys.coef)

    def token_to_image(
        self,
        side: ImageSide,
        keys: SymbolicKeys,
        attn: Attention,
        queries: Queries,
        name: str,
    ) -> torch.Tensor:
        """Attention of the tokens to the (symbolic) image keys; returns out_proj output."""
        logits = self.token_scores(side, keys, attn, queries, f"{name}.k")
        probs = torch.softmax(logits, dim=-1)  # (H, B*T, N)
        out = self.weighted_values(side, keys, attn, probs, f"{name}.v")
        return self.linear(attn.out_proj, out + attn.v_proj.bias)

    def token_scores(
        self,
        side: ImageSide,
        keys: SymbolicKeys,
        attn: Attention,
        queries: Queries,
        name: str,
    ) -> torch.Tensor:
        """(H, B*T, N), heads first: ``s * (q . W_h L K + low rank) + q . W_h P`` (k = W
        (keys + P) + b; the bias is the same for every position: softmax drops it). The
        image and positional parts are one product per head for all prompts; the softmax
        and the values' image part read this layout as it is."""
        q = queries.heads
        b, num_heads, t, dh = q.shape
        q_heads = heads_first(q.to(self.dtype))  # (H, B*T, dh)
        image = side.block(name).view(num_heads, dh, -1)
        if keys.rank == 0:  # layer 0: s is 1 and the block holds W (K + P)
            return q_heads @ image
        low_rank = queries.low_rank
        if low_rank is None:
            low_rank = self.low_rank_scores(keys, attn.k_proj.weight, q)
        low_rank = low_rank.view(b, num_heads, t, image.shape[-1])
        # Each product is consumed at once: the next one's output reuses its memory, warm.
        low_rank.add_(prompts_first(q_heads @ image, b))
        logits = q_heads @ side.pe_block(name).view(num_heads, dh, -1)
        prompts_first(logits, b).addcmul_(low_rank, keys.scale_in_dtype()[:, None])
        return logits

    def weighted_values(
        self,
        side: ImageSide,
        keys: SymbolicKeys,
        attn: Attention,
        probs: torch.Tensor,
        name: str,
    ) -> torch.Tensor:
        """(B, T, H*dh): ``sum_i probs[h, b*T + t, i] * W_h keys_i`` for heads-first
        probabilities (without the bias, which the probabilities, summing to 1, pass
        through unchanged). The image part reads them as they are, the low-rank part a
        prompts-first copy."""
        num_heads, bt, n = probs.shape
        b = keys.coef.shape[0]
        t = bt // b
        if keys.scale is not None:  # probs is the caller's own: scaled in place
            prompts_first(probs, b).mul_(keys.scale_in_dtype()[:, None])
        shared = side.block(name).view(num_heads, -1, n).transpose(1, 2)  # (H, N, dh)
        out = prompts_first(probs @ shared, b).float()  # (B, H, T, dh)
        if keys.rank:
            by_prompt = prompts_first(probs, b).reshape(b, num_heads * t, n)
            mixed = torch.bmm(by_prompt, keys.coef.transpose(1, 2)).float()  # (B, H*T, R)
            # sum_r mixed_r W_h V_r = W_h (mixed @ V): the projection after the mixing.
            mixed = (mixed @ keys.vecs).view(b, num_heads, t, -1)
            per_head = attn.v_proj.weight.view(num_heads, out.shape[-1], -1)
            out = out + torch.einsum("bhtc,hdc->bhtd", mixed, per_head)
        return merge_heads(out)

    def image_to_token(
        self,
        side: ImageSide,
        keys: SymbolicKeys,
        attn: Attention,
        queries: torch.Tensor,
        query_pe: torch.Tensor,
        name: str,
    ) -> SymbolicKeys:
        """Attention of the image positions to the tokens, added to the keys as rows."""
        num_heads = attn.num_heads
        k = self.linear(attn.k_proj, queries + query_pe)
        b, t, c = k.shape
        k = (k * (1.0 / math.sqrt(c // num_heads))).view(b, t, num_heads, -1).transpose(1, 2)
        v = self.linear(attn.v_proj, queries).view(b, t, num_heads, -1).transpose(1, 2)
        logits = self.image_scores(side, keys, attn, k, name)  # (H, B, T, N)
        probs = torch.softmax(logits, dim=2).transpose(0, 1)  # over the tokens
        return self.append_family(keys, probs, v, attn)

    def image_scores(
        self, side: ImageSide, keys: SymbolicKeys, attn: Attention, k: torch.Tensor, name: str
    ) -> torch.Tensor:
        """(H, B, T, N), heads first: scores of the image positions against the tokens'
        keys ``k`` (B, H, T, dh). At layer 0 the block holds W (K + P) + b; after, the
        low-rank part reads all rows (the beta row too: over the tokens its term is not a
        constant)."""
        b, num_heads, t, dh = k.shape
        k_heads = heads_first(k.to(self.dtype))
        image = side.block(f"{name}.q").view(num_heads, dh, -1)
        n = image.shape[-1]
        if keys.rank == 0:
            return (k_heads @ image).view(num_heads, b, t, n)
        low_rank = self.low_rank_scores(keys, attn.q_proj.weight, k).view(b, num_heads, t, n)
        low_rank.add_(prompts_first(k_heads @ image, b))
        logits = k_heads @ side.pe_block(f"{name}.q").view(num_heads, dh, -1)
        prompts_first(logits, b).addcmul_(low_rank, keys.scale_in_dtype()[:, None])
        return logits.view(num_heads, b, t, n)

    def append_family(
        self, keys: SymbolicKeys, probs: torch.Tensor, values: torch.Tensor, attn: Attention
    ) -> SymbolicKeys:
        """keys + sum_{h,t} probs[h, t, i] Wo_h v_ht + out_proj bias, still symbolic.

        Per head the probabilities sum to 1, so ``H * (T - 1)`` rows carry the family: the
        last token's vector, and the bias, have the coefficient 1 (1/s in the keys' frame)
        and join the row that already has it. The coefficients move to a new buffer with
        room for the row the LayerNorm after the attention adds, so that every batched
        product reads one contiguous tensor."""
        b, num_heads, t, n = probs.shape
        start, rows = keys.rank, num_heads * (t - 1)
        new_ones_row = keys.ones_row is None  # a row of 1/s = 1 (before any LayerNorm)
        total = start + rows + new_ones_row + 1
        coef = keys.coef.new_empty((b, total, n))
        coef[:, :start] = keys.coef[:, :start]
        target = coef[:, start : start + rows].view(b, num_heads, t - 1, n)
        target.copy_(probs[:, :, : t - 1])
        if keys.scale is not None:
            target.div_(keys.scale_in_dtype()[:, None])
        coef[:, start + rows :].zero_()
        out_weight = attn.out_proj.weight  # (C, H*dh)
        wo = out_weight.reshape(out_weight.shape[0], num_heads, -1)
        vectors = torch.einsum("bhtd,chd->bhtc", values, wo)  # (B, H, T, C)
        last = vectors[:, :, t - 1 :]
        differences = (vectors[:, :, : t - 1] - last).reshape(b, rows, -1)
        constant = last.sum(1) + attn.out_proj.bias  # (B, 1, C)
        vecs = torch.cat([keys.vecs, differences], dim=1)
        const_rows, ones_row, rank = keys.const_rows, keys.ones_row, start + rows
        if new_ones_row:
            coef[:, rank : rank + 1].fill_(1.0)
            vecs = torch.cat([vecs, constant], dim=1)
            const_rows, ones_row, rank = [*const_rows, (rank, rank + 1)], rank, rank + 1
        else:
            assert ones_row is not None  # not new_ones_row
            vecs[:, ones_row : ones_row + 1] += constant
        family = FamilyRows(f"layer{keys.layer}.i2t", start, ones_row, values)
        return SymbolicKeys(
            keys.scale,
            coef,
            rank,
            vecs,
            keys.layer,
            [*keys.families, family],
            const_rows,
            ones_row,
            keys.scale_cast,
        )

    def layer_norm(
        self,
        side: ImageSide,
        keys: SymbolicKeys,
        norm: nn.LayerNorm,
        ahead: Queries,
        ahead_weight: torch.Tensor,
    ) -> tuple[SymbolicKeys, Queries]:
        """LayerNorm of symbolic keys: moments from the Gram matrix of the centred vectors,
        the result symbolic (s rescaled, the vectors centred and scaled by gamma, one row
        added: beta, coefficient 1/s').

        With centred vectors ``V~`` and keys ``K~ = M L K``, per position
        ``C var / s^2 = |K~|^2 + 2 sum_r coef_r (V~_r . K~) + coef^T (V~ V~^T) coef``:
        |K~|^2 and the cross terms (through each family's head structure) come from the image
        side. The quadratic form is split at the newest family (rows a before it, b from
        it): ``c_a . (G_aa c_a + 2 G_ab c_b) + c_b . (G_bb c_b)``, a quarter fewer products
        than the full form. The attention after the LayerNorm (queries ``ahead`` of the
        projection ``ahead_weight``) reads the same coefficient rows: its low-rank scores
        join the first product and are returned with its queries."""
        coef, rank, dtype = keys.coef, keys.rank, self.dtype
        b, rows, _ = coef.shape  # rows: rank and the reserved (zero) row
        channels = keys.vecs.shape[-1]
        layer = keys.layer
        centred = keys.vecs - keys.vecs.mean(-1, keepdim=True)
        gram = centred @ centred.transpose(1, 2)  # (B, R, R)
        vecs = centred * norm.weight  # the vectors after this LayerNorm
        split = keys.families[-1].start or rank
        first = gram[:, :split]
        if split < rank:
            first = torch.cat([first[:, :, :split], 2 * first[:, :, split:]], dim=2)
        # The next scores' rows: (V' W_h^T q) over the rows before this LayerNorm's.
        small = key_rows(ahead_weight, ahead.heads) @ vecs.transpose(1, 2)
        left = F.pad(torch.cat([first, small], dim=1), (0, rows - rank))
        product = torch.bmm(left.to(dtype), coef)  # (B, split + H*T, N)
        quads = [product[:, :split]]
        if split < rank:
            quads.append(torch.bmm(gram[:, split:, split:].to(dtype), coef[:, split:rank]))

        def quad(start: int, stop: int) -> torch.Tensor:
            """Rows [start, stop) of the quadratic form's products (never across blocks)."""
            return (
                quads[0][:, start:stop]
                if stop <= split
                else quads[1][:, start - split : stop - split]
            )

        for family in keys.families:  # + 2 (V~_r . K~_i), through the heads
            block = side.block(f"layer{layer}.norm4.cross.{family.name}")
            self.add_cross_terms(quad, family, block)
        const = side.block(f"layer{layer}.norm4.cross.const")
        at = 0
        for start, stop in keys.const_rows:  # the block's rows are the runs' rows in order
            quad(start, stop).add_(const[at : at + stop - start], alpha=2)
            at += stop - start
        # Summed with fp32 accumulation (the reduction's own, for bf16 too).
        form = quads[0].mul_(coef[:, :split]).sum(1)
        if split < rank:
            form = form + quads[1].mul_(coef[:, split:rank]).sum(1)
        var = (side.norm_stats(layer) + form.float()) / channels
        if keys.scale is not None:
            var = var * keys.scale[:, 0].pow(2)
        inv_std = torch.rsqrt(var + norm.eps)[:, None]  # (B, 1, N)
        scale = inv_std if keys.scale is None else keys.scale * inv_std
        # The reserved row by a slice, not an integer index: an exported program keeps the
        # rank symbolic.
        coef[:, rank : rank + 1] = scale.reciprocal()
        vecs = torch.cat([vecs, norm.bias.expand(b, 1, -1)], dim=1)
        runs = list(keys.const_rows)
        if runs and runs[-1][1] == rank:  # the new row continues the last run
            runs[-1] = (runs[-1][0], rank + 1)
        else:
            runs.append((rank, rank + 1))
        normed = SymbolicKeys(
            scale,
            coef,
            rank + 1,
            vecs,
            layer + 1,
            keys.families,
            runs,
            rank,
            scale.to(dtype),
        )
        return normed, Queries(ahead.heads, product[:, split:])

    def add_cross_terms(
        self,
        quad: Callable[[int, int], torch.Tensor],
        family: FamilyRows,
        block: torch.Tensor,
    ) -> None:
        """Adds ``2 (V~_r . K~_i)`` to the rows of ``family`` and its anchor row, ``quad(start,
        stop)`` giving the rows: per head, the differences' rows and the last token's (for
        the anchor) against ``block`` (H*dh, N), in one product."""
        b, num_heads, t, _ = family.values.shape
        values, n = family.values, block.shape[-1]
        last = values[:, :, t - 1 :]
        both = heads_first(torch.cat([values[:, :, : t - 1] - last, last], 2).to(self.dtype))
        cross = prompts_first(both @ block.view(num_heads, -1, n), b)  # (B, H, T, N)
        span = quad(family.start, family.start + num_heads * (t - 1))
        span.view(b, num_heads, t - 1, n).add_(cross[:, :, : t - 1], alpha=2)
        anchor = cross[:, :, t - 1].sum(1, keepdim=True)  # (B, 1, N)
        quad(family.anchor, family.anchor + 1).add_(anchor, alpha=2)

    # ------------------------------------------------------------------ the decoder
    def transformer_layers(
        self, side: ImageSide, tokens: torch.Tensor, final_tokens: list[int]
    ) -> tuple[torch.Tensor, torch.Tensor, SymbolicKeys, Queries]:
        """The transformer's blocks: token states, their positional encoding (the tokens
        themselves), the symbolic image keys, and the final attention's queries of the
        tokens ``final_tokens`` (with their low-rank scores).

        The attention after each LayerNorm of the keys has queries that depend on the
        tokens only (the next block's self-attention, or the final attention's), so they
        are computed before it, and their low-rank scores share its product."""
        b, _, channels = tokens.shape
        n = side.tensors["proj"].shape[-1]
        keys = SymbolicKeys(
            scale=None,
            coef=tokens.new_empty((b, 0, n), dtype=self.dtype),
            rank=0,
            vecs=tokens.new_zeros((b, 0, channels), dtype=FP32),
            layer=0,
            families=[],
            const_rows=[],
            ones_row=None,
        )
        layers = self.transformer.blocks()
        query_pe = tokens
        queries = self.self_attention(layers[0], tokens, query_pe)
        attn = layers[0].cross_attn_token_to_image
        ahead = Queries(self.image_queries(attn, queries + query_pe))
        for index, layer in enumerate(layers):
            name = f"layer{index}"
            attn_out = self.token_to_image(
                side, keys, layer.cross_attn_token_to_image, ahead, f"{name}.t2i"
            )
            queries = layer.norm2(queries + attn_out)
            queries = layer.norm3(queries + self.mlp(layer.mlp, queries))
            attn = layer.cross_attn_image_to_token
            keys = self.image_to_token(side, keys, attn, queries, query_pe, f"{name}.i2t")
            if index + 1 < len(layers):
                queries = self.self_attention(layers[index + 1], queries, query_pe)
                attn = layers[index + 1].cross_attn_token_to_image
                states = queries + query_pe
            else:
                attn = self.transformer.final_attn_token_to_image
                states = _tokens_at(queries + query_pe, final_tokens)
            ahead = Queries(self.image_queries(attn, states))
            keys, ahead = self.layer_norm(side, keys, layer.norm4, ahead, attn.k_proj.weight)
        return queries, query_pe, keys, ahead

    def final_attention(
        self,
        side: ImageSide,
        keys: SymbolicKeys,
        queries: torch.Tensor,
        query_pe: torch.Tensor,
        read_tokens: list[int],
        final_queries: Queries | None = None,
    ) -> torch.Tensor:
        """The last token-to-image attention, for the tokens read afterwards only (the IoU
        token, the mask tokens that are returned): each token attends on its own, so the
        others' would be dead work. ``final_queries``: theirs from
        :meth:`transformer_layers`, else computed here. (B, len(read_tokens), C)."""
        final = self.transformer.final_attn_token_to_image
        q_out = _tokens_at(queries, read_tokens)
        if final_queries is None:
            final_queries = Queries(
                self.image_queries(final, q_out + _tokens_at(query_pe, read_tokens))
            )
        attn_out = self.token_to_image(side, keys, final, final_queries, "final")
        normed: torch.Tensor = self.transformer.norm_final_attn(q_out + attn_out)
        return normed

    def transformer_forward(
        self, side: ImageSide, tokens: torch.Tensor, read_tokens: list[int]
    ) -> tuple[torch.Tensor, SymbolicKeys]:
        """The two-way transformer: the final states (B, len(read_tokens), C) of the tokens
        that are read afterwards, and the symbolic image keys."""
        queries, query_pe, keys, final = self.transformer_layers(side, tokens, read_tokens)
        hs = self.final_attention(side, keys, queries, query_pe, read_tokens, final)
        return hs, keys

    def hypernetwork(self, mask_tokens_out: torch.Tensor, mask_indices: list[int]) -> torch.Tensor:
        """(B, M, c_out): the hypernetwork MLP of each mask token ``mask_indices[j]`` applied
        to its final state ``mask_tokens_out[:, j]``."""
        mlps = self.decoder.output_hypernetworks_mlps
        return torch.stack(
            [mlps[m](mask_tokens_out[:, j]) for j, m in enumerate(mask_indices)], dim=1
        )

    def upscale(self, side: ImageSide, keys: FinalKeys, hyper: torch.Tensor) -> torch.Tensor:
        """Upscaling + hypernetwork dot products: (B, M, 256, 256) logits of the masks whose
        hypernetwork outputs are ``hyper`` (B, M, c_out).

        Both ConvTranspose2d(k=2, s=2) are per-pixel linear maps (every output pixel reads
        exactly one input pixel), so the upscaling runs channels-last as two matmuls with
        the pixels kept in "parent pixel, then sub-pixel" order: LayerNorm2d becomes one
        fused layer_norm over the last dimension, no convolution and no NCHW permute is
        needed until the final logits, and the high-res features are laid out the same way
        once per image."""
        dec = self.decoder
        dc1, ln1, act1, dc2, act2 = dec.upscaling()
        c_in, c_mid = dc1.weight.shape[:2]
        c_out = dc2.weight.shape[1]
        dtype = self.dtype
        # Rows ordered (sub-pixel, channel): (4 * c_mid, c_in).
        w1 = dc1.weight.permute(2, 3, 1, 0).reshape(4 * c_mid, c_in)
        s1, s0 = side.tensors["s1"], side.tensors["s0"]
        b = keys.coef.shape[0]
        shared = side.tensors["up"]  # (N, 4 * c_mid): dc1 of L K, channels last
        n = shared.shape[0]
        # dc1(keys) + bias + feat_s1 = s1 + s * (W L K + coef^T (vecs W^T)).
        low_rank = (keys.vecs @ w1.T).to(dtype)
        x = torch.baddbmm(shared.expand(b, -1, -1), keys.coef.transpose(1, 2), low_rank)
        x = torch.addcmul(s1, x, keys.scale.to(dtype).transpose(1, 2))
        x = x.view(b, n * 4, c_mid)
        # The affine parameters in x's dtype: CUDA's layer_norm refuses bf16 input with
        # fp32 weights (CPU's accepts the mix).
        x = torch.nn.functional.layer_norm(
            x, (c_mid,), ln1.weight.to(dtype), ln1.bias.to(dtype), ln1.eps
        )
        x = gelu_(x, act1)
        # dc2 as (c_mid -> (sub-pixel, c_out)), with its bias and feat_s0 as the addend.
        w2 = dc2.weight.permute(0, 2, 3, 1).reshape(c_mid, 4 * c_out).to(dtype)
        y = torch.baddbmm(s0.expand(b, -1, -1), x, w2.expand(b, -1, -1))
        y = gelu_(y, act2).view(b, n * 16, c_out)
        # (B, pixels in (i, j, di, dj, ei, ej) order, M): the pixels stay rows, as y has
        # them (``hyper @ y^T`` would copy y transposed first: 5x slower), then (B*M,
        # pixels) and to raster order by one gather (an 8-dimensional permute of 2 x 2
        # blocks copies ~10x slower).
        m = hyper.shape[1]
        logits = torch.bmm(y, hyper.to(dtype).transpose(1, 2)).transpose(1, 2)
        h, w = side.size
        source = self.raster_order((h, w), logits.device)
        flat = logits.reshape(b * m, n * 16).float()
        return flat.index_select(1, source).view(b, m, 4 * h, 4 * w)

    def raster_order(self, size: tuple[int, int], device: torch.device) -> torch.Tensor:
        """For each pixel of the (4h, 4w) logits in raster order, its column in the
        upscaling's (i, j, di, dj, ei, ej) order: a constant per size and device, kept
        (except while tracing, whose tensors must not outlive it)."""
        key = (size, device)
        source = self._raster.get(key)
        if source is None:
            h, w = size
            source = torch.arange(h * w * 16, device=device).view(h, w, 2, 2, 2, 2)
            source = source.permute(0, 2, 4, 1, 3, 5).reshape(-1)
            if not torch.compiler.is_compiling():
                self._raster[key] = source
        return source

    def decode_prompts(
        self, side: ImageSide, sparse_embeddings: torch.Tensor, mask_indices: list[int]
    ) -> tuple[torch.Tensor, torch.Tensor, FinalKeys]:
        """Everything before the pixels: IoU predictions of all four masks (B, 4), the
        hypernetwork outputs of the masks ``mask_indices`` (B, M, c_out) and the final keys.

        Token layout: 0 object score, 1 IoU, 2.. mask tokens, then the prompt tokens; only
        the IoU token and the asked-for mask tokens are read after the transformer."""
        read = [1] + [2 + m for m in mask_indices]
        hs, keys = self.transformer_forward(side, self.tokens(sparse_embeddings), read)
        iou = self.decoder.iou_prediction_head(hs[:, 0])
        return iou, self.hypernetwork(hs[:, 1:], mask_indices), keys.final()

    def decode_filtered(
        self,
        side: ImageSide,
        sparse_embeddings: torch.Tensor,
        mask_indices: list[int],
        keep: Callable[[torch.Tensor], torch.Tensor],
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, FinalKeys]:
        """:meth:`decode_prompts` with the prompts filtered by their IoU before any work
        that only kept prompts need: the IoU token's final attention for every prompt, then
        ``keep(iou) -> index``, then the mask tokens' final attention and hypernetworks for
        the kept prompts only (AMG keeps few). Returns IoU (B, 4), the index, and the kept
        prompts' hypernetwork outputs and final keys."""
        tokens = self.tokens(sparse_embeddings)
        queries, query_pe, keys, final = self.transformer_layers(side, tokens, [1])
        iou = self.decoder.iou_prediction_head(
            self.final_attention(side, keys, queries, query_pe, [1], final)[:, 0]
        )
        rows = keep(iou)
        if rows.numel() == 0:  # nothing survives (the index's size is known on the host)
            none = iou.new_zeros((0, len(mask_indices), self.decoder.upscaling()[3].out_channels))
            return iou, rows, none, keys.select(rows).final()
        keys = keys.select(rows)
        masks = [2 + m for m in mask_indices]
        hs = self.final_attention(side, keys, queries[rows], query_pe[rows], masks)
        return iou, rows, self.hypernetwork(hs, mask_indices), keys.final()

    def forward(
        self,
        side: ImageSide,
        sparse_embeddings: torch.Tensor,
        mask_indices: list[int] | None = None,
        keep: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Logits of the mask tokens ``mask_indices`` (default all four) (B', M, 256, 256)
        and IoU predictions of all four (B, 4), like MaskDecoder.predict_all_masks.

        ``keep(iou) -> index`` optionally selects the prompts worth the mask work (AMG drops
        every prompt whose masks all fail the IoU threshold before any of it); the logits
        then hold only those rows, and the index is returned as the third value.
        """
        masks = list(range(self.decoder.num_mask_tokens)) if mask_indices is None else mask_indices
        if keep is None:
            iou, hyper, keys = self.decode_prompts(side, sparse_embeddings, masks)
            rows = torch.arange(iou.shape[0], device=iou.device)
        else:
            iou, rows, hyper, keys = self.decode_filtered(side, sparse_embeddings, masks, keep)
        kept = hyper.shape[0]
        if kept == 0:  # nothing survives: no pixel work at all
            h, w = side.size
            return iou.new_zeros((0, len(masks), 4 * h, 4 * w)), iou, rows
        step = UPSCALE_CHUNK_CPU if hyper.device.type == "cpu" else kept
        logits = [
            self.upscale(side, keys.slice(start, start + step), hyper[start : start + step])
            for start in range(0, kept, step)
        ]
        return (logits[0] if len(logits) == 1 else torch.cat(logits)), iou, rows

    def tokens(self, sparse_embeddings: torch.Tensor) -> torch.Tensor:
        dec = self.decoder
        b = sparse_embeddings.shape[0]
        output_tokens = torch.cat(
            [dec.obj_score_token.weight, dec.iou_token.weight, dec.mask_tokens.weight], dim=0
        )
        return torch.cat([output_tokens.unsqueeze(0).expand(b, -1, -1), sparse_embeddings], 1)
