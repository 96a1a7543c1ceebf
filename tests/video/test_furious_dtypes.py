"""Furious tracking converts a handful of tensors per frame, never a weight: the reduced
precision runs on reduced weights with its inputs converted once (a GPU pays for every
conversion as a kernel and a pass over memory; autocast under inference mode converted
every weight and the whole memory bank again on every frame: 90 large conversions per
tracked frame on this small tracker before, 11 after). Counted on the CPU by a dispatch
mode that sees every conversion between float32 and bfloat16; the masks still agree with
the fp32 tracker's."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from small_tracker import small_tiny_tracker
from torch.utils._python_dispatch import TorchDispatchMode

from sam2serve.runtime.spec import RuntimeSpec
from sam2serve.runtime.video import video_predictor_for
from sam2serve.samples import sample_clip

NUM_FRAMES = 9  # past num_maskmem (7): the bank fills and slides
# Conversions fp32 <-> bf16 of tensors this large or larger are counted (smaller ones are
# scalars and tiny per-slot vectors).
LARGE = 4096
# Per tracked frame with 2 objects: the frame into the encoder and its 3 levels out, the
# memory bank's positions, pointer tokens and positions, the frame's features and their
# encoding into the attention, its output out, the new memory to its stored bf16, the neck,
# and the frame's features and the masks into the bf16 memory encoder.
MAX_CASTS_PER_FRAME = 14
# Furious answers within what bf16 gives: per object and frame, the mask's IoU with the
# fp32 tracker's.
MIN_IOU = 0.9
FP32_BF16 = {torch.float32, torch.bfloat16}


class Conversions(TorchDispatchMode):
    """Counts the conversions between float32 and bfloat16 of large tensors, and those of
    ``weights`` (tensors identified by their storage)."""

    def __init__(self, weights: set[int]) -> None:
        super().__init__()
        self.weights = weights
        self.large = 0
        self.of_weights = 0
        self.shapes: Counter = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func.overloadpacket in (torch.ops.aten._to_copy, torch.ops.aten.to):
            src = args[0]
            if (
                isinstance(src, torch.Tensor)
                and isinstance(out, torch.Tensor)
                and src.dtype != out.dtype
                and {src.dtype, out.dtype} <= FP32_BF16
            ):
                if src.data_ptr() in self.weights:
                    self.of_weights += 1
                if src.numel() >= LARGE:
                    self.large += 1
                    self.shapes[(src.dtype, out.dtype, tuple(src.shape))] += 1
        return out


def track(predictor, frames, counting: bool):
    state = predictor.init_state(frames)
    predictor.add_points(state, 0, 1, [[20.0, 20.0]], [1])
    predictor.add_points(state, 0, 2, [[60.0, 40.0]], [1])
    weights = {p.data_ptr() for p in predictor.model.parameters()}
    masks, counts = [], []
    frames_iter = predictor.propagate(state)
    for _ in range(NUM_FRAMES):
        if counting:
            with Conversions(weights) as seen:
                out = next(frames_iter)
            counts.append(seen)
        else:
            out = next(frames_iter)
        masks.append(out.masks)
    return torch.stack(masks), counts


@pytest.fixture(scope="module")
def frames():
    clip, _ = sample_clip(NUM_FRAMES, (64, 80))
    return list(clip)


def test_furious_converts_no_weight_and_a_few_tensors_per_frame(frames):
    furious = video_predictor_for(
        small_tiny_tracker(seed=5), RuntimeSpec(mode="furious", dtype="bfloat16")
    )
    assert furious.memory_attention_dtype == torch.bfloat16
    # Both objects in one frame step, as on a GPU, whose conversions this counts (a CPU's
    # default steps one object at a time and converts the frame's features per object).
    furious.objects_per_call = 2
    masks, counts = track(furious, frames, counting=True)
    # Frame 0 is the prompted one; frame 1 makes the attention's bf16 weights, once.
    tracked = counts[2:]
    assert all(seen.of_weights == 0 for seen in tracked), [s.of_weights for s in tracked]
    assert max(seen.large for seen in tracked) <= MAX_CASTS_PER_FRAME, tracked[-1].shapes
    assert min(seen.large for seen in tracked) > 0  # the counter sees conversions

    baseline = video_predictor_for(small_tiny_tracker(seed=5), RuntimeSpec(mode="baseline"))
    reference, _ = track(baseline, frames, counting=False)
    inter = (masks & reference).flatten(2).sum(-1).float()
    union = (masks | reference).flatten(2).sum(-1).float()
    assert union.min() > 0  # both track something on every frame
    iou = inter / union
    assert iou.min() >= MIN_IOU, iou


def test_the_counter_sees_what_autocast_converts():
    """Autocast under inference mode: every weight, every call (the cost removed above)."""
    layer = torch.nn.Linear(128, 128)
    weights = {p.data_ptr() for p in layer.parameters()}
    autocast = torch.autocast("cpu", dtype=torch.bfloat16)
    with torch.inference_mode(), Conversions(weights) as seen, autocast:
        for _ in range(3):
            layer(torch.randn(64, 128))
    assert seen.of_weights == 6  # weight and bias, 3 calls
    assert seen.large == 6  # the weight and the input, 3 calls
