"""A lossless fast path for the SAM2 mask decoder: the same function, ~3x fewer FLOPs.

Why it can be exact: in the two-way transformer the 4096 image keys start out identical
for every prompt of an image (``K``), and each prompt only ever changes them by
(a) image-to-token attention outputs, which are *low rank*: position i receives
``sum_{h,t} alpha[h, i, t] * Wo_h v[h, t]`` — 8 heads x T tokens vectors, and
(b) LayerNorm, which per position only shifts and rescales, then applies a fixed
channel gain ``gamma`` and bias ``beta``.
So the keys of every prompt stay in the symbolic form

    keys_i = a_i * (d * K_i) + sum_f coef_f[i] @ V_f + c_i @ E

with a per-position scalar ``a``, a fixed channel gain ``d`` (a product of gammas),
low-rank families ``(coef_f, V_f)`` and a few constant vectors ``E``. Any linear map of
the keys is then ``a_i * (W d K)_i`` (precomputed once per image) plus rank-R products,
attention scores against few token vectors never need the 4096 x 256 keys, and
LayerNorm statistics come from Gram matrices. Only the upscaling convolutions after the
transformer see dense per-prompt tensors.

Used when a prompt has no mask input (AMG, clicks, boxes); mask inputs make the image
side per-prompt from the start, and those go through the reference decoder.

Over 500 lines on purpose: it is one derivation (keys kept symbolic through every layer)
and its code, which read best together; split, each half would explain the other.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from sam2serve.modeling.mask_decoder import MaskDecoder
from sam2serve.modeling.transformer import Attention, TwoWayAttentionBlock


def split_heads(x: torch.Tensor, num_heads: int) -> torch.Tensor:
    """(B, N, H*dh) -> (B, H, N, dh)."""
    b, n, c = x.shape
    return x.reshape(b, n, num_heads, c // num_heads).transpose(1, 2)


def shared_times_prompts(shared: torch.Tensor, vectors: torch.Tensor) -> torch.Tensor:
    """(1, H, N, dh) shared image rows x (B, H, T, dh) prompt vectors -> (B, H, N, T).

    A broadcast matmul would copy ``shared`` once per prompt; folding the prompts into the
    column dimension makes it one (H, N, dh) @ (H, dh, B*T) product and no copy."""
    b, h, t, d = vectors.shape
    n = shared.shape[2]
    folded = vectors.permute(1, 3, 0, 2).reshape(h, d, b * t)
    return (shared[0] @ folded).reshape(h, n, b, t).permute(2, 0, 1, 3)


def prompts_times_shared_rows(vectors: torch.Tensor, shared: torch.Tensor) -> torch.Tensor:
    """(B, H, T, dh) prompt vectors x (1, H, N, dh) shared rows -> (B, H, T, N), one
    (H, B*T, dh) @ (H, dh, N) product with no copy of ``shared``."""
    b, h, t, d = vectors.shape
    folded = vectors.transpose(0, 1).reshape(h, b * t, d)
    return (folded @ shared[0].transpose(1, 2)).reshape(h, b, t, -1).transpose(0, 1)


def prompts_times_shared(weights: torch.Tensor, shared: torch.Tensor) -> torch.Tensor:
    """(B, H, T, N) per-prompt weights x (1, H, N, dh) shared rows -> (B, H, T, dh)."""
    b, h, t, n = weights.shape
    folded = weights.transpose(0, 1).reshape(h, b * t, n)
    return (folded @ shared[0]).reshape(h, b, t, -1).transpose(0, 1)


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


@dataclass
class Family:
    """Low-rank part added by one image-to-token attention: vectors ``scale * Wo_h v_ht``
    weighted per position by ``coef`` (the attention probabilities, head-major)."""

    coef: torch.Tensor  # (B, 4096, H*T)
    values: torch.Tensor  # (B, H, T, dh)
    out_weight: torch.Tensor  # (C, H*dh): the attention's out_proj weight
    scale: torch.Tensor  # (C,)
    name: str  # identifies (out_weight, scale) for per-image caches

    def vectors(self) -> torch.Tensor:
        """(B, H*T, C): the family's vectors in channel space."""
        b, h, t, dh = self.values.shape
        wo = self.out_weight.reshape(-1, h, dh)  # (C, H, dh)
        vec = torch.einsum("bhtd,chd->bhtc", self.values, wo).reshape(b, h * t, -1)
        return vec * self.scale

    def rescaled(self, position_scale: torch.Tensor, gain: torch.Tensor, tag: str) -> Family:
        return Family(
            self.coef * position_scale,
            self.values,
            self.out_weight,
            self.scale * gain,
            f"{self.name}*{tag}",
        )


@dataclass
class SymbolicKeys:
    a: torch.Tensor  # (B or 1, 4096, 1) scale of the shared image part
    gain: torch.Tensor  # (C,) channel gain d of the shared image part
    gain_name: str
    families: list[Family]
    const_coef: torch.Tensor  # (B or 1, 4096, K)
    const_vecs: torch.Tensor  # (K, C)

    @property
    def batch(self) -> int:
        return max(
            [self.a.shape[0], self.const_coef.shape[0]] + [f.coef.shape[0] for f in self.families]
        )

    @functools.cached_property
    def family_parts(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(coef (B, 4096, R), vectors (B, R, C)) of all families; R = 0 before the first.
        Concatenated once per keys value: several projections read it."""
        if not self.families:
            b, n, c = self.batch, self.a.shape[1], self.const_vecs.shape[1]
            return self.a.new_zeros((b, n, 0)), self.a.new_zeros((b, 0, c))
        coef = torch.cat([f.coef for f in self.families], dim=2)
        return coef, torch.cat([f.vectors() for f in self.families], dim=1)

    @functools.cached_property
    def low_rank(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Families and constant vectors together: (coef (B, 4096, R+K), vecs (B, R+K, C))."""
        coef, vecs = self.family_parts
        b = coef.shape[0]
        const_coef = self.const_coef.expand(b, -1, -1)
        const_vecs = self.const_vecs.expand(b, -1, -1)
        return torch.cat([coef, const_coef], dim=2), torch.cat([vecs, const_vecs], dim=1)

    def final(self) -> FinalKeys:
        coef, vecs = self.low_rank
        return FinalKeys(self.a, coef, vecs, self.gain, self.gain_name)


@dataclass
class FinalKeys:
    """The image keys after the transformer, flattened to what the upscaling reads:
    ``a * (gain * K) + coef @ vecs`` per prompt (families and constants in one rank-R part).
    ``gain_name`` names the gain for the per-image projection caches."""

    a: torch.Tensor  # (B or 1, 4096, 1)
    coef: torch.Tensor  # (B, 4096, R)
    vecs: torch.Tensor  # (B, R, C)
    gain: torch.Tensor | None  # (C,); None when every projection of K is already cached
    gain_name: str

    def select(self, index: torch.Tensor) -> FinalKeys:
        a = self.a if self.a.shape[0] == 1 else self.a[index]
        return FinalKeys(a, self.coef[index], self.vecs[index], self.gain, self.gain_name)


@dataclass
class ImageSide:
    """Per-image tensors shared by every prompt: the keys K, their positional encoding P,
    and a cache of projections of K computed on first use."""

    keys: torch.Tensor  # (1, 4096, C)
    pe: torch.Tensor  # (1, 4096, C)
    high_res_feats: tuple[torch.Tensor, ...]  # (s0, s1); () once they are in the cache
    size: tuple[int, int]
    cache: dict[str, Any] = field(default_factory=dict)
    # A frozen side (inside an exported program) computes nothing: a miss is an error.
    frozen: bool = False

    def memo(self, name: str, compute: Callable[[], Any]) -> Any:
        if name not in self.cache:
            if self.frozen:
                raise KeyError(f"the image side has no {name!r} precomputed")
            self.cache[name] = compute()
        return self.cache[name]

    def project_keys(self, weight: torch.Tensor, gain: torch.Tensor, name: str) -> torch.Tensor:
        """(1, 4096, out) = (gain * K) @ weight.T, once per image."""
        return self.memo(f"K@{name}", lambda: (self.keys * gain) @ weight.T)

    def project_pe(
        self, weight: torch.Tensor, bias: torch.Tensor | None, name: str
    ) -> torch.Tensor:
        """(1, 4096, out) = P @ weight.T (+ bias), once per image."""
        if bias is None:
            return self.memo(f"P@{name}", lambda: self.pe @ weight.T)
        return self.memo(f"P@{name}+b", lambda: torch.addmm(bias, self.pe[0], weight.T)[None])

    def upscaling_features(
        self, decoder: MaskDecoder, s0_dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The high-res features plus the transposed convolutions' biases, in the
        channels-last "parent pixel, then sub-pixel" order of ``masks_from_keys``:
        s1 (1, 4096, 4 * 64) and s0 (1, 4096 * 4, 4 * 32), s0 in ``s0_dtype`` (the dtype
        of the upscaling's second half)."""

        def compute() -> tuple[torch.Tensor, torch.Tensor]:
            dc1, dc2 = decoder.output_upscaling[0], decoder.output_upscaling[3]
            feat_s0, feat_s1 = self.high_res_feats
            h, w = self.size
            c1, c0 = feat_s1.shape[1], feat_s0.shape[1]
            # feat_s1 pixel (2i + di, 2j + dj) -> [i * w + j, di * 2 + dj, c]
            s1 = feat_s1[:1].reshape(c1, h, 2, w, 2).permute(1, 3, 2, 4, 0)
            s1 = (s1.reshape(1, h * w, 4, c1) + dc1.bias).reshape(1, h * w, 4 * c1)
            # feat_s0 pixel (4i + 2di + ei, 4j + 2dj + ej) -> [(i, j, di, dj, ei, ej), c]
            s0 = feat_s0[:1].reshape(c0, h, 2, 2, w, 2, 2).permute(1, 4, 2, 5, 3, 6, 0)
            s0 = (s0.reshape(1, h * w * 16, c0) + dc2.bias).reshape(1, h * w * 4, 4 * c0)
            return s1.contiguous(), s0.to(s0_dtype).contiguous()

        return self.memo(f"upscaling:{s0_dtype}", compute)

    def gained_keys_stats(self, gain: torch.Tensor, gain_name: str) -> tuple[torch.Tensor, ...]:
        """Per-position mean and sum of squares of gain * K."""

        def compute() -> torch.Tensor:
            k = self.keys * gain
            return torch.stack([k.mean(-1), k.pow(2).sum(-1)], dim=-1)

        stats = self.memo(f"stats:{gain_name}", compute)
        return stats[..., 0:1], stats[..., 1:2]


class FastMaskDecoder:
    """Computes ``MaskDecoder.predict_all_masks`` for prompts without a mask input."""

    source = "eager"

    def __init__(self, decoder: MaskDecoder, upscaling_dtype: torch.dtype = torch.float32) -> None:
        self.decoder = decoder
        self.transformer = decoder.transformer
        # Mode furious runs the second half of the upscaling (the largest per-prompt
        # tensors: 256 x 256 x 32) and the hypernetwork products in bf16 / fp16; everything
        # before stays fp32, the Gram-based LayerNorm statistics included.
        self.upscaling_dtype = upscaling_dtype

    # ------------------------------------------------------------------ image side
    def prepare(
        self,
        image_embed: torch.Tensor,
        image_pe: torch.Tensor,
        no_mask_dense: torch.Tensor,
        high_res_feats: tuple[torch.Tensor, torch.Tensor],
    ) -> ImageSide:
        keys = (image_embed + no_mask_dense).flatten(2).transpose(1, 2)
        pe = image_pe.flatten(2).transpose(1, 2)
        h, w = image_embed.shape[-2:]
        return ImageSide(keys, pe, high_res_feats, (h, w))

    # ------------------------------------------------------------------ symbolic algebra
    def scores(
        self,
        side: ImageSide,
        keys: SymbolicKeys,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        vectors: torch.Tensor,
        name: str,
    ) -> torch.Tensor:
        """(B, H, T, 4096): sum_d (W_h (keys_i + P_i) + b_h)_d * vectors[b, h, t, d].

        Positions last: both attentions' softmaxes then run over contiguous rows."""
        b, num_heads, t, _ = vectors.shape
        shared = split_heads(
            side.project_keys(weight, keys.gain, f"{name}|{keys.gain_name}"), num_heads
        )
        scale = keys.a.transpose(1, 2).unsqueeze(1)  # (B or 1, 1, 1, 4096)
        # The positional part and the bias are the same for every prompt: W P + b is
        # projected once per image, so each prompt pays one product for both.
        pe = split_heads(side.project_pe(weight, bias, name), num_heads)
        coef, vecs = keys.low_rank
        projected = (vecs @ weight.T).reshape(vecs.shape[0], -1, num_heads, vectors.shape[3])
        small = torch.einsum("brhd,bhtd->bhtr", projected, vectors)  # (B, H, T, R)
        # The low-rank part first, then the shared parts accumulated into it in place: one
        # (B, H, T, 4096) buffer instead of a new one per term.
        out = (small.reshape(b, num_heads * t, -1) @ coef.transpose(1, 2)).view(b, num_heads, t, -1)
        out.add_(prompts_times_shared_rows(vectors, pe))
        return out.addcmul_(prompts_times_shared_rows(vectors, shared), scale)

    def weighted_values(
        self,
        side: ImageSide,
        keys: SymbolicKeys,
        weight: torch.Tensor,
        bias: torch.Tensor,
        probs: torch.Tensor,
        name: str,
    ) -> torch.Tensor:
        """(B, T, H*dh): sum_i probs[b, h, t, i] * (W_h keys_i + b_h)."""
        num_heads = probs.shape[1]
        shared = split_heads(
            side.project_keys(weight, keys.gain, f"{name}|{keys.gain_name}"), num_heads
        )  # (1, H, 4096, dh)
        out = prompts_times_shared(probs * keys.a.transpose(1, 2).unsqueeze(1), shared)
        coef, vecs = keys.low_rank
        mixed = torch.einsum("bhti,bir->bhtr", probs, coef)  # (B, H, T, R)
        dh = weight.shape[0] // num_heads
        projected = (vecs @ weight.T).reshape(vecs.shape[0], vecs.shape[1], num_heads, dh)
        out = out + torch.einsum("bhtr,brhd->bhtd", mixed, projected)
        out = merge_heads(out)
        return out + bias

    def add_attention_output(
        self, keys: SymbolicKeys, family: Family, bias: torch.Tensor
    ) -> SymbolicKeys:
        """keys + (low-rank attention output) + bias, still symbolic."""
        one = keys.const_coef.new_ones((*keys.const_coef.shape[:-1], 1))
        const_coef = torch.cat([keys.const_coef, one], dim=-1)
        return SymbolicKeys(
            keys.a,
            keys.gain,
            keys.gain_name,
            [*keys.families, family],
            const_coef,
            torch.cat([keys.const_vecs, bias[None]], dim=0),
        )

    def layer_norm(
        self, side: ImageSide, keys: SymbolicKeys, norm: torch.nn.LayerNorm, tag: str
    ) -> SymbolicKeys:
        """LayerNorm of symbolic keys: statistics from Gram matrices, result symbolic."""
        channels = keys.gain.shape[0]
        k_mean, k_sumsq = side.gained_keys_stats(keys.gain, keys.gain_name)
        coef, vecs = keys.family_parts  # (B, 4096, R), (B, R, C)
        batch = coef.shape[0]
        const_coef = keys.const_coef.expand(batch, -1, -1)
        consts = keys.const_vecs  # (K, C)
        a = keys.a

        mean = (
            a * k_mean
            + coef @ vecs.mean(-1, keepdim=True)
            + const_coef @ consts.mean(-1, keepdim=True)
        )
        # Cross products of the shared part with the low-rank vectors, through each family's
        # head structure: (d K_i) . (s Wo_h v_ht) = (Wo_h^T diag(d s) K_i) . v_ht.
        cross = []
        for fam in keys.families:
            num_heads = fam.values.shape[1]
            proj = split_heads(
                side.project_keys(
                    fam.out_weight.T * fam.scale, keys.gain, f"WoT:{fam.name}|{keys.gain_name}"
                ),
                num_heads,
            )  # (1, H, 4096, dh)
            prod = shared_times_prompts(proj, fam.values)  # (B, H, 4096, T)
            cross.append(prod.permute(0, 2, 1, 3).reshape(batch, prod.shape[2], -1))
        cross_kv = torch.cat(cross, dim=-1)  # (B, 4096, R)
        cross_ke = side.memo(
            f"KE:{keys.gain_name}:{consts.shape[0]}:{tag}",
            lambda: (side.keys * keys.gain) @ consts.T,
        )  # (1, 4096, K)
        gram_vv = vecs @ vecs.transpose(1, 2)  # (B, R, R)
        gram_ve = vecs @ consts.T  # (B, R, K)
        gram_ee = consts @ consts.T  # (K, K)
        sumsq = (
            a.pow(2) * k_sumsq
            + 2 * a * (coef * cross_kv).sum(-1, keepdim=True)
            + 2 * a * (const_coef * cross_ke).sum(-1, keepdim=True)
            + ((coef @ gram_vv) * coef).sum(-1, keepdim=True)
            + 2 * ((coef @ gram_ve) * const_coef).sum(-1, keepdim=True)
            + ((const_coef @ gram_ee) * const_coef).sum(-1, keepdim=True)
        )
        var = (sumsq / channels - mean.pow(2)).clamp_min(0)
        inv_std = torch.rsqrt(var + norm.eps)

        gamma, beta = norm.weight, norm.bias
        families = [f.rescaled(inv_std, gamma, tag) for f in keys.families]
        new_consts = torch.cat([consts * gamma, gamma[None], beta[None]], dim=0)
        new_const_coef = torch.cat(
            [const_coef * inv_std, -mean * inv_std, torch.ones_like(mean)], dim=-1
        )
        return SymbolicKeys(
            a * inv_std,
            keys.gain * gamma,
            f"{keys.gain_name}*{tag}",
            families,
            new_const_coef,
            new_consts,
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
        q = split_heads(attn.q_proj(queries_with_pe), num_heads)  # (B, H, T, dh)
        scale = 1.0 / math.sqrt(q.shape[-1])
        # k = Wk (keys + P) + bk; the bias is the same for every position: softmax drops it.
        logits = self.scores(side, keys, attn.k_proj.weight, None, q, f"{name}.k")
        probs = torch.softmax(logits * scale, dim=-1)  # (B, H, T, 4096)
        out = self.weighted_values(
            side, keys, attn.v_proj.weight, attn.v_proj.bias, probs, f"{name}.v"
        )
        return attn.out_proj(out)

    def image_to_token(
        self,
        side: ImageSide,
        keys: SymbolicKeys,
        attn: Attention,
        queries: torch.Tensor,
        query_pe: torch.Tensor,
        name: str,
    ) -> Family:
        """Attention of the image positions to the tokens, as a low-rank family."""
        num_heads = attn.num_heads
        k = split_heads(attn.k_proj(queries + query_pe), num_heads)  # (B, H, T, dh)
        v = split_heads(attn.v_proj(queries), num_heads)
        scale = 1.0 / math.sqrt(k.shape[-1])
        logits = self.scores(
            side, keys, attn.q_proj.weight, attn.q_proj.bias, k, f"{name}.q"
        )  # (B, H, T, 4096)
        probs = torch.softmax(logits * scale, dim=2)  # over the tokens
        b, h, t, n = probs.shape
        coef = probs.permute(0, 3, 1, 2).reshape(b, n, h * t)
        return Family(coef, v, attn.out_proj.weight, torch.ones_like(attn.out_proj.bias), name)

    # ------------------------------------------------------------------ the decoder
    def transformer_forward(
        self, side: ImageSide, tokens: torch.Tensor, read_tokens: list[int]
    ) -> tuple[torch.Tensor, SymbolicKeys]:
        """The two-way transformer: the final states (B, len(read_tokens), C) of the tokens
        that are read afterwards, and the symbolic image keys.

        After the last attention only some output tokens are read (the IoU token, the mask
        tokens that are returned, the object-score token if asked for); the others'
        final attention would be dead work, so it is not computed."""
        channels = tokens.shape[-1]
        ref = side.keys
        keys = SymbolicKeys(
            a=torch.ones_like(ref[..., :1]),
            gain=torch.ones(channels, dtype=ref.dtype, device=ref.device),
            gain_name="1",
            families=[],
            const_coef=ref.new_zeros((1, ref.shape[1], 0)),
            const_vecs=ref.new_zeros((0, channels)),
        )
        queries, query_pe = tokens, tokens
        for index, layer in enumerate(self.transformer.layers):
            queries, keys = self.block_forward(
                side, keys, layer, queries, query_pe, f"layer{index}"
            )
        final = self.transformer.final_attn_token_to_image
        q_out, pe_out = _tokens_at(queries, read_tokens), _tokens_at(query_pe, read_tokens)
        attn_out = self.token_to_image(side, keys, final, q_out + pe_out, "final")
        return self.transformer.norm_final_attn(q_out + attn_out), keys

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
        family = self.image_to_token(side, keys, attn, queries, query_pe, f"{name}.i2t")
        keys = self.add_attention_output(keys, family, attn.out_proj.bias)
        keys = self.layer_norm(side, keys, layer.norm4, f"{name}.norm4")
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
        # Rows ordered (sub-pixel, channel): (4 * c_mid, c_in).
        w1 = dc1.weight.permute(2, 3, 1, 0).reshape(4 * c_mid, c_in)
        shared = side.project_keys(w1, keys.gain, f"dc1-cl|{keys.gain_name}")
        dtype = self.upscaling_dtype
        s1, s0 = side.upscaling_features(dec, dtype)
        # dc1(keys) + bias + feat_s1 = s1 + a * (W K) + coef @ (vecs W^T): two fused ops.
        x = torch.baddbmm(torch.addcmul(s1, keys.a, shared), keys.coef, keys.vecs @ w1.T)
        b, n = x.shape[:2]
        x = x.view(b, n * 4, c_mid)
        x = torch.nn.functional.layer_norm(x, (c_mid,), ln1.weight, ln1.bias, ln1.eps)
        x = gelu_(x, act1).to(dtype)
        # dc2 as (c_mid -> (sub-pixel, c_out)), with its bias and feat_s0 as the addend.
        w2 = dc2.weight.permute(0, 2, 3, 1).reshape(c_mid, 4 * c_out).to(dtype)
        y = torch.baddbmm(s0.expand(b, -1, -1), x, w2.expand(b, -1, -1))
        y = gelu_(y, act2).view(b, n * 16, c_out)
        # (B, M, pixels in (i, j, di, dj, ei, ej) order)
        logits = (hyper.to(dtype) @ y.transpose(1, 2)).float()
        h, w = side.size
        m = logits.shape[1]
        logits = logits.view(b, m, h, w, 2, 2, 2, 2).permute(0, 1, 2, 4, 6, 3, 5, 7)
        return logits.reshape(b, m, 4 * h, 4 * w)

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

    def forward(
        self,
        side: ImageSide,
        sparse_embeddings: torch.Tensor,
        mask_indices: list[int] | None = None,
        keep: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Logits of the mask tokens ``mask_indices`` (default all four) (B', M, 256, 256)
        and IoU predictions of all four (B, 4), like MaskDecoder.predict_all_masks.

        ``keep(iou) -> index`` optionally selects the prompts worth upscaling (AMG drops
        every prompt whose masks all fail the IoU threshold before any pixel work); the
        logits then hold only those rows, and the index is returned as the third value.
        """
        masks = list(range(self.decoder.num_mask_tokens)) if mask_indices is None else mask_indices
        iou, hyper, keys = self.decode_prompts(side, sparse_embeddings, masks)
        rows = torch.arange(iou.shape[0], device=iou.device) if keep is None else keep(iou)
        if keep is not None:
            if rows.numel() == 0:  # nothing survives: no pixel work at all
                h, w = side.size
                return iou.new_zeros((0, len(masks), 4 * h, 4 * w)), iou, rows
            hyper, keys = hyper[rows], keys.select(rows)
        return self.upscale(side, keys, hyper), iou, rows

    def tokens(self, sparse_embeddings: torch.Tensor) -> torch.Tensor:
        dec = self.decoder
        b = sparse_embeddings.shape[0]
        output_tokens = torch.cat(
            [dec.obj_score_token.weight, dec.iou_token.weight, dec.mask_tokens.weight], dim=0
        )
        return torch.cat([output_tokens.unsqueeze(0).expand(b, -1, -1), sparse_embeddings], 1)
