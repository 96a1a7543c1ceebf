"""Artifacts from a path or an fsspec URI: copied once to a cache, checked by the manifest."""

from __future__ import annotations

import hashlib
import shutil

import pytest

from sam2serve.cluster.args import ReplicaArgs
from sam2serve.cluster.artifacts import resolve_artifacts
from sam2serve.cluster.model_source import load_replica_model
from sam2serve.runtime.export import ArtifactError, load_artifacts
from sam2serve.runtime.spec import RuntimeSpec


def test_a_uri_is_copied_once_and_loads(exported_artifacts, tmp_path):
    cache = tmp_path / "cache"
    uri = exported_artifacts.resolve().as_uri()  # file://...: goes through fsspec
    first = resolve_artifacts(uri, cache)
    again = resolve_artifacts(uri, cache)
    assert first.copied and not again.copied and first.directory == again.directory
    assert first.directory.parent == cache
    manifest = (exported_artifacts / "manifest.json").read_bytes()
    assert first.manifest_sha256 == hashlib.sha256(manifest).hexdigest()
    predictor = load_artifacts(first.directory, RuntimeSpec("tiny", "fast", "artifacts"))
    assert predictor.model.weights_info.is_random


def test_an_artifacts_replica_loads_them_with_their_backend(exported_artifacts, tmp_path):
    uri = exported_artifacts.resolve().as_uri()
    args = ReplicaArgs.from_dict(
        {"model": "tiny", "mode": "fast", "artifacts": uri, "artifacts_cache": str(tmp_path)}
    )
    loaded = load_replica_model(args, threads=1)
    runtime = loaded.predictor.runtime
    assert (runtime.backend, runtime.device, runtime.threads) == ("artifacts", "cpu", 1)
    manifest = (exported_artifacts / "manifest.json").read_bytes()
    source = loaded.source
    assert (source.kind, source.location, source.copied) == ("artifacts", uri, True)
    assert source.sha256 == hashlib.sha256(manifest).hexdigest()
    assert set(loaded.stages_s) == {"fetch_model", "load_model"}


def test_a_corrupt_copy_is_refused_by_the_manifest(exported_artifacts, tmp_path):
    source = tmp_path / "source"
    shutil.copytree(exported_artifacts, source)
    with (source / "heads.pt").open("ab") as f:
        f.write(b"corrupt")
    local = resolve_artifacts(source.as_uri(), tmp_path / "cache")
    with pytest.raises(ArtifactError, match="heads.pt does not match its sha256"):
        load_artifacts(local.directory, RuntimeSpec("tiny", "fast", "artifacts"))


def test_missing_locations_are_named(tmp_path):
    with pytest.raises(ArtifactError, match="artifacts directory '/nonexistent/x' does not"):
        resolve_artifacts("/nonexistent/x")
    with pytest.raises(ArtifactError, match="no manifest.json at artifacts URI"):
        resolve_artifacts((tmp_path).as_uri(), tmp_path / "cache")
    with pytest.raises(ArtifactError, match="cannot open artifacts URI 'nosuch://a'"):
        resolve_artifacts("nosuch://a", tmp_path / "cache")
