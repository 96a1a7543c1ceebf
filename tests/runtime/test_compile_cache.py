"""The compile cache (sam2serve.runtime.compile_cache): a second process loads what the
first compiled, uses it (torch's cache hits, no kernel built) and answers identically;
an entry made for something else is ignored with one log line; a damaged one gives one
warning and a compilation from scratch.

The first tier compiles a toy function (one fused kernel) in child processes; the second
(``extended``) tiny's image path, as backend compile runs it and as 'sam2serve export
--format compile-cache' writes it."""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from sam2serve.runtime.cache_entry import MANIFEST
from sam2serve.runtime.compile_cache import (
    ARTIFACTS_FILE,
    KERNELS_FILE,
    CompileCached,
    compile_identity,
    find_entry,
    read_entry_manifest,
)

CHILD = Path(__file__).with_name("compile_cache_child.py")
ROOT = Path(__file__).resolve().parents[2]


def child(cache: Path, what: str, out: Path, *extra: str) -> tuple[dict, dict, str]:
    """Run the child under ``cache``: (its outputs, its cache report, its stderr)."""
    env = {**os.environ, "SAM2SERVE_CACHE": str(cache), "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, str(CHILD), what, "--save", str(out), *extra],
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    return torch.load(out, weights_only=True), report, done.stderr


def only_entry(cache: Path) -> Path:
    [entry] = [p for p in (cache / "compile").iterdir() if not p.name.startswith(".")]
    return entry


def warning_lines(stderr: str) -> list[str]:
    """The child's log lines of level WARNING and above (its format: NAME LEVEL: ...)."""
    levels = (" WARNING: ", " ERROR: ", " CRITICAL: ")
    return [line for line in stderr.splitlines() if any(level in line for level in levels)]


def assert_identical(first: dict, second: dict) -> None:
    assert first.keys() == second.keys()
    for name, value in first.items():
        assert torch.equal(value, second[name]), name


def assert_from_cache(report: dict) -> None:
    """torch served every graph from the entry and built no kernel."""
    assert report["loaded"] is True
    assert report["fx_graph_hits"] > 0 and report["aot_autograd_hits"] > 0
    assert report["fx_graph_misses"] == 0 and report["aot_autograd_misses"] == 0
    assert report["kernels_built"] == 0


def assert_compiled(report: dict) -> None:
    assert report["loaded"] is False
    assert report["fx_graph_misses"] > 0 and report["kernels_built"] > 0


@pytest.fixture(scope="module")
def toy_cache(tmp_path_factory) -> tuple[Path, dict, dict]:
    """A cache written by a first process compiling the toy: (its entry, outputs, report)."""
    cache = tmp_path_factory.mktemp("toy-cache")
    outputs, report, _ = child(cache, "toy", cache.parent / "toy-first.pt")
    return only_entry(cache), outputs, report


def test_first_process_compiles_and_keeps_an_entry(toy_cache):
    entry, _, report = toy_cache
    assert_compiled(report)
    assert report["written"] is True and report["entry"] == str(entry)
    manifest = read_entry_manifest(entry)
    assert manifest is not None and set(manifest["files"]) == {ARTIFACTS_FILE, KERNELS_FILE}
    assert manifest["identity"]["torch"] == torch.__version__
    assert manifest["identity"]["input"] == [[64, 64, "float32"]]
    assert manifest["kernels"] == report["kernels_built"]


def test_second_process_loads_it_and_answers_identically(toy_cache, tmp_path):
    entry, first, _ = toy_cache
    second, report, _ = child(entry.parent.parent, "toy", tmp_path / "second.pt")
    assert_from_cache(report)
    assert report["written"] is False
    assert_identical(first, second)


# Each compiles the toy again in a child (with the cold first one, over a minute on a
# loaded 2-core host): the second tier. The first tier checks the same decisions without
# compiling (find_entry, _read) below.
@pytest.mark.extended
def test_an_entry_of_another_torch_is_ignored_with_one_line(toy_cache, tmp_path):
    entry, first, _ = toy_cache
    cache = tmp_path / "cache"
    shutil.copytree(entry, cache / "compile" / entry.name)
    other, report, stderr = child(cache, "toy", tmp_path / "other.pt", "--torch-version", "0.1")
    assert_compiled(report)
    lines = warning_lines(stderr)
    assert len(lines) == 1 and "not used" in lines[0], stderr
    assert "torch '2.13" in lines[0] and "(here '0.1')" in lines[0], stderr
    assert_identical(first, other)
    # Its own entry sits beside the first one, which is left as it was.
    assert len([p for p in (cache / "compile").iterdir() if not p.name.startswith(".")]) == 2


@pytest.mark.extended
def test_a_damaged_entry_warns_once_and_compiles_from_scratch(toy_cache, tmp_path):
    source, first, _ = toy_cache
    cache = tmp_path / "cache"
    entry = cache / "compile" / source.name
    shutil.copytree(source, entry)
    kernels = entry / KERNELS_FILE
    data = bytearray(kernels.read_bytes())
    data[len(data) // 2] ^= 0xFF
    kernels.write_bytes(bytes(data))
    again, report, stderr = child(cache, "toy", tmp_path / "again.pt")
    assert_compiled(report)
    warnings = warning_lines(stderr)
    assert len(warnings) == 1 and "is damaged" in warnings[0], stderr
    assert f"{KERNELS_FILE} does not match its sha256" in warnings[0], stderr
    assert "Traceback" not in stderr
    assert_identical(first, again)
    # ... and the entry is written again, whole: the next process loads it.
    _, reloaded, _ = child(cache, "toy", tmp_path / "reloaded.pt")
    assert_from_cache(reloaded)


# ---------------------------------------------------------------- without compiling


def fake_entry(root: Path, name: str, identity: dict, files: dict | None = None) -> Path:
    entry = root / name
    entry.mkdir(parents=True)
    manifest = {"format": "compile-cache", "version": 1, "identity": identity, "files": files}
    (entry / MANIFEST).write_text(json.dumps(manifest))
    return entry


def test_find_entry_names_what_differs(tmp_path, caplog):
    identity = {**compile_identity("tiny", "furious", "bfloat16", "cpu"), "input": [[1]]}
    fake_entry(tmp_path, "a", {**identity, "torch": "2.11.0", "target": "another CPU"})
    fake_entry(tmp_path, "b", {**identity, "model": "large"})  # another model: silent
    with caplog.at_level(logging.INFO, "sam2serve.runtime"):
        assert find_entry(identity, tmp_path) is None
    [record] = caplog.records
    assert "torch '2.11.0'" in record.message and "another CPU" in record.message
    assert "large" not in record.message
    match = fake_entry(tmp_path, "c", identity)
    assert find_entry(identity, tmp_path) == match


def test_find_entry_without_a_cache(tmp_path, caplog):
    with caplog.at_level(logging.INFO, "sam2serve.runtime"):
        assert find_entry({"model": "tiny"}, tmp_path / "missing") is None
    (tmp_path / "not-an-entry").mkdir()
    (tmp_path / "not-an-entry" / MANIFEST).write_text("{not json")
    assert find_entry({"model": "tiny"}, tmp_path) is None
    assert caplog.records == []


def test_a_missing_file_is_a_damaged_entry(tmp_path, caplog):
    identity = {"model": "tiny"}
    entry = fake_entry(tmp_path, "e", identity, {ARTIFACTS_FILE: "0" * 64, KERNELS_FILE: "0"})
    cached = CompileCached(lambda x: x, identity, root=tmp_path)
    with caplog.at_level(logging.WARNING, "sam2serve.runtime"):
        assert cached._read(entry, tmp_path / "work") is None
    [record] = caplog.records
    assert "damaged" in record.message and f"{ARTIFACTS_FILE} is missing" in record.message


def test_export_compile_cache_usage_errors(tmp_path, capsys):
    from sam2serve.cli import main

    out = str(tmp_path / "out")
    base = ["export", "--format", "compile-cache", "--random-weights", "--out", out]
    assert main([*base, "--mode", "int8"]) == 2
    assert "modes fast and furious, not --mode int8" in capsys.readouterr().err
    assert main([*base, "--video"]) == 2
    assert "--video" in capsys.readouterr().err
    assert not Path(out).exists()


def test_artifacts_flag_on_a_compile_cache_says_what_it_is(tmp_path):
    from sam2serve.runtime.export import ArtifactError, read_manifest

    entry = fake_entry(tmp_path, "e", {"model": "tiny"})
    with pytest.raises(ArtifactError, match="is a compile cache.*--backend compile"):
        read_manifest(entry)


# ---------------------------------------------------------------- tiny's image path


@pytest.fixture(scope="module")
def image_cache(tmp_path_factory) -> tuple[Path, dict, dict]:
    cache = tmp_path_factory.mktemp("image-cache")
    outputs, report, _ = child(cache, "image", cache.parent / "image-first.pt")
    return cache, outputs, report


@pytest.mark.extended
def test_image_path_from_the_cache_answers_identically(image_cache, tmp_path):
    cache, first, report = image_cache
    assert_compiled(report)
    assert report["written"] is True
    second, report, _ = child(cache, "image", tmp_path / "second.pt")
    assert_from_cache(report)
    assert_identical(first, second)


@pytest.mark.extended
def test_export_compile_cache_is_loaded_by_backend_compile(image_cache, tmp_path):
    _, first, _ = image_cache
    cache = tmp_path / "cache"
    out = cache / "compile" / "tiny-fast"
    argv = ["export", "--format", "compile-cache", "--mode", "fast", "--random-weights"]
    # Its own process, as a user runs it: what earlier tests left in this process (torch's
    # threads, dynamo's state) is no part of the entry's identity.
    env = {**os.environ, "SAM2SERVE_CACHE": str(cache), "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", "sam2serve", *argv, "--out", str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    manifest = read_entry_manifest(out)
    assert manifest["model"] == "tiny" and manifest["mode"] == "fast"
    assert manifest["weights"]["source"] == "random"
    # The export's weights (seed 0) differ from the child's (seed 3): the entry is the same.
    second, report, _ = child(cache, "image", tmp_path / "second.pt")
    assert_from_cache(report)
    assert report["entry"] == str(out)
    assert_identical(first, second)
