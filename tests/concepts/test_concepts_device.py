"""SAM 3 on any device, checked without a GPU (issue 37 item 3): the whole concept path
(text, images, the detector with and without exemplar boxes, the post-processing) runs with
the model on the ``meta`` device under :class:`DeviceGuard`, which fails on a stray CPU
tensor or a CPU-only kernel; RoIAlign makes no host read; the resize is Meta's on each
device."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from device_guard import DeviceError, DeviceGuard

from sam2serve.concepts import engine
from sam2serve.concepts.engine import (
    ExemplarBox,
    detect,
    encode_images,
    encode_text,
    preprocess,
    segment_concepts,
)
from sam2serve.concepts.model import Sam3Size, build_model
from sam2serve.concepts.roi_align import roi_align
from sam2serve.runtime.sync_guard import SyncGuard

# Token ids are host data by design (Python lists from the tokenizer), uploaded by
# encode_text.
HOST = ["sam2serve.concepts.engine.token_batch"]
SIZE = Sam3Size.tiny()


def tokenize(phrase: str) -> list[int]:
    return [49406, *(ord(c) % 49000 for c in phrase), 49407]


@pytest.fixture(scope="module")
def on_meta():
    """The reduced model with its weights on the meta device (shapes only: no values)."""
    return build_model(SIZE).to("meta")


def images() -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [rng.integers(0, 256, shape, dtype=np.uint8) for shape in ((60, 90, 3), (50, 40, 3))]


# -- the guard's rules, each seen -------------------------------------------------------------


def test_the_guard_names_each_cpu_only_operation():
    on_device = torch.zeros(4, 5, device="meta")
    cases = [
        (lambda: on_device + torch.tensor([1.0] * 5), "mixes devices"),
        (lambda: on_device[:, torch.tensor([0, 2])], "mixes devices"),
        (lambda: torch.arange(5), "makes a tensor on the host"),
        (lambda: torch.zeros(2, 3), "makes a tensor on the host"),
        (lambda: torch.linspace(0, 1, 5), "makes a tensor on the host"),
        (
            lambda: F.interpolate(
                torch.zeros(1, 3, 8, 8, dtype=torch.uint8, device="meta"),
                size=(4, 4),
                mode="bilinear",
                antialias=True,
            ),
            "no kernel for that dtype off the CPU",
        ),
    ]
    for make, message in cases:
        with pytest.raises(DeviceError, match=message), DeviceGuard("meta"):
            make()


def test_the_guard_passes_device_work_uploads_scalars_and_hand_outs():
    with DeviceGuard("meta") as guard, torch.inference_mode():
        x = torch.arange(6, device="meta").float().view(2, 3)
        y = x + torch.tensor(1.0)  # a 0-dim CPU tensor is a scalar to every device
        y = y * torch.tensor([[1.0, 2.0, 3.0]]).to("meta", non_blocking=True)
        y = torch.where(y > 0, y, -1.0)
        z = F.interpolate(y[None, None], size=(4, 6), mode="bilinear", antialias=True)
        kept = y[y > 0]  # nonzero on meta: every element assumed set
        shapes = torch.tensor([[3, 4]], device="meta")
        assert int(shapes[0, 1]) == 4  # host values beside small meta tensors are followed
        host = z.cpu().numpy()
    assert guard.errors == [] and host.shape == (1, 1, 4, 6) and kept.shape == (6,)


def test_host_patterns_allow_host_data_but_never_its_use_on_the_device():
    def token_like():
        return torch.zeros(2, 3, dtype=torch.long)

    with DeviceGuard("meta", host=[f"{__name__}.*token_like"]):
        ids = token_like().to("meta")
    assert ids.device.type == "meta"
    with pytest.raises(DeviceError, match="mixes devices"), DeviceGuard("meta", host=["*"]):
        torch.ones(2, 3, device="meta") * token_like()


# -- the concept path on the model's device ----------------------------------------------------


def test_the_whole_concept_path_keeps_to_the_models_device(on_meta):
    """Text, two images of other sizes in one batch, the detector text-only (its padding
    exemplar box goes through RoIAlign), with a positive and a negative box, boxes only,
    with a bound on instances, and the post-processing: no CPU tensor meets the device and
    no CPU-only kernel runs. RoIAlign and the resize are among the operators seen."""
    boxes = [ExemplarBox((5, 6, 40, 30)), ExemplarBox((50, 10, 80, 55), positive=False)]
    with DeviceGuard("meta", host=HOST) as guard:
        text = encode_text(on_meta, tokenize, ["red cat", "dog"])
        encodings = encode_images(on_meta, images())
        text_only = detect(on_meta, tokenize, encodings[0], ["red cat", "dog"], (), 0.0, text)
        with_boxes = detect(on_meta, tokenize, encodings[1], ["red cat"], boxes, 0.0)
        boxes_only = detect(on_meta, tokenize, encodings[0], [], boxes[:1], 0.1, max_instances=3)
        whole = segment_concepts(on_meta, tokenize, images(), ["cat"], boxes, 0.0)
    assert guard.errors == []
    assert {"aten::_upsample_bilinear2d_aa", "aten::scatter_add_"} <= guard.ops
    # Hand-outs with the stand-ins' shapes: every query kept (nonzero assumes all set).
    assert [len(v) for v in text_only.values()] == [SIZE.queries, SIZE.queries]
    assert text_only["dog"][0].mask.shape == (60, 90)
    assert len(with_boxes["red cat"]) == SIZE.queries
    assert with_boxes["red cat"][0].mask.shape == (50, 40)
    assert len(boxes_only["visual"]) >= 1
    assert [sorted(r) for r in whole] == [["cat"], ["cat"]]


def test_the_guard_fails_a_host_grid_roi_align(on_meta, monkeypatch):
    """Not vacuous: RoIAlign with sample grids made on the host (main's before this fix:
    torch.arange without device=) fails the text-only request, named."""
    from transformers.models.sam3 import modeling_sam3

    def host_grid_roi_align(features, boxes, output_size):
        bins = torch.arange(output_size, dtype=torch.float32)
        return features[:1, :, : len(bins), : len(bins)].expand(len(boxes), -1, -1, -1)

    monkeypatch.setattr(modeling_sam3.torchvision.ops, "roi_align", host_grid_roi_align)
    encoding = encode_images(on_meta, images()[:1])[0]
    message = "arange makes a tensor on the host.*host_grid_roi_align.*via .*run_detector"
    with pytest.raises(DeviceError, match=message), DeviceGuard("meta", host=HOST):
        detect(on_meta, tokenize, encoding, ["cat"], score_thresh=0.0)


def test_the_guard_fails_a_uint8_antialiased_resize_off_the_cpu(monkeypatch):
    """Not vacuous: resizing the uint8 image with the uint8 kernel on the device (main's
    preprocessing, a kernel only the CPU has) is caught on meta, where it would run."""
    monkeypatch.setattr(engine, "meta_resizes_uint8", lambda device: True)
    message = "_upsample_bilinear2d_aa of a torch.uint8 .*at sam2serve.concepts.engine._resize"
    with pytest.raises(DeviceError, match=message), DeviceGuard("meta"):
        preprocess(images()[:1], 32, "meta")


# -- RoIAlign: no host reads, any box ----------------------------------------------------------


def test_roi_align_asks_for_no_host_value():
    """The sample counts depend on each box's size, on the device: nothing is read back."""
    features = torch.randn(2, 3, 9, 11, generator=torch.Generator().manual_seed(0))
    boxes = [torch.tensor([[0.5, 1.0, 7.3, 8.9], [-20.0, -1.0, 30.0, 40.0]]), torch.zeros(0, 4)]
    with SyncGuard(device="cpu"), torch.inference_mode():
        pooled = roi_align(features, boxes, 7)
    assert pooled.shape == (2, 3, 7, 7)


def test_roi_align_matches_a_per_sample_loop_for_hostile_boxes():
    """Boxes far outside the map, many times its size, thinner than a pixel, reversed:
    torchvision's per-sample rule (written here as a plain loop) gives the same bins."""

    def bilinear(feature, y, x):
        height, width = feature.shape[-2:]
        if y < -1.0 or y > height or x < -1.0 or x > width:
            return torch.zeros(feature.shape[0], dtype=feature.dtype)
        y, x = max(y, 0.0), max(x, 0.0)
        y0, x0 = int(y), int(x)
        if y0 >= height - 1:
            y0 = y1 = height - 1
            y = float(y0)
        else:
            y1 = y0 + 1
        if x0 >= width - 1:
            x0 = x1 = width - 1
            x = float(x0)
        else:
            x1 = x0 + 1
        ly, lx = y - y0, x - x0
        top = (1 - lx) * feature[:, y0, x0] + lx * feature[:, y0, x1]
        bottom = (1 - lx) * feature[:, y1, x0] + lx * feature[:, y1, x1]
        return (1 - ly) * top + ly * bottom

    def reference(feature, box, size):
        x1, y1, x2, y2 = box
        roi_w, roi_h = max(x2 - x1, 1.0), max(y2 - y1, 1.0)
        grid_h, grid_w = int(np.ceil(roi_h / size)), int(np.ceil(roi_w / size))
        out = torch.zeros(feature.shape[0], size, size, dtype=torch.float64)
        for by in range(size):
            for bx in range(size):
                for iy in range(grid_h):
                    y = y1 + by * roi_h / size + (iy + 0.5) * roi_h / size / grid_h
                    for ix in range(grid_w):
                        x = x1 + bx * roi_w / size + (ix + 0.5) * roi_w / size / grid_w
                        out[:, by, bx] += bilinear(feature, y, x)
        return out / (grid_h * grid_w)

    feature = torch.randn(1, 2, 6, 8, generator=torch.Generator().manual_seed(1))
    hostile = [
        [-30.0, -25.0, -12.0, -3.0],
        [-40.0, -30.0, 60.0, 45.0],
        [2.3, 1.1, 2.4, 1.15],
        [5.0, 4.0, 1.0, 2.0],
        [7.5, 5.5, 30.0, 31.0],
        [0.0, 0.0, 8.0, 6.0],
    ]
    got = roi_align(feature, [torch.tensor(hostile)], 3)
    for row, box in enumerate(hostile):
        want = reference(feature[0].double(), box, 3).float()
        torch.testing.assert_close(got[row], want, atol=1e-5, rtol=1e-5)


# -- the resize, per device --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("capability", "native"), [("AVX2", True), ("AVX512", True), ("DEFAULT", False)]
)
def test_the_resize_is_meta_processors_on_each_cpu(monkeypatch, capability, native):
    """torchvision's Resize uses torch's uint8 kernel on an x86 CPU whose capability reads
    AVX2 or AVX512 and resizes in float32, rounded back, elsewhere (no AVX2, CUDA); then
    x * (1/255), (x - 0.5) / 0.5. The two kernels differ, so the rule is seen (checked
    against the real torchvision by tests/concepts/test_concepts_meta_stack.py)."""
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: capability)
    monkeypatch.setattr(engine.platform, "machine", lambda: "x86_64")
    image = images()[0]
    chw = torch.from_numpy(image.transpose(2, 0, 1).copy())[None]
    resize = {"size": (48, 48), "mode": "bilinear", "align_corners": False, "antialias": True}
    uint8_kernel = F.interpolate(chw, **resize)
    float_kernel = F.interpolate(chw.float(), **resize).round_().to(torch.uint8)
    assert not torch.equal(uint8_kernel, float_kernel)
    expected = uint8_kernel if native else float_kernel
    expected = (expected.to(torch.float32).mul_(1.0 / 255) - 0.5) / 0.5
    assert engine.meta_resizes_uint8("cpu") is native
    assert engine.meta_resizes_uint8("cuda") is False
    assert torch.equal(preprocess([image], 48), expected)
