"""``sam2serve bench --task concepts`` on the tiny SAM 3 (the session's ``concepts_tiny``):
the rows run and carry every stage, the FLOP count and the report; the int8 and furious
modes build from a copy of the same weights without touching them; the agreement rule on a
constructed case; the command's one-line usage errors. Nothing here asserts a duration."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import numpy as np
import pytest
import torch

from sam2serve import cli
from sam2serve.bench.concepts import (
    STAGES,
    ConceptsBenchConfig,
    ConceptsBenchError,
    HostPeak,
    parse_host_peak,
    phrase_flops,
    run_concepts_bench,
)
from sam2serve.bench.concepts_report import concepts_csv, concepts_markdown
from sam2serve.concepts.agreement import agreement, mask_iou
from sam2serve.concepts.engine import Instance
from sam2serve.runtime.concepts import apply_concepts_mode

RESULTS = Path(__file__).resolve().parents[2] / "bench" / "results"


def _image(seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (40, 56, 3), dtype=np.uint8)


@pytest.fixture(scope="module")
def bench_result(concepts_tiny):
    config = ConceptsBenchConfig(
        spec=concepts_tiny.spec,
        modes=("baseline", "int8", "furious"),
        images=(("noise", _image()),),
        phrase_counts=(1, 2),
        repeats=1,
        warmup=0,
        top_k=5,
        host_peak=HostPeak(fp32=100.0, int8=400.0, bf16=50.0, bf16_emulated=True),
        native_bf16=False,  # furious: built and run for its accuracy, not timed
        command="test",
    )
    return run_concepts_bench(config, concepts_tiny)


def test_rows_carry_every_stage(bench_result):
    rows = {(row.mode, row.phrases): row for row in bench_result.rows}
    assert set(rows) == {(m, n) for m in ("baseline", "int8", "furious") for n in (1, 2)}
    for mode in ("baseline", "int8"):
        for phrases in (1, 2):
            row = rows[mode, phrases]
            assert list(row.stages_ms) == list(STAGES)
            assert all(len(v) == 1 and min(v) >= 0 for v in row.stages_ms.values())
            assert len(row.totals_ms()) == 1 and row.ran
        # the image stages are one measurement shared by the phrase counts
        assert rows[mode, 1].stages_ms["backbone"] == rows[mode, 2].stages_ms["backbone"]
    for phrases in (1, 2):
        furious = rows["furious", phrases]
        assert not furious.timed and furious.ran and "no bf16" in furious.note
        for mode in ("int8", "furious"):
            row = rows[mode, phrases]
            assert row.compared == phrases * 5  # top 5 of each phrase, one image
            assert 0.0 <= row.miou <= 1.0 and row.max_score_diff >= 0.0
    assert rows["baseline", 1].miou is None
    # FLOPs: the backbone once, text and detector per phrase count, twice the prompts
    # cost more than one
    flops = bench_result.flops
    assert flops["backbone", 0] > 0
    assert flops["detector", 2] > flops["detector", 1] > 0
    assert flops["text", 2] > flops["text", 1] > 0


def test_phrase_flops_scale_with_the_phrases(concepts_tiny):
    """The bench counts the phrase stages for one phrase and scales them: N phrases are N
    prompts of one batch (tokens padded to 32, the image's features expanded)."""
    encoding = concepts_tiny.encode([_image(2)])[0]
    one = phrase_flops(concepts_tiny, encoding, 1)
    three = phrase_flops(concepts_tiny, encoding, 3)
    assert one[0] > 0 and one[1] > 0
    assert three == pytest.approx((3 * one[0], 3 * one[1]), rel=1e-9)


def test_report_names_stages_rates_and_untimed_rows(bench_result):
    text = concepts_markdown(bench_result)
    for title in ("preprocess + upload", "vision backbone", "text encoder", "detector + heads"):
        assert title in text
    assert "post-processing" in text and "% of fp32 peak" in text and "% of int8 peak" in text
    assert "not measured: no bf16 on this host" in text
    assert "load average" in text and "`test`" in text
    lines = concepts_csv(bench_result).splitlines()
    assert lines[0].split(",")[:8] == ["mode", "phrases", "repeat", *STAGES]
    assert len(lines) == 1 + 2 * 2 + 2  # two timed modes x 2 counts x 1 repeat + furious


def test_bench_modes_copy_the_model(concepts_tiny):
    """The bench's modes are copies (copy=True): the loaded model keeps answering in fp32;
    furious converts every part, int8 quantises the ViT's Linear layers and converts the
    rest (tests/runtime/test_concepts_modes.py checks the product paths' in-place rule)."""
    from torch.ao.nn.quantized.dynamic import Linear as DynamicLinear

    bf16 = torch.bfloat16
    furious = apply_concepts_mode(concepts_tiny, "furious", reduced=bf16, copy=True)
    assert furious.model is not concepts_tiny.model
    assert furious.tokenize is concepts_tiny.tokenize
    assert {p.dtype for p in furious.model.parameters()} == {bf16}
    int8 = apply_concepts_mode(concepts_tiny, "int8", reduced=bf16, copy=True).model
    backbone = int8.vision_encoder.backbone
    assert any(isinstance(m, DynamicLinear) for m in backbone.modules())
    assert not any(type(m) is torch.nn.Linear for m in backbone.modules())
    assert {p.dtype for p in int8.detr_encoder.parameters()} == {bf16}
    assert {p.dtype for p in int8.text_encoder.parameters()} == {bf16}
    assert {p.dtype for p in int8.vision_encoder.neck.parameters()} == {bf16}
    original = concepts_tiny.model.vision_encoder.backbone
    assert any(type(m) is torch.nn.Linear for m in original.modules())
    assert all(p.dtype == torch.float32 for p in concepts_tiny.model.parameters())
    with pytest.raises(ValueError, match="'turbo'"):
        apply_concepts_mode(concepts_tiny, "turbo", copy=True)


def _instance(mask: np.ndarray, score: float) -> Instance:
    return Instance(mask=mask, box=(0.0, 0.0, 1.0, 1.0), score=score)


def test_agreement_on_a_constructed_case():
    top = np.zeros((4, 4), bool)
    top[0:2] = True  # 8 pixels
    middle = np.zeros((4, 4), bool)
    middle[1:3] = True  # 8 pixels, 4 shared with top
    left = np.zeros((4, 4), bool)
    left[:, 0] = True
    empty = np.zeros((4, 4), bool)
    assert mask_iou(top, middle) == pytest.approx(4 / 12)
    assert mask_iou(empty, empty) == 1.0
    reference = [_instance(top, 0.9), _instance(left, 0.1), _instance(top, 0.5)]
    # query 0 moved down a row, query 1 (lowest reference score) wholly wrong, query 2 same
    other = [_instance(middle, 0.8), _instance(empty, 0.7), _instance(top, 0.45)]
    result = agreement(reference, other, top_k=2)  # queries 0 and 2 by reference score
    assert result.compared == 2
    assert result.miou == pytest.approx((4 / 12 + 1.0) / 2)
    assert result.max_score_diff == pytest.approx(0.1)
    every = agreement(reference, other, top_k=10)
    assert every.compared == 3 and every.miou == pytest.approx((4 / 12 + 0.0 + 1.0) / 3)
    assert every.max_score_diff == pytest.approx(0.6)
    with pytest.raises(ValueError, match="query index"):
        agreement(reference, other[:2], top_k=2)
    with pytest.raises(ValueError, match="top_k"):
        agreement(reference, other, top_k=0)


def test_host_peak_and_config_checks(concepts_tiny):
    peak = parse_host_peak((RESULTS / "host_peak_cpu_avx512vnni.txt").read_text())
    assert peak.fp32 and peak.int8 and peak.bf16 and peak.bf16_emulated
    with pytest.raises(ConceptsBenchError, match="GFLOP/s"):
        parse_host_peak("nothing here")
    image = (("x", _image()),)
    for bad, fragment in (
        ({"modes": ("turbo",)}, "'turbo'"),
        ({"phrase_counts": (0,)}, "phrase counts"),
        ({"phrase_counts": (11,)}, "phrase counts"),
        ({"repeats": 0}, "repeats"),
        ({"score_thresh": 2.0}, "score_thresh"),
    ):
        with pytest.raises(ConceptsBenchError, match=fragment):
            ConceptsBenchConfig(spec=concepts_tiny.spec, images=image, **bad)


def test_concepts_usage_errors_are_one_line(tmp_path):
    base = ["bench", "--task", "concepts", "--random-weights", "--sam3-size", "tiny"]
    cases = [
        (base + ["--modes", "baseline,reference"], "runs the modes baseline, fast, furious, int8"),
        (base + ["--phrases", "1,x"], "--phrases"),
        (base + ["--phrases", "1,11"], "phrase counts must be 1..10"),
        (base + ["--host-peak", str(tmp_path / "none.txt")], "--host-peak"),
        (["bench", "--task", "concepts", "--sam3-size", "tiny"], "random-weights only"),
        (["bench", "--task", "concepts", "--checkpoint", "x.pt"], "--sam3-weights"),
    ]
    for argv, fragment in cases:
        stderr = io.StringIO()
        with contextlib.redirect_stderr(stderr):
            code = cli.main(argv + ["--out", str(tmp_path / "out")])
        errors = [l for l in stderr.getvalue().splitlines() if l.startswith("sam2serve: error:")]
        assert code == 2 and len(errors) == 1 and fragment in errors[0], stderr.getvalue()
        assert "Traceback" not in stderr.getvalue()
    assert not (tmp_path / "out").exists()
