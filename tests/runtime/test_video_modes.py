"""What the modes mean for the video tracker (sam2serve.runtime.video): baseline and fast
are the faithful fp32 tracker, furious takes the dtype the image path's rule gives the
device (bf16 weights for the CPU's encoder, autocast for memory attention), and what the
tracker cannot run is refused by name. The settings are checked here; that they track as
Meta's is tests/video's, and the bf16 numerics run on a GPU (scripts/gpu-check.sh)."""

from __future__ import annotations

import pytest
import torch

from sam2serve.checkpoint import load_video_model
from sam2serve.runtime.build import native_reduced_dtype
from sam2serve.runtime.modes import VIDEO_MODES, get_video_mode
from sam2serve.runtime.spec import RuntimeSpec
from sam2serve.runtime.video import check_video_spec, video_predictor_for


@pytest.fixture(scope="module")
def model():
    return load_video_model("tiny", random_weights=True, seed=2)


def test_the_tracker_runs_the_float_modes_on_eager_and_compile():
    assert VIDEO_MODES == ("baseline", "fast", "furious")
    with pytest.raises(ValueError, match="runs the modes baseline, fast, furious, not 'int8'"):
        get_video_mode("int8")
    with pytest.raises(ValueError, match="not 'int8'"):
        check_video_spec(RuntimeSpec(mode="int8"))  # its default backend is openvino
    check_video_spec(RuntimeSpec(mode="fast", backend="compile"))
    check_video_spec(RuntimeSpec(mode="furious", backend="compile"))
    with pytest.raises(
        ValueError, match="backend 'eager' or 'onnxruntime' or 'compile', not 'openvino'"
    ):
        check_video_spec(RuntimeSpec(mode="fast", backend="openvino"))


@pytest.mark.parametrize("mode", ["baseline", "fast"])
def test_baseline_and_fast_are_the_fp32_tracker(model, mode):
    predictor = video_predictor_for(model, RuntimeSpec(mode=mode))
    assert predictor.runtime.mode == mode and predictor.runtime.dtype == "float32"
    assert predictor.encoder_autocast_dtype is None
    assert predictor.memory_attention_dtype is None


def test_furious_resolves_its_dtype_as_the_image_path_does(model):
    predictor = video_predictor_for(model, RuntimeSpec(mode="furious"))
    native = native_reduced_dtype("cpu")
    assert predictor.runtime.dtype == native
    if native == "float32":  # no native bf16 on this CPU: furious tracks as fast
        assert predictor.memory_attention_dtype is None
        assert predictor.encoder_autocast_dtype is None


def test_furious_in_bf16_on_the_cpu():
    """bf16 weights for the encoder (the image path's CPU rule) and the memory encoder,
    a bf16 copy for memory attention; the heads and memory attention's own weights stay
    fp32."""
    model = load_video_model("tiny", random_weights=True, seed=2)  # converted in place
    predictor = video_predictor_for(model, RuntimeSpec(mode="furious", dtype="bfloat16"))
    assert predictor.encoder_autocast_dtype is None
    assert predictor.memory_attention_dtype == torch.bfloat16
    for part in (model.image_encoder, model.memory_encoder):
        assert {p.dtype for p in part.parameters()} == {torch.bfloat16}
    for part in (model.memory_attention, model.sam_mask_decoder):
        assert {p.dtype for p in part.parameters()} == {torch.float32}


def test_the_bf16_memory_encoder_agrees_with_fp32():
    """The memories furious stores (bf16 either way) from a bf16 memory encoder are those
    of the fp32 one within bf16's rounding; float32 comes out in both."""
    fp32 = load_video_model("tiny", random_weights=True, seed=3)
    bf16 = load_video_model("tiny", random_weights=True, seed=3)
    bf16.memory_encoder.to(torch.bfloat16)
    generator = torch.Generator().manual_seed(0)
    feats = torch.randn(1, 256, 64, 64, generator=generator)
    mask = torch.rand(2, 1, 1024, 1024, generator=generator)
    scores = torch.tensor([[1.0], [-1.0]])  # one present, one absent
    with torch.inference_mode():
        want = fp32.encode_mask(feats, mask, scores)
        got = bf16.encode_mask(feats, mask, scores)
    assert got.dtype == want.dtype == torch.float32
    assert not torch.equal(got, want)  # it did run in bf16
    rel = (got - want).norm() / want.norm()
    assert rel < 0.02, rel
    cos = torch.nn.functional.cosine_similarity(got.flatten(), want.flatten(), dim=0)
    assert cos > 0.999, cos
