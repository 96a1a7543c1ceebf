"""The rotary encoding in real arithmetic (what an ONNX export of memory attention runs)
gives Meta's complex rotation bit for bit, and so does the attention layer in that form."""

from __future__ import annotations

import torch
from reference import import_reference

from sam2serve.modeling.rope import RoPEAttention, grid_rotations, rotate, rotate_real


def test_real_rotation_is_metas_complex_rotation_bit_for_bit():
    import_reference()
    from sam2.modeling.position_encoding import apply_rotary_enc, compute_axial_cis

    head_dim, side, frames = 256, 64, 3  # SAM 2.1's memory attention: one 256-d head
    freqs, cos, sin = grid_rotations(head_dim, side * side, 10000.0, torch.device("cpu"))
    assert torch.equal(freqs, compute_axial_cis(head_dim, side, side))
    generator = torch.Generator().manual_seed(0)
    q = 4 * torch.randn(2, 1, side * side, head_dim, generator=generator)
    k = 4 * torch.randn(2, 1, frames * side * side, head_dim, generator=generator)
    q_ref, k_ref = apply_rotary_enc(q, k, freqs, repeat_freqs_k=True)
    assert torch.equal(rotate(q, freqs), q_ref)
    assert torch.equal(rotate_real(q, cos, sin), q_ref)
    # Keys of several memory frames: each frame rotated by the query grid's positions.
    k_frames = k.reshape(2, 1, frames, side * side, head_dim)
    assert torch.equal(rotate_real(k_frames, cos, sin).reshape(k.shape), k_ref)


def test_attention_in_its_exported_form_is_the_eager_attention(monkeypatch):
    """The layer's ONNX form (real rotation, keys rotated frame by frame, pointer tokens
    unrotated) against its eager form, on 3 memory frames and 8 pointer tokens."""
    torch.manual_seed(0)
    attention = RoPEAttention(32, kv_in_dim=16, repeat_keys=True).eval()
    grid, frames, pointers = 64, 3, 8  # an 8 x 8 grid
    q = torch.randn(2, grid, 32)
    k = torch.randn(2, frames * grid + pointers, 16)
    v = torch.randn(2, frames * grid + pointers, 16)
    with torch.no_grad():
        eager = attention(q, k, v, num_k_exclude_rope=pointers)
        monkeypatch.setattr(torch.onnx, "is_in_onnx_export", lambda: True)
        exported = attention(q, k, v, num_k_exclude_rope=pointers)
    assert torch.equal(eager, exported)
    # Not vacuous: which keys are rotated changes the answer.
    with torch.no_grad():
        other = attention(q, k, v, num_k_exclude_rope=pointers + grid)
    assert not torch.equal(exported, other)
