"""The VideoModel protocol (engine/video/model.py) names what the tracker reads from its
model, and both models implement it by name and by signature: SAM 2's own (eager) and the
ONNX video graphs' (onnxruntime). That each tracks through the engine's state is checked
with a real export in tests/runtime/test_onnx_video.py."""

from __future__ import annotations

import inspect

import pytest
import torch

from sam2serve.checkpoint import load_video_model
from sam2serve.engine.video.model import (
    VIDEO_MODEL_ATTRIBUTES,
    VIDEO_MODEL_METHODS,
    VideoModel,
)
from sam2serve.engine.video.predictor import VideoPredictor
from sam2serve.engine.video.state import object_frame_bytes


@pytest.fixture(scope="module")
def eager():
    return load_video_model("tiny", random_weights=True, seed=0)


@pytest.fixture(scope="module")
def ort():
    pytest.importorskip("onnxruntime")
    from sam2serve.runtime.ort_video import OrtVideoModel

    manifest = {"model": "tiny", "weights": {"source": "random", "seed": 0}}
    sessions = dict.fromkeys(
        ("frame_encoder.onnx", "memory_attention.onnx", "video_decoder.onnx", "memory_encoder.onnx")
    )
    return OrtVideoModel(manifest, sessions, torch.device("cpu"))


def test_the_protocol_names_every_member_it_declares():
    declared = {
        name
        for name in (*VideoModel.__annotations__, *vars(VideoModel))
        if not name.startswith("_")
    }
    assert declared == {*VIDEO_MODEL_ATTRIBUTES, *VIDEO_MODEL_METHODS, "device"}


@pytest.mark.parametrize("which", ["eager", "ort"])
def test_each_model_is_a_video_model_by_name_and_signature(request, which):
    model = request.getfixturevalue(which)
    assert isinstance(model, VideoModel)
    assert isinstance(model.device, torch.device)
    assert isinstance(model.image_size, int) and isinstance(model.per_object_banks, bool)
    for name in VIDEO_MODEL_METHODS:
        wanted = list(inspect.signature(getattr(VideoModel, name)).parameters)[1:]
        got = list(inspect.signature(getattr(model, name)).parameters)
        assert got == wanted, (which, name)


def test_a_model_without_a_member_is_not_one(eager):
    class Partial:
        config = eager.config
        video_config = eager.video_config
        image_size = eager.image_size
        weights_info = eager.weights_info
        per_object_banks = True
        device = torch.device("cpu")

    assert not isinstance(Partial(), VideoModel)


def test_the_engine_reads_the_same_from_both(eager, ort):
    """The predictor's settings and the state's memory count come from protocol members
    only, and agree between the two models of one size."""
    assert object_frame_bytes(ort) == object_frame_bytes(eager)
    assert object_frame_bytes(eager) == 64 * 64 * 64 * 2 + 256 * 256 * 4 + 256 * 4 + 4
    a, b = VideoPredictor(eager), VideoPredictor(ort)
    assert a.config == b.config and a.memory_dtype == b.memory_dtype == torch.bfloat16
