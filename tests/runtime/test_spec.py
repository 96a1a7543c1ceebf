"""The runtime vocabulary: RuntimeSpec's checks and defaults, the backend registry, and
adding a backend as one module plus one registry line."""

from __future__ import annotations

import re

import pytest
import torch

from sam2serve.runtime import backends
from sam2serve.runtime.backends import BACKENDS, BackendInfo
from sam2serve.runtime.build import build_predictor
from sam2serve.runtime.spec import RuntimeSpec, WeightsSource


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"model": "huge"}, "unknown model 'huge'; expected one of tiny, small, base_plus, large"),
        ({"mode": "turbo"}, "unknown mode 'turbo'; expected one of baseline, fast, furious"),
        ({"backend": "tensorrt"}, "unknown backend 'tensorrt'; expected one of eager, compile"),
        ({"device": "tpu"}, "unknown device 'tpu'; expected one of cpu, cuda"),
        ({"backend": "openvino", "device": "cuda"}, "backend 'openvino' runs on cpu, not on"),
        ({"backend": "artifacts", "mode": "baseline"}, "runs the fast, furious and int8 modes"),
        ({"threads": 0}, "threads must be an integer >= 1, got 0"),
        ({"prompt_chunk": 0}, "prompt_chunk must be an integer >= 1, got 0"),
        ({"dtype": "int4"}, "unknown dtype 'int4'; expected one of float32, bfloat16, float16"),
        ({"mode": "fast", "dtype": "bfloat16"}, "mode 'fast' computes in float32 (it is lossless)"),
    ],
)
def test_bad_specs_name_the_value(fields, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        RuntimeSpec(**fields)


def test_prompt_chunk_is_chosen_per_device():
    """Cache-sized chunks on the CPU (measured), large ones on a GPU (launch-bound)."""
    assert RuntimeSpec(mode="fast").prompt_chunk == 8
    assert RuntimeSpec(mode="furious", device="cuda").prompt_chunk == 64
    assert RuntimeSpec(mode="baseline").prompt_chunk == 64
    assert RuntimeSpec(mode="fast", prompt_chunk=8).prompt_chunk == 8


def test_weights_come_from_one_place():
    with pytest.raises(ValueError, match="artifacts carry their weights"):
        WeightsSource(checkpoint="x.pt", artifacts="art/")


def test_the_predictor_carries_its_spec():
    spec = RuntimeSpec("tiny", "furious", threads=1, dtype="bfloat16")
    predictor = build_predictor(spec, WeightsSource(random_weights=True, seed=1))
    assert predictor.runtime == spec and predictor.prompt_chunk == 8
    # furious in bf16 on the CPU: bf16 encoder weights, the heads fp32.
    assert str(predictor.model.image_encoder.neck.convs[0].conv.weight.dtype) == "torch.bfloat16"
    assert str(predictor.dtype) == "torch.float32"
    assert predictor.fast_decoder.dtype == torch.bfloat16


@pytest.mark.parametrize(("native", "expected"), [(True, "bfloat16"), (False, "float32")])
def test_furious_computes_in_what_the_cpu_runs_natively(monkeypatch, native, expected):
    """bf16 where the CPU has bf16 instructions; elsewhere it is emulated (8x slower,
    measured) and furious keeps float32. The spec the predictor carries says which."""
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: native)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
    spec = RuntimeSpec("tiny", "furious", threads=1)
    assert spec.dtype is None  # decided when built, from the device
    predictor = build_predictor(spec, WeightsSource(random_weights=True, seed=1))
    assert predictor.runtime == spec.replace(dtype=expected)
    weight = predictor.model.image_encoder.neck.convs[0].conv.weight
    assert str(weight.dtype) == f"torch.{expected}"
    lossless = build_predictor(
        RuntimeSpec("tiny", "fast", threads=1), WeightsSource(random_weights=True)
    )
    assert lossless.runtime.dtype == "float32"


def test_a_new_backend_is_one_module_and_one_registry_line(monkeypatch):
    import example_backend

    line = BackendInfo("example", "eager, noted", "example_backend", ("cpu",))
    monkeypatch.setitem(BACKENDS, "example", line)
    spec = RuntimeSpec.from_label("fast+example", model="tiny")
    predictor = build_predictor(spec, WeightsSource(random_weights=True))
    assert example_backend.BUILT == ["fast+example"]
    assert predictor.runtime.backend == "example"
    assert backends.get_backend_info("example") is line
