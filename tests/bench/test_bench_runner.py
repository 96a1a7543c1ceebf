"""The runner's plan, with the worker processes replaced by fakes: the baseline runs
first, prompts come from its AMG masks (largest first) or from a grid, a missing sam2
becomes a clear row and note, and every row is compared with the baseline."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from pycocotools import mask as mask_utils

from sam2serve.bench import metrics, runner
from sam2serve.bench.report import CSV_COLUMNS, csv_text, markdown
from sam2serve.bench.runner import BenchConfig, BenchError, BenchImage, RunResult
from sam2serve.engine.amg import AMGParams
from sam2serve.runtime.host import host_isa


def coco(mask: np.ndarray) -> dict:
    encoded = mask_utils.encode(np.asfortranarray(mask.astype(np.uint8)))
    return {"size": list(encoded["size"]), "counts": encoded["counts"].decode()}


def config(tmp_path: Path, **changes) -> BenchConfig:
    values = {
        "tasks": ("amg", "sps", "mps"),
        "model": "tiny",
        "modes": ("fast", "reference"),
        "images": "samples",
        "n": 3,
        "checkpoint": None,
        "random_weights": True,
        "seed": 0,
        "device": "cpu",
        "amg_params": AMGParams(points_per_side=4),
        "out_dir": tmp_path / "out",
        "name": "test",
        "mps_prompts": 9,
        "command": "sam2serve bench --test",
        "work_dir": tmp_path / "work",
    }
    values.update(changes)
    return BenchConfig(**values)


class FakeWorkers:
    """Records every run; AMG finds two boxes per image (the big one second)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, str, object]] = []

    def __call__(self, config, work, task, mode, cache, checkpoint, images, prompts, variant=""):
        self.calls.append((task, mode, cache, prompts))
        run = RunResult(task=task, mode=mode, label=mode, cache=cache)
        records = []
        for image in images:
            small = np.zeros((image.height, image.width), dtype=bool)
            small[10:20, 10:20] = True
            big = np.zeros_like(small)
            big[50:150, 100:300] = True
            masks = [small, big] if task == "amg" else [big] * len(prompts[0])
            records.append([{"segmentation": coco(m), "area": int(m.sum())} for m in masks])
        run.stats = metrics.latency_stats([100.0] * len(images))
        run.ready_s, run.peak_mem_mb = 1.0, 500.0
        run.masks_per_image = float(np.mean([len(r) for r in records]))
        run.stages_ms = dict.fromkeys(runner.STAGES, 10.0)
        run.records = records
        return run


@pytest.fixture
def fake_workers(monkeypatch):
    fake = FakeWorkers()
    monkeypatch.setattr(runner, "_run_worker", fake)
    monkeypatch.setattr(runner, "_write_checkpoint", lambda config, work: work / "ckpt.pt")
    return fake


def test_baseline_first_and_missing_sam2_is_a_clear_row(tmp_path, fake_workers, monkeypatch):
    monkeypatch.setattr(runner, "missing_requirements", lambda: ["sam2==1.1.0"])
    result = runner.run_bench(config(tmp_path))
    assert [(c[0], c[1]) for c in fake_workers.calls] == [
        (task, mode) for task in ("amg", "sps", "mps") for mode in ("baseline", "fast")
    ]
    reference_rows = [r for r in result.runs if r.mode == "reference"]
    assert len(reference_rows) == 3
    assert all(r.error == "not run: sam2 not installed" for r in reference_rows)
    assert all(r.skipped and not r.ok for r in reference_rows)  # skipped: not a failure
    assert not any(r.skipped for r in result.runs if r.mode != "reference")
    assert any("pip install" in note and "sam2" in note for note in result.notes)
    assert any("baseline was added" in note for note in result.notes)
    text = markdown(result)
    assert "not run: sam2 not installed" in text and "pip install" in text
    lines = csv_text(result).splitlines()
    assert lines[0].split(",") == list(CSV_COLUMNS)
    assert len(lines) == 1 + 3 * 3
    # The host's ISA is on the machine line and on every row: two CPUs of one name differ.
    isa = host_isa().describe()
    assert f"({isa}; torch CPU capability" in text
    assert all(
        line.endswith(f",{isa},{torch.backends.cpu.get_cpu_capability()}") for line in lines[1:]
    )


def test_random_weights_use_grid_prompts_and_say_so(tmp_path, fake_workers, monkeypatch):
    monkeypatch.setattr(runner, "missing_requirements", list)
    result = runner.run_bench(config(tmp_path, modes=("baseline", "fast")))
    prompts = {task: p for task, mode, _, p in fake_workers.calls if mode == "baseline"}
    assert prompts["amg"] is None
    for image, sps, mps in zip(result.images, prompts["sps"], prompts["mps"], strict=True):
        assert sps == [[image.width / 2, image.height / 2]]
        assert len(mps) == 9
        assert all(0 < x < image.width and 0 < y < image.height for x, y in mps)
    assert "grid" in result.prompts["mps"] and "random weights" in result.prompts["mps"]
    assert "9 grid points" in markdown(result)


def test_prompts_from_the_baseline_amg_masks(tmp_path, fake_workers, monkeypatch):
    monkeypatch.setattr(runner, "missing_requirements", list)
    result = runner.run_bench(config(tmp_path, modes=("baseline",), point_prompts="amg"))
    prompts = {task: p for task, mode, _, p in fake_workers.calls if mode == "baseline"}
    for sps, mps in zip(prompts["sps"], prompts["mps"], strict=True):
        assert len(mps) == 2
        (x, y), (x_small, y_small) = mps  # the big box first, then the small one
        assert 100 <= x < 300 and 50 <= y < 150
        assert 10 <= x_small < 20 and 10 <= y_small < 20
        assert sps == mps[:1]
    assert "largest baseline AMG mask" in result.prompts["sps"]
    for run in result.runs:
        assert run.accuracy is not None and run.accuracy.miou == 1.0 and run.accuracy.fails == 0


def test_point_tasks_alone_still_run_the_baseline_amg(tmp_path, fake_workers, monkeypatch):
    monkeypatch.setattr(runner, "missing_requirements", list)
    result = runner.run_bench(
        config(tmp_path, tasks=("sps",), modes=("baseline",), point_prompts="amg")
    )
    assert [(c[0], c[1]) for c in fake_workers.calls] == [("amg", "baseline"), ("sps", "baseline")]
    assert [r.task for r in result.runs] == ["sps"]
    assert any("not reported" in note for note in result.notes)


def test_images_cycle_to_n(tmp_path):
    images = runner.prepare_images("samples", 6, tmp_path)
    names = [image.name for image in images]
    samples = ["astronaut.png", "coffee.png", "chelsea.png", "rocket.png"]
    assert names == samples + samples[:2]
    assert all(image.path.is_file() for image in images)
    assert (images[2].height, images[2].width) == (300, 451)


def test_bad_inputs_are_bench_errors(tmp_path, monkeypatch):
    monkeypatch.setattr(runner, "missing_requirements", list)
    with pytest.raises(BenchError, match="unknown mode\\(s\\) 'turbo'"):
        runner.run_bench(config(tmp_path, modes=("turbo",)))
    with pytest.raises(BenchError, match="not found"):
        runner.run_bench(config(tmp_path, random_weights=False, checkpoint=tmp_path / "missing.pt"))
    with pytest.raises(BenchError, match="neither 'samples' nor a directory"):
        runner.prepare_images(str(tmp_path / "nowhere"), 2, tmp_path)
    (tmp_path / "empty").mkdir()
    with pytest.raises(BenchError, match="no image files"):
        runner.prepare_images(str(tmp_path / "empty"), 2, tmp_path)


def test_grid_prompts_are_amg_grid_cell_centres():
    image = BenchImage(Path("x.png"), "x.png", height=100, width=200)
    points = runner.grid_prompts(image, "mps", 4)
    assert points == [[50.0, 25.0], [150.0, 25.0], [50.0, 75.0], [150.0, 75.0]]
    assert len(runner.grid_prompts(image, "mps", 5)) == 5  # the first 5 of a 3 x 3 grid
    assert runner.grid_prompts(image, "sps", 64) == [[100.0, 50.0]]


def test_auto_rows_run_and_are_named_as_what_auto_picks_here(tmp_path, fake_workers, monkeypatch):
    from sam2serve.runtime.backend_choice import auto_backend

    monkeypatch.setattr(runner, "missing_requirements", list)
    result = runner.run_bench(config(tmp_path, tasks=("sps",), modes=("furious+auto",)))
    picked = f"furious+{auto_backend('furious', 'cpu')}"
    assert [(task, mode) for task, mode, _, _ in fake_workers.calls] == [
        ("sps", "baseline"),
        ("sps", picked),
    ]
    assert any(note.startswith(f"furious+auto ran as {picked}") for note in result.notes)
