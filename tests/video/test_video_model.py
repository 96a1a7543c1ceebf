"""The VideoModel protocol (engine/video/model.py) names what the tracker reads from its
model, and both models implement it by name and by signature: SAM 2's own (eager) and the
ONNX video graphs' (onnxruntime). That each tracks through the engine's state is checked
with a real export in tests/runtime/test_onnx_video.py."""

from __future__ import annotations

import copy
import inspect

import numpy as np
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
from sam2serve.modeling.prompt_encoder import points_or_padding


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


def test_both_models_give_a_frame_without_points_one_padding_point(eager, ort):
    """A tracked frame has no clicks: each model's heads see one padding point (0, 0),
    label -1, per object (modeling.prompt_encoder.points_or_padding), exactly as if that
    point were passed."""
    objects = 2
    generator = torch.Generator().manual_seed(0)
    pix_feat = torch.randn(objects, 256, 64, 64, generator=generator)
    high_res = (
        torch.randn(objects, 32, 256, 256, generator=generator),
        torch.randn(objects, 64, 128, 128, generator=generator),
    )
    coords, labels = points_or_padding(None, None, objects, torch.device("cpu"))
    assert coords.tolist() == [[[0.0, 0.0]]] * objects and labels.tolist() == [[-1]] * objects
    with torch.inference_mode():
        padded = eager.forward_heads(pix_feat, high_res, None, None, None, False)
        given = eager.forward_heads(pix_feat, high_res, coords, labels, None, False)
    torch.testing.assert_close(padded.low_res_masks, given.low_res_masks, rtol=0, atol=0)

    fed: dict[str, np.ndarray] = {}

    class Decoder:  # video_decoder.onnx's session: records what the model feeds it
        def run(self, names: None, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
            fed.update(feeds)
            low_res = np.zeros((objects, 1, 256, 256), np.float32)
            return [low_res, low_res, np.zeros((objects, 256), np.float32), low_res[:, :, 0, :1]]

    onnx = copy.copy(ort)
    onnx.decoder = Decoder()
    onnx.forward_heads(pix_feat, high_res, None, None, None, False)
    assert fed["point_coords"].tolist() == coords.tolist()
    assert fed["point_labels"].tolist() == labels.float().tolist()
