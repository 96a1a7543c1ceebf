"""Mode int8: the image path quantised by NNCF and run by OpenVINO, at start-up and from
'sam2serve export' artifacts, checked against the fp32 eager model.

Calibration is cut to 2 photographs here (the default is 14) to keep the module's two
quantisations short; the bounds below were measured with that calibration.
"""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from sam2serve import cli
from sam2serve.checkpoint import load_model
from sam2serve.commands.common import EXIT_OK, EXIT_USAGE
from sam2serve.runtime import quantize
from sam2serve.runtime.spec import RuntimeSpec
from sam2serve.samples import load_sample

pytest.importorskip("nncf")

SEED = 0
CALIBRATION = quantize.Calibration(images=2)
# Relative L2 error of the int8 image path against fp32, on an unseen photograph: measured
# 0.10-0.15 (embedding) and 0.08-0.11 (high-res features) with a 4-photograph calibration
# and these random weights (docs/benchmarks.md, "int8"); this 2-photograph calibration
# stays under 0.3. Random weights have none of a trained model's structure, so the bound
# says "quantised, not broken", not how good int8 is; the bench reports mIoU vs baseline.
EMBED_REL_ERROR = 0.3


def run_cli(*argv: str | Path) -> tuple[int, str]:
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr):
        code = cli.main([str(a) for a in argv])
    return code, stderr.getvalue()


def relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


@pytest.fixture(scope="module", autouse=True)
def short_calibration():
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(quantize, "DEFAULT_CALIBRATION", CALIBRATION)
        yield


@pytest.fixture(scope="module")
def photo(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("int8_photo") / "coffee.png"
    Image.fromarray(load_sample("coffee")).save(path)
    return path


@pytest.fixture(scope="module")
def int8_artifacts(tmp_path_factory) -> tuple[Path, str]:
    out = tmp_path_factory.mktemp("int8_artifacts")
    code, stderr = run_cli(
        "export", "--model", "tiny", "--mode", "int8", "--decoder", "eager",
        "--random-weights", "--seed", SEED, "--out", out,
    )  # fmt: skip
    assert code == EXIT_OK, stderr
    return out, stderr


@pytest.fixture(scope="module")
def fp32_model():
    return load_model("tiny", random_weights=True, seed=SEED)


@pytest.mark.extended  # quantises the encoder once for the module (over a minute)
def test_the_manifest_records_int8_and_its_calibration(int8_artifacts):
    out, _ = int8_artifacts
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["mode"] == "int8"
    assert manifest["precision"] == "int8"
    assert manifest["calibration"] == CALIBRATION.as_dict()
    assert manifest["spec"]["backend"] == "artifacts"
    # The IR holds quantisation: FakeQuantize (or its decomposition) nodes with int8 levels.
    xml = (out / "image_encoder.xml").read_text()
    assert "FakeQuantize" in xml or "FakeConvert" in xml or "i8" in xml


@pytest.mark.extended  # quantises the encoder once for the module (over a minute)
def test_int8_embeddings_are_close_to_fp32(int8_artifacts, fp32_model):
    from sam2serve.runtime.export import load_artifacts

    out, _ = int8_artifacts
    int8 = load_artifacts(out)
    assert int8.runtime.mode == "int8"
    image = load_sample("coffee")  # not among the 2 calibration photographs
    other = load_sample("chelsea")
    with torch.inference_mode():
        got = int8.encode(image)
        from sam2serve.engine.predictor import Predictor

        reference = Predictor(fp32_model, decoder="fast")
        want = reference.encode(image)
        unrelated = reference.encode(other)
    error = relative_error(got.image_embed, want.image_embed)
    # An answer for another photograph is far off: the int8 embedding is of this one.
    assert relative_error(unrelated.image_embed, want.image_embed) > 3 * error
    assert 0 < error < EMBED_REL_ERROR  # 0: it is really quantised, not the fp32 model
    for got_s, want_s in zip(got.high_res_feats, want.high_res_feats):
        assert 0 < relative_error(got_s, want_s) < EMBED_REL_ERROR


@pytest.mark.extended  # quantises the encoder once for the module (over a minute)
def test_run_from_int8_artifacts(int8_artifacts, photo, tmp_path):
    out, _ = int8_artifacts
    prompts = tmp_path / "prompts.json"
    prompts.write_text(json.dumps({"coffee": [[300, 200]]}))
    code, stderr = run_cli(
        "run", "--task", "sps", photo, "--prompts", prompts, "--mode", "int8",
        "--artifacts", out, "--out", tmp_path / "masks",
    )  # fmt: skip
    assert code == EXIT_OK, stderr
    [result] = (tmp_path / "masks").glob("*_masks.json")
    record = json.loads(result.read_text())
    assert record["runtime"]["mode"] == "int8"
    assert record["runtime"]["backend"] == "artifacts"


@pytest.mark.extended  # a second conversion and quantisation, at start-up
def test_run_mode_int8_needs_no_backend(photo, tmp_path):
    """`run --mode int8` quantises at start-up through its default backend, OpenVINO."""
    prompts = tmp_path / "prompts.json"
    prompts.write_text(json.dumps({"coffee": [[300, 200]]}))
    code, stderr = run_cli(
        "run", "--task", "sps", photo, "--prompts", prompts, "--mode", "int8",
        "--random-weights", "--seed", SEED, "--out", tmp_path / "masks",
    )  # fmt: skip
    assert code == EXIT_OK, stderr
    [result] = (tmp_path / "masks").glob("*_masks.json")
    record = json.loads(result.read_text())
    assert record["runtime"]["mode"] == "int8"
    assert record["runtime"]["backend"] == "openvino"
    assert len(record["masks"]) == 1


@pytest.mark.parametrize("backend", ["eager", "compile"])
def test_int8_on_a_float_backend_is_a_usage_error(backend, photo, tmp_path):
    code, stderr = run_cli(
        "run", "--task", "amg", photo, "--mode", "int8", "--backend", backend,
        "--random-weights", "--out", tmp_path / "masks",
    )  # fmt: skip
    assert code == EXIT_USAGE
    assert "Traceback" not in stderr
    [line] = [line for line in stderr.splitlines() if line.startswith("sam2serve: error: ")]
    assert "'int8'" in line and f"{backend!r}" in line and "openvino" in line
    with pytest.raises(ValueError, match="int8 kernels"):
        RuntimeSpec(mode="int8", backend=backend)


def test_the_spec_resolves_int8_to_openvino():
    assert RuntimeSpec(mode="int8").backend == "openvino"
    assert RuntimeSpec(mode="fast").backend == "eager"
    assert RuntimeSpec.from_label("int8") == RuntimeSpec(mode="int8", backend="openvino")
    assert RuntimeSpec(mode="int8").label == "int8"


def test_missing_nncf_is_a_usage_error_naming_the_extra(monkeypatch, photo, tmp_path):
    monkeypatch.setitem(__import__("sys").modules, "nncf", None)  # find_spec: not importable
    code, stderr = run_cli(
        "run", "--task", "amg", photo, "--mode", "int8", "--random-weights",
        "--out", tmp_path / "masks",
    )  # fmt: skip
    assert code == EXIT_USAGE
    assert "Traceback" not in stderr
    assert 'pip install "sam2serve[int8]"' in stderr
    assert not (tmp_path / "masks").exists() or not any((tmp_path / "masks").iterdir())


def test_calibration_inputs_are_what_the_encoder_sees_of_a_request(fp32_model):
    """The Predictor's own path (load_image, preprocess) gives the encoder the very array
    the quantiser calibrates on."""
    from sam2serve.engine.predictor import Predictor
    from sam2serve.runtime.calibration import calibration_images

    seen = []

    def capture(batch):
        seen.append(batch.numpy().copy())
        return fp32_model.encode_image(batch)

    [image] = calibration_images(1)
    Predictor(fp32_model, decoder="fast", image_encoder=capture).encode(image)
    [calibration] = quantize.calibration_inputs(1, fp32_model.image_size)
    np.testing.assert_array_equal(calibration, seen[0])
