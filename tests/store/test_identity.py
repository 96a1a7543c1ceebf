"""The store's keys: image ids are content hashes, and every field of the runtime
identity (model, mode, dtype, weights, store precision) moves an entry elsewhere."""

from __future__ import annotations

import hashlib
import json
from types import SimpleNamespace

import pytest

from sam2serve.server.cache import image_id_of as server_image_id_of
from sam2serve.store.identity import StoreIdentity, file_sha256, image_id_of, weights_identity

BASE = StoreIdentity("tiny", "fast", "float32", "random seed 0")


def test_image_id_is_the_sha256_of_the_bytes_as_the_server_issues_it():
    data = b"\x89PNG not really"
    assert image_id_of(data) == hashlib.sha256(data).hexdigest() == server_image_id_of(data)


@pytest.mark.parametrize(
    "change",
    [
        {"model": "large"},
        {"mode": "baseline"},
        {"dtype": "bfloat16"},
        {"weights": "random seed 1"},
        {"weights": "checkpoint sha256:" + "0" * 64},
        {"store_dtype": "float16"},
    ],
)
def test_every_field_changes_the_digest(change):
    other = StoreIdentity(**{**BASE.__dict__, **change})
    assert other.digest != BASE.digest
    assert StoreIdentity(**BASE.__dict__).digest == BASE.digest  # and it is stable
    assert len(BASE.digest) == 16


def test_an_unknown_store_dtype_is_named():
    with pytest.raises(ValueError, match="'int8'"):
        StoreIdentity("tiny", "fast", "float32", "random seed 0", store_dtype="int8")


def test_weights_identity_is_content_not_path(tmp_path):
    a, b, c = tmp_path / "a.pt", tmp_path / "b.pt", tmp_path / "c.pt"
    a.write_bytes(b"weights one")
    b.write_bytes(b"weights one")  # a copy elsewhere: the same weights
    c.write_bytes(b"weights two")
    ident = {
        p: weights_identity(SimpleNamespace(source="checkpoint", path=str(p))) for p in (a, b, c)
    }
    assert ident[a] == ident[b] == f"checkpoint sha256:{hashlib.sha256(b'weights one').hexdigest()}"
    assert ident[c] != ident[a]
    assert file_sha256(c) == hashlib.sha256(b"weights two").hexdigest()


def test_weights_identity_of_random_weights_and_artifacts(tmp_path):
    assert weights_identity(SimpleNamespace(source="random", seed=3, path=None)) == "random seed 3"
    manifest = {"files": {"heads.pt": "ab" * 32, "image_encoder.xml": "cd" * 32}}
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    info = SimpleNamespace(source="checkpoint", path="/elsewhere/x.pt", seed=None)  # as exported
    first = weights_identity(info, artifacts=str(tmp_path))
    assert first.startswith("artifacts sha256:")
    assert weights_identity(info, artifacts=f"file://{tmp_path}") == first  # a URI too
    manifest["files"]["heads.pt"] = "ef" * 32
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    assert weights_identity(info, artifacts=str(tmp_path)) != first


def test_weights_that_cannot_be_identified_are_refused(tmp_path):
    gone = SimpleNamespace(source="checkpoint", path=str(tmp_path / "missing.pt"), seed=None)
    with pytest.raises(ValueError, match="cannot tell which weights"):
        weights_identity(gone)
    with pytest.raises(ValueError, match="cannot tell which weights"):
        weights_identity(None)
