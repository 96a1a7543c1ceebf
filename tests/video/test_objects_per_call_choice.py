"""How many objects one tracked frame step batches, per CPU class: the tracker built from
a mode reads its class's row and its precision's column, every class has a row, an
accelerator batches every object, and docs/benchmarks.md's table says what the code
does. Hosts are made from fake /proc/cpuinfo flags, never this CPU."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import torch
from small_tracker import small_tiny_tracker

from sam2serve.engine.video.predictor import VideoPredictor, default_objects_per_call
from sam2serve.runtime import video as runtime_video
from sam2serve.runtime.auto_table import (
    AUTO_TABLE,
    TRACKER_OBJECTS_TABLE,
    TrackerObjectsRow,
    tracker_objects_row,
)
from sam2serve.runtime.host import HostIsa, parse_cpuinfo
from sam2serve.runtime.spec import RuntimeSpec
from sam2serve.runtime.video import objects_per_call_for, video_predictor_for

DOCS = Path(__file__).resolve().parents[2] / "docs" / "benchmarks.md"
SECTION = "### Objects per call by host class"

HOSTS = {
    "amx": "avx2 avx512f avx512_bf16 avx512_vnni amx_tile amx_bf16 amx_int8",
    "avx512_bf16": "avx2 avx512f avx512_bf16 avx512_vnni",
    "avx512_vnni": "avx2 avx512f avx512_vnni",
    "avx512": "avx2 avx512f",
    "avx2": "avx2 fma",
    "other": "sse4_2",
}


def _host(isa_class: str) -> HostIsa:
    isa = parse_cpuinfo(f"processor : 0\nflags : {HOSTS[isa_class]}\n")
    assert isa.isa_class == isa_class
    return isa


def test_one_row_per_class_as_the_backend_table():
    classes = [row.isa_class for row in TRACKER_OBJECTS_TABLE]
    assert sorted(classes) == sorted(HOSTS) == sorted(row.isa_class for row in AUTO_TABLE)
    assert all(row.fp32 >= 1 and row.bf16 >= 1 for row in TRACKER_OBJECTS_TABLE)
    assert tracker_objects_row("no-such-class") == tracker_objects_row("other")


@pytest.mark.parametrize("isa_class", sorted(HOSTS))
def test_a_cpu_tracker_gets_its_class_row_and_precision(isa_class):
    row = tracker_objects_row(isa_class)
    for bf16 in (False, True):
        assert objects_per_call_for("cpu", bf16, _host(isa_class)) == row.objects_per_call(bf16)
    assert row.objects_per_call(True) == row.bf16
    assert row.objects_per_call(False) == row.fp32


def test_an_accelerator_batches_every_object():
    for device in ("cuda", "cuda:1"):
        assert objects_per_call_for(device, True, _host("amx")) is None
    # None leaves it to the predictor's device default: every object in one call.
    assert default_objects_per_call(torch.device("cuda")) == sys.maxsize


def test_the_rows_say_what_they_rest_on():
    measured = tracker_objects_row("avx512_bf16")
    assert measured.measured is not None
    amx = tracker_objects_row("amx")
    assert amx.measured is None and "not measured" in amx.why and "analogy" in amx.why
    for row in TRACKER_OBJECTS_TABLE:
        assert (row.measured is None) == ("not measured" in row.why), row.isa_class


def test_the_mode_builds_its_tracker_with_the_row(monkeypatch):
    """The row the tracker is built with, by precision: a stand-in row whose columns
    differ, so a tracker that ignored the table or read the wrong column fails."""
    seen: list[str] = []

    def row(isa_class: str) -> TrackerObjectsRow:
        seen.append(isa_class)
        return TrackerObjectsRow(isa_class, 2, 5, None, "not measured: a test's row")

    monkeypatch.setattr(runtime_video, "tracker_objects_row", row)
    monkeypatch.setattr(runtime_video, "host_isa", lambda: _host("amx"))
    furious = video_predictor_for(
        small_tiny_tracker(seed=3), RuntimeSpec(mode="furious", dtype="bfloat16")
    )
    baseline = video_predictor_for(small_tiny_tracker(seed=3), RuntimeSpec(mode="baseline"))
    assert (furious.objects_per_call, baseline.objects_per_call) == (5, 2)
    assert seen == ["amx", "amx"]


def test_by_hand_a_cpu_predictor_keeps_one_per_call():
    assert VideoPredictor(small_tiny_tracker(seed=3)).objects_per_call == 1


def _docs_rows() -> dict[str, list[str]]:
    section = DOCS.read_text().split(SECTION, 1)[1].split("\n#", 1)[0]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 4 and re.fullmatch(r"`\w+`", cells[0]):
            rows[cells[0].strip("`")] = cells[1:4]
    return rows


def test_the_docs_table_is_the_code_table():
    rows = _docs_rows()
    assert sorted(rows) == sorted(row.isa_class for row in TRACKER_OBJECTS_TABLE)
    for row in TRACKER_OBJECTS_TABLE:
        fp32, bf16, measured = rows[row.isa_class]
        assert [fp32, bf16] == [str(row.fp32), str(row.bf16)], row.isa_class
        assert ("not measured" in measured) == (row.measured is None), row.isa_class
