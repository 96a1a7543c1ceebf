"""The embedding store: one safetensors file per image and runtime, in a directory or
any fsspec location (``file://``, ``memory://``, ``s3://`` with s3fs installed, ...), so
every process and replica that opens the same location shares its entries.

Layout, under the location::

    <identity digest>/identity.json          the runtime these entries belong to
    <identity digest>/<id[:2]>/<id>.safetensors

A runtime (:class:`~sam2serve.store.identity.StoreIdentity`: model, mode, dtype, weights,
store precision) has its own directory, so another checkpoint or mode never reads these
entries. An entry is written to a staging file beside it and then renamed into place: a
writer killed mid-write leaves a ``.partial`` file that readers never look at (and
``remove_stale_staging`` deletes later), never a half-written entry. A damaged entry (a
disk that lost its tail) is refused when read and counts as a miss; the next write
replaces it.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import threading
import time
from dataclasses import dataclass
from typing import Any

from sam2serve.engine.predictor import Embedding
from sam2serve.store.entry import CorruptEntry, decode_entry, encode_entry
from sam2serve.store.identity import StoreIdentity
from sam2serve.store.location import StoreError, open_location

log = logging.getLogger("sam2serve.store")

ENTRY_SUFFIX = ".safetensors"
STAGING_SUFFIX = ".partial"
IDENTITY_FILE = "identity.json"
# A staging file older than this was left by a writer that died (a write takes well
# under a second); younger ones may belong to a writer still at work.
STALE_STAGING_S = 3600.0


@dataclass(frozen=True)
class StoreStats:
    hits: int
    misses: int
    corrupt: int
    writes: int


class EmbeddingStore:
    """Embeddings of single images by image id, for one runtime identity."""

    def __init__(self, location: str, identity: StoreIdentity) -> None:
        self.location = location
        self.identity = identity
        self.fs, root = open_location(location)
        self.root = f"{root.rstrip('/')}/{identity.digest}"
        self._lock = threading.Lock()
        self._hits = self._misses = self._corrupt = self._writes = 0
        self._describe()

    def _describe(self) -> None:
        """Create the runtime's directory and write identity.json (what it holds)."""
        path = f"{self.root}/{IDENTITY_FILE}"
        if self.fs.isfile(self.root.rsplit("/", 1)[0]):
            raise StoreError(f"store {self.location!r} is a file; give a directory")
        try:
            self.fs.makedirs(self.root, exist_ok=True)
            if not self.fs.exists(path):
                self._write(path, json.dumps(self.identity.as_dict(), indent=2).encode() + b"\n")
        except OSError as exc:
            raise StoreError(
                f"store {self.location!r}: cannot write in it ({exc.strerror or exc})"
            ) from None

    # ------------------------------------------------------------------ entries
    def path_of(self, image_id: str) -> str:
        return f"{self.root}/{image_id[:2]}/{image_id}{ENTRY_SUFFIX}"

    def get(self, image_id: str, device: Any = "cpu") -> Embedding | None:
        """The stored embedding, or None (missing, or damaged: logged and counted)."""
        path = self.path_of(image_id)
        try:
            data = self.fs.cat_file(path)
        except FileNotFoundError:
            self._count(misses=1)
            return None
        try:
            embedding = decode_entry(data, image_id, self.identity, device)
        except CorruptEntry as exc:
            log.warning("store entry %s is damaged and is ignored: %s", path, exc)
            self._count(misses=1, corrupt=1)
            return None
        self._count(hits=1)
        return embedding

    def has(self, image_id: str) -> bool:
        """Whether a complete entry is stored, from its size and header only (no tensors
        read): what ``sam2serve embed`` checks to skip an image."""
        path = self.path_of(image_id)
        try:
            size = self.fs.size(path)
            head = self.fs.cat_file(path, start=0, end=min(size, 64 * 1024))
        except FileNotFoundError:
            return False
        return size == _declared_size(head)

    def put(self, image_id: str, embedding: Embedding) -> int:
        """Store one image's embedding (replacing any entry); returns its bytes."""
        data = encode_entry(embedding, image_id, self.identity)
        path = self.path_of(image_id)
        self.fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
        self._write(path, data)
        self._count(writes=1)
        return len(data)

    def _write(self, path: str, data: bytes) -> None:
        """Write to a staging file beside ``path``, then rename it into place."""
        directory, name = path.rsplit("/", 1)
        staging = f"{directory}/.{name}.{os.getpid()}-{secrets.token_hex(4)}{STAGING_SUFFIX}"
        try:
            with self.fs.open(staging, "wb") as handle:
                handle.write(data)
            self.fs.mv(staging, path)
        except BaseException:
            try:
                self.fs.rm(staging)
            except OSError:  # nothing was created, or the store is gone
                pass
            raise

    def remove_stale_staging(self, older_than_s: float = STALE_STAGING_S) -> int:
        """Delete staging files that writers which died left behind; returns how many."""
        removed = 0
        now = time.time()
        for path in self.fs.find(self.root):
            if not path.endswith(STAGING_SUFFIX):
                continue
            modified = _modified(self.fs.info(path))
            if modified is not None and now - modified >= older_than_s:
                self.fs.rm(path)
                removed += 1
        return removed

    # ------------------------------------------------------------------ counters
    def _count(self, hits: int = 0, misses: int = 0, corrupt: int = 0, writes: int = 0) -> None:
        with self._lock:
            self._hits += hits
            self._misses += misses
            self._corrupt += corrupt
            self._writes += writes

    def stats(self) -> StoreStats:
        with self._lock:
            return StoreStats(self._hits, self._misses, self._corrupt, self._writes)


def _declared_size(head: bytes) -> int | None:
    """The size a safetensors file must have, from its header: 8 + header + data."""
    if len(head) < 8:
        return None
    length = int.from_bytes(head[:8], "little")
    try:
        header = json.loads(head[8 : 8 + length])
        ends = [
            entry["data_offsets"][1] for name, entry in header.items() if name != "__metadata__"
        ]
    except (ValueError, TypeError, KeyError, AttributeError, IndexError):
        return None
    return 8 + length + max(ends, default=0)


def _modified(info: dict[str, Any]) -> float | None:
    """A file's modification time in seconds since the epoch, where the filesystem says."""
    for key in ("mtime", "created", "LastModified", "last_modified"):
        value = info.get(key)
        if isinstance(value, (int, float)):
            return float(value)
        if value is not None and hasattr(value, "timestamp"):
            return float(value.timestamp())
    return None
