"""Artifacts exported once for every cluster test (random tiny weights, fast mode)."""

from __future__ import annotations

import pytest

pytest.importorskip("ray.serve")


@pytest.fixture(scope="session")
def exported_artifacts(tmp_path_factory):
    from sam2serve.accel.export import export_artifacts

    out = tmp_path_factory.mktemp("cluster_artifacts")
    export_artifacts("tiny", "fast", out, random_weights=True, seed=3, command="tests/cluster")
    return out
