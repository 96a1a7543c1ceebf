"""``sam2serve bench --task concepts-video``: the measurement of SAM 3's video predictor on
the session's tiny SAM 3 (``concepts_tiny``) over 2 frames of the sample clip, its rows
rendered as the report and the JSON; the command's one-line usage errors; and (second
tier) the whole command, each row in its own process with SAM 2.1's tracker beside it.
Nothing here asserts a duration."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest

from sam2serve import cli
from sam2serve.bench.concepts_video import (
    SAM2,
    SAM3,
    STAGES,
    ConceptsVideoConfig,
    ConceptsVideoError,
    ConceptsVideoResult,
    FrameCost,
    VideoRow,
    thresholds,
)
from sam2serve.bench.concepts_video_report import concepts_video_markdown
from sam2serve.bench.concepts_video_worker import measure_sam3
from sam2serve.bench.machine import machine_info
from sam2serve.commands.common import EXIT_OK, EXIT_USAGE
from sam2serve.runtime.concepts import video_predictor_in_mode
from sam2serve.samples import sample_clip

FRAMES = 2


@pytest.fixture(scope="module")
def sam3_costs(concepts_tiny) -> list[FrameCost]:
    config = ConceptsVideoConfig(spec=concepts_tiny.spec, frames=FRAMES, max_objects=1)
    predictor = video_predictor_in_mode(concepts_tiny, thresholds(config), mode="baseline")
    frames, _ = sample_clip(FRAMES, size=(96, 128))
    return measure_sam3(predictor, frames, config.phrase)


def test_each_frame_has_every_stage_objects_and_memory(sam3_costs):
    assert [cost.frame for cost in sam3_costs] == list(range(FRAMES))
    for cost in sam3_costs:
        assert list(cost.stages) == list(STAGES)
        assert all(seconds >= 0 for seconds in cost.stages.values())
        # a frame's wall time holds its stages (and what runs between them)
        assert cost.seconds >= sum(cost.stages.values())
        assert 0 <= cost.shown <= cost.objects <= 1  # --max-objects 1
        assert cost.records is not None and cost.records >= 1 and cost.held_mib > 0
        assert cost.rss_mib is None or cost.rss_mib > 0
    # random weights score about 0.25: the first frame's detection becomes the object
    assert sam3_costs[0].objects == 1
    # the state holds one more record per tracked frame (well inside the memory's reach)
    assert sam3_costs[1].records > sam3_costs[0].records


def _result(concepts_tiny, costs: list[FrameCost]) -> ConceptsVideoResult:
    config = ConceptsVideoConfig(
        spec=concepts_tiny.spec, modes=("baseline", "int8"), frames=FRAMES, command="test"
    )
    sam3 = VideoRow(SAM3, "baseline", "tiny", frames=costs, precisions={"backbone": "fp32"})
    sam3.peak_rss_mib = 700.0
    sam2_costs = [
        FrameCost(frame=t, seconds=0.5, objects=1, shown=1, rss_mib=800.0, held_mib=0.75)
        for t in range(FRAMES)
    ]
    sam2 = VideoRow(SAM2, "baseline", "tiny", frames=sam2_costs)
    failed = VideoRow(SAM3, "int8", "tiny", error="worker failed (exit status 1)")
    return ConceptsVideoResult(
        config=config,
        machine=machine_info(),
        clip="the sample clip",
        thresholds={"score": 0.0, "new_det": 0.2, "max_objects": 1},
        rows=[sam3, sam2, failed],
        started="2026-12-07 04:00:00 UTC",
        load_start=(1.0, 2.0, 3.0),
        load_end=(1.5, 2.0, 3.0),
        duration_s=60.0,
        niceness=10,
    )


def test_the_report_and_json_carry_every_row(concepts_tiny, sam3_costs):
    result = _result(concepts_tiny, sam3_costs)
    text = concepts_video_markdown(result)
    for line in ("- **command:** `test` (niceness 10)", "- **load average (1/5/15 min):** 1.00"):
        assert line in text
    assert "detector s/frame" in text and "association s/frame" in text
    assert f"| SAM 3 tiny baseline | backbone fp32 | 2 | {sam3_costs[-1].objects} |" in text
    assert "| SAM 2.1 tiny baseline |" in text and "worker failed (exit status 1)" in text
    per_frame = [line for line in text.splitlines() if line.startswith("| SAM 3 tiny baseline | ")]
    assert len(per_frame) == 1 + FRAMES  # the mode's row and one per frame
    data = json.loads(json.dumps(result.as_dict()))
    assert data["task"] == "concepts-video" and data["config"]["command"] == "test"
    sam3, sam2, failed = data["rows"]
    assert sam3["stage_means"] == {s: sam3_costs[1].stages[s] for s in STAGES}  # frame 1 only
    assert sam3["seconds_per_frame"] == pytest.approx(sam3_costs[1].seconds)
    assert sam2["frames_per_s"] == pytest.approx(2.0) and sam2["stage_means"] == {
        s: None for s in STAGES
    }
    assert failed["error"] and failed["frames_per_s"] is None


def test_config_checks(concepts_tiny):
    for bad, fragment in (
        ({"modes": ("reference",)}, "'reference'"),
        ({"frames": 1}, "--frames"),
        ({"phrase": " "}, "--phrase"),
        ({"score_thresh": float("nan")}, "--score-thresh"),
        ({"max_objects": 0}, "--max-objects"),
        ({"video": "/nonexistent/clip.mp4"}, "--video"),
    ):
        with pytest.raises(ConceptsVideoError, match=fragment):
            ConceptsVideoConfig(spec=concepts_tiny.spec, **bad)


def run_cli(argv: list[str]) -> tuple[int, str, str]:
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        code = cli.main(argv)
    return code, stdout.getvalue(), stderr.getvalue()


BASE = ["bench", "--task", "concepts-video", "--sam3-size", "tiny", "--random-weights"]


@pytest.mark.parametrize(
    ("flags", "fragment"),
    [
        (["--modes", "baseline,reference"], "runs the modes baseline, fast, furious, int8"),
        (["--frames", "1"], "--frames"),
        (["--phrase", ""], "--phrase is empty"),
        (["--max-objects", "0"], "--max-objects"),
        (["--score-thresh", "2"], "--score-thresh"),
        (["--video", "/nonexistent/clip.mp4"], "--video '/nonexistent/clip.mp4'"),
    ],
)
def test_usage_errors_are_one_line(tmp_path, flags, fragment):
    _assert_one_line_usage_error(tmp_path, BASE + flags, fragment)


def _assert_one_line_usage_error(tmp_path: Path, argv: list[str], fragment: str) -> None:
    code, _, stderr = run_cli(argv + ["--out", str(tmp_path / "out")])
    errors = [line for line in stderr.splitlines() if line.startswith("sam2serve: error:")]
    assert code == EXIT_USAGE and len(errors) == 1 and fragment in errors[0], stderr
    assert "Traceback" not in stderr
    assert not (tmp_path / "out").exists()


def test_weights_errors_are_one_line(tmp_path):
    task = ["bench", "--task", "concepts-video"]
    # SAM 3's reduced size exists as random weights only
    _assert_one_line_usage_error(tmp_path, task + ["--sam3-size", "tiny"], "random-weights only")
    # SAM 2.1's rows read --checkpoint (SAM 3's weights are --sam3-weights)
    missing = ["--checkpoint", "/nonexistent/sam2.pt"]
    _assert_one_line_usage_error(tmp_path, task + missing, "--checkpoint file not found")


@pytest.mark.extended
def test_the_command_writes_its_report_and_json(tmp_path):
    out = tmp_path / "results"
    argv = BASE + ["--frames", "2", "--max-objects", "1", "--modes", "baseline"]
    code, stdout, stderr = run_cli(argv + ["--out", str(out), "--name", "cv"])
    assert code == EXIT_OK, stderr
    assert "Traceback" not in stderr
    text = Path(out / "cv.md").read_text()
    assert "- **command:** `sam2serve bench --task concepts-video" in text
    assert "## Per mode" in stdout  # the tables are printed too
    data = json.loads((out / "cv.json").read_text())
    rows = {(row["model"], row["mode"]): row for row in data["rows"]}
    assert set(rows) == {(SAM3, "baseline"), (SAM2, "baseline")}
    sam3, sam2 = rows[SAM3, "baseline"], rows[SAM2, "baseline"]
    for row in (sam3, sam2):
        assert row["error"] is None and len(row["frames"]) == 2
        assert row["frames_per_s"] > 0 and row["peak_rss_mib"] > 0 and row["load_s"] > 0
    assert set(sam3["stage_means"]) == set(STAGES)
    assert sam3["precisions"]["tracker memory_attention"] == "fp32"
    # SAM 2.1 tracks as many objects as SAM 3 ended with
    assert sam2["frames"][-1]["objects"] == max(sam3["frames"][-1]["objects"], 1)
