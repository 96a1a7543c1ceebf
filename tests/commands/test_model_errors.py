"""Device, checkpoint and address mistakes end in one error line and the documented exit
status, never a traceback or torch's advice; --threads reaches torch."""

from __future__ import annotations

import contextlib
import io
import json
import pickle
import socket
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from sam2serve import cli
from sam2serve.commands.common import EXIT_NOT_STARTED, EXIT_OK, EXIT_USAGE
from sam2serve.runtime.threads import available_cpus

needs_no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is available here")


def run_cli(*argv: str | Path) -> tuple[int, str]:
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr):
        code = cli.main([str(a) for a in argv])
    return code, stderr.getvalue()


def one_error(stderr: str) -> str:
    assert "Traceback" not in stderr and "Warning" not in stderr, stderr
    [line] = [line for line in stderr.splitlines() if line.startswith("sam2serve: error: ")]
    return line


@pytest.fixture
def photo(tmp_path) -> Path:
    path = tmp_path / "grey.png"
    Image.fromarray(np.full((24, 32, 3), 100, np.uint8)).save(path)
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@needs_no_cuda
@pytest.mark.parametrize("command", ["run", "serve", "bench", "export"])
def test_cuda_without_cuda_is_a_usage_error(command, photo, tmp_path):
    argv = {
        "run": ["run", "--task", "amg", photo, "--out", tmp_path / "out", "--random-weights"],
        "serve": ["serve", "--random-weights", "--port", str(free_port())],
        "bench": ["bench", "--random-weights", "--out", tmp_path / "bench"],
        "export": ["export", "--random-weights", "--out", tmp_path / "art"],
    }[command]
    code, stderr = run_cli(*argv, "--device", "cuda")
    assert code == EXIT_USAGE
    line = one_error(stderr)
    if command == "export":  # artifacts are CPU-only: refused before CUDA is looked for
        assert "--format aoti exports for cpu, not --device cuda" in line
        assert "--backend eager or compile" in line
    else:
        assert "--device cuda: CUDA is not available here" in line and "--device cpu" in line


@pytest.fixture(params=["text", "random", "pickle"])
def not_a_checkpoint(request, tmp_path) -> Path:
    path = tmp_path / f"{request.param}.pt"
    if request.param == "text":
        path.write_text("hello\n")
    elif request.param == "random":
        path.write_bytes(np.random.default_rng(0).bytes(2000))
    else:  # a pickle torch refuses under weights_only=True (and would run if allowed)
        path.write_bytes(pickle.dumps({"model": {"x": {1, 2}}}, protocol=4))
    return path


@pytest.mark.parametrize("command", ["run", "serve", "export"])
def test_a_file_that_is_not_a_checkpoint_is_one_clear_line(
    command, not_a_checkpoint, photo, tmp_path
):
    argv = {
        "run": ["run", "--task", "amg", photo, "--out", tmp_path / "out"],
        "serve": ["serve", "--port", str(free_port())],
        "export": ["export", "--out", tmp_path / "art"],
    }[command]
    code, stderr = run_cli(*argv, "--checkpoint", not_a_checkpoint)
    assert code == EXIT_USAGE
    line = one_error(stderr)
    assert f"'{not_a_checkpoint}' is not a checkpoint sam2serve can read" in line
    assert "weights_only" not in stderr and "trusted source" not in stderr


def test_a_port_in_use_is_exit_3_before_the_model_loads():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        started = time.perf_counter()
        code, stderr = run_cli("serve", "--random-weights", "--port", str(port))
        elapsed = time.perf_counter() - started
    assert code == EXIT_NOT_STARTED
    assert f"cannot listen on 127.0.0.1:{port}: the port is in use" in one_error(stderr)
    assert "RANDOM WEIGHTS" not in stderr and elapsed < 5  # the model was never loaded


def test_a_bad_host_or_port_is_a_usage_error():
    code, stderr = run_cli("serve", "--host", "no-such-host.invalid", "--port", "8000")
    assert code == EXIT_USAGE and "--host 'no-such-host.invalid'" in one_error(stderr)
    code, stderr = run_cli("serve", "--port", "70000")
    assert code == EXIT_USAGE
    assert "--port must be an integer in [1, 65535], got 70000" in one_error(stderr)


@pytest.mark.parametrize("threads", [1, None])
def test_threads_reach_torch_and_the_output(threads, photo, tmp_path):
    before = torch.get_num_threads()
    prompts = tmp_path / "prompts.json"
    prompts.write_text(json.dumps({photo.name: [[10, 10]]}))
    out = tmp_path / "out"
    flags = [] if threads is None else ["--threads", str(threads)]
    try:
        code, stderr = run_cli(
            "run", "--task", "sps", photo, "--out", out, "--random-weights",
            "--prompts", prompts, *flags,
        )  # fmt: skip
        used = torch.get_num_threads()
    finally:
        torch.set_num_threads(before)
    assert code == EXIT_OK, stderr
    expected = available_cpus() if threads is None else threads
    assert used == expected
    result = json.loads((out / "grey_masks.json").read_text())
    assert result["runtime"]["threads"] == expected
    assert result["runtime"]["mode"] == "fast" and result["runtime"]["backend"] == "eager"
