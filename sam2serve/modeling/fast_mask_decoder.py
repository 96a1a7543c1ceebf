"""A lossless fast path for the SAM2 mask decoder: the same function, 3.5x fewer FLOPs.

Why it can be exact: in the two-way transformer the 4096 image keys start out identical
for every prompt of an image (``K``), and each prompt only ever changes them by
(a) image-to-token attention outputs, which are *low rank*: position i receives
``sum_{h,t} alpha[h, t, i] * Wo_h v[h, t]`` — 8 heads x T tokens vectors, and
(b) LayerNorm, which per position only shifts and rescales, then applies a fixed
channel gain ``gamma`` and bias ``beta``.
So the keys of every prompt stay in the symbolic form

    keys_i = s_i * (g * K_i + sum_r coef[r, i] * V_r)

with a per-position scale ``s`` (the product of the LayerNorms' 1/std), a channel gain ``g``
fixed per layer (the product of their gammas), and per prompt a low-rank part: coefficient
rows ``coef`` (positions last; each attention appends rows) and their vectors ``V``.
Any linear map W of the keys is then ``s * (W g K + (V W^T)^T coef)``: every ``W g K`` is a
weights-only matrix times ``K``, so the whole per-image side is ONE matrix product,
computed once per image; per prompt only rank-R products remain. Attention scores against
a few token vectors never need the 4096 x 256 keys, and LayerNorm moments come from Gram
matrices of the centred vectors (centred, so that no ``mean^2`` cancels against
``E[x^2]``). A LayerNorm rescales ``s`` (4096 numbers per prompt) instead of every row of
``coef``, and adds two rows. Only the upscaling convolutions after the transformer see
dense per-prompt tensors.

Products against the image side are one matrix product per head for all prompts of a call
(``(B*T, dh) @ (dh, 4096)``); products with the low-rank part are one per prompt, in the
decoder's ``dtype`` (bf16 in mode furious on hosts with native bf16; the positions' scales,
the LayerNorm statistics' sums and the softmax statistics stay fp32).

Used when a prompt has no mask input (AMG, clicks, boxes); mask inputs make the image
side per-prompt from the start, and those go through the reference decoder.

Over 500 lines on purpose: it is one derivation (keys kept symbolic through every layer)
and its code, which read best together; split, each half would explain the other.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from sam2serve.modeling.mask_decoder import MaskDecoder
from sam2serve.modeling.transformer import Attention, TwoWayAttentionBlock

FP32 = torch.float32
# Prompts upscaled together on a CPU: each carries ~8 MB of activations (fp32) through the
# upscaling, so more than two at a time leave the cache (the transformer's per-prompt
# tensors are smaller: it takes larger chunks). A GPU upscales a chunk at once.
UPSCALE_CHUNK_CPU = 2


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
    return torch.ops.aten.gelu_(x, approximate=act.approximate)


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


# --------------------------------------------------------------------------- image side


@dataclass
class SidePlan:
    """Weights-only: which linear maps of ``K`` the prompts read, stacked so that the
    per-image side is one product ``weight @ K``, and the LayerNorm gains.

    Block names: ``layer{l}.t2i.k`` / ``.v``, ``layer{l}.i2t.q``, ``final.k`` / ``.v``
    (the attention projections of ``g K``), ``layer{l}.norm4.cross.<family>`` and
    ``.cross.const`` (``V_r . (g K - mean)`` for the LayerNorm's cross terms, through the
    families' head structure); apart, ``upscale``: the first transposed convolution of
    the final keys, which the upscaling reads channels-last."""

    weight: torch.Tensor  # (rows, C)
    rows: dict[str, slice]
    upscale: torch.Tensor  # (4 * 64, C), rows (sub-pixel, channel)
    norm_gains: list[torch.Tensor]  # g of each layer's norm4, (C,)
    # Model constants: projections of the positional encoding P (added to layer 0's
    # blocks, kept apart for later layers, whose scores scale the image part by s).
    pe_weight: torch.Tensor  # (rows_pe, C)
    pe_rows: dict[str, slice]
    pe_bias: torch.Tensor  # (rows_pe,)


def _centring(gain: torch.Tensor) -> torch.Tensor:
    """M with ``M K_i = g * K_i - mean(g * K_i)``: the LayerNorm's centred keys."""
    c = gain.shape[0]
    return torch.diag(gain) - gain[None, :].expand(c, c) / c


def side_plan(decoder: MaskDecoder) -> SidePlan:
    """Walks the transformer with the same bookkeeping as :class:`FastMaskDecoder` (gains,
    families, constant rows), recording the maps of ``K`` each stage will read."""
    transformer = decoder.transformer
    channels = decoder.iou_token.weight.shape[1]
    gain = torch.ones(channels, dtype=FP32, device=decoder.iou_token.weight.device)
    families: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}  # name -> (Wo, sigma)
    consts = gain.new_zeros((0, channels))  # constant rows' vectors, in row order
    blocks: list[tuple[str, torch.Tensor]] = []
    pe_blocks: list[tuple[str, torch.Tensor, torch.Tensor | None]] = []
    norm_gains = []
    for index, layer in enumerate(transformer.layers):
        name = f"layer{index}"
        t2i, i2t = layer.cross_attn_token_to_image, layer.cross_attn_image_to_token
        blocks += [
            (f"{name}.t2i.k", t2i.k_proj.weight * gain),
            (f"{name}.t2i.v", t2i.v_proj.weight * gain),
            (f"{name}.i2t.q", i2t.q_proj.weight * gain),
        ]
        pe_blocks += [(f"{name}.t2i.k", t2i.k_proj.weight, None)]
        pe_blocks += [(f"{name}.i2t.q", i2t.q_proj.weight, i2t.q_proj.bias)]
        families[f"{name}.i2t"] = (i2t.out_proj.weight, torch.ones_like(gain))
        # The out_proj bias has coefficient 1/s: a new row in the first layer, else added
        # to the previous LayerNorm's beta row, whose coefficient is the same 1/s.
        if index == 0:
            consts = torch.cat([consts, i2t.out_proj.bias[None]])
        else:
            consts = torch.cat([consts[:-1], (consts[-1] + i2t.out_proj.bias)[None]])
        centring = _centring(gain)
        for family, (out_weight, sigma) in families.items():
            blocks.append((f"{name}.norm4.cross.{family}", (out_weight.T * sigma) @ centring))
        blocks.append((f"{name}.norm4.cross.const", consts @ centring))
        norm_gains.append(gain)
        gamma, beta = layer.norm4.weight, layer.norm4.bias
        families = {f: (w, sigma * gamma) for f, (w, sigma) in families.items()}
        consts = torch.cat([consts * gamma, gamma[None], beta[None]])
        gain = gain * gamma
    final = transformer.final_attn_token_to_image
    dc1 = decoder.output_upscaling[0]
    w1 = dc1.weight.permute(2, 3, 1, 0).reshape(-1, channels)  # rows (sub-pixel, channel)
    blocks += [("final.k", final.k_proj.weight * gain), ("final.v", final.v_proj.weight * gain)]
    pe_blocks += [("final.k", final.k_proj.weight, None)]
    rows, start = {}, 0
    for block_name, matrix in blocks:
        rows[block_name] = slice(start, start + matrix.shape[0])
        start += matrix.shape[0]
    pe_rows, start = {}, 0
    for block_name, matrix, _ in pe_blocks:
        pe_rows[block_name] = slice(start, start + matrix.shape[0])
        start += matrix.shape[0]
    pe_bias = torch.cat([gain.new_zeros(m.shape[0]) if b is None else b for _, m, b in pe_blocks])
    return SidePlan(
        torch.cat([m for _, m in blocks]).contiguous(),
        rows,
        (w1 * gain).contiguous(),
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
    - ``stats`` (2 * depth, N) fp32: per LayerNorm, mean and centred sum of squares of g K;
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

    def norm_stats(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(mean (N,), centred sum of squares (N,)) of ``g K`` at layer ``layer``'s norm4."""
        stats = self.tensors["stats"]
        return stats[2 * layer], stats[2 * layer + 1]

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
    others' (divided by s), with vectors ``sigma * Wo_h (v_ht - v_h,last)``, and the last
    token's vectors ``sigma * Wo_h v_h,last`` join the ``anchor`` row (coefficient 1/s).
    The LayerNorm cross terms go through the head structure, so the values are kept."""

    name: str
    start: int
    anchor: int
    values: torch.Tensor  # (B, H, T, dh), the last token's included


@dataclass
class SymbolicKeys:
    """``keys_i = s_i * (g K_i + sum_r coef[r, i] V_r)`` for a chunk of B prompts."""

    scale: torch.Tensor | None  # (B, 1, N) fp32; None: identically 1 (before any LayerNorm)
    # (B, rows, N) in the decoder's dtype, contiguous (a batched product reads it whole):
    # rows >= rank are zeros, reserved for the LayerNorm that follows an attention.
    coef: torch.Tensor
    rank: int
    vecs: torch.Tensor  # (B, rank, C) fp32
    layer: int  # which LayerNorm gains apply (the plan's stage)
    families: list[FamilyRows]
    # Runs [start, stop) of the rows whose vectors are constants (biases, gammas, betas).
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

    def final(self) -> FinalKeys:
        scale = self.scale
        if scale is None:
            scale = self.vecs.new_ones((self.coef.shape[0], 1, self.coef.shape[2]))
        return FinalKeys(scale, self.coef, self.vecs)


@dataclass
class FinalKeys:
    """The image keys after the transformer, as the upscaling reads them:
    ``scale * (g K + coef^T vecs)``, g K's projection being the side's ``up`` tensor."""

    scale: torch.Tensor  # (B, 1, N) fp32
    coef: torch.Tensor  # (B, R, N)
    vecs: torch.Tensor  # (B, R, C) fp32

    def select(self, index: torch.Tensor) -> FinalKeys:
        return FinalKeys(self.scale[index], self.coef[index], self.vecs[index])

    def slice(self, start: int, stop: int) -> FinalKeys:
        return FinalKeys(self.scale[start:stop], self.coef[start:stop], self.vecs[start:stop])


class FastMaskDecoder:
    """Computes ``MaskDecoder.predict_all_masks`` for prompts without a mask input.

    ``dtype``: what the per-prompt products and the image side are stored and multiplied
    in (fp32: mode fast, equal to the reference up to float reassociation; bf16: mode
    furious on devices that run it natively)."""

    source = "eager"

    def __init__(self, decoder: MaskDecoder, dtype: torch.dtype = FP32) -> None:
        self.decoder = decoder
        self.transformer = decoder.transformer
        self.dtype = dtype
        with torch.no_grad():
            self.plan = side_plan(decoder)
        # The positional encoding's projections, per dtype (a model constant).
        self._pe: dict[torch.dtype, torch.Tensor] = {}

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
        stats = []
        for gain in plan.norm_gains:
            gained = keys * gain[:, None]
            mean = gained.mean(0)
            stats += [mean, (gained - mean).pow(2).sum(0)]
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
        dc1, dc2 = self.decoder.output_upscaling[0], self.decoder.output_upscaling[3]
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

    # ------------------------------------------------------------------ symbolic algebra
    def scores(
        self,
        side: ImageSide,
        keys: SymbolicKeys,
        weight: torch.Tensor,
        queries: torch.Tensor,
        name: str,
    ) -> torch.Tensor:
        """(B, H, T, N): ``queries[b, h, t] . (W_h (keys_i + P_i) + b_h)`` (the bias only
        for blocks whose positional projection carries it).

        The image part is one product per head for all prompts; the low-rank part one
        product per prompt; ``s`` scales both, the positional part is added after."""
        b, num_heads, t, dh = queries.shape
        q_heads = heads_first(queries.to(self.dtype))  # (H, B*T, dh)
        image = prompts_first(q_heads @ side.block(name).view(num_heads, dh, -1), b)
        if keys.rank == 0:  # layer 0: s is 1 and the block holds W (K + P) (+ b)
            return image
        # (V W^T) . q per prompt: the low-rank part's scores are (B, H*T, R) @ (R, N).
        projected = (keys.vecs @ weight.T).view(b, keys.rank, num_heads, dh)
        small = torch.einsum("brhd,bhtd->bhtr", projected, queries.float())
        out = torch.bmm(small.reshape(b, num_heads * t, -1).to(self.dtype), keys.coef)
        out = out.view(b, num_heads, t, -1).add_(image)
        positional = prompts_first(q_heads @ side.pe_block(name).view(num_heads, dh, -1), b)
        return torch.addcmul(positional, out, keys.scale_cast[:, None])

    def weighted_values(
        self,
        side: ImageSide,
        keys: SymbolicKeys,
        weight: torch.Tensor,
        probs: torch.Tensor,
        name: str,
    ) -> torch.Tensor:
        """(B, T, H*dh): ``sum_i probs[b, h, t, i] * W_h keys_i`` (without the bias, which
        the probabilities, summing to 1, pass through unchanged)."""
        b, num_heads, t, n = probs.shape
        if keys.scale is not None:  # probs is this call's own: scaled in place
            probs = probs.mul_(keys.scale_cast[:, None])
        shared = side.block(name).view(num_heads, -1, n).transpose(1, 2)  # (H, N, dh)
        out = prompts_first(heads_first(probs) @ shared, b).float()  # (B, H, T, dh)
        if keys.rank:
            mixed = torch.bmm(probs.reshape(b, num_heads * t, n), keys.coef.transpose(1, 2))
            projected = (keys.vecs @ weight.T).view(b, keys.rank, num_heads, -1)
            mixed = mixed.view(b, num_heads, t, -1).float()
            out = out + torch.einsum("bhtr,brhd->bhtd", mixed, projected)
        return merge_heads(out)

    def append_family(
        self, keys: SymbolicKeys, probs: torch.Tensor, values: torch.Tensor, attn: Attention
    ) -> SymbolicKeys:
        """keys + sum_{h,t} probs[h, t, i] Wo_h v_ht + out_proj bias, still symbolic.

        Per head the probabilities sum to 1, so ``H * (T - 1)`` rows carry the family: the
        last token's vector, and the bias, have the coefficient 1 (1/s in the keys' frame)
        and join the row that already has it. The coefficients move to a new buffer with
        room for the rows the LayerNorm after the attention adds, so that every batched
        product reads one contiguous tensor."""
        b, num_heads, t, n = probs.shape
        start, rows = keys.rank, num_heads * (t - 1)
        new_ones_row = keys.ones_row is None  # a row of 1/s = 1 (before any LayerNorm)
        total = start + rows + new_ones_row + 2
        coef = keys.coef.new_empty((b, total, n))
        coef[:, :start] = keys.coef[:, :start]
        target = coef[:, start : start + rows].view(b, num_heads, t - 1, n)
        if keys.scale is None:
            target.copy_(probs[:, :, : t - 1])
        else:
            torch.div(probs[:, :, : t - 1], keys.scale_cast[:, None], out=target)
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
        self, side: ImageSide, keys: SymbolicKeys, norm: torch.nn.LayerNorm
    ) -> SymbolicKeys:
        """LayerNorm of symbolic keys: moments from the Gram matrix of the centred vectors,
        the result symbolic (s rescaled, two rows added: -mean/s for gamma, 1/s' for beta).

        With centred vectors ``V~`` and keys ``K~``, per position
        ``C var / s^2 = |K~|^2 + 2 sum_r coef_r (V~_r . K~) + coef^T (V~ V~^T) coef``:
        |K~|^2 and the cross terms (through each family's head structure) come from the image
        side, the quadratic form is one (R + 1, R) @ (R, N) product per prompt whose extra
        row gives the mean."""
        coef, rank = keys.coef, keys.rank
        b, rows, n = coef.shape
        channels = keys.vecs.shape[-1]
        layer = keys.layer
        vec_mean = keys.vecs.mean(-1)  # (B, R)
        centred = keys.vecs - vec_mean[..., None]
        gram = torch.cat([centred @ centred.transpose(1, 2), vec_mean[:, None]], dim=1)
        # Zero columns for the reserved rows: the product reads the whole buffer.
        gram = torch.nn.functional.pad(gram, (0, rows - rank))
        quad = torch.bmm(gram.to(self.dtype), coef)  # (B, R + 1, N)
        mean_over_s = quad[:, rank : rank + 1].float()  # (B, 1, N)
        for family in keys.families:  # + 2 (V~_r . K~_i), through the heads
            _, num_heads, t, _ = family.values.shape
            block = side.block(f"layer{layer}.norm4.cross.{family.name}")
            block = block.view(num_heads, -1, n)
            values = family.values.to(self.dtype)
            last = values[:, :, t - 1 :]
            cross = prompts_first(heads_first(values[:, :, : t - 1] - last) @ block, b)
            span = quad[:, family.start : family.start + num_heads * (t - 1)]
            span.view(b, num_heads, t - 1, n).add_(cross, alpha=2)
            anchor = prompts_first(heads_first(last) @ block, b).sum(1)  # (B, 1, N)
            quad[:, family.anchor : family.anchor + 1].add_(anchor, alpha=2)
        const = side.block(f"layer{layer}.norm4.cross.const")
        at = 0
        for start, stop in keys.const_rows:  # the block's rows are the runs' rows in order
            quad[:, start:stop].add_(const[at : at + stop - start], alpha=2)
            at += stop - start
        # Summed with fp32 accumulation (the reduction's own, for bf16 too).
        form = quad[:, :rank].mul_(coef[:, :rank]).sum(1).float()  # (B, N)
        k_mean, k_sumsq = side.norm_stats(layer)
        var = (k_sumsq + form) / channels
        if keys.scale is not None:
            var = var * keys.scale[:, 0].pow(2)
        inv_std = torch.rsqrt(var + norm.eps)[:, None]  # (B, 1, N)
        scale = inv_std if keys.scale is None else keys.scale * inv_std
        # Rows by slices, not integer indices: an exported program keeps the rank symbolic.
        coef[:, rank : rank + 1] = -(mean_over_s + k_mean)
        coef[:, rank + 1 : rank + 2] = scale.reciprocal()
        gamma, beta = norm.weight, norm.bias
        vecs = torch.cat([keys.vecs * gamma, gamma.expand(b, 1, -1), beta.expand(b, 1, -1)], dim=1)
        runs = list(keys.const_rows)
        if runs and runs[-1][1] == rank:  # the new rows continue the last run
            runs[-1] = (runs[-1][0], rank + 2)
        else:
            runs.append((rank, rank + 2))
        return SymbolicKeys(
            scale,
            coef,
            rank + 2,
            vecs,
            layer + 1,
            keys.families,
            runs,
            rank + 1,
            scale.to(self.dtype),
        )

    # ------------------------------------------------------------------ attention pieces
    def token_to_image(
        self,
        side: ImageSide,
        keys: SymbolicKeys,
        attn: Attention,
        queries_with_pe: torch.Tensor,
        name: str,
    ) -> torch.Tensor:
        """Attention of the tokens to the (symbolic) image keys; returns out_proj output."""
        num_heads = attn.num_heads
        q = attn.q_proj(queries_with_pe)  # (B, T, H*dh)
        b, t, c = q.shape
        # The softmax scale goes into the queries (T rows) rather than the scores (4096).
        q = (q * (1.0 / math.sqrt(c // num_heads))).view(b, t, num_heads, -1).transpose(1, 2)
        # k = Wk (keys + P) + bk; the bias is the same for every position: softmax drops it.
        logits = self.scores(side, keys, attn.k_proj.weight, q, f"{name}.k")
        probs = torch.softmax(logits, dim=-1)  # (B, H, T, N)
        out = self.weighted_values(side, keys, attn.v_proj.weight, probs, f"{name}.v")
        return attn.out_proj(out + attn.v_proj.bias)

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
        k = attn.k_proj(queries + query_pe)
        b, t, c = k.shape
        k = (k * (1.0 / math.sqrt(c // num_heads))).view(b, t, num_heads, -1).transpose(1, 2)
        v = attn.v_proj(queries).view(b, t, num_heads, -1).transpose(1, 2)  # (B, H, T, dh)
        logits = self.scores(side, keys, attn.q_proj.weight, k, f"{name}.q")
        probs = torch.softmax(logits, dim=2)  # over the tokens
        return self.append_family(keys, probs, v, attn)

    # ------------------------------------------------------------------ the decoder
    def transformer_forward(
        self, side: ImageSide, tokens: torch.Tensor, read_tokens: list[int]
    ) -> tuple[torch.Tensor, SymbolicKeys]:
        """The two-way transformer: the final states (B, len(read_tokens), C) of the tokens
        that are read afterwards, and the symbolic image keys."""
        queries, query_pe, keys = self.transformer_layers(side, tokens)
        return self.final_attention(side, keys, queries, query_pe, read_tokens), keys

    def transformer_layers(
        self, side: ImageSide, tokens: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, SymbolicKeys]:
        """The transformer's blocks: token states, their positional encoding (the tokens
        themselves) and the symbolic image keys."""
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
        queries, query_pe = tokens, tokens
        for index, layer in enumerate(self.transformer.layers):
            queries, keys = self.block_forward(
                side, keys, layer, queries, query_pe, f"layer{index}"
            )
        return queries, query_pe, keys

    def final_attention(
        self,
        side: ImageSide,
        keys: SymbolicKeys,
        queries: torch.Tensor,
        query_pe: torch.Tensor,
        read_tokens: list[int],
    ) -> torch.Tensor:
        """The last token-to-image attention, for the tokens read afterwards only (the IoU
        token, the mask tokens that are returned): each token attends on its own, so the
        others' would be dead work. (B, len(read_tokens), C)."""
        final = self.transformer.final_attn_token_to_image
        q_out, pe_out = _tokens_at(queries, read_tokens), _tokens_at(query_pe, read_tokens)
        attn_out = self.token_to_image(side, keys, final, q_out + pe_out, "final")
        return self.transformer.norm_final_attn(q_out + attn_out)

    def block_forward(
        self,
        side: ImageSide,
        keys: SymbolicKeys,
        layer: TwoWayAttentionBlock,
        queries: torch.Tensor,
        query_pe: torch.Tensor,
        name: str,
    ) -> tuple[torch.Tensor, SymbolicKeys]:
        if layer.skip_first_layer_pe:
            queries = layer.self_attn(queries, queries, queries)
        else:
            q = queries + query_pe
            queries = queries + layer.self_attn(q, q, queries)
        queries = layer.norm1(queries)
        attn_out = self.token_to_image(
            side, keys, layer.cross_attn_token_to_image, queries + query_pe, f"{name}.t2i"
        )
        queries = layer.norm2(queries + attn_out)
        queries = layer.norm3(queries + layer.mlp(queries))
        attn = layer.cross_attn_image_to_token
        keys = self.image_to_token(side, keys, attn, queries, query_pe, f"{name}.i2t")
        keys = self.layer_norm(side, keys, layer.norm4)
        return queries, keys

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
        dc1, ln1, act1, dc2, act2 = dec.output_upscaling
        c_in, c_mid = dc1.weight.shape[:2]
        c_out = dc2.weight.shape[1]
        dtype = self.dtype
        # Rows ordered (sub-pixel, channel): (4 * c_mid, c_in).
        w1 = dc1.weight.permute(2, 3, 1, 0).reshape(4 * c_mid, c_in)
        s1, s0 = side.tensors["s1"], side.tensors["s0"]
        b = keys.coef.shape[0]
        shared = side.tensors["up"]  # (N, 4 * c_mid): dc1 of g K, channels last
        n = shared.shape[0]
        # dc1(keys) + bias + feat_s1 = s1 + s * (W g K + coef^T (vecs W^T)).
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
        # (B, M, pixels in (i, j, di, dj, ei, ej) order), to raster order by one gather (an
        # 8-dimensional permute of 2 x 2 blocks copies ~10x slower).
        logits = (hyper.to(dtype) @ y.transpose(1, 2)).float()
        h, w = side.size
        m = logits.shape[1]
        source = torch.arange(n * 16, device=logits.device).view(h, w, 2, 2, 2, 2)
        source = source.permute(0, 2, 4, 1, 3, 5).reshape(-1)  # raster pixel -> its column
        return logits.view(b * m, -1).index_select(1, source).view(b, m, 4 * h, 4 * w)

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
        queries, query_pe, keys = self.transformer_layers(side, self.tokens(sparse_embeddings))
        iou = self.decoder.iou_prediction_head(
            self.final_attention(side, keys, queries, query_pe, [1])[:, 0]
        )
        rows = keep(iou)
        if rows.numel() == 0:  # nothing survives (the index's size is known on the host)
            none = iou.new_zeros(
                (0, len(mask_indices), self.decoder.output_upscaling[3].out_channels)
            )
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
