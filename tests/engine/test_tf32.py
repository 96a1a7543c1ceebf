"""engine.tf32: an exact predictor keeps CUDA's TF32 switches off for its calls, whatever
the process set, and puts back what it found; overlapping calls in several threads never
restore the switches under each other; a predictor that allows TF32 leaves them alone.
The switches are process flags, set and read on a CPU-only build too."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from sam2serve.engine.predictor import Predictor
from sam2serve.engine.tf32 import exact_float32
from sam2serve.engine.video.predictor import VideoPredictor
from sam2serve.modeling.sam2 import ImageFeatures


def switches() -> tuple[bool, bool]:
    return torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32


def set_switches(matmul: bool, cudnn: bool) -> None:
    torch.backends.cuda.matmul.allow_tf32 = matmul
    torch.backends.cudnn.allow_tf32 = cudnn


@pytest.fixture(autouse=True)
def process_switches():
    saved = switches()
    yield
    set_switches(*saved)


@pytest.mark.parametrize("found", [(True, True), (True, False), (False, True)])
def test_an_exact_block_turns_tf32_off_and_puts_back_what_it_found(found):
    set_switches(*found)
    with exact_float32():
        assert switches() == (False, False)
        with exact_float32():  # a call inside a call
            assert switches() == (False, False)
        assert switches() == (False, False)
    assert switches() == found


def test_overlapping_exact_calls_in_two_threads_restore_only_at_the_last():
    set_switches(True, True)
    first_in, second_in, first_out = threading.Event(), threading.Event(), threading.Event()
    seen: list[tuple[bool, bool]] = []

    def first() -> None:
        with exact_float32():
            first_in.set()
            assert second_in.wait(10)
        first_out.set()

    def second() -> None:
        assert first_in.wait(10)
        with exact_float32():
            second_in.set()
            assert first_out.wait(10)
            seen.append(switches())  # the first has ended: still off for this one

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert seen == [(False, False)] and switches() == (True, True)


def test_an_exception_still_restores():
    set_switches(True, True)
    with pytest.raises(RuntimeError), exact_float32():
        raise RuntimeError("a failed call")
    assert switches() == (True, True)


def spy_predictor(model, allow_tf32: bool, seen: list) -> Predictor:
    """A Predictor whose image path and prompt decoder note the switches they run under."""

    def image_encoder(batch: torch.Tensor) -> ImageFeatures:
        seen.append(("encode", switches()))
        n = batch.shape[0]
        return ImageFeatures(
            torch.zeros(n, 256, 64, 64),
            (torch.zeros(n, 32, 256, 256), torch.zeros(n, 64, 128, 128)),
        )

    def prompt_decoder(image_embed, high_res_feats, coords, labels, mask_input):
        seen.append(("decode", switches()))
        return torch.zeros(coords.shape[0], 4, 256, 256), torch.zeros(coords.shape[0], 4)

    return Predictor(
        model, image_encoder=image_encoder, prompt_decoder=prompt_decoder, allow_tf32=allow_tf32
    )


@pytest.mark.parametrize("allow_tf32", [False, True])
def test_a_predictor_runs_its_calls_under_its_own_policy(tiny_model, allow_tf32):
    """A process that allows TF32 (a furious entry point's): the exact predictor still
    computes without it; one that allows TF32 computes as the process says."""
    seen: list = []
    predictor = spy_predictor(tiny_model, allow_tf32, seen)
    set_switches(True, True)
    embedding = predictor.encode(np.zeros((20, 30, 3), np.uint8))
    predictor.predict(embedding, point_coords=[[5, 5]], point_labels=[1])
    expected = (True, True) if allow_tf32 else (False, False)
    assert seen == [("encode", expected), ("decode", expected)]
    assert switches() == (True, True)


def test_a_video_predictor_does_too():
    """Its image path (the frames' features) runs under its policy (a stub model: the
    predictor only asks it for features here)."""
    seen: list = []

    def encode_frames(images: torch.Tensor, autocast_dtype) -> str:
        seen.append(switches())
        return "features"

    model = SimpleNamespace(
        video_config=SimpleNamespace(memory_dtype_name="float32"),
        device=torch.device("cpu"),
        image_size=16,
        encode_frames=encode_frames,
    )
    set_switches(True, True)
    for allow_tf32 in (False, True):
        predictor = VideoPredictor(model, allow_tf32=allow_tf32)
        state = predictor.init_state([np.zeros((8, 8, 3), np.uint8)])
        assert predictor.frame_features(state, 0) == "features"
    assert seen == [(False, False), (True, True)] and switches() == (True, True)
