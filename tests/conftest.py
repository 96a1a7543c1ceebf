"""Shared fixtures: one official-shaped random checkpoint per size, loaded into our
model and Meta's (the oracle)."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

# One cache root for the whole run, the servers it starts included (they inherit the
# environment): nothing of the user's ~/.cache/sam2serve is read or written, and every
# run starts from an empty cache. Tests that need a cache of their own set their own.
TEST_CACHE = tempfile.mkdtemp(prefix="sam2serve-test-cache-")
os.environ["SAM2SERVE_CACHE"] = TEST_CACHE


def pytest_sessionfinish(session, exitstatus):
    shutil.rmtree(TEST_CACHE, ignore_errors=True)


from oracle import load_meta_model, write_official_like_checkpoint

SEED = 7


def pytest_collection_modifyitems(config, items):
    """Tests marked ``cuda`` run only where torch sees a GPU (scripts/gpu-check.sh)."""
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (run scripts/gpu-check.sh on one)")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def checkpoint_factory(tmp_path_factory):
    cache: dict[str, Path] = {}

    def make(size: str) -> Path:
        if size not in cache:
            path = tmp_path_factory.mktemp(f"ckpt_{size}") / f"sam2.1_hiera_{size}.pt"
            cache[size] = write_official_like_checkpoint(size, SEED, path)
        return cache[size]

    return make


@pytest.fixture(scope="session")
def tiny_checkpoint(checkpoint_factory) -> Path:
    return checkpoint_factory("tiny")


@pytest.fixture(scope="session")
def tiny_model(tiny_checkpoint):
    from sam2serve.checkpoint import load_model

    return load_model("tiny", checkpoint=tiny_checkpoint)


@pytest.fixture(scope="session")
def tiny_meta_model(tiny_checkpoint):
    return load_meta_model("tiny", tiny_checkpoint)


@pytest.fixture(scope="session")
def exported_artifacts(tmp_path_factory) -> Path:
    """``sam2serve export`` of random tiny weights (seed 4) for mode fast, the image path
    only (OpenVINO; the decoder runs eagerly from heads.pt): for tests/runtime and
    tests/cluster. The decoder programs take most of an export's time (~2 min more on 2
    cores): their tests use ``exported_programs``, in the second tier."""
    from sam2serve.runtime.export import export_artifacts

    out = tmp_path_factory.mktemp("artifacts")
    export_artifacts(
        "tiny", "fast", out, decoder="eager", random_weights=True, seed=4, command="test"
    )
    return out


@pytest.fixture(scope="session")
def exported_programs(tmp_path_factory) -> Path:
    """The same export as the command makes it by default: with the decoder programs
    (AOTInductor), compiled once (~2.5 min) for the tests marked ``extended``."""
    from sam2serve.runtime.export import export_artifacts

    out = tmp_path_factory.mktemp("artifacts-programs")
    export_artifacts("tiny", "fast", out, random_weights=True, seed=4, command="test")
    return out


@pytest.fixture(scope="session")
def concepts_tiny(tmp_path_factory):
    """One seeded random SAM 3 of the reduced size (CLIP's public BPE vocabulary), shared by
    every concept test in the process (read-only: the engine is stateless)."""
    from sam2serve.concepts.runtime import ConceptsSpec, load_concepts

    spec = ConceptsSpec(random_weights=True, size="tiny", seed=0)
    return load_concepts(spec)
