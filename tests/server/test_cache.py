"""The byte-budgeted LRU behind the embedding and mask caches (no server needed)."""

from __future__ import annotations

import torch

from sam2serve.engine.predictor import Embedding
from sam2serve.server.cache import ByteLRU, EmbeddingCache, image_id_of, looks_like_image_id


def lru(budget: int) -> ByteLRU[str, bytes]:
    return ByteLRU(budget, len)


def test_get_counts_hits_and_misses():
    cache = lru(10)
    cache.put("a", b"123")
    assert cache.get("a") == b"123"
    assert cache.get("b") is None
    stats = cache.stats()
    assert (stats.hits, stats.misses, stats.entries, stats.bytes) == (1, 1, 1, 3)


def test_evicts_least_recently_used_and_reads_refresh():
    cache = lru(10)
    for key in "abc":
        cache.put(key, b"123")  # 9 bytes
    assert cache.get("a") == b"123"  # a is now the most recently used
    cache.put("d", b"123")  # 12 > 10: evict the least recently used, b
    assert "b" not in cache and "a" in cache and "c" in cache and "d" in cache
    assert cache.stats().evictions == 1
    assert cache.stats().bytes == 9


def test_membership_does_not_refresh_or_count():
    cache = lru(6)
    cache.put("a", b"123")
    cache.put("b", b"123")
    assert "a" in cache  # not a read: a stays least recently used
    cache.put("c", b"123")
    assert "a" not in cache and "b" in cache
    assert cache.stats().hits == 0 and cache.stats().misses == 0


def test_entry_larger_than_budget_is_not_stored():
    cache = lru(4)
    cache.put("a", b"12")
    assert cache.put("big", b"12345") is False
    assert "big" not in cache and "a" in cache
    assert cache.stats().evictions == 0


def test_replacing_a_key_updates_its_size():
    cache = lru(10)
    cache.put("a", b"12345678")
    cache.put("a", b"1")
    assert cache.stats().bytes == 1 and len(cache) == 1


def test_zero_budget_stores_nothing():
    cache = lru(0)
    assert cache.put("a", b"1") is False
    assert len(cache) == 0


def test_embedding_cache_sizes_by_nbytes():
    embedding = Embedding(
        torch.zeros(1, 256, 64, 64),
        (torch.zeros(1, 32, 256, 256), torch.zeros(1, 64, 128, 128)),
        ((10, 20),),
    )
    assert embedding.nbytes == 16 * 1024 * 1024  # the documented fp32 entry size
    cache = EmbeddingCache(budget=embedding.nbytes)
    assert cache.put("k", embedding) and cache.stats().bytes == embedding.nbytes


def test_image_ids_are_content_hashes():
    first, second = image_id_of(b"abc"), image_id_of(b"abd")
    assert first != second and looks_like_image_id(first)
    assert first == image_id_of(b"abc")
    assert not looks_like_image_id("../../etc") and not looks_like_image_id(first.upper())


def test_recount_follows_a_value_that_grew():
    """An embedding gains the decoder's per-image side after it was cached: recounting it
    evicts the least recently used others, or drops it when it alone no longer fits."""
    cache: ByteLRU[str, bytearray] = ByteLRU(10, len)
    grows = bytearray(b"12")
    for key, value in (("a", bytearray(b"123")), ("b", bytearray(b"123")), ("g", grows)):
        cache.put(key, value)
    grows.extend(b"12345")  # 7 bytes now: 3 + 3 + 7 = 13 > 10
    cache.recount("g")
    assert "a" not in cache and "b" in cache and "g" in cache
    assert cache.stats().bytes == 10 and cache.stats().evictions == 1
    grows.extend(b"12345")  # 12 bytes alone: over the budget
    cache.recount("g")
    assert "g" not in cache and cache.stats().bytes == 3
    cache.recount("missing")  # nothing cached under it: nothing happens
    assert cache.stats().entries == 1
