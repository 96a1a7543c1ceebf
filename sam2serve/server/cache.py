"""Byte-budgeted LRU caches: image embeddings, and the low-res logits of returned masks.

The embedding cache is keyed by :class:`EmbeddingKey` — the SHA-256 of the uploaded
image bytes plus the model, mode and dtype that produced the embedding — so an entry can
only ever be reached by sending the same image to the same model. The ``image_id`` a
client sends back is that hash (:func:`sam2serve.store.identity.image_id_of`, which the
persistent store keys by too), issued by the server: a client cannot choose what an id
points to, so it cannot poison another client's entry. (Behind the cache, the persistent
store is trusted like the model's weights: whoever may write it chooses its answers.)

Both caches are plain LRUs with a byte budget: reads refresh an entry, inserting past the
budget evicts the least recently used entries, and an entry larger than the whole budget
is not stored at all. Counters (hits, misses, evictions) are kept here and read by the
metrics collector at scrape time. A lock makes every operation atomic, so the caches may
be touched from the event loop and from worker threads alike.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Generic, TypeVar

import torch

from sam2serve.engine.predictor import Embedding
from sam2serve.store.identity import image_id_of

__all__ = [
    "ByteLRU",
    "CacheStats",
    "EmbeddingCache",
    "EmbeddingKey",
    "MaskCache",
    "StoredMask",
    "image_id_of",
    "looks_like_image_id",
]

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

IMAGE_ID_HEX_CHARS = 64  # a SHA-256 digest in hex


@dataclass(frozen=True)
class CacheStats:
    """A consistent snapshot of one cache's counters and size."""

    hits: int
    misses: int
    evictions: int
    entries: int
    bytes: int
    budget: int


class ByteLRU(Generic[K, V]):
    """A least-recently-used map whose entries' sizes add up to at most ``budget`` bytes."""

    def __init__(self, budget: int, size_of: Callable[[V], int]) -> None:
        if budget < 0:
            raise ValueError(f"budget must be >= 0 bytes, got {budget}")
        self.budget = budget
        self._size_of = size_of
        self._entries: OrderedDict[K, tuple[V, int]] = OrderedDict()
        self._bytes = 0
        self._hits = self._misses = self._evictions = 0
        self._lock = threading.Lock()

    def get(self, key: K) -> V | None:
        """The value for ``key`` (now the most recently used), or None; counts a hit/miss."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                self._misses += 1
                return None
            self._entries.move_to_end(key)
            self._hits += 1
            return entry[0]

    def __contains__(self, key: K) -> bool:
        """Membership without counting a hit or refreshing the entry."""
        with self._lock:
            return key in self._entries

    def put(self, key: K, value: V) -> bool:
        """Store ``value``, evicting least recently used entries to fit; False when the
        value alone is larger than the budget (it is then not stored)."""
        size = self._size_of(value)
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._bytes -= old[1]
            if size > self.budget:
                return False
            while self._entries and self._bytes + size > self.budget:
                _, (_, evicted_size) = self._entries.popitem(last=False)
                self._bytes -= evicted_size
                self._evictions += 1
            self._entries[key] = (value, size)
            self._bytes += size
            return True

    def recount(self, key: K) -> None:
        """Size ``key``'s entry again (a value that grew since it was stored, e.g. an
        embedding that now carries the decoder's per-image side), evicting the least
        recently used other entries to keep within the budget; an entry that alone no
        longer fits is dropped."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return
            value, old_size = entry
            size = self._size_of(value)
            if size == old_size:
                return
            if size > self.budget:  # alone over the budget: drop it, keep the others
                self._entries.pop(key)
                self._bytes -= old_size
                self._evictions += 1
                return
            self._bytes += size - old_size
            self._entries[key] = (value, size)
            for other in [k for k in self._entries if k != key]:
                if self._bytes <= self.budget:
                    break
                _, evicted_size = self._entries.pop(other)
                self._bytes -= evicted_size
                self._evictions += 1

    def stats(self) -> CacheStats:
        with self._lock:
            return CacheStats(
                self._hits,
                self._misses,
                self._evictions,
                len(self._entries),
                self._bytes,
                self.budget,
            )

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)


@dataclass(frozen=True)
class EmbeddingKey:
    """What makes two embeddings interchangeable: same image bytes, same model."""

    image_id: str  # hex SHA-256 of the encoded image bytes
    model: str
    mode: str
    dtype: str


def looks_like_image_id(value: str) -> bool:
    return len(value) == IMAGE_ID_HEX_CHARS and all(c in "0123456789abcdef" for c in value)


class EmbeddingCache(ByteLRU[EmbeddingKey, Embedding]):
    """Embeddings of single images, sized by :attr:`Embedding.nbytes`."""

    def __init__(self, budget: int) -> None:
        super().__init__(budget, lambda embedding: embedding.nbytes)


@dataclass(frozen=True)
class StoredMask:
    """The low-res logits of one returned mask, and the image they belong to."""

    image: EmbeddingKey
    low_res_logits: torch.Tensor  # (1, 256, 256), clamped to +-32

    @property
    def nbytes(self) -> int:
        return self.low_res_logits.numel() * self.low_res_logits.element_size()


class MaskCache(ByteLRU[str, StoredMask]):
    """Low-res logits of returned masks by mask_id, so a client can refine a mask by
    reference instead of sending 256 KiB of logits back."""

    def __init__(self, budget: int) -> None:
        super().__init__(budget, lambda stored: stored.nbytes)
