"""The runtime vocabulary: RuntimeSpec's checks and defaults, the backend registry, and
adding a backend as one module plus one registry line."""

from __future__ import annotations

import re

import pytest

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
        ({"backend": "artifacts", "mode": "baseline"}, "runs the fast and furious modes"),
        ({"threads": 0}, "threads must be an integer >= 1, got 0"),
        ({"prompt_chunk": 0}, "prompt_chunk must be an integer >= 1, got 0"),
    ],
)
def test_bad_specs_name_the_value(fields, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        RuntimeSpec(**fields)


def test_prompt_chunk_is_chosen_per_device():
    """Cache-sized chunks on the CPU (measured), large ones on a GPU (launch-bound)."""
    assert RuntimeSpec(mode="fast").prompt_chunk == 4
    assert RuntimeSpec(mode="furious", device="cuda").prompt_chunk == 64
    assert RuntimeSpec(mode="baseline").prompt_chunk == 64
    assert RuntimeSpec(mode="fast", prompt_chunk=8).prompt_chunk == 8


def test_weights_come_from_one_place():
    with pytest.raises(ValueError, match="artifacts carry their weights"):
        WeightsSource(checkpoint="x.pt", artifacts="art/")


def test_the_predictor_carries_its_spec():
    spec = RuntimeSpec("tiny", "furious", threads=1)
    predictor = build_predictor(spec, WeightsSource(random_weights=True, seed=1))
    assert predictor.runtime == spec and predictor.prompt_chunk == 4
    # furious on the CPU: bf16 encoder weights, the heads fp32.
    assert predictor.model.image_encoder.neck.convs[0].conv.weight.dtype.is_floating_point
    assert str(predictor.model.image_encoder.neck.convs[0].conv.weight.dtype) == "torch.bfloat16"
    assert str(predictor.dtype) == "torch.float32"


def test_a_new_backend_is_one_module_and_one_registry_line(monkeypatch):
    import example_backend

    line = BackendInfo("example", "eager, noted", "example_backend", ("cpu",))
    monkeypatch.setitem(BACKENDS, "example", line)
    spec = RuntimeSpec.from_label("fast+example", model="tiny")
    predictor = build_predictor(spec, WeightsSource(random_weights=True))
    assert example_backend.BUILT == ["fast+example"]
    assert predictor.runtime.backend == "example"
    assert backends.get_backend_info("example") is line
