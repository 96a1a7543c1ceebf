"""What makes two stored embeddings interchangeable: the image's content and the runtime
that encoded it.

An image is named by the SHA-256 of its encoded bytes (the server's ``image_id``). The
runtime is a :class:`StoreIdentity`: model, mode, the dtype the encoder computed in, where
the weights came from (the checkpoint's own SHA-256, the random seed, or the sha256 of
every exported file) and the precision the store keeps. Its digest names the store's
directory for that runtime, so a different checkpoint, mode or dtype looks in another
directory and never reads an embedding it did not make. Torch-free.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass
from typing import Any

# The precisions an entry may be kept in: float32 is the encoder's own answer (bit-exact);
# float16 halves the bytes (its effect on masks is measured in docs/labelling.md).
STORE_DTYPES = ("float32", "float16")
DEFAULT_STORE_DTYPE = "float32"
# Bumped when the entry layout changes: entries of another version are never read.
ENTRY_FORMAT = "sam2serve-embedding/1"
_HASH_CHUNK = 8 * 1024 * 1024


def image_id_of(data: bytes) -> str:
    """The id of an image: the hex SHA-256 of its encoded bytes."""
    return hashlib.sha256(data).hexdigest()


def file_sha256(path: str | os.PathLike[str]) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(_HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def check_store_dtype(value: str) -> str:
    if value not in STORE_DTYPES:
        raise ValueError(f"store dtype must be one of {', '.join(STORE_DTYPES)}, got {value!r}")
    return value


@dataclass(frozen=True)
class StoreIdentity:
    """The runtime an entry belongs to; equal identities may share entries."""

    model: str
    mode: str
    dtype: str  # what the image encoder computed in (a furious mode's reduced precision)
    weights: str  # e.g. "checkpoint sha256:ab12...", "random seed 0", "artifacts sha256:..."
    store_dtype: str = DEFAULT_STORE_DTYPE

    def __post_init__(self) -> None:
        check_store_dtype(self.store_dtype)

    def as_dict(self) -> dict[str, str]:
        return {"format": ENTRY_FORMAT, **asdict(self)}

    @property
    def digest(self) -> str:
        """16 hex characters of the SHA-256 of every field: the runtime's directory name."""
        text = json.dumps(self.as_dict(), sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]


def weights_identity(weights_info: Any, artifacts: str | None = None) -> str:
    """Where the weights came from, as content: the seed of random weights, the checkpoint
    file's SHA-256 (not its path: a copy elsewhere is the same weights, a new file at the
    same path is not), or for a 'sam2serve export' directory (or URI) of a checkpoint, the
    sha256 of its files (from its manifest).

    ``weights_info``: a :class:`~sam2serve.checkpoint.WeightsInfo` (source, path, seed).
    """
    source = getattr(weights_info, "source", None)
    if source == "random":  # from a seed, however they were loaded
        return f"random seed {weights_info.seed}"
    if artifacts is not None:  # a directory or an fsspec URI (cluster replicas)
        import fsspec

        with fsspec.open(f"{str(artifacts).rstrip('/')}/manifest.json", "rb") as handle:
            manifest = json.loads(handle.read())
        files = json.dumps(manifest.get("files", {}), sort_keys=True)
        return f"artifacts sha256:{hashlib.sha256(files.encode()).hexdigest()}"
    path = getattr(weights_info, "path", None)
    if source == "checkpoint" and path is not None and os.path.isfile(path):
        return f"checkpoint sha256:{file_sha256(path)}"
    raise ValueError(
        f"cannot tell which weights these are ({weights_info!r}): the embedding store needs "
        "a checkpoint file, random weights or an export directory"
    )


def embedding_dtype(predictor: Any) -> str:
    """What a predictor's encoder computes in: its runtime's dtype (a furious mode's
    reduced precision), else the model's own dtype."""
    runtime_dtype = getattr(getattr(predictor, "runtime", None), "dtype", None)
    return runtime_dtype or str(predictor.dtype).removeprefix("torch.")
