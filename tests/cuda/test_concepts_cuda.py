"""On a CUDA GPU: SAM 3's concept path (issue 37 item 3) with the model and the inputs on the
GPU gives the CPU's instances at the reduced size; its preprocessing is Meta's processor's on
CUDA; RoIAlign runs there without a host sync; and the kernels the first tier's
DeviceGuard calls CPU-only are refused by CUDA. Marked ``cuda``: skipped where torch sees
no GPU (tests/conftest.py), run by ``scripts/gpu-check.sh --part concepts-device`` (and
``--part tests``)."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "concepts"))
from device_guard import _FLOAT_ONLY_OFF_CPU

from sam2serve.concepts import engine
from sam2serve.concepts.engine import ExemplarBox, preprocess
from sam2serve.concepts.roi_align import roi_align

pytestmark = pytest.mark.cuda
DEVICE = "cuda"
# The GPU against the CPU, same weights and inputs, fp32 (TF32 off).
SCORE_ATOL, BOX_ATOL_PX, MASK_MISMATCH = 1e-4, 1e-2, 1e-3


@contextlib.contextmanager
def no_tf32() -> Iterator[None]:
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """The same seeded random reduced SAM 3 on the CPU and on the GPU."""
    from sam2serve.concepts.runtime import ConceptsSpec, load_concepts

    scratch = tmp_path_factory.mktemp("sam3-stand-in")
    spec = {"random_weights": True, "size": "tiny", "seed": 1}
    cpu = load_concepts(ConceptsSpec(**spec), scratch)
    gpu = load_concepts(ConceptsSpec(**spec, device=DEVICE), scratch)
    assert gpu.device.type == "cuda"
    name, weight = next(iter(cpu.model.state_dict().items()))
    torch.testing.assert_close(gpu.model.state_dict()[name].cpu(), weight, atol=0, rtol=0)
    return cpu, gpu


def photo() -> np.ndarray:
    return np.random.default_rng(0).integers(0, 256, (200, 300, 3), dtype=np.uint8)


@pytest.mark.parametrize("with_boxes", [False, True])
def test_concepts_on_cuda_equal_the_cpu(pair, monkeypatch, with_boxes):
    """Text only (the padding exemplar box through RoIAlign) and with a positive and a
    negative box: every query (threshold 0) with the CPU's score, box and mask. The CPU
    resizes in float32 here as CUDA does (on an AVX2 or AVX-512 CPU Meta's processor uses
    the uint8 kernel, a difference of the processor, not of the device)."""
    cpu, gpu = pair
    monkeypatch.setattr(engine, "meta_resizes_uint8", lambda device: False)
    boxes = (
        [ExemplarBox((30, 40, 120, 150)), ExemplarBox((200, 20, 280, 90), positive=False)]
        if with_boxes
        else []
    )
    phrases = ["red cat", "dog"]
    with no_tf32():
        encoding = gpu.encode([photo()])[0]
        assert all(t.device.type == "cuda" for t in encoding.fpn_hidden_states)
        got = gpu.detect(encoding, phrases, boxes, score_thresh=0.0)
    expected = cpu.segment([photo()], phrases, boxes, score_thresh=0.0)[0]
    for phrase in phrases:
        ours, want = got[phrase], expected[phrase]
        assert len(ours) == len(want) == gpu.size.queries
        np.testing.assert_allclose(
            [i.score for i in ours], [i.score for i in want], atol=SCORE_ATOL
        )
        np.testing.assert_allclose(
            np.array([i.box for i in ours]), np.array([i.box for i in want]), atol=BOX_ATOL_PX
        )
        masks = np.stack([i.mask for i in ours])
        assert (masks != np.stack([i.mask for i in want])).mean() < MASK_MISMATCH


def test_preprocessing_on_cuda_is_meta_processors():
    """On CUDA Meta's processor (torchvision's Resize) resizes the uint8 image in float32
    and rounds back (CUDA has no uint8 antialiased kernel): ours, exactly; and within a
    level of the CPU's float32 resize at a few values."""
    image = photo()
    got = preprocess([image], 336, DEVICE)
    assert got.device.type == "cuda" and got.dtype == torch.float32
    chw = torch.from_numpy(image.transpose(2, 0, 1).copy())[None].to(DEVICE)
    resize = {"size": (336, 336), "mode": "bilinear", "align_corners": False, "antialias": True}
    meta = F.interpolate(chw.float(), **resize).round_().to(torch.uint8)
    expected = (meta.to(torch.float32).mul_(1.0 / 255) - 0.5) / 0.5
    assert torch.equal(got, expected)
    on_cpu = F.interpolate(chw.cpu().float(), **resize).round_().to(torch.uint8)
    levels = (meta.cpu().int() - on_cpu.int()).abs()
    assert int(levels.max()) <= 1 and float((levels > 0).float().mean()) < 1e-3


def test_roi_align_on_cuda_equals_the_cpu_without_a_host_sync():
    generator = torch.Generator().manual_seed(0)
    features = torch.randn(2, 8, 24, 24, generator=generator)
    boxes = [
        torch.tensor([[0.0, 0.0, 24.0, 24.0], [-30.0, 5.0, 60.0, 70.0]]),
        torch.tensor([[3.2, 4.1, 3.3, 9.9]]),
    ]
    expected = roi_align(features, boxes, 7)
    on_gpu = features.to(DEVICE)
    gpu_boxes = [b.to(DEVICE) for b in boxes]
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        got = roi_align(on_gpu, gpu_boxes, 7)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert got.device.type == "cuda"
    torch.testing.assert_close(got.cpu(), expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", sorted(_FLOAT_ONLY_OFF_CPU))
def test_cuda_refuses_what_the_guard_calls_cpu_only(name):
    """The first tier's DeviceGuard fails integer interpolation off the CPU: CUDA has no
    uint8 kernel for any of those operators (and runs each in float32 where it has one)."""
    op = getattr(torch.ops.aten, name.removeprefix("aten::")).vec
    dims = 1 if "1d" in name else 3 if "3d" in name else 2
    image = torch.zeros((1, 3) + (8,) * dims, device=DEVICE)
    try:
        resized = op(image, [4] * dims, False, None)
    except (RuntimeError, NotImplementedError):
        pytest.skip(f"{name} has no CUDA kernel at all in this build")
    assert resized.device.type == "cuda"
    with pytest.raises((RuntimeError, NotImplementedError), match="Byte|uint8"):
        op(image.to(torch.uint8), [4] * dims, False, None)
        torch.cuda.synchronize()
