"""What a replica loads, without Ray: a checkpoint from a path or an fsspec URI (copied
once per node, never seen half-written), built into a Predictor by the configured backend."""

from __future__ import annotations

import hashlib
import shutil
import threading
from pathlib import Path

import pytest

from sam2serve.checkpoint import CheckpointError
from sam2serve.cluster.args import ReplicaArgs
from sam2serve.cluster.checkpoints import SHA256_FILE, resolve_checkpoint_file
from sam2serve.cluster.model_source import load_replica_model
from sam2serve.runtime.warmup import warm_up


def sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def leftovers(cache: Path) -> list[str]:
    """Staging directories left in the cache (a complete copy never starts with '.')."""
    return [p.name for p in cache.iterdir() if p.name.startswith(".")]


def test_a_checkpoint_uri_is_copied_once_into_the_cache(tiny_checkpoint, tmp_path):
    cache = tmp_path / "cache"
    uri = tiny_checkpoint.resolve().as_uri()  # file://...: goes through fsspec
    first = resolve_checkpoint_file(uri, cache)
    again = resolve_checkpoint_file(uri, cache)
    assert first.copied and not again.copied and first.path == again.path
    # cache/<digest of the URI and its version>/<the file's own name>
    assert first.path.parent.parent == cache and len(first.path.parent.name) == 32
    assert first.path.name == tiny_checkpoint.name
    assert first.sha256 == again.sha256 == sha256_of(tiny_checkpoint) == sha256_of(first.path)
    assert (first.path.parent / SHA256_FILE).read_text() == first.sha256
    assert leftovers(cache) == []


def test_replicas_fetching_together_share_one_complete_copy(tiny_checkpoint, tmp_path):
    cache = tmp_path / "cache"
    uri = tiny_checkpoint.resolve().as_uri()
    start = threading.Barrier(4)
    results: list = []
    errors: list[BaseException] = []

    def fetch() -> None:
        start.wait()
        try:
            results.append(resolve_checkpoint_file(uri, cache))
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=fetch) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not errors, errors
    assert len({r.path for r in results}) == 1 and len(results) == 4
    assert sum(r.copied for r in results) == 1  # one rename won; the others used it
    assert {r.sha256 for r in results} == {sha256_of(tiny_checkpoint)}
    assert sha256_of(results[0].path) == sha256_of(tiny_checkpoint)
    assert leftovers(cache) == [] and len(list(cache.iterdir())) == 1


def test_a_replaced_file_under_the_same_uri_gets_a_new_copy(tiny_checkpoint, tmp_path):
    source = tmp_path / "remote" / tiny_checkpoint.name
    source.parent.mkdir()
    shutil.copyfile(tiny_checkpoint, source)
    cache = tmp_path / "cache"
    old = resolve_checkpoint_file(source.as_uri(), cache)
    with source.open("ab") as f:
        f.write(b"a re-upload")
    new = resolve_checkpoint_file(source.as_uri(), cache)
    assert new.copied and new.path != old.path and new.sha256 == sha256_of(source)


def test_a_local_path_is_used_in_place(tiny_checkpoint, tmp_path):
    local = resolve_checkpoint_file(str(tiny_checkpoint), tmp_path / "cache")
    assert local.path == tiny_checkpoint and not local.copied
    assert local.sha256 == sha256_of(tiny_checkpoint)
    assert not (tmp_path / "cache").exists()


def test_missing_checkpoints_are_named(tmp_path):
    with pytest.raises(CheckpointError, match="checkpoint file '/nonexistent/c.pt' does not"):
        resolve_checkpoint_file("/nonexistent/c.pt")
    missing = (tmp_path / "c.pt").as_uri()
    with pytest.raises(CheckpointError, match=f"no checkpoint file at URI '{missing}'"):
        resolve_checkpoint_file(missing, tmp_path / "cache")
    with pytest.raises(CheckpointError, match=r"checkpoint URI 'file://.*' is not a file"):
        resolve_checkpoint_file(tmp_path.as_uri(), tmp_path / "cache")
    with pytest.raises(CheckpointError, match="cannot open checkpoint URI 'nosuch://a.pt'"):
        resolve_checkpoint_file("nosuch://a.pt", tmp_path / "cache")


def replica_args(checkpoint: str, **changes) -> ReplicaArgs:
    return ReplicaArgs.from_dict(
        {"model": "tiny", "mode": "fast", "checkpoint": checkpoint, **changes}
    )


def test_a_checkpoint_replica_builds_its_backend_on_its_device(tiny_checkpoint, tmp_path):
    uri = tiny_checkpoint.resolve().as_uri()
    args = replica_args(uri, checkpoint_cache=str(tmp_path / "cache"))
    loaded = load_replica_model(args, threads=1)  # threads: what Ray reserved
    runtime = loaded.predictor.runtime
    assert (runtime.model, runtime.mode, runtime.backend, runtime.device, runtime.threads) == (
        "tiny",
        "fast",
        "eager",  # a checkpoint's default backend
        "cpu",
        1,
    )
    source = loaded.source
    assert (source.kind, source.location, source.copied) == ("checkpoint", uri, True)
    assert source.sha256 == sha256_of(tiny_checkpoint)
    weights = loaded.predictor.model.weights_info
    assert weights.source == "checkpoint" and weights.path == source.local_path
    assert Path(source.local_path).parent.parent == tmp_path / "cache"
    assert set(loaded.stages_s) == {"fetch_model", "load_model"}
    assert all(seconds >= 0 for seconds in loaded.stages_s.values())
    warm_up(loaded.predictor)  # what the replica does next: the predictor answers


def test_the_compile_backend_is_built_from_the_checkpoint(tiny_checkpoint):
    loaded = load_replica_model(replica_args(str(tiny_checkpoint), backend="compile", threads=2))
    runtime = loaded.predictor.runtime
    assert (runtime.backend, runtime.device, runtime.threads) == ("compile", "cpu", 2)
    assert (loaded.source.kind, loaded.source.copied) == ("checkpoint", False)
    assert loaded.source.local_path == str(tiny_checkpoint)
