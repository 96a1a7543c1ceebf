"""--image-decode on run, bench, serve and labelstudio: one definition
(engine.decode_choice), listed in --help, parsed, and 'device' where it cannot run (this
CPU machine) refused at start-up with exit 2 and one line naming what is missing, before
any model loads."""

from __future__ import annotations

import contextlib
import io
import json
import socket
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from sam2serve import cli
from sam2serve.engine.decode_choice import IMAGE_DECODES
from sam2serve.server.settings import ServerSettings

COMMANDS = ("run", "bench", "serve", "labelstudio")


def run_cli(*argv: str | Path) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main([str(a) for a in argv])
    return code, out.getvalue(), err.getvalue()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def error_line(stderr: str) -> str:
    assert "Traceback" not in stderr
    errors = [line for line in stderr.splitlines() if line.startswith("sam2serve: error: ")]
    assert len(errors) == 1, stderr
    return errors[0]


@pytest.mark.parametrize("command", COMMANDS)
def test_help_lists_the_flag_with_its_choices(command):
    code, out, _ = run_cli(command, "--help")
    assert code == 0
    assert "--image-decode {auto,host,device}" in out
    flat = " ".join(out.split())
    assert "nvImageCodec" in flat and "(default: auto)" in flat


@pytest.mark.parametrize("command", COMMANDS)
def test_an_unknown_choice_is_a_usage_error(command):
    code, _, err = run_cli(command, "--image-decode", "gpu", "--random-weights")
    assert code == 2
    assert "--image-decode" in err and "'gpu'" in err and "Traceback" not in err


@pytest.fixture
def one_jpeg(tmp_path) -> tuple[Path, Path]:
    image = tmp_path / "a.jpg"
    Image.fromarray(np.full((32, 48, 3), 120, np.uint8)).save(image)
    prompts = tmp_path / "prompts.json"
    prompts.write_text(json.dumps({"a.jpg": [[10, 10]]}))
    return image, prompts


def test_run_with_device_decode_on_the_cpu_exits_2(one_jpeg, tmp_path):
    image, prompts = one_jpeg
    code, _, err = run_cli(
        "run", "--task", "sps", image, "--prompts", prompts, "--out", tmp_path / "out",
        "--random-weights", "--image-decode", "device",
    )  # fmt: skip
    assert code == 2
    line = error_line(err)
    assert "--image-decode device" in line and "needs a CUDA device" in line
    assert not list((tmp_path / "out").glob("*_masks.json"))


def test_bench_with_device_decode_on_the_cpu_exits_2(tmp_path):
    code, _, err = run_cli(
        "bench", "--task", "sps", "--random-weights", "--image-decode", "device",
        "--out", tmp_path,
    )  # fmt: skip
    assert code == 2
    assert "needs a CUDA device" in error_line(err)
    assert list(tmp_path.iterdir()) == []  # refused before any run


@pytest.mark.parametrize("command", ("serve", "labelstudio"))
def test_servers_with_device_decode_on_the_cpu_exit_2_before_loading(command):
    code, _, err = run_cli(
        command, "--random-weights", "--port", str(free_port()), "--image-decode", "device"
    )
    assert code == 2
    line = error_line(err)
    assert "--image-decode device" in line and "needs a CUDA device (the model runs on cpu)" in line


def test_serve_reads_the_choice_from_its_variable(monkeypatch):
    monkeypatch.setenv("SAM2SERVE_IMAGE_DECODE", "device")
    code, _, err = run_cli("serve", "--random-weights", "--port", str(free_port()))
    assert code == 2 and "needs a CUDA device" in error_line(err)


def test_the_service_setting_is_one_of_the_choices():
    assert ServerSettings().runtime.image_decode == "auto"
    assert ServerSettings.from_flat(image_decode="host").runtime.image_decode == "host"
    with pytest.raises(ValueError, match="image_decode"):
        ServerSettings.from_flat(image_decode="gpu")
    assert IMAGE_DECODES == ("auto", "host", "device")
