"""Process-wide settings belong to the entry point (runtime.process), not to a constructor:
building a predictor changes no thread count or TF32 switch, and two predictors of
different modes in one process answer as each does alone, the first unchanged by the
second (its runtime, dtype, threads and outputs)."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from skimage import data

from sam2serve.runtime.build import build_predictor
from sam2serve.runtime.process import configure_process
from sam2serve.runtime.spec import RuntimeSpec, WeightsSource

WEIGHTS = WeightsSource(random_weights=True, seed=3)
# A click, and a box with a background click: the fast decoder and the padding both run.
POINTS = np.array([[[150.0, 120.0], [0.0, 0.0]], [[200.0, 60.0], [300.0, 200.0]]])
LABELS = np.array([[1, -1], [2, 3]])


def spec(mode: str, threads: int = 1) -> RuntimeSpec:
    return RuntimeSpec("tiny", mode, threads=threads)


def answers(predictor) -> str:
    """A digest of everything the predictor answers for one image: its embedding, low-res
    logits and IoU (bit for bit)."""
    image = data.chelsea()[::2, ::2]  # 150 x 226
    embedding = predictor.encode(image)
    low_res, iou = predictor.predict_low_res(embedding, POINTS, LABELS)
    digest = hashlib.sha256()
    for tensor in (embedding.image_embed, *embedding.high_res_feats, low_res, iou):
        digest.update(tensor.float().contiguous().cpu().numpy().tobytes())
    return digest.hexdigest()


def answers_alone(mode: str) -> str:
    """``answers`` of a predictor built alone, in a process of its own (its entry point
    sets the same threads as the test's process)."""
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); import test_process as t; "
        "from sam2serve.runtime.process import configure_process; "
        "from sam2serve.runtime.build import build_predictor; "
        "configure_process(t.spec(sys.argv[2])); "
        "print(t.answers(build_predictor(t.spec(sys.argv[2]), t.WEIGHTS)))"
    )
    here = str(Path(__file__).resolve().parent)
    done = subprocess.run(
        [sys.executable, "-c", code, here, mode], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().splitlines()[-1]


@pytest.fixture
def process_settings():
    """The test process's threads and TF32 switches, put back after the test."""
    saved = (
        torch.get_num_threads(),
        torch.backends.cuda.matmul.allow_tf32,
        torch.backends.cudnn.allow_tf32,
    )
    yield
    threads, matmul, cudnn = saved
    torch.set_num_threads(threads)
    torch.backends.cuda.matmul.allow_tf32 = matmul
    torch.backends.cudnn.allow_tf32 = cudnn


def switches() -> tuple[int, bool, bool]:
    return (
        torch.get_num_threads(),
        torch.backends.cuda.matmul.allow_tf32,
        torch.backends.cudnn.allow_tf32,
    )


def test_the_entry_point_sets_threads_and_tf32_as_the_mode_allows(process_settings):
    assert configure_process(spec("fast", threads=1)) == 1 and torch.get_num_threads() == 1
    for mode, allowed in [("furious", True), ("fast", False), ("baseline", False)]:
        configure_process(RuntimeSpec("tiny", mode, device="cuda", threads=1))
        assert torch.backends.cuda.matmul.allow_tf32 is allowed
        assert torch.backends.cudnn.allow_tf32 is allowed
    torch.backends.cuda.matmul.allow_tf32 = True
    configure_process(spec("fast"))  # a CPU process: TF32 is none of its business
    assert torch.backends.cuda.matmul.allow_tf32 is True


def test_building_sets_nothing_process_wide(process_settings):
    torch.set_num_threads(1)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = False
    for mode in ("fast", "furious", "baseline"):
        predictor = build_predictor(spec(mode, threads=2), WEIGHTS)
        assert switches() == (1, True, False), mode
        assert predictor.runtime.threads == 2  # recorded, for the entry point to apply
        assert predictor.allow_tf32 is (mode == "furious")


@pytest.mark.parametrize(
    ("first", "second"),
    [
        pytest.param("fast", "furious", marks=pytest.mark.extended),
        # Second tier too (30 s): the first tier checks each mode's process settings alone.
        pytest.param("baseline", "fast", marks=pytest.mark.extended),
    ],
)
def test_two_modes_in_one_process_answer_as_each_alone(process_settings, first, second):
    configure_process(spec(first))
    one = build_predictor(spec(first), WEIGHTS)
    before = (one.runtime, one.dtype, one.allow_tf32, switches(), answers(one))
    two = build_predictor(spec(second, threads=2), WEIGHTS)
    after = (one.runtime, one.dtype, one.allow_tf32, switches(), answers(one))
    assert after == before  # the second predictor changed nothing of the first's
    assert one.runtime != two.runtime
    alone = {mode: answers_alone(mode) for mode in (first, second)}
    assert before[-1] == alone[first] and answers(two) == alone[second]
