"""Artifacts exported once for every cluster test (random tiny weights, fast mode)."""

from __future__ import annotations

import pytest

pytest.importorskip("ray.serve")


@pytest.fixture(scope="session")
def exported_artifacts(tmp_path_factory):
    from sam2serve.accel.export import export_artifacts

    out = tmp_path_factory.mktemp("cluster_artifacts")
    # The decoder programs are tested in tests/accel; compiling them here too would add
    # ~2 minutes to the suite for nothing the replicas' tests look at.
    export_artifacts(
        "tiny", "fast", out, decoder="eager", random_weights=True, seed=3, command="tests/cluster"
    )
    return out
