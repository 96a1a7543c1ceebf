"""The torchvision stand-in (tests/shim) that the oracle and the benchmark's reference
worker give Meta's code: torchvision's box semantics (and the same boxes kept as
sam2serve's own NMS, an independent implementation) and SAM2Transforms' input pipeline
equal to sam2serve's preprocessing. The modules are loaded from their files."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from skimage import data

from sam2serve.bench import reference
from sam2serve.bench.reference import STANDIN_DIR, meta_config_name
from sam2serve.engine.image import preprocess
from sam2serve.engine.nms import batched_nms

TESTS = Path(__file__).resolve().parents[1]


def load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def boxes():
    return load(STANDIN_DIR / "torchvision" / "ops" / "boxes.py", "standin_boxes")


@pytest.fixture(scope="module")
def transforms():
    return load(STANDIN_DIR / "torchvision" / "transforms" / "__init__.py", "standin_transforms")


def test_the_bench_finds_the_one_stand_in_of_the_tests():
    assert STANDIN_DIR == TESTS / "shim"
    assert (STANDIN_DIR / "torchvision" / "__init__.py").is_file()


def test_iou_equal_to_the_threshold_does_not_suppress(boxes):
    pair = torch.tensor([[0.0, 0.0, 4.0, 2.0], [0.0, 0.0, 2.0, 2.0]])  # IoU 4 / 8 = 0.5
    scores = torch.tensor([0.9, 0.8])
    same = torch.zeros(2, dtype=torch.int64)
    assert boxes.batched_nms(pair, scores, same, 0.5).tolist() == [0, 1]
    assert boxes.batched_nms(pair, scores, same, 0.49).tolist() == [0]


def test_float_iou_is_compared_with_the_threshold_as_a_double(boxes):
    """torchvision's kernel: ``float ovr > double iou_threshold``. IoU 1/3 in float32 is
    0.33333334, above the double 1/3, so it suppresses."""
    pair = torch.tensor([[0.0, 0.0, 4.0, 2.0], [2.0, 0.0, 6.0, 2.0]])  # IoU 4 / 12
    scores = torch.tensor([0.9, 0.8])
    assert boxes.batched_nms(pair, scores, torch.zeros(2), 1 / 3).tolist() == [0]
    assert boxes.batched_nms(pair.double(), scores, torch.zeros(2), 1 / 3).tolist() == [0, 1]


def test_nan_iou_never_suppresses(boxes):
    degenerate = torch.tensor([[3.0, 3.0, 3.0, 3.0], [3.0, 3.0, 3.0, 3.0]])  # 0 / 0
    assert math.isnan(float(boxes.box_iou(degenerate, degenerate)[0, 1]))
    kept = boxes.batched_nms(degenerate, torch.tensor([0.2, 0.7]), torch.zeros(2), 0.5)
    assert kept.tolist() == [1, 0]


def test_categories_are_kept_apart(boxes):
    same_box = torch.tensor([[0.0, 0.0, 5.0, 5.0]] * 2)
    scores = torch.tensor([0.5, 0.6])
    assert boxes.batched_nms(same_box, scores, torch.tensor([0, 1]), 0.5).tolist() == [1, 0]
    assert boxes.batched_nms(same_box, scores, torch.tensor([1, 1]), 0.5).tolist() == [1]


def test_keeps_what_sam2serves_own_nms_keeps_on_random_boxes(boxes):
    generator = torch.Generator().manual_seed(0)
    for _ in range(20):
        n = 40
        corner = torch.randint(0, 50, (n, 2), generator=generator).float()
        size = torch.randint(0, 30, (n, 2), generator=generator).float()  # some empty
        xyxy = torch.cat([corner, corner + size], dim=1)
        scores = torch.rand(n, generator=generator)
        groups = torch.randint(0, 3, (n,), generator=generator)
        for threshold in (0.3, 0.7):
            ours = boxes.batched_nms(xyxy, scores, groups, threshold)
            theirs = batched_nms(xyxy, scores, groups, threshold)
            assert sorted(ours.tolist()) == sorted(theirs.tolist())
            assert ours.tolist() == sorted(ours.tolist(), key=lambda i: -float(scores[i]))


def test_sam2_transforms_pipeline_equals_our_preprocessing(transforms):
    """What Meta's SAM2Transforms builds from the stand-in: ToTensor, then a scripted
    Resize((1024, 1024)) + Normalize."""
    pipeline = torch.jit.script(
        torch.nn.Sequential(
            transforms.Resize((1024, 1024)),
            transforms.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225]),
        )
    )
    image = data.chelsea()
    theirs = pipeline(transforms.ToTensor()(image))
    ours = preprocess([image])[0]
    torch.testing.assert_close(theirs, ours, atol=1e-5, rtol=1e-5)
    tensor = transforms.ToTensor()(np.zeros((3, 4), dtype=np.uint8))
    assert tensor.shape == (1, 3, 4) and tensor.dtype == torch.float32


def test_checking_for_the_reference_leaves_this_process_path_alone():
    """Only the reference worker process activates the stand-in."""
    before = list(sys.path)
    assert reference.TORCHVISION_MISSING not in reference.missing_requirements()
    assert sys.path == before


def test_meta_config_names():
    assert meta_config_name("tiny") == "configs/sam2.1/sam2.1_hiera_t.yaml"
    assert meta_config_name("base_plus", Path("x/sam2.1_hiera_base_plus.pt")).endswith("b+.yaml")
    assert meta_config_name("large", Path("sam2_hiera_large.pt")) == (
        "configs/sam2/sam2_hiera_l.yaml"
    )
