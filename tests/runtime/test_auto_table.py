"""``--backend auto`` per CPU class: the chooser reads the table, the table covers every
class, and docs/benchmarks.md's 'Backend auto' table says what the code does. The hosts
are made from fake /proc/cpuinfo flags, never this CPU."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from sam2serve.runtime.auto_table import AUTO_TABLE, auto_row
from sam2serve.runtime.backend_choice import auto_backend
from sam2serve.runtime.host import parse_cpuinfo
from sam2serve.runtime.modes import MODES

DOCS = Path(__file__).resolve().parents[2] / "docs" / "benchmarks.md"

# One fake CPU per class, as /proc/cpuinfo would list it.
HOSTS = {
    "amx": "avx2 avx512f avx512_bf16 avx512_vnni amx_tile amx_bf16 amx_int8",
    "avx512_bf16": "avx2 avx512f avx512_bf16 avx512_vnni",
    "avx512_vnni": "avx2 avx512f avx512_vnni",
    "avx512": "avx2 avx512f",
    "avx2": "avx2 fma",
    "other": "sse4_2",
}


def _host(isa_class: str):
    isa = parse_cpuinfo(f"processor : 0\nflags : {HOSTS[isa_class]}\n")
    assert isa.isa_class == isa_class
    return isa


def test_the_table_has_one_row_per_class():
    assert sorted(row.isa_class for row in AUTO_TABLE) == sorted(HOSTS)


@pytest.mark.parametrize("isa_class", sorted(HOSTS))
def test_the_chooser_picks_the_row_of_the_host_class(isa_class):
    isa = _host(isa_class)
    row = auto_row(isa_class)
    for mode in MODES:
        assert auto_backend(mode, "cpu", isa) == row.backend(mode)
        # Off the CPU the class does not matter.
        assert auto_backend(mode, "cuda", isa) == auto_backend(mode, "cuda:0", _host("avx2"))


def test_what_each_class_gets():
    """The measured winners: OpenVINO's bf16 encoder where bf16 is native (AMX by analogy),
    eager where furious is float32; lossless modes eager and int8 OpenVINO everywhere."""
    picks = {c: auto_backend("furious", "cpu", _host(c)) for c in HOSTS}
    assert picks == {
        "amx": "openvino",
        "avx512_bf16": "openvino",
        "avx512_vnni": "eager",
        "avx512": "eager",
        "avx2": "eager",
        "other": "eager",
    }
    for isa_class in HOSTS:
        assert auto_backend("baseline", "cpu", _host(isa_class)) == "eager"
        assert auto_backend("fast", "cpu", _host(isa_class)) == "eager"
        assert auto_backend("int8", "cpu", _host(isa_class)) == "openvino"


def test_an_unmeasured_row_says_so_and_why():
    amx = auto_row("amx")
    assert amx.measured is None
    assert "not measured" in amx.why and "analogy" in amx.why
    assert auto_row("avx512_bf16").measured is not None
    assert auto_row("no-such-class") == auto_row("other")


def _docs_table() -> dict[str, list[str]]:
    text = DOCS.read_text()
    section = text.split("## Backend auto", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 6 and re.fullmatch(r"`\w+`", cells[0]):
            rows[cells[0].strip("`")] = cells[1:6]
    return rows


def test_the_docs_table_is_the_code_table():
    rows = _docs_table()
    assert sorted(rows) == sorted(row.isa_class for row in AUTO_TABLE)
    for row in AUTO_TABLE:
        baseline, fast, furious, int8, measured = rows[row.isa_class]
        assert [baseline, fast, furious, int8] == [row.baseline, row.fast, row.furious, row.int8]
        assert ("not measured" in measured) == (row.measured is None), row.isa_class
