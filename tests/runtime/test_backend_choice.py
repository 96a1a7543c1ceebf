"""One rule for which backend runs a mode, asked by the CLI, the server settings and the
cluster alike: auto, export directories by their manifest, explicit names checked."""

from __future__ import annotations

import json

import pytest

from sam2serve.cluster.args import ConfigError, ReplicaArgs
from sam2serve.runtime.backend_choice import (
    AUTO,
    BackendChoiceError,
    auto_backend,
    choose_backend,
)
from sam2serve.runtime.host import parse_cpuinfo
from sam2serve.server.settings import ServerSettings


@pytest.fixture
def onnx_export(tmp_path):
    folder = tmp_path / "onnx"
    folder.mkdir()
    (folder / "manifest.json").write_text(json.dumps({"format": "onnx"}))
    return str(folder)


@pytest.fixture
def artifacts_export(tmp_path):
    folder = tmp_path / "art"
    folder.mkdir()
    (folder / "manifest.json").write_text(json.dumps({"format": "sam2serve-artifacts"}))
    return str(folder)


def test_auto_and_none_follow_the_manifest_or_the_mode(onnx_export, artifacts_export):
    for requested in (None, AUTO):
        assert choose_backend(requested, "fast", "cpu", onnx_export) == "onnxruntime"
        assert choose_backend(requested, "fast", "cpu", artifacts_export) == "artifacts"
        assert choose_backend(requested, "fast", "cpu", None) == auto_backend("fast", "cpu")
        assert choose_backend(requested, "int8", "cpu", None) == auto_backend("int8", "cpu")
    # int8 has no eager kernels: auto never picks a float-only backend for it.
    assert auto_backend("int8", "cpu") in ("openvino", "onnxruntime")


def test_auto_picks_per_cpu_class():
    """furious's bf16 image path goes to OpenVINO where bf16 is native; elsewhere and for
    the lossless modes eager PyTorch; int8 always to OpenVINO; GPUs run eager."""
    zen4 = parse_cpuinfo("flags : avx2 avx512f avx512_bf16 avx512_vnni\n")
    avx2 = parse_cpuinfo("flags : avx2 fma\n")
    assert auto_backend("furious", "cpu", zen4) == "openvino"
    assert auto_backend("furious", "cpu", avx2) == "eager"
    for isa in (zen4, avx2):
        assert auto_backend("fast", "cpu", isa) == "eager"
        assert auto_backend("baseline", "cpu", isa) == "eager"
        assert auto_backend("int8", "cpu", isa) == "openvino"
    assert auto_backend("furious", "cuda", zen4) == "eager"
    assert auto_backend("fast", "cuda:1", zen4) == "eager"


def test_explicit_names_are_checked_against_the_source(onnx_export, artifacts_export):
    assert choose_backend("eager", "fast", "cpu", None) == "eager"
    assert choose_backend("onnxruntime", "fast", "cpu", onnx_export) == "onnxruntime"
    cases = [
        (("turbo", "fast", "cpu", None), "unknown backend 'turbo'; expected one of auto"),
        (("artifacts", "fast", "cpu", None), "give the export directory"),
        (("eager", "fast", "cpu", onnx_export), "run it with backend 'onnxruntime'"),
        (("artifacts", "fast", "cpu", onnx_export), "is run by backend 'onnxruntime', not"),
        (("onnxruntime", "fast", "cpu", artifacts_export), "is run by backend 'artifacts'"),
    ]
    for arguments, message in cases:
        with pytest.raises(BackendChoiceError, match=message):
            choose_backend(*arguments)


def test_every_surface_asks_the_same_rule(onnx_export):
    """The server's settings and a cluster replica pick the ONNX export's backend (the
    cluster used to take the first artifacts backend whatever the manifest said)."""
    settings = ServerSettings.from_flat(mode="fast", artifacts=onnx_export)
    assert settings.runtime.spec().backend == "onnxruntime"
    with pytest.raises(ValueError, match="run it with backend 'onnxruntime'"):
        ServerSettings.from_flat(mode="fast", backend="eager", artifacts=onnx_export).runtime.spec()
    replica = ReplicaArgs(model="tiny", mode="fast", artifacts=onnx_export)
    replica.check()
    assert replica.runtime_spec(threads=1).backend == "onnxruntime"
    # A URI is read once fetched: the fetched copy's manifest decides.
    remote = ReplicaArgs(model="tiny", mode="fast", artifacts="s3://bucket/onnx")
    assert remote.runtime_spec(1, artifacts_dir=onnx_export).backend == "onnxruntime"
    with pytest.raises(ConfigError, match=r"args\.backend: backend 'eager' starts from weights"):
        ReplicaArgs(model="tiny", mode="fast", artifacts=onnx_export, backend="eager").check()
