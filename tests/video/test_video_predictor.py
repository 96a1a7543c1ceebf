"""The video predictor's contract without running the network: input errors name the bad
value, the feature cache is bounded, the settings are Meta's SAM 2.1 yaml values, and the
video-capable random weights leave the image path's weights unchanged."""

from __future__ import annotations

import os
from dataclasses import fields

import numpy as np
import pytest
import torch
import yaml
from oracle import META_CONFIGS
from reference import import_reference

from sam2serve.checkpoint import load_video_model, random_state_dict
from sam2serve.config import MODEL_SIZES, VideoConfig, get_config
from sam2serve.engine.video import VideoPredictor, VideoPromptError
from sam2serve.engine.video.frames import FrameError
from sam2serve.engine.video.state import FeatureCache


@pytest.fixture(scope="module")
def predictor() -> VideoPredictor:
    return VideoPredictor(load_video_model("tiny", random_weights=True, seed=1))


@pytest.fixture
def state(predictor):
    frames = [np.zeros((48, 64, 3), np.uint8) for _ in range(3)]
    return predictor.init_state(frames)


def test_frames_are_checked(predictor):
    with pytest.raises(FrameError, match="at least one frame"):
        predictor.init_state([])
    with pytest.raises(FrameError, match="frame 1 must be a uint8"):
        predictor.init_state([np.zeros((8, 8, 3), np.uint8), np.zeros((8, 8, 3), np.float32)])
    with pytest.raises(FrameError, match=r"frame 0 must have shape \(H, W, 3\)"):
        predictor.init_state([np.zeros((8, 8), np.uint8)])
    with pytest.raises(FrameError, match="frame 1 is 9x8, frame 0 is 8x8"):
        predictor.init_state([np.zeros((8, 8, 3), np.uint8), np.zeros((8, 9, 3), np.uint8)])


@pytest.mark.parametrize(
    ("call", "message"),
    [
        ({"frame_idx": 3, "points": [[1, 1]], "labels": [1]}, "frame index 3 is out of range"),
        ({"frame_idx": -1, "points": [[1, 1]], "labels": [1]}, "frame index -1 is out of range"),
        ({"frame_idx": 0, "points": [[1, 1]]}, "points and labels must be given together"),
        ({"frame_idx": 0}, "give points"),
        ({"frame_idx": 0, "points": [1, 1], "labels": [1]}, r"points must have shape \(P, 2\)"),
        ({"frame_idx": 0, "points": [[1, 1]], "labels": [1, 0]}, r"labels must have shape \(1,\)"),
        (
            {"frame_idx": 0, "points": [[1, 1]], "labels": [2]},
            r"labels\[0\]: a label is 1 \(foreground\) or 0",
        ),
        ({"frame_idx": 0, "box": [1, 2, 3]}, r"box must be \[x0, y0, x1, y1\], got shape \(3,\)"),
        (
            {"frame_idx": 0, "box": [1, 2, 3, 4], "clear_old_points": False},
            "a box must come before",
        ),
    ],
)
def test_bad_prompts_are_refused_before_any_work(predictor, state, call, message):
    with pytest.raises(VideoPromptError, match=message):
        predictor.add_points(state, obj_id=1, **call)
    assert state.objects == {} or all(not t.point_inputs for t in state.objects.values())
    assert len(state.features) == 0


def test_bad_object_ids_and_masks(predictor, state):
    with pytest.raises(VideoPromptError, match="object id must be an integer, got 'a'"):
        predictor.add_points(state, 0, "a", points=[[1, 1]], labels=[1])
    with pytest.raises(VideoPromptError, match=r"mask must be 2-D \(H, W\)"):
        predictor.add_mask(state, 0, 1, np.zeros((1, 4, 4), bool))
    with pytest.raises(VideoPromptError, match="no object with id 7"):
        predictor.remove_object(state, 7, strict=True)
    assert predictor.remove_object(state, 7) == ([], [])


def test_propagate_needs_a_prompt(predictor, state):
    with pytest.raises(VideoPromptError, match="no object has a prompt yet"):
        next(predictor.propagate(state))


def test_feature_cache_is_a_bounded_lru():
    cache = FeatureCache(2)
    a, b, c = object(), object(), object()
    cache.put(0, a)
    cache.put(1, b)
    assert cache.get(0) is a  # 0 is now the most recent
    cache.put(2, c)
    assert len(cache) == 2 and cache.get(1) is None
    assert cache.get(0) is a and cache.get(2) is c
    with pytest.raises(ValueError, match="at least 1"):
        FeatureCache(0)


def test_video_random_weights_keep_the_image_weights():
    cfg = get_config("tiny")
    image = random_state_dict(cfg, 5)
    video = random_state_dict(cfg, 5, video=True)
    assert set(image) < set(video)
    for key, value in image.items():
        assert torch.equal(video[key], value), key


def _meta_yaml(size: str) -> dict:
    import_reference()
    import sam2

    path = os.path.join(
        os.path.dirname(sam2.__file__),
        "configs",
        "sam2.1",
        f"sam2.1_hiera_{META_CONFIGS[size]}.yaml",
    )
    with open(path) as f:
        return yaml.safe_load(f)["model"]


@pytest.mark.parametrize("size", MODEL_SIZES)
def test_video_config_is_metas_yaml(size):
    """Every VideoConfig field Meta's yaml sets has the yaml's value (all four sizes);
    the memory modules' shapes come from the yaml's nested settings."""
    model = _meta_yaml(size)
    video = get_config(size).video
    checked = 0
    for f in fields(VideoConfig):
        if f.name in model:
            assert getattr(video, f.name) == model[f.name], f.name
            checked += 1
    assert checked >= 18
    assert video.mem_dim == model["memory_encoder"]["out_dim"]
    assert video.memory_attention_layers == model["memory_attention"]["num_layers"]
    layer = model["memory_attention"]["layer"]
    assert video.memory_attention_ffn_dim == layer["dim_feedforward"]
    assert video.rope_theta == layer["self_attention"]["rope_theta"]
    # Set by Meta's build_sam2_video_predictor on top of the yaml.
    assert video.binarize_mask_from_pts_for_mem_enc is True
