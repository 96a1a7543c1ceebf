"""The video bench's objects-per-call column: each row says how many objects its frame step
batched (ours: the tracker's setting, at most the scenario's objects; Meta's: one), in the
Markdown table and the CSV; a row that did not say (an older result) reads "-" and empty.
Rows without a worker: nothing here runs a tracker."""

from __future__ import annotations

import csv
import io
from pathlib import Path

from sam2serve.bench.machine import machine_info
from sam2serve.bench.metrics import latency_stats
from sam2serve.bench.runner import BenchConfig
from sam2serve.bench.video import VideoBenchResult, VideoRun, object_prompts, prepare_clip
from sam2serve.bench.video_reference import MetaVideoTracker
from sam2serve.bench.video_report import video_csv_text, video_markdown
from sam2serve.engine.amg import AMGParams


def _result(tmp_path: Path, per_call: dict[str, int | None]) -> VideoBenchResult:
    config = BenchConfig(
        tasks=(),
        model="tiny",
        modes=tuple(per_call),
        images="samples",
        n=None,
        checkpoint=None,
        random_weights=True,
        seed=0,
        device="cpu",
        amg_params=AMGParams(),
        out_dir=tmp_path,
        name="x",
        command="sam2serve bench --task video",
        video_objects=(8,),
    )
    clip = prepare_clip("sample", 2, tmp_path)
    runs = []
    for mode, n in per_call.items():
        run = VideoRun(8, mode, "float32", latency_stats([900.0, 20_000.0]), 3.0, 10.0, 5_000.0)
        run.peak_mem_mb, run.objects_bytes, run.frames_bytes = 900.0, 2**20, 2**20
        run.objects_per_call = n
        runs.append(run)
    return VideoBenchResult(
        config,
        machine_info(),
        clip,
        {8: object_prompts(8, clip)},
        runs,
        "random",
        [],
        (0.0, 0.0, 0.0),
        (0.0, 0.0, 0.0),
        "now",
        1.0,
    )


def test_each_row_says_its_objects_per_call(tmp_path):
    result = _result(tmp_path, {"baseline": 1, "reference": 1, "furious": 3, "fast": None})
    lines = video_markdown(result).splitlines()
    header = next(line for line in lines if line.startswith("| mode |"))
    column = [c.strip() for c in header.strip("|").split("|")].index("objects/call")
    cells = {
        cols[0]: cols[column]
        for line in lines
        if (cols := [c.strip() for c in line.strip("|").split("|")])[0]
        in ("baseline", "reference", "furious", "fast")
    }
    assert cells == {"baseline": "1", "reference": "1", "furious": "3", "fast": "-"}
    table = list(csv.DictReader(io.StringIO(video_csv_text(result))))
    assert [r["objects_per_call"] for r in table] == ["1", "1", "3", ""]


def test_meta_steps_each_object_alone():
    assert MetaVideoTracker.objects_per_call == 1
