"""One stored embedding as a safetensors file: the three tensors of an
:class:`~sam2serve.engine.predictor.Embedding` of one image, and what they belong to.

safetensors is a JSON header (tensor names, dtypes, shapes, byte offsets, string
metadata) followed by the raw tensor bytes: no pickle, nothing runs when it is read, and
a file cut short fails the header's offsets check. On top of that an entry is checked
against what the reader expects (format version, runtime identity, image id, every
shape), so a damaged or foreign file is refused as :class:`CorruptEntry`, never
half-used.
"""

from __future__ import annotations

import json
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.numpy import load as load_arrays
from safetensors.torch import save as save_tensors

from sam2serve.engine.predictor import Embedding
from sam2serve.store.identity import ENTRY_FORMAT, StoreIdentity

# Per image; the channels are the same for every model size (the neck's and the decoder's).
SHAPES = {
    "image_embed": (1, 256, 64, 64),
    "high_res_feats_0": (1, 32, 256, 256),
    "high_res_feats_1": (1, 64, 128, 128),
}
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


class CorruptEntry(ValueError):
    """A stored entry that cannot be used (truncated, foreign or of another layout)."""


def encode_entry(embedding: Embedding, image_id: str, identity: StoreIdentity) -> bytes:
    """The safetensors bytes of one image's embedding, in ``identity.store_dtype``."""
    if len(embedding) != 1:
        raise ValueError(f"an entry holds one image, got a batch of {len(embedding)}")
    store_dtype = DTYPES[identity.store_dtype]
    tensors = {
        "image_embed": embedding.image_embed,
        "high_res_feats_0": embedding.high_res_feats[0],
        "high_res_feats_1": embedding.high_res_feats[1],
    }
    # The encoder leaves some features channels-last; the decoder's kernels (and so the
    # last bits of its answers) depend on that layout, so it is recorded and restored.
    channels_last = [name for name, tensor in tensors.items() if _is_channels_last(tensor)]
    tensors = {
        name: tensor.detach().to("cpu", store_dtype).contiguous()
        for name, tensor in tensors.items()
    }
    height, width = embedding.original_size
    metadata = {
        "format": ENTRY_FORMAT,
        "identity": identity.digest,
        "image_id": image_id,
        "original_size": f"{height},{width}",
        "dtype": str(embedding.image_embed.dtype).removeprefix("torch."),
        "channels_last": ",".join(channels_last),
    }
    return save_tensors(tensors, metadata=metadata)


def decode_entry(
    data: bytes, image_id: str, identity: StoreIdentity, device: str | torch.device = "cpu"
) -> Embedding:
    """The embedding an entry holds, in the dtype it was computed in, on ``device``."""
    try:
        metadata = _metadata(data)
        arrays = load_arrays(data)  # read-only views: copied once below, into torch
    except (SafetensorError, ValueError, TypeError) as exc:
        raise CorruptEntry(f"not a readable safetensors file ({exc})") from None
    expected = {"format": ENTRY_FORMAT, "identity": identity.digest, "image_id": image_id}
    for name, value in expected.items():
        if metadata.get(name) != value:
            raise CorruptEntry(f"its {name} is {metadata.get(name)!r}, expected {value!r}")
    for name, shape in SHAPES.items():
        array = arrays.get(name)
        if array is None or tuple(array.shape) != shape:
            got = None if array is None else tuple(array.shape)
            raise CorruptEntry(f"tensor {name} has shape {got}, expected {shape}")
    try:
        height, width = (int(v) for v in metadata["original_size"].split(","))
        dtype = DTYPES[metadata["dtype"]]
        channels_last = set(metadata["channels_last"].split(",")) - {""}
    except (KeyError, ValueError) as exc:
        raise CorruptEntry(f"bad metadata ({exc!r})") from None
    image_embed, feats_0, feats_1 = (
        _tensor(arrays[name], device, dtype, name in channels_last) for name in SHAPES
    )
    return Embedding(image_embed, (feats_0, feats_1), ((height, width),))


def _is_channels_last(tensor: torch.Tensor) -> bool:
    return not tensor.is_contiguous() and tensor.is_contiguous(memory_format=torch.channels_last)


def _tensor(array: Any, device: Any, dtype: torch.dtype, channels_last: bool) -> torch.Tensor:
    """A writable tensor of a stored (read-only) array, in the layout it was stored from."""
    tensor = torch.from_numpy(array.copy()).to(device, dtype)
    if channels_last:
        tensor = tensor.contiguous(memory_format=torch.channels_last)
    return tensor


def _metadata(data: bytes) -> dict[str, str]:
    """The header's string metadata (safetensors' header: 8-byte length, then JSON)."""
    if len(data) < 8:
        raise ValueError(f"{len(data)} bytes, shorter than a header")
    length = int.from_bytes(data[:8], "little")
    if length > len(data) - 8:
        raise ValueError(f"the header claims {length} bytes, the file has {len(data) - 8}")
    header = json.loads(data[8 : 8 + length])
    metadata = header.get("__metadata__") if isinstance(header, dict) else None
    if not isinstance(metadata, dict):
        raise TypeError("no metadata in its header")
    return metadata
