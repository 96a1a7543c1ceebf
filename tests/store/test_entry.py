"""One entry <-> one safetensors file: exact for float32, half the bytes for float16, and
every damaged or foreign file refused."""

from __future__ import annotations

import pytest
import torch
from safetensors.numpy import load as load_arrays
from store_support import IDENTITY, random_embedding

from sam2serve.engine.predictor import Embedding
from sam2serve.store.entry import CorruptEntry, decode_entry, encode_entry
from sam2serve.store.identity import StoreIdentity

IMAGE_ID = "ab" * 32


def tensors_of(embedding):
    return (embedding.image_embed, *embedding.high_res_feats)


def test_float32_round_trip_is_bit_exact_in_the_same_layout():
    plain = random_embedding(seed=1, size=(480, 640))
    # The encoder leaves image_embed and the 128x128 features channels-last; the decoder's
    # last bits depend on it (measured on an AVX2 CPU), so the layout comes back too.
    channels_last = torch.channels_last
    embedding = Embedding(
        plain.image_embed.contiguous(memory_format=channels_last),
        (plain.high_res_feats[0], plain.high_res_feats[1].contiguous(memory_format=channels_last)),
        plain.original_sizes,
    )
    data = encode_entry(embedding, IMAGE_ID, IDENTITY)
    back = decode_entry(data, IMAGE_ID, IDENTITY)
    assert back.original_sizes == ((480, 640),)
    for stored, original in zip(tensors_of(back), tensors_of(embedding), strict=True):
        assert stored.dtype == torch.float32 and torch.equal(stored, original)
        assert stored.stride() == original.stride()
    # A plain safetensors file: any safetensors reader opens it.
    assert set(load_arrays(data)) == {"image_embed", "high_res_feats_0", "high_res_feats_1"}


def test_float16_halves_the_bytes_and_reads_back_in_float32():
    embedding = random_embedding(seed=2)
    half = StoreIdentity(**{**IDENTITY.__dict__, "store_dtype": "float16"})
    full_bytes = len(encode_entry(embedding, IMAGE_ID, IDENTITY))
    data = encode_entry(embedding, IMAGE_ID, half)
    assert abs(len(data) - full_bytes / 2) < 4096  # the header is the same small JSON
    back = decode_entry(data, IMAGE_ID, half)
    for stored, original in zip(tensors_of(back), tensors_of(embedding), strict=True):
        assert stored.dtype == torch.float32
        torch.testing.assert_close(stored, original, rtol=1e-3, atol=1e-3)


def test_a_truncated_entry_is_refused():
    data = encode_entry(random_embedding(), IMAGE_ID, IDENTITY)
    for cut in (4, 200, len(data) // 2, len(data) - 1):
        with pytest.raises(CorruptEntry):
            decode_entry(data[:cut], IMAGE_ID, IDENTITY)


def test_an_entry_of_another_image_or_runtime_is_refused():
    data = encode_entry(random_embedding(), IMAGE_ID, IDENTITY)
    with pytest.raises(CorruptEntry, match="image_id"):
        decode_entry(data, "cd" * 32, IDENTITY)
    other = StoreIdentity(**{**IDENTITY.__dict__, "weights": "random seed 1"})
    with pytest.raises(CorruptEntry, match="identity"):
        decode_entry(data, IMAGE_ID, other)
    with pytest.raises(CorruptEntry):
        decode_entry(b"not a safetensors file at all", IMAGE_ID, IDENTITY)


def test_an_entry_holds_one_image():
    one = random_embedding()
    two = type(one)(
        torch.cat([one.image_embed] * 2),
        tuple(torch.cat([t] * 2) for t in one.high_res_feats),
        one.original_sizes * 2,
    )
    with pytest.raises(ValueError, match="batch of 2"):
        encode_entry(two, IMAGE_ID, IDENTITY)
