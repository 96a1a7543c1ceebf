"""The store on a directory and on fsspec URIs: entries by image id and runtime,
write-then-rename (a killed writer leaves no damaged entry), damaged entries refused."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest
import torch
from store_support import IDENTITY, random_embedding

from sam2serve.store.embedding_store import STAGING_SUFFIX, EmbeddingStore
from sam2serve.store.identity import StoreIdentity
from sam2serve.store.location import StoreError, check_location

IMAGE_ID = "ab" * 32


@pytest.fixture(params=["dir", "file://", "memory://"])
def location(request, tmp_path) -> str:
    if request.param == "dir":
        return str(tmp_path / "store")
    if request.param == "file://":
        return f"file://{tmp_path / 'store'}"
    return f"memory://store-{uuid.uuid4().hex}"


def test_put_then_get_on_every_kind_of_location(location):
    store = EmbeddingStore(location, IDENTITY)
    assert store.get(IMAGE_ID) is None and not store.has(IMAGE_ID)
    embedding = random_embedding(seed=3, size=(300, 200))
    written = store.put(IMAGE_ID, embedding)
    assert written > 16 * 2**20  # fp32: 4 MiB + 12 MiB of tensors, plus a header
    assert store.has(IMAGE_ID)
    back = EmbeddingStore(location, IDENTITY).get(IMAGE_ID)  # another opener: shared
    assert back is not None and back.original_size == (300, 200)
    assert torch.equal(back.image_embed, embedding.image_embed)
    assert torch.equal(back.high_res_feats[1], embedding.high_res_feats[1])
    assert store.stats().writes == 1
    # identity.json says which runtime the entries belong to
    assert store.fs.cat_file(f"{store.root}/identity.json").decode().count('"random seed 0"') == 1


def test_another_runtime_never_reads_the_entries(tmp_path):
    location = str(tmp_path / "store")
    EmbeddingStore(location, IDENTITY).put(IMAGE_ID, random_embedding())
    for change in ({"weights": "random seed 1"}, {"mode": "baseline"}, {"dtype": "bfloat16"},
                   {"model": "small"}, {"store_dtype": "float16"}):  # fmt: skip
        other = EmbeddingStore(location, StoreIdentity(**{**IDENTITY.__dict__, **change}))
        assert other.get(IMAGE_ID) is None and not other.has(IMAGE_ID), change


def test_a_truncated_entry_is_a_miss_and_is_replaced(tmp_path):
    store = EmbeddingStore(str(tmp_path), IDENTITY)
    store.put(IMAGE_ID, random_embedding())
    path = Path(store.path_of(IMAGE_ID))
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 3])  # a disk lost its tail
    assert not store.has(IMAGE_ID)
    assert store.get(IMAGE_ID) is None
    assert store.stats().corrupt == 1
    store.put(IMAGE_ID, random_embedding(seed=5))
    assert store.has(IMAGE_ID) and store.get(IMAGE_ID) is not None


def test_an_interrupted_write_leaves_no_entry_and_no_staging_file(tmp_path, monkeypatch):
    store = EmbeddingStore(str(tmp_path), IDENTITY)

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt  # Ctrl-C between the write and the rename

    monkeypatch.setattr(store.fs, "mv", interrupted)
    with pytest.raises(KeyboardInterrupt):
        store.put(IMAGE_ID, random_embedding())
    assert not store.has(IMAGE_ID)
    assert not list(tmp_path.rglob(f"*{STAGING_SUFFIX}"))


def test_staging_files_are_ignored_and_stale_ones_removed(tmp_path):
    store = EmbeddingStore(str(tmp_path), IDENTITY)
    directory = Path(store.path_of(IMAGE_ID)).parent
    directory.mkdir(parents=True)
    stale = directory / f".{IMAGE_ID}.safetensors.123-dead{STAGING_SUFFIX}"
    fresh = directory / f".{IMAGE_ID}.safetensors.456-live{STAGING_SUFFIX}"
    stale.write_bytes(b"half an entry")
    fresh.write_bytes(b"a writer at work")
    an_hour_ago = time.time() - 3700
    os.utime(stale, (an_hour_ago, an_hour_ago))
    assert store.get(IMAGE_ID) is None and not store.has(IMAGE_ID)
    assert store.remove_stale_staging() == 1
    assert not stale.exists() and fresh.exists()


KILLED_WRITER = textwrap.dedent(
    """
    import sys, torch
    from sam2serve.engine.predictor import Embedding
    from sam2serve.store.embedding_store import EmbeddingStore
    from sam2serve.store.identity import StoreIdentity

    store = EmbeddingStore(sys.argv[1], StoreIdentity("tiny", "fast", "float32", "random seed 0"))
    embedding = Embedding(torch.randn(1, 256, 64, 64),
                          (torch.randn(1, 32, 256, 256), torch.randn(1, 64, 128, 128)), ((8, 8),))
    for i in range(10_000):
        store.put(f"{i:064x}", embedding)
    """
)


def test_a_writer_killed_mid_run_leaves_only_complete_entries(tmp_path):
    """SIGKILL (nothing runs after it) a process that writes entries as fast as it can."""
    location = str(tmp_path / "store")
    writer = subprocess.Popen([sys.executable, "-c", KILLED_WRITER, location])
    store = EmbeddingStore(location, IDENTITY)
    deadline = time.monotonic() + 120
    try:
        while len(list(Path(store.root).rglob("*.safetensors"))) < 3:
            assert writer.poll() is None, "the writer died on its own"
            assert time.monotonic() < deadline, "the writer wrote nothing"
            time.sleep(0.02)
    finally:
        writer.send_signal(signal.SIGKILL)
        writer.wait()
    entries = list(Path(store.root).rglob("*.safetensors"))
    assert len(entries) >= 3
    for path in entries:
        image_id = path.name.removesuffix(".safetensors")
        assert store.has(image_id) and store.get(image_id) is not None, path
    assert store.stats().corrupt == 0


def test_a_location_that_is_a_file_or_an_unknown_protocol_is_named(tmp_path):
    a_file = tmp_path / "file.txt"
    a_file.write_text("x")
    with pytest.raises(StoreError, match="is a file"):
        check_location(str(a_file))
    with pytest.raises(StoreError, match="nosuchproto"):
        check_location("nosuchproto://bucket/emb")
    check_location(str(tmp_path / "new" / "store"))  # created
    assert (tmp_path / "new" / "store").is_dir()
