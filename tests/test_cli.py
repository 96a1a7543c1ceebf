"""End to end through the command line with a real (random-weights) tiny model:
amg -> annotate -> sps and mps, checked against pycocotools and the Predictor itself,
plus the error paths a user can hit (one clear line, the right exit status, no traceback)."""

from __future__ import annotations

import argparse
import base64
import contextlib
import dataclasses
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import skimage.data
from PIL import Image
from pycocotools import mask as mask_utils
from pycocotools.coco import COCO

from sam2serve import cli
from sam2serve.commands.amg_flags import AMG_FIXED
from sam2serve.commands.common import DEFAULT_MODE
from sam2serve.commands.inputs import expand_images
from sam2serve.commands.run_outputs import format_json
from sam2serve.engine import tasks
from sam2serve.engine.amg import AMGParams
from sam2serve.engine.formats import JSON_FORMATS, mask_to_polygons
from sam2serve.engine.overlay import STAMP_COLOUR
from sam2serve.engine.tasks import prompt_point

# Small grids keep this file fast; thresholds at 0 so random weights still give masks.
AMG_FLAGS = ["--points-per-side", "4", "--pred-iou-thresh", "0", "--stability-score-thresh", "0"]
RECORD_KEYS = {"segmentation", "area", "bbox", "predicted_iou", "point_coords"}
AMG_RECORD_KEYS = RECORD_KEYS | {"stability_score", "crop_box"}


def run_cli(*argv: str | Path) -> tuple[int, str]:
    """main(argv) in this process: exit status and everything written to stderr."""
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr):
        code = cli.main([str(a) for a in argv])
    return code, stderr.getvalue()


def assert_one_error_line(stderr: str, *fragments: str) -> None:
    assert "Traceback" not in stderr
    errors = [line for line in stderr.splitlines() if line.startswith("sam2serve: error: ")]
    assert len(errors) == 1, stderr
    for fragment in fragments:
        assert fragment in errors[0], errors[0]


@pytest.fixture(scope="module")
def image_dir(tmp_path_factory) -> Path:
    """Two small real photos, one JPEG and one PNG (plus a file that is not an image)."""
    directory = tmp_path_factory.mktemp("images")
    Image.fromarray(skimage.data.astronaut()[::4, ::4]).save(directory / "astronaut.jpg")
    Image.fromarray(skimage.data.coffee()[::4, ::5]).save(directory / "coffee.png")
    (directory / "notes.txt").write_text("not an image")
    return directory


@pytest.fixture(scope="module")
def amg_run(image_dir, tmp_path_factory):
    """amg over the directory plus a corrupt file, weights by fallback."""
    root = tmp_path_factory.mktemp("amg")
    corrupt = root / "corrupt.jpg"
    corrupt.write_bytes(b"\xff\xd8 this is not a jpeg")
    out = root / "out"
    env = {"SAM2SERVE_CACHE": str(root / "empty_cache"), "SAM2SERVE_OFFLINE": "1"}
    with pytest.MonkeyPatch.context() as patch:
        for key, value in env.items():
            patch.setenv(key, value)
        code, stderr = run_cli(
            "run",
            "--task",
            "amg",
            image_dir,
            corrupt,
            "--out",
            out,
            "--fallback-random-weights",
            "--overlay",
            "--coco",
            root / "coco" / "instances.json",
            *AMG_FLAGS,
        )
    return code, stderr, out


def load_result(path: Path) -> dict:
    return json.loads(path.read_text())


def check_records(result: dict, keys: set[str]) -> list[np.ndarray]:
    """Every record's RLE decodes (pycocotools) to a mask of the record's area and bbox."""
    h, w = result["height"], result["width"]
    masks = []
    for record in result["masks"]:
        assert set(record) == keys
        rle = record["segmentation"]
        assert rle["size"] == [h, w] and isinstance(rle["counts"], str)
        coco = {"size": rle["size"], "counts": rle["counts"].encode()}
        mask = mask_utils.decode(coco).astype(bool)
        assert mask.shape == (h, w)
        assert record["area"] == int(mask.sum()) == int(mask_utils.area(coco))
        # Meta's bbox convention: XYWH with W = max column - min column (pycocotools: +1).
        if mask.any():
            cols, rows = np.flatnonzero(mask.any(0)), np.flatnonzero(mask.any(1))
            expected = [cols[0], rows[0], cols[-1] - cols[0], rows[-1] - rows[0]]
            coco_box = mask_utils.toBbox(coco)
            assert np.allclose(coco_box, np.add(expected, [0, 0, 1, 1]))
        else:
            expected = [0, 0, 0, 0]
        assert record["bbox"] == [float(v) for v in expected]
        assert 0 <= record["point_coords"][0][0] <= w and 0 <= record["point_coords"][0][1] <= h
        masks.append(mask)
    return masks


# --------------------------------------------------------------------------- amg


def test_amg_writes_every_good_image_and_reports_the_bad_ones(amg_run):
    code, stderr, out = amg_run
    assert code == 1  # one input failed
    assert "Traceback" not in stderr
    errors = [line for line in stderr.splitlines() if line.startswith("sam2serve: error: ")]
    assert len(errors) == 1, stderr
    assert "corrupt.jpg" in errors[0] and "not a readable image" in errors[0]
    assert "<_io." not in errors[0]  # no Python repr of a stream
    assert sorted(p.name for p in out.glob("*_masks.json")) == [
        "astronaut_masks.json",
        "coffee_masks.json",
    ]
    assert "--fallback-random-weights: using random weights" in stderr
    assert "!!! RANDOM WEIGHTS" in stderr
    assert "p50" in stderr and "p90" in stderr and "images/s" in stderr


def test_amg_json_records_match_pycocotools(amg_run, image_dir):
    _, _, out = amg_run
    for stem, source in (("astronaut", "astronaut.jpg"), ("coffee", "coffee.png")):
        result = load_result(out / f"{stem}_masks.json")
        height, width = np.asarray(Image.open(image_dir / source)).shape[:2]
        assert (result["image"], result["width"], result["height"]) == (source, width, height)
        assert (result["task"], result["model"], result["device"]) == ("amg", "tiny", "cpu")
        assert result["weights"]["random"] is True and result["weights"]["source"] == "random"
        assert "meaningless" in result["weights"]["warning"]
        assert result["params"]["points_per_side"] == 4
        assert result["params"]["box_nms_thresh"] == AMGParams().box_nms_thresh
        timings = result["timings"]
        assert timings["total_ms"] == pytest.approx(
            timings["decode_ms"] + timings["encode_ms"] + timings["masks_ms"], abs=0.01
        )
        assert result["masks"], "thresholds at 0 must keep some masks"
        check_records(result, AMG_RECORD_KEYS)


def test_overlay_is_a_png_of_the_image_size(amg_run, image_dir):
    _, _, out = amg_run
    source = np.asarray(Image.open(image_dir / "coffee.png"))
    with Image.open(out / "coffee_overlay.png") as overlay:
        assert overlay.format == "PNG"
        assert overlay.size == (source.shape[1], source.shape[0])
        pixels = np.asarray(overlay.convert("RGB"))
    assert not np.array_equal(pixels, source), "masks must be drawn over the image"


# --------------------------------------------------------------------------- mask formats


@pytest.fixture(scope="module")
def format_runs(image_dir, tmp_path_factory) -> dict[str, dict]:
    """amg on one image in every other --mask-format, the same (seeded random) model."""
    results = {}
    for name in JSON_FORMATS:
        if name == "coco_rle":
            continue  # amg_run wrote the default
        out = tmp_path_factory.mktemp(name)
        code, stderr = run_cli(
            "run", "--task", "amg", image_dir / "coffee.png", "--out", out,
            "--random-weights", "--mask-format", name, *AMG_FLAGS,
        )  # fmt: skip
        assert code == 0, stderr
        results[name] = load_result(out / "coffee_masks.json")
    return results


def read_segmentation(name: str, segmentation, height: int, width: int) -> np.ndarray:
    """A mask in --mask-format ``name``, read back with pycocotools or PIL."""
    if name == "uncompressed_rle":
        return mask_utils.decode(mask_utils.frPyObjects(segmentation, height, width)) > 0
    assert name == "png_base64", name
    image = Image.open(io.BytesIO(base64.b64decode(segmentation)))
    assert image.mode == "1" and image.size == (width, height)
    return np.asarray(image)


def test_default_mask_format_is_coco_rle_and_recorded(amg_run):
    _, _, out = amg_run
    result = load_result(out / "coffee_masks.json")
    assert result["mask_format"] == "coco_rle" == result["params"]["output_mode"]


def test_every_mask_format_holds_the_same_masks(amg_run, format_runs):
    _, _, out = amg_run
    coco = load_result(out / "coffee_masks.json")
    masks = check_records(coco, AMG_RECORD_KEYS)
    for name, result in format_runs.items():
        assert result["mask_format"] == name == result["params"]["output_mode"]
        assert len(result["masks"]) == len(coco["masks"]) > 0
        for record, expected, mask in zip(result["masks"], coco["masks"], masks, strict=True):
            assert {k: v for k, v in record.items() if k != "segmentation"} == {
                k: v for k, v in expected.items() if k != "segmentation"
            }
            if name == "polygon":  # an approximation: its tracing is tested in test_formats
                assert record["segmentation"] == mask_to_polygons(mask)
                continue
            read = read_segmentation(name, record["segmentation"], coco["height"], coco["width"])
            assert np.array_equal(read, mask), name


def test_bad_mask_format_is_a_usage_error(tmp_path, image_dir):
    code, stderr = run_cli(
        "run", "--task", "amg", image_dir, "--out", tmp_path, "--mask-format", "binary_mask"
    )
    assert code == 2
    assert_one_error_line(stderr, "--mask-format", "invalid choice: 'binary_mask'")


# --------------------------------------------------------------------------- annotate


@pytest.fixture(scope="module")
def prompts_file(amg_run) -> Path:
    _, _, out = amg_run
    code, stderr = run_cli("annotate", out)
    assert code == 0, stderr
    return out / "prompts.json"


def test_annotate_gives_a_point_inside_each_mask_largest_first(amg_run, prompts_file):
    _, _, out = amg_run
    prompts = json.loads(prompts_file.read_text())
    assert sorted(prompts) == ["astronaut.jpg", "coffee.png"]
    for name, points in prompts.items():
        result = load_result(out / f"{Path(name).stem}_masks.json")
        records = sorted(result["masks"], key=lambda r: -r["area"])
        masks = check_records({**result, "masks": records}, AMG_RECORD_KEYS)
        non_empty = [m for m in masks if m.any()]
        assert len(points) == len(non_empty)
        for (x, y), mask in zip(points, non_empty, strict=True):
            assert mask[round(y), round(x)], (name, x, y)


def test_prompt_point_centroid_or_deepest_point():
    ring = np.zeros((21, 21), dtype=bool)
    ring[2:19, 2:19] = True
    ring[6:15, 6:15] = False  # centroid (10, 10) falls in the hole
    x, y = prompt_point(ring)
    assert ring[int(y), int(x)]
    square = np.zeros((9, 12), dtype=bool)
    square[2:5, 3:8] = True
    assert prompt_point(square) == [5.0, 3.0]
    assert prompt_point(np.zeros((4, 4), dtype=bool)) is None


# --------------------------------------------------------------------------- sps / mps


@pytest.fixture(scope="module")
def point_runs(image_dir, prompts_file, tmp_path_factory):
    """mps on both images with annotate's file; sps on one image, its prompts keyed by stem."""
    coffee_only = tmp_path_factory.mktemp("prompts") / "coffee.json"
    coffee_only.write_text(
        json.dumps({"coffee": json.loads(prompts_file.read_text())["coffee.png"]})
    )
    results = {}
    for task, images, prompts in (
        ("sps", [image_dir / "coffee.png"], coffee_only),
        ("mps", [image_dir], prompts_file),
    ):
        out = tmp_path_factory.mktemp(task)
        code, stderr = run_cli(
            "run",
            "--task",
            task,
            *images,
            "--out",
            out,
            "--random-weights",
            "--seed",
            "0",
            "--prompts",
            prompts,
        )
        assert code == 0, stderr
        assert "Traceback" not in stderr and "!!! RANDOM WEIGHTS" in stderr
        results[task] = out
    return results


def test_sps_uses_the_largest_masks_point(point_runs, prompts_file):
    points = json.loads(prompts_file.read_text())["coffee.png"]
    assert [p.name for p in point_runs["sps"].iterdir()] == ["coffee_masks.json"]
    result = load_result(point_runs["sps"] / "coffee_masks.json")
    assert (result["task"], result["image"]) == ("sps", "coffee.png")
    assert len(result["masks"]) == 1
    assert result["masks"][0]["point_coords"] == [points[0]]
    check_records(result, RECORD_KEYS)


def test_mps_gives_one_mask_per_point(point_runs, prompts_file):
    prompts = json.loads(prompts_file.read_text())
    for name, points in prompts.items():
        result = load_result(point_runs["mps"] / f"{Path(name).stem}_masks.json")
        assert result["task"] == "mps"
        assert [r["point_coords"] for r in result["masks"]] == [[p] for p in points]
        check_records(result, RECORD_KEYS)


def test_point_masks_are_the_predictors_best_of_three(point_runs, prompts_file, image_dir):
    """Independently of the CLI: the same seeded model, Predictor called directly."""
    import torch

    from sam2serve.checkpoint import load_model
    from sam2serve.engine.predictor import Predictor

    points = json.loads(prompts_file.read_text())["coffee.png"]
    predictor = Predictor(load_model("tiny", random_weights=True, seed=0))
    embedding = predictor.encode(image_dir / "coffee.png")
    result = load_result(point_runs["mps"] / "coffee_masks.json")
    masks = check_records(result, RECORD_KEYS)
    for point, record, mask in zip(points, result["masks"], masks, strict=True):
        one = predictor.predict(
            embedding, point_coords=[point], point_labels=[1], multimask_output=True
        )
        best = int(torch.argmax(one.iou_scores[0]))
        expected = one.masks[0, best].numpy()
        assert record["predicted_iou"] == pytest.approx(float(one.iou_scores[0, best]), abs=1e-4)
        # Batched and single decoding may differ in float rounding at a few edge pixels.
        assert np.logical_xor(mask, expected).sum() <= max(5, expected.sum() // 1000)
    sps = load_result(point_runs["sps"] / "coffee_masks.json")["masks"][0]
    assert sps["point_coords"] == result["masks"][0]["point_coords"]


# --------------------------------------------------------------------------- errors


def test_missing_explicit_checkpoint_names_the_path(tmp_path, image_dir):
    missing = tmp_path / "nowhere" / "sam2.1_hiera_tiny.pt"
    code, stderr = run_cli(
        "run", "--task", "amg", image_dir, "--out", tmp_path / "out", "--checkpoint", missing
    )
    assert code == 2
    assert_one_error_line(stderr, str(missing))


def test_missing_cached_checkpoint_says_where_to_put_it(tmp_path, image_dir, monkeypatch):
    monkeypatch.setenv("SAM2SERVE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("SAM2SERVE_OFFLINE", "1")
    code, stderr = run_cli("run", "--task", "amg", image_dir, "--out", tmp_path / "out")
    assert code == 2
    assert_one_error_line(stderr, "sam2.1_hiera_tiny.pt", str(tmp_path / "cache"))
    assert not list((tmp_path / "out").glob("*.json"))


@pytest.mark.parametrize(
    ("flags", "fragment"),
    [
        (["--points-per-side", "0"], "--points-per-side must be an integer >= 1, got 0"),
        (["--points-per-side", "many"], "expected an integer, got 'many'"),
        (["--pred-iou-thresh", "1.5"], "--pred-iou-thresh must be a number in [0.0, 1.0]"),
        (["--model", "huge"], "invalid choice: 'huge'"),
        (["--mode", "turbo"], "invalid choice: 'turbo'"),
    ],
)
def test_bad_flag_values_are_one_line_errors(tmp_path, image_dir, flags, fragment):
    code, stderr = run_cli("run", "--task", "amg", image_dir, "--out", tmp_path, *flags)
    assert code == 2
    assert_one_error_line(stderr, fragment)


def test_point_task_without_prompts_explains_how_to_get_them(tmp_path, image_dir):
    code, stderr = run_cli("run", "--task", "sps", image_dir, "--out", tmp_path)
    assert code == 2
    assert_one_error_line(stderr, "--prompts", "sam2serve annotate")


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        ("{not json", "not valid JSON"),
        ("[[1, 2]]", "must hold a JSON object"),
        ('{"coffee.png": [[1, "a"]]}', "point 0"),
        ('{"coffee.png": [[1, 2]], "dog.jpg": [[3, 4]]}', "'dog.jpg'"),
    ],
)
def test_bad_prompts_files_are_one_line_errors(tmp_path, image_dir, content, fragment):
    prompts = tmp_path / "prompts.json"
    prompts.write_text(content)
    code, stderr = run_cli(
        "run", "--task", "mps", image_dir, "--out", tmp_path / "out", "--prompts", prompts
    )
    assert code == 2
    assert_one_error_line(stderr, fragment)


def test_annotate_errors(tmp_path):
    code, stderr = run_cli("annotate", tmp_path / "absent")
    assert code == 2
    assert_one_error_line(stderr, "absent")
    code, stderr = run_cli("annotate", tmp_path)
    assert code == 2
    assert_one_error_line(stderr, "_masks.json")


def test_subprocess_error_has_no_traceback(tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "sam2serve",
            "run",
            "--task",
            "mps",
            "x.jpg",
            "--out",
            str(tmp_path),
        ],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "SAM2SERVE_OFFLINE": "1"},
    )
    assert proc.returncode == 2
    assert proc.stderr.startswith("sam2serve: error: --task mps needs --prompts FILE")
    assert "Traceback" not in proc.stderr


# --------------------------------------------------------------------------- help


def test_help_documents_every_amg_parameter_with_its_default(capsys):
    assert cli.main(["run", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    for field in dataclasses.fields(AMGParams):
        if field.name in AMG_FIXED:
            continue
        flag = "--" + field.name.replace("_", "-")
        assert flag in text, flag
    for default in ("(default: 32)", "(default: 64)", "(default: 0.8)", "(default: 0.95)"):
        assert default in text
    for word in (
        "--task",
        "--prompts",
        "--overlay",
        "--random-weights",
        "--fallback-random-weights",
        "--mask-format",
        "--coco",
        "--min-score",
        "--max-masks",
        "samples",
        "_masks.json",
        "p50",
    ):
        assert word in text
    assert cli.main(["annotate", "--help"]) == 0
    assert "largest mask first" in capsys.readouterr().out


def test_samples_are_real_rgb_photos():
    from sam2serve.samples import SAMPLE_NAMES, load_samples

    samples = load_samples()
    assert list(samples) == list(SAMPLE_NAMES) and len(samples) == 4
    for image in samples.values():
        assert image.dtype == np.uint8 and image.ndim == 3 and image.shape[2] == 3
        assert image.std() > 20  # a photo, not a flat test pattern
    items = expand_images(["samples"])
    assert [i.name for i in items] == list(SAMPLE_NAMES)


def test_ci_runs_the_readme_test_command():
    root = Path(__file__).resolve().parents[1]
    readme = (root / "README.md").read_text().splitlines()
    commands = [line for line in readme if line.startswith("pip install") and "pytest" in line]
    assert len(commands) == 1, commands
    ci = (root / ".ci" / "run").read_text().splitlines()
    assert commands[0] in ci
    assert ci[0] == "#!/usr/bin/env bash" and "set -euo pipefail" in ci
    assert os.access(root / ".ci" / "run", os.X_OK)


def test_json_output_has_no_nan():
    """An empty mask's stability score is 0/0 (NaN, as in Meta's records); JSON gets null."""
    import json as _json

    text = format_json({"masks": [{"stability_score": float("nan"), "area": 0}], "x": 1.5})
    parsed = _json.loads(text)  # strict JSON parsers reject NaN
    assert parsed["masks"][0]["stability_score"] is None and parsed["x"] == 1.5
    assert "NaN" not in text


# --------------------------------------------------------------------------- modes


def test_modes_change_the_speed_not_the_masks(image_dir, prompts_file, tmp_path):
    """mps in the reference way (baseline) and the default (fast) way: the same records,
    up to a few edge pixels of float rounding; the mode is recorded in the JSON."""
    results = {}
    for mode in ("baseline", None):
        out = tmp_path / (mode or "default")
        flags = ["--mode", mode] if mode else []
        code, stderr = run_cli(
            "run", "--task", "mps", image_dir, "--out", out, "--random-weights",
            "--prompts", prompts_file, *flags,
        )  # fmt: skip
        assert code == 0, stderr
        assert "decode masks" in stderr and "rle" in stderr  # the finer stage summary
        results[mode] = load_result(out / "coffee_masks.json")
    baseline, default = results["baseline"], results[None]
    assert DEFAULT_MODE == "fast"
    assert (baseline["mode"], default["mode"]) == ("baseline", "fast")
    stages = default["timings"]["stages"]
    assert set(stages) == {f"{s}_ms" for s in tasks.STAGES}
    assert default["timings"]["total_ms"] == pytest.approx(sum(stages.values()), abs=0.05)
    assert len(baseline["masks"]) == len(default["masks"]) > 0
    for a, b in zip(baseline["masks"], default["masks"], strict=True):
        assert a["point_coords"] == b["point_coords"]
        assert a["predicted_iou"] == pytest.approx(b["predicted_iou"], abs=1e-4)
        mask_a, mask_b = (
            mask_utils.decode(
                {"size": r["segmentation"]["size"], "counts": r["segmentation"]["counts"].encode()}
            )
            for r in (a, b)
        )
        assert np.logical_xor(mask_a, mask_b).sum() <= max(5, mask_a.sum() // 1000)


def test_help_lists_the_modes_and_the_bench_command(capsys):
    assert cli.main(["run", "--help"]) == 0
    run_help = capsys.readouterr().out
    for mode in ("baseline", "fast", "furious"):
        assert mode in run_help
    assert "(default: fast)" in run_help
    assert cli.main(["bench", "--help"]) == 0
    bench_help = capsys.readouterr().out
    for flag in ("--modes", "--n", "--random-weights", "--pred-iou-thresh", "--mps-prompts"):
        assert flag in bench_help


# --------------------------------------------------------------------------- COCO


def decode_record(record: dict) -> np.ndarray:
    rle = record["segmentation"]
    return mask_utils.decode({"size": rle["size"], "counts": rle["counts"].encode()}) > 0


def assert_coco_matches_the_json(coco_path: Path, out: Path) -> COCO:
    """pycocotools loads the run's COCO file, and every annotation is the mask (score,
    area) of the per-image JSON, in order; bbox is pycocotools' own toBbox."""
    coco = COCO(str(coco_path))
    for image in coco.loadImgs(coco.getImgIds()):
        result = load_result(out / f"{Path(image['file_name']).stem}_masks.json")
        assert (image["file_name"], image["width"], image["height"]) == (
            result["image"], result["width"], result["height"],
        )  # fmt: skip
        annotations = coco.loadAnns(coco.getAnnIds(imgIds=[image["id"]]))
        assert len(annotations) == len(result["masks"])
        for annotation, record in zip(annotations, result["masks"], strict=True):
            mask = decode_record(record)
            assert np.array_equal(coco.annToMask(annotation) > 0, mask)
            assert annotation["score"] == record["predicted_iou"]
            assert annotation["area"] == record["area"] == int(mask.sum())
            assert annotation["bbox"] == mask_utils.toBbox(coco.annToRLE(annotation)).tolist()
            assert (annotation["iscrowd"], annotation["category_id"]) == (0, 1)
    return coco


def test_coco_file_holds_every_written_image_and_round_trips(amg_run):
    _, stderr, out = amg_run
    coco_path = out.parent / "coco" / "instances.json"
    coco = assert_coco_matches_the_json(coco_path, out)
    names = [image["file_name"] for image in coco.loadImgs(coco.getImgIds())]
    assert names == ["astronaut.jpg", "coffee.png"]  # not the corrupt file
    assert len(coco.getAnnIds()) > 0
    assert coco.loadCats(coco.getCatIds()) == [
        {"id": 1, "name": "object", "supercategory": "object"}
    ]
    info = json.loads(coco_path.read_text())["info"]
    assert info["sam2serve"]["random_weights"] is True
    assert info["sam2serve"]["runtime"]["model"] == "tiny" and info["sam2serve"]["task"] == "amg"
    assert f"coco: 2 image(s), {len(coco.getAnnIds())} annotation(s) written" in stderr


@pytest.fixture(scope="module")
def object_prompts(tmp_path_factory) -> Path:
    """A click, a box, a box with a negative click, two clicks with labels (coffee.png is
    120 x 100 after the fixture's downscaling)."""
    path = tmp_path_factory.mktemp("objects") / "prompts.json"
    path.write_text(
        json.dumps(
            {
                "coffee.png": [
                    [75, 40],
                    {"box": [20, 10, 120, 70]},
                    {"points": [[60, 30]], "labels": [0], "box": [20, 10, 120, 70]},
                    {"points": [[30, 20], [100, 60]], "labels": [1, 0]},
                ]
            }
        )
    )
    return path


def test_mps_with_objects_and_filters_writes_them_everywhere(image_dir, object_prompts, tmp_path):
    """Boxes and negative clicks reach the records and the overlay; --min-score and
    --max-masks keep the same masks in the JSON and the COCO file."""
    coffee = image_dir / "coffee.png"
    base = ["run", "--task", "mps", coffee, "--random-weights", "--prompts", object_prompts]
    code, stderr = run_cli(*base, "--out", tmp_path / "all", "--overlay")
    assert code == 0, stderr
    everything = load_result(tmp_path / "all" / "coffee_masks.json")["masks"]
    assert len(everything) == 4
    assert everything[1]["box"] == [20.0, 10.0, 120.0, 70.0] and everything[1]["point_coords"] == []
    assert everything[3]["point_labels"] == [1, 0] and "point_labels" not in everything[0]
    with Image.open(tmp_path / "all" / "coffee_overlay.png") as overlay:
        pixels = np.asarray(overlay.convert("RGB"))
    assert tuple(pixels[30, 60]) == (230, 0, 0)  # the negative click: a red dot
    assert tuple(pixels[20, 30]) == (255, 255, 255)  # a positive click: a white dot

    scores = sorted(r["predicted_iou"] for r in everything)
    min_score = (scores[0] + scores[1]) / 2  # drops exactly the lowest
    code, stderr = run_cli(
        *base, "--out", tmp_path / "some", "--coco", tmp_path / "some.json",
        "--min-score", str(min_score), "--max-masks", "2",
    )  # fmt: skip
    assert code == 0, stderr
    result = load_result(tmp_path / "some" / "coffee_masks.json")
    assert result["filters"] == {"min_score": min_score, "max_masks": 2}
    kept = [r for r in everything if r["predicted_iou"] >= min_score]
    best = sorted(kept, key=lambda r: -r["predicted_iou"])[:2]
    expected = [r for r in everything if any(r is b for b in best)]
    assert [r["predicted_iou"] for r in result["masks"]] == [r["predicted_iou"] for r in expected]
    assert [r["segmentation"] for r in result["masks"]] == [r["segmentation"] for r in expected]
    assert_coco_matches_the_json(tmp_path / "some.json", tmp_path / "some")


# --------------------------------------------------------------------------- first run


def readme_quick_start() -> list[str]:
    """The arguments of the README's one-line quick start after 'sam2serve'."""
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text().splitlines()
    [line] = [line for line in readme if line.startswith("pip install -c constraints.txt -e . && ")]
    install, _, command = line.partition(" && ")
    assert install == "pip install -c constraints.txt -e ."
    program, *argv = command.split()
    assert program == "sam2serve"
    return argv


def test_readme_quick_start_shows_masks_with_random_weights(image_dir, tmp_path, monkeypatch):
    """The README's main command, on one small photo instead of the four samples: with no
    checkpoint it falls back to random weights, keeps every mask (and says so), and
    stamps the overlay."""
    argv = readme_quick_start()
    assert {"--overlay", "--fallback-random-weights", "samples", "out/"} <= set(argv)
    argv = [
        str(image_dir / "coffee.png") if a == "samples" else str(tmp_path) if a == "out/" else a
        for a in argv
    ]
    monkeypatch.setenv("SAM2SERVE_CACHE", str(tmp_path / "empty_cache"))
    monkeypatch.setenv("SAM2SERVE_OFFLINE", "1")
    code, stderr = run_cli(*argv)
    assert code == 0, stderr
    assert "amg keeps every mask (--pred-iou-thresh 0 --stability-score-thresh 0" in stderr
    result = load_result(tmp_path / "coffee_masks.json")
    assert result["params"]["pred_iou_thresh"] == 0.0
    assert result["params"]["stability_score_thresh"] == 0.0
    assert result["params"]["points_per_side"] == 16
    assert result["masks"], "random weights must still show masks"
    with Image.open(tmp_path / "coffee_overlay.png") as overlay:
        pixels = np.asarray(overlay.convert("RGB")).astype(int)
    band = pixels[:8]  # the stamp: a red band with white letters, across the top
    red = (np.abs(band - STAMP_COLOUR).sum(axis=2) < 10).mean()
    white = (band.min(axis=2) > 200).mean()
    assert red > 0.5 and white > 0.02, (red, white)


def test_a_checkpoint_keeps_metas_thresholds_and_no_stamp(image_dir, tiny_checkpoint, tmp_path):
    """Weights from a file (even these test weights) are not random: Meta's defaults, no
    notice, no stamp (nothing passes them here, so the overlay is the photo itself)."""
    code, stderr = run_cli(
        "run", "--task", "amg", image_dir / "coffee.png", "--out", tmp_path,
        "--checkpoint", tiny_checkpoint, "--points-per-side", "4", "--overlay",
    )  # fmt: skip
    assert code == 0, stderr
    assert "keeps every mask" not in stderr
    result = load_result(tmp_path / "coffee_masks.json")
    assert (result["params"]["pred_iou_thresh"], result["params"]["stability_score_thresh"]) == (
        0.8, 0.95,
    )  # fmt: skip
    assert result["masks"] == []
    with Image.open(tmp_path / "coffee_overlay.png") as overlay:
        assert np.array_equal(np.asarray(overlay), np.asarray(Image.open(image_dir / "coffee.png")))


def test_random_weights_keep_a_threshold_the_user_gave(image_dir, tmp_path):
    code, stderr = run_cli(
        "run", "--task", "amg", image_dir / "coffee.png", "--out", tmp_path,
        "--random-weights", "--points-per-side", "2", "--pred-iou-thresh", "0.3",
    )  # fmt: skip
    assert code == 0, stderr
    assert "amg keeps every mask (--stability-score-thresh 0;" in stderr
    params = load_result(tmp_path / "coffee_masks.json")["params"]
    assert (params["pred_iou_thresh"], params["stability_score_thresh"]) == (0.3, 0.0)


def test_readme_run_synopsis_is_the_parsers():
    """README's `sam2serve run` synopsis names every flag of the command and every choice
    of its choice flags, as the parser has them (docs drift otherwise)."""
    import re

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    synopsis = readme.split("### `sam2serve run`", 1)[1].split("```", 2)[1]
    parser = cli.build_parser()
    run = next(
        action.choices["run"]
        for action in parser._actions
        if isinstance(action, argparse._SubParsersAction)
    )
    for action in run._actions:
        flags = [f for f in action.option_strings if f.startswith("--") and f != "--help"]
        if not flags:
            continue
        named = [f for f in flags if re.search(re.escape(f) + r"\b", synopsis)]
        bool_form = f"--[no-]{flags[0][2:]}" in synopsis
        assert named or bool_form, f"README's run synopsis lacks {flags[0]}"
        if action.choices is not None and not isinstance(action.choices, dict):
            choices = "{" + ",".join(map(str, action.choices)) + "}"
            assert choices in synopsis, f"README's run synopsis: {flags[0]} {choices}"
