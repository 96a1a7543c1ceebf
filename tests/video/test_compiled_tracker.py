"""The compiled tracker (backend compile, :mod:`sam2serve.engine.video.compiled`): memory
banks padded to one shape with the padding masked give the eager tracker's logits, and
compiled with torch.compile it tracks as eager does and stops compiling after the first
frames: no frame after the warm-up adds a graph, while the bank fills, then slides
(second tier: the compilation takes minutes on a 2-core CPU; measured 4.8e-7 apart and 5
graphs from the second tracked frame on, CPU, 2 cores, Intel Xeon AVX-512 + VNNI, loaded
by other helpers)."""

from __future__ import annotations

import pytest
import torch
from small_tracker import small_tiny_tracker
from torch._dynamo.utils import counters

from sam2serve.engine.video import VideoPredictor
from sam2serve.engine.video.compiled import compile_mode_for, compile_tracker
from sam2serve.samples import sample_clip

LOGIT_ATOL = 1e-4
NUM_FRAMES = 12  # num_maskmem is 7: the bank fills by frame 7, then slides
WARMUP = 8


@pytest.fixture(scope="module")
def frames():
    clip, _ = sample_clip(NUM_FRAMES, (64, 80))
    return list(clip)


def track(predictor, frames):
    """Two objects clicked on frame 0 (a third on frame 2: its bank is a frame behind);
    every frame's logits and the graphs Dynamo had made after it."""
    state = predictor.init_state(frames)
    predictor.add_points(state, 0, 1, [[20.0, 20.0]], [1])
    predictor.add_points(state, 0, 2, [[60.0, 40.0]], [1])
    logits, graphs = [], []
    for frame in predictor.propagate(state):
        logits.append(frame.mask_logits)
        graphs.append(counters["stats"]["unique_graphs"])
    return torch.stack(logits), graphs


@pytest.fixture(scope="module")
def eager(frames):
    logits, _ = track(VideoPredictor(small_tiny_tracker(seed=5)), frames)
    return logits


# The bank padded to exactly its full size (the compiled tracker's shapes): the second
# tier, beside the compiled tracker that runs it; the first tier pads far beyond the bank
# on every frame (the next test), the same masking on every frame.
@pytest.mark.extended
def test_a_static_bank_is_the_eager_answer(frames, eager):
    config = small_tiny_tracker(seed=5).video_config
    padded = VideoPredictor(
        small_tiny_tracker(seed=5),
        static_bank=(config.num_maskmem, config.max_obj_ptrs_in_encoder),
        objects_per_call=2,  # both objects in one padded batch, as on a GPU
    )
    logits, _ = track(padded, frames)
    assert (eager > 0).any() and (eager < 0).any()  # real masks, not all absent
    torch.testing.assert_close(logits, eager, atol=LOGIT_ATOL, rtol=0)


def test_a_bank_shorter_than_its_padding_still_masks_the_padding(frames, eager):
    """Padded far beyond what the bank ever holds: still the eager answer (the padding is
    masked, not merely small)."""
    padded = VideoPredictor(small_tiny_tracker(seed=5), static_bank=(12, 40), objects_per_call=2)
    logits, _ = track(padded, frames)
    assert (eager > 0).any() and (eager < 0).any()  # real masks, not all absent
    torch.testing.assert_close(logits, eager, atol=LOGIT_ATOL, rtol=0)


def test_the_compile_mode_follows_the_device():
    assert compile_mode_for(torch.device("cpu")) is None
    assert compile_mode_for(torch.device("cuda")) == "max-autotune"


@pytest.mark.extended  # Inductor builds its C++ kernels: 12 minutes on the loaded 2-core host
def test_the_compiled_tracker_tracks_as_eager_and_stops_compiling(frames, eager):
    torch._dynamo.reset()
    predictor = compile_tracker(VideoPredictor(small_tiny_tracker(seed=5)))
    assert predictor.static_bank == (7, 16)
    logits, graphs = track(predictor, frames)
    torch.testing.assert_close(logits, eager, atol=LOGIT_ATOL, rtol=0)
    assert graphs[-1] > 0  # it compiled
    assert graphs[WARMUP:] == [graphs[WARMUP - 1]] * (NUM_FRAMES - WARMUP), graphs


CHILD = """
import json, sys
from pathlib import Path
from small_tracker import small_tiny_tracker
from sam2serve.engine.video import VideoPredictor
from sam2serve.runtime.spec import RuntimeSpec
from sam2serve.runtime.video import compile_cached_tracker

spec = RuntimeSpec(mode="fast", backend="compile", dtype="float32")
report = compile_cached_tracker(VideoPredictor(small_tiny_tracker(seed=5)), spec, Path(sys.argv[1]))
print(json.dumps(report.as_dict()))
"""


@pytest.mark.extended  # two processes, the first compiles (minutes on 2 cores)
def test_a_second_process_loads_the_tracker_compilation(tmp_path):
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    tests = Path(__file__).parents[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tests.parent), str(tests)])}

    def child() -> dict:
        done = subprocess.run(
            [sys.executable, "-c", CHILD, str(tmp_path)],
            capture_output=True,
            text=True,
            env=env,
            timeout=1800,
            check=True,
        )
        return json.loads(done.stdout.strip().splitlines()[-1])

    first = child()
    assert first["written"] and not first["loaded"] and first["kernels_built"] > 0, first
    second = child()
    assert second["loaded"], second
    assert second["fx_graph_misses"] == 0 and second["kernels_built"] == 0, second
