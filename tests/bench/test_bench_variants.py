"""The bench's AMG variants and its Hugging Face peer rows, on real workers, small: the tiny
model with random weights, one 128 x 128 photo, a 4 x 4 AMG grid, tasks AMG and SPS, modes
baseline and hf.

Checked: variant keep-all keeps masks where the default keeps none (random weights), each
variant gets its own baseline and table; transformers' Sam2Model on the converted weights
gives the baseline's SPS masks; unknown variant names and missing peers are clear. Nothing
here asserts a duration."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import pytest
import skimage.data
from PIL import Image

from sam2serve import cli
from sam2serve.bench import hf_peer, runner
from sam2serve.bench.report import csv_text, markdown
from sam2serve.bench.runner import BenchConfig, RunResult
from sam2serve.bench.variants import AMG_VARIANTS, parse_variants
from sam2serve.engine.amg import AMGParams

HAS_TRANSFORMERS = hf_peer.unavailable(hf_peer.HF) is None
MODES = ("baseline", "hf") if HAS_TRANSFORMERS else ("baseline",)
# Sam2Model on the same weights and the same pixels: its masks differ from the baseline's
# only where float rounding (other kernels, other summation orders) moves a logit across
# 0. Measured (CPU, tiny, random weights): SPS mIoU 1.0 with every mask identical, here
# and on two sample photos; MPS with 64 prompts on those photos mIoU 1.0000 (4 places),
# 122 of 128 masks identical. The bound leaves room for edge pixels on another CPU and is
# far above what a wrong conversion gives (a swapped tensor changes the masks entirely).
HF_MIN_MIOU = 0.99


@pytest.fixture(scope="module")
def bench(tmp_path_factory):
    import torch

    from sam2serve.checkpoint import random_state_dict
    from sam2serve.config import get_config

    root = tmp_path_factory.mktemp("variants")
    images = root / "images"
    images.mkdir()
    Image.fromarray(skimage.data.astronaut()[::4, ::4]).save(images / "astronaut.png")
    # Random image-path weights written here, not by the bench's checkpoint worker (which
    # adds Meta's video tensors for the reference row): one process fewer.
    checkpoint = root / "random_tiny.pt"
    torch.save({"model": random_state_dict(get_config("tiny"), 0)}, checkpoint)
    config = BenchConfig(
        tasks=("amg", "sps"),
        model="tiny",
        modes=MODES,
        images=str(images),
        n=1,
        checkpoint=checkpoint,
        random_weights=False,
        seed=0,
        device="cpu",
        amg_params=AMGParams(points_per_side=4),
        out_dir=root / "out",
        name="variants",
        point_prompts="grid",
        command="sam2serve bench (test)",
        work_dir=root / "work",
        timeout_s=600,
        amg_variants=("default", "keep-all"),
    )
    return runner.run_bench(config)


def rows(result, task, variant=""):
    return {run.mode: run for run in result.runs if run.task == task and run.variant == variant}


@pytest.mark.extended
def test_keep_all_keeps_masks_that_the_default_filters_out(bench):
    default, keep_all = rows(bench, "amg", "default"), rows(bench, "amg", "keep-all")
    assert set(default) == set(keep_all) == {"baseline"}  # the peer runs the point tasks only
    assert default["baseline"].ok and keep_all["baseline"].ok
    # Random weights predict IoUs near 0.5, under the default pred_iou_thresh 0.8.
    assert default["baseline"].masks_per_image == 0
    assert keep_all["baseline"].masks_per_image >= 1
    # With masks kept, post-processing and RLE have work to do.
    assert keep_all["baseline"].stages_ms["rle"] > 0
    assert (
        keep_all["baseline"].stages_ms["postprocess"] > default["baseline"].stages_ms["postprocess"]
    )


@pytest.mark.extended
def test_report_has_a_table_per_variant(bench):
    text = markdown(bench)
    assert "## AMG (automatic mask generation)\n" in text
    assert "## AMG (automatic mask generation), variant keep-all" in text
    assert "keeps next to no masks" in text
    lines = csv_text(bench).splitlines()
    header = lines[0].split(",")
    variants = [line.split(",")[header.index("variant")] for line in lines[1:]]
    tasks = [line.split(",")[header.index("task")] for line in lines[1:]]
    assert sorted(zip(tasks, variants, strict=True))[:2] == [
        ("amg", "default"),
        ("amg", "keep-all"),
    ]
    assert "amg keep-all" in text  # the stage table names the variant


@pytest.mark.extended
@pytest.mark.skipif(not HAS_TRANSFORMERS, reason="transformers with Sam2Model not installed")
def test_hf_peer_gives_the_baselines_masks(bench):
    sps = rows(bench, "sps")
    assert sps["hf"].ok, sps["hf"].error
    assert sps["hf"].masks_per_image == 1
    accuracy = sps["hf"].accuracy
    assert accuracy is not None and accuracy.fails == 0
    assert accuracy.miou is not None and accuracy.miou >= HF_MIN_MIOU


def test_hf_state_dict_fills_every_parameter_of_sam2model(tmp_path):
    if not HAS_TRANSFORMERS:
        pytest.skip("transformers with Sam2Model not installed")
    import torch

    from sam2serve.checkpoint import random_state_dict
    from sam2serve.config import get_config

    ours = random_state_dict(get_config("tiny"), 1)
    torch.save({"model": ours}, tmp_path / "ours.pt")
    # Raises naming any parameter of Sam2Model left unfilled or any key it does not have.
    converted = hf_peer.load_hf_model("tiny", tmp_path / "ours.pt").state_dict()
    points = converted["prompt_encoder.point_embed.weight"]  # Meta's 4 embeddings, stacked
    for i in range(4):
        assert torch.equal(points[i], ours[f"sam_prompt_encoder.point_embeddings.{i}.weight"][0])
    assert torch.equal(
        converted["vision_encoder.backbone.blocks.3.mlp.proj_out.weight"],
        ours["image_encoder.trunk.blocks.3.mlp.layers.1.weight"],
    )
    assert torch.equal(
        converted["mask_decoder.iou_prediction_head.layers.0.weight"],
        ours["sam_mask_decoder.iou_prediction_head.layers.1.weight"],
    )


def test_variant_names_are_checked():
    assert parse_variants("keep-all, default,keep-all") == ("keep-all", "default")
    with pytest.raises(ValueError, match="unknown AMG variant\\(s\\) 'all'.*default, keep-all"):
        parse_variants("default,all")
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr):
        code = cli.main(["bench", "--random-weights", "--amg-variants", "keepall"])
    errors = [line for line in stderr.getvalue().splitlines() if "error:" in line]
    assert code == 2 and len(errors) == 1 and "'keepall'" in errors[0]
    assert "Traceback" not in stderr.getvalue()
    assert set(AMG_VARIANTS) == {"default", "keep-all"}


def fake_worker(config, work, task, mode, cache, checkpoint, images, prompts, variant=""):
    from sam2serve.bench import metrics

    run = RunResult(task=task, mode=mode, label=mode, cache=cache)
    run.stats = metrics.latency_stats([1.0])
    run.ready_s, run.peak_mem_mb, run.masks_per_image = 1.0, 1.0, 0.0
    run.stages_ms = dict.fromkeys(runner.STAGES, 1.0)
    run.records = [[] for _ in images]
    return run


def test_missing_peer_is_a_skipped_row_with_a_note(tmp_path, monkeypatch):
    monkeypatch.setattr(runner, "_run_worker", fake_worker)
    monkeypatch.setattr(runner, "_write_checkpoint", lambda config, work: work / "ckpt.pt")
    reason = hf_peer.Unavailable("transformers not installed", "install transformers")
    monkeypatch.setattr(hf_peer, "unavailable", lambda mode: reason)
    config = BenchConfig(
        tasks=("amg", "sps", "mps"),
        model="tiny",
        modes=("baseline", "hf", "hf-processor"),
        images="samples",
        n=1,
        checkpoint=None,
        random_weights=True,
        seed=0,
        device="cpu",
        amg_params=AMGParams(pred_iou_thresh=0.0, stability_score_thresh=0.0),
        out_dir=tmp_path / "out",
        name="x",
        work_dir=tmp_path / "work",
        amg_variants=("default", "keep-all"),
    )
    result = runner.run_bench(config)
    # Those AMG flags already keep every mask: keep-all would repeat the default's run.
    assert {run.variant for run in result.runs if run.task == "amg"} == {"default"}
    assert any("variant keep-all was not run" in note for note in result.notes)
    skipped = [(run.task, run.mode) for run in result.runs if run.skipped]
    assert skipped == [(t, m) for t in ("sps", "mps") for m in ("hf", "hf-processor")]
    assert all(
        run.error == "not run: transformers not installed" for run in result.runs if run.skipped
    )
    assert "install transformers" in markdown(result)


def test_every_worker_gets_its_variants_parameters(tmp_path, monkeypatch):
    import json
    import subprocess

    specs = []

    def start_worker(args, env, timeout_s):  # reads the spec the worker would get
        specs.append(json.loads(Path(args[1]).read_text(encoding="utf-8")))
        return subprocess.CompletedProcess(args, 1)

    monkeypatch.setattr(runner, "_start_worker", start_worker)
    monkeypatch.setattr(runner, "_write_checkpoint", lambda config, work: work / "ckpt.pt")
    config = BenchConfig(
        tasks=("amg",),
        model="tiny",
        modes=("baseline",),
        images="samples",
        n=1,
        checkpoint=None,
        random_weights=True,
        seed=0,
        device="cpu",
        amg_params=AMGParams(points_per_side=8),
        out_dir=tmp_path / "out",
        name="x",
        work_dir=tmp_path / "work",
        amg_variants=("default", "keep-all"),
    )
    result = runner.run_bench(config)
    assert [run.variant for run in result.runs] == ["default", "keep-all"]
    default, keep_all = (AMGParams.from_dict(spec["amg_params"]) for spec in specs)
    assert default == AMGParams(points_per_side=8)
    assert (keep_all.pred_iou_thresh, keep_all.stability_score_thresh) == (0.0, 0.0)
    assert keep_all == default.replace(pred_iou_thresh=0.0, stability_score_thresh=0.0)
