"""An optional package a command needs (Ray, PyYAML, PyAV, ONNX, ONNX Runtime, NNCF) that
is not installed is one usage-error line with the install command, never a traceback.

Each case runs the real command in a fresh interpreter with the package made unimportable
(``sys.modules[name] = None``: its import raises as if it were not installed), so the
test holds whether or not the package is installed here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sam2serve.commands.common import EXTRAS, missing_extra

ROOT = Path(__file__).resolve().parents[2]


def run_without(module: str, argv: list[str], tmp_path: Path) -> tuple[int, list[str]]:
    code = (
        f"import sys; sys.modules[{module!r}] = None\n"
        "from sam2serve.cli import main\n"
        f"sys.exit(main({argv!r}))\n"
    )
    env = {**os.environ, "SAM2SERVE_CACHE": str(tmp_path / "cache"), "SAM2SERVE_OFFLINE": "1"}
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        check=False,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=300,
    )
    return done.returncode, done.stderr.strip().splitlines()


def cases(tmp: Path) -> dict[str, tuple[str, list[str], str]]:
    return {
        "cluster up without Ray": (
            "ray",
            ["cluster", "up", "--config", "deploy/serve_tiny.yaml"],
            'cluster up needs Ray: pip install "sam2serve[cluster]"',
        ),
        "cluster status without Ray": (
            "ray",
            ["cluster", "status"],
            'cluster status needs Ray: pip install "sam2serve[cluster]"',
        ),
        "cluster config without PyYAML": (
            "yaml",
            ["cluster", "burst", "--config", "deploy/serve_tiny.yaml"],
            'cluster burst needs PyYAML: pip install "sam2serve[cluster]"',
        ),
        "track a video file without PyAV": (
            "av",
            [
                "track",
                str(tmp / "clip.mp4"),
                "--prompts",
                str(tmp / "prompts.json"),
                "--random-weights",
                "--out",
                str(tmp / "out"),
            ],
            "PyAV is needed to read video files: pip install av",
        ),
        "export onnx without onnx": (
            "onnx",
            ["export", "--format", "onnx", "--random-weights", "--out", str(tmp / "onnx")],
            'pip install "sam2serve[onnx]"',
        ),
        "export onnx without onnxruntime": (
            "onnxruntime",
            ["export", "--format", "onnx", "--random-weights", "--out", str(tmp / "ort")],
            'pip install "sam2serve[onnx]"',
        ),
        "int8 without NNCF": (
            "nncf",
            [
                "run",
                "--mode",
                "int8",
                "--random-weights",
                "--task",
                "amg",
                "samples",
                "--out",
                str(tmp / "int8"),
            ],
            'NNCF, which is not installed: pip install "sam2serve[int8]"',
        ),
    }


@pytest.mark.parametrize("case", list(cases(Path("/tmp"))))
def test_a_missing_extra_is_one_line_with_its_install_command(case, tmp_path):
    (tmp_path / "clip.mp4").write_bytes(b"\x00\x00\x00\x18ftypmp42")
    (tmp_path / "prompts.json").write_text(
        json.dumps({"0": {"1": {"points": [[10, 10]], "labels": [1]}}})
    )
    module, argv, expected = cases(tmp_path)[case]
    code, lines = run_without(module, argv, tmp_path)
    assert code == 2, lines
    assert not any("Traceback" in line for line in lines), lines
    errors = [line for line in lines if line.startswith("sam2serve: error: ")]
    assert len(errors) == 1 and expected in errors[0], lines


def test_the_message_names_the_extra_only_for_optional_packages():
    for module, (what, extra) in EXTRAS.items():
        exc = ModuleNotFoundError(f"No module named {module!r}", name=f"{module}.sub")
        assert missing_extra(exc, "cluster") == (
            f'cluster needs {what}: pip install "sam2serve[{extra}]"'
        )
    # Any other import error is a bug, not a missing extra: it is not disguised as one.
    assert missing_extra(ModuleNotFoundError("x", name="torchvision"), "run") is None
    assert missing_extra(ImportError("cannot import name 'x'"), "run") is None
