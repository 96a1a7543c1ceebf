"""``sam2serve bench`` end to end, small: the tiny model with random weights, two small
images (one photo cycled), a 2 x 2 AMG grid with the quality filters off so masks
survive, modes baseline and fast, and reference when Meta's sam2 is importable.

Checked: the CSV / Markdown / PNG outputs with every column, one fresh process (and one
compile cache) per run, the lossless mode agreeing with the baseline, the reference
agreeing with the baseline, and the prompts made from the baseline's AMG masks. Nothing
here asserts a duration."""

from __future__ import annotations

import contextlib
import csv
import io
import json
import os
import re
from pathlib import Path

import pytest
import skimage.data
from PIL import Image

from sam2serve import cli
from sam2serve.bench.reference import missing_requirements
from sam2serve.bench.report import CSV_COLUMNS, MACHINE_COLUMNS
from sam2serve.engine.tasks import STAGES

HAS_SAM2 = not missing_requirements()
# fast+artifacts: exported once by the bench, its worker starts from the artifacts.
MODES = ["baseline", "fast", "fast+artifacts"] + (["reference"] if HAS_SAM2 else [])
TASKS = ["amg", "sps", "mps"]


@pytest.fixture(scope="module")
def bench(tmp_path_factory):
    root = tmp_path_factory.mktemp("bench")
    images = root / "images"
    images.mkdir()
    Image.fromarray(skimage.data.astronaut()[::4, ::4]).save(images / "astronaut.jpg")
    argv = [
        "bench",
        "--task",
        "all",
        "--model",
        "tiny",
        "--modes",
        ",".join(MODES),
        "--images",
        str(images),
        "--n",
        "2",
        "--random-weights",
        "--seed",
        "3",
        "--point-prompts",
        "amg",
        "--points-per-side",
        "2",
        "--pred-iou-thresh",
        "0",
        "--stability-score-thresh",
        "0",
        "--out",
        str(root / "results"),
        "--name",
        "small",
        "--work-dir",
        str(root / "work"),
        "--timeout",
        "600",
        # The decoder programs are tested in tests/runtime; compiling them here would add
        # ~2 minutes to the suite.
        "--aot-decoder",
        "eager",
    ]
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        code = cli.main(argv)
    return code, stdout.getvalue(), stderr.getvalue(), root


def read_csv(root: Path) -> list[dict[str, str]]:
    with open(root / "results" / "small.csv", newline="") as f:
        return list(csv.DictReader(f))


@pytest.mark.extended
def test_bench_succeeds_and_prints_the_tables(bench):
    code, stdout, stderr, _ = bench
    assert code == 0, stderr
    assert "Traceback" not in stderr
    for title in ("## AMG", "## SPS", "## MPS", "## Where the time goes"):
        assert title in stdout


@pytest.mark.extended
def test_csv_has_every_column_and_a_row_per_task_and_mode(bench):
    rows = read_csv(bench[3])
    assert list(rows[0]) == list(CSV_COLUMNS)
    assert [(r["task"], r["mode"]) for r in rows] == [
        (task, mode) for task in TASKS for mode in ["baseline", *[m for m in MODES[1:]]]
    ]
    text = ("task", "variant", "mode", "cache", "error", "miou", *MACHINE_COLUMNS)
    numeric = [c for c in CSV_COLUMNS if c not in text]
    for row in rows:
        assert row["error"] == "" and row["cache"] == "cold"
        assert int(row["images"]) == 2
        for column in numeric:
            assert float(row[column]) >= 0, (column, row)
        assert float(row["encode_ms"]) > 0 and float(row["decode_masks_ms"]) > 0
        if row["mode"] == "baseline":
            assert float(row["p50_speedup"]) == 1.0
            assert float(row["miou"]) == 1.0 and row["fails"] == "0"


@pytest.mark.extended
def test_the_lossless_mode_and_the_reference_agree_with_the_baseline(bench):
    for row in read_csv(bench[3]):
        assert row["fails"] == "0", row
        assert float(row["miou"]) > 0.99, row
        assert float(row["masks_per_image"]) > 0


@pytest.mark.extended
def test_point_prompts_come_from_the_baseline_amg_masks(bench):
    work = bench[3] / "work"
    baseline_amg = json.loads((work / "amg-baseline-cold.result.json").read_text())
    sps = json.loads((work / "sps-baseline-cold.spec.json").read_text())
    mps = json.loads((work / "mps-baseline-cold.spec.json").read_text())
    for records, sps_points, mps_points in zip(
        baseline_amg["records"], sps["prompts"], mps["prompts"], strict=True
    ):
        assert len(mps_points) == len([r for r in records if r["area"] > 0])
        assert sps_points == mps_points[:1]
    for task in ("sps", "mps"):
        result = json.loads((work / f"{task}-baseline-cold.result.json").read_text())
        spec = json.loads((work / f"{task}-baseline-cold.spec.json").read_text())
        assert [len(r) for r in result["records"]] == [len(p) for p in spec["prompts"]]


@pytest.mark.extended
def test_every_run_had_its_own_process_and_compile_cache(bench):
    work = bench[3] / "work"
    results = [json.loads(p.read_text()) for p in sorted(work.glob("*.result.json"))]
    assert len(results) == len(TASKS) * len(MODES)
    pids = {r["pid"] for r in results}
    assert len(pids) == len(results) and os.getpid() not in pids
    caches = {r["compile_cache"] for r in results}
    assert len(caches) == len(results)
    assert all(Path(c).parent == work / "inductor" for c in caches)
    for result in results:
        assert len(result["stages_ms"]) == 2 and set(result["stages_ms"][0]) == set(STAGES)
        assert result["ready_s"] > 0 and result["peak_rss_mb"] > 0


@pytest.mark.extended
def test_markdown_says_what_how_where_and_when(bench):
    text = (bench[3] / "results" / "small.md").read_text()
    assert "`sam2serve bench --task all --model tiny" in text
    assert re.search(r"\*\*date:\*\* \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC", text)
    import torch

    assert f"torch {torch.__version__}" in text
    assert "logical cores" in text and "load average" in text
    assert "random (seed 3)" in text
    assert "2x2 = 4 clicks" in text and "pred_iou_thresh=0.0" in text
    assert "largest baseline AMG mask" in text
    for mode in MODES:
        assert text.count(f"| {mode} |") == len(TASKS) * 2  # task table + stage table
    assert "![latency by stage](small.png)" in text


@pytest.mark.extended
def test_aot_mode_started_from_artifacts_exported_once(bench):
    work, text = bench[3] / "work", (bench[3] / "results" / "small.md").read_text()
    row_dir = work / "artifacts" / "fast-artifacts"  # one directory per +artifacts row
    manifest = json.loads((row_dir / "manifest.json").read_text())
    assert manifest["mode"] == "fast" and manifest["weights"]["source"] == "checkpoint"
    for task in TASKS:
        spec = json.loads((work / f"{task}-fast+artifacts-cold.spec.json").read_text())
        assert spec["artifacts"] == str(row_dir)
    assert "fast+artifacts: artifacts exported once before the runs" in text
    assert "mask decoder eager" in text


@pytest.mark.extended
def test_chart_is_a_png(bench):
    with Image.open(bench[3] / "results" / "small.png") as chart:
        assert chart.format == "PNG"
        assert chart.width == 1100 and chart.height > 300


@pytest.mark.extended
@pytest.mark.skipif(not HAS_SAM2, reason="Meta's sam2 is not installed")
def test_reference_ran_metas_code_in_its_own_process_only(bench):
    work = bench[3] / "work"
    for task in TASKS:
        result = json.loads((work / f"{task}-reference-cold.result.json").read_text())
        assert result["torchvision"] in ("torchvision", "sam2serve stand-in")


def test_bench_usage_errors_are_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("SAM2SERVE_CACHE", str(tmp_path / "cache"))  # no checkpoint there
    monkeypatch.setenv("SAM2SERVE_OFFLINE", "1")
    cases = [
        (["bench", "--modes", "baseline,turbo", "--random-weights"], "turbo"),
        (["bench", "--modes", "fast+turbo", "--random-weights"], "'turbo'"),
        (
            ["bench", "--modes", "baseline+artifacts", "--random-weights"],
            "runs the fast, furious and int8 modes",
        ),
        (["bench", "--images", str(tmp_path / "none"), "--random-weights"], "neither"),
        (["bench", "--n", "0", "--random-weights"], "--n must be an integer >= 1, got 0"),
        (["bench", "--random-weights", "--points-per-side", "0"], "--points-per-side"),
        (["bench", "--checkpoint", str(tmp_path / "x.pt")], "not found"),
        # No weights flag: the cache's checkpoint, which is not there and not fetched.
        (["bench"], "no checkpoint for model 'tiny'"),
    ]
    for argv, fragment in cases:
        stderr = io.StringIO()
        with contextlib.redirect_stderr(stderr):
            code = cli.main(argv + ["--out", str(tmp_path / "out")])
        errors = [l for l in stderr.getvalue().splitlines() if l.startswith("sam2serve: error:")]
        assert code == 2 and len(errors) == 1 and fragment in errors[0], stderr.getvalue()
        assert "Traceback" not in stderr.getvalue()
    assert not (tmp_path / "out").exists()


def test_bench_without_weights_flags_reads_the_cached_checkpoint(tmp_path, monkeypatch):
    """As --checkpoint's help says (and as run does): without --checkpoint or
    --random-weights, every row loads Meta's file from the cache's checkpoints folder."""
    from sam2serve.bench import runner

    cached = tmp_path / "cache" / "checkpoints" / "sam2.1_hiera_tiny.pt"
    cached.parent.mkdir(parents=True)
    cached.write_bytes(b"stand-in: the bench is not run")
    monkeypatch.setenv("SAM2SERVE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("SAM2SERVE_OFFLINE", "1")
    configs = []

    def stop(config):
        configs.append(config)
        raise runner.BenchError("stopped before running")

    monkeypatch.setattr(runner, "run_bench", stop)
    code = cli.main(["bench", "--task", "sps", "--modes", "baseline", "--out", str(tmp_path)])
    assert code == 2 and [config.checkpoint for config in configs] == [cached]
