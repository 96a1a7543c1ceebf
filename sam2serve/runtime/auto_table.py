"""Which backend ``--backend auto`` runs each mode on, per CPU class: the measured winners
(torch-free).

One row per ISA class of :mod:`sam2serve.runtime.host`. docs/benchmarks.md, "Backend
auto", holds the same table with the measurements behind it (a test checks that the two
agree). A row says where its choice comes from: a measurement on a host of that class
(``measured``: the dated run), or, for a class no session has had a host of, an analogy
with its reason (``measured`` None): such a row is built and tested, not timed.

Only furious differs between classes. baseline is Meta's computation and fast its exact
equal: both eager everywhere (OpenVINO's fp32 was at most ~10 % faster and costs a
conversion at the first start). int8 has no eager kernels: OpenVINO everywhere. Off the
CPU (CUDA) every mode runs its default backend.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["AUTO_TABLE", "AutoRow", "auto_row"]


@dataclass(frozen=True)
class AutoRow:
    """What ``auto`` picks on CPUs of ``isa_class``, and on what evidence."""

    isa_class: str
    baseline: str
    fast: str
    furious: str
    int8: str
    measured: str | None  # the dated measurement, docs/benchmarks.md; None: not timed
    why: str

    def backend(self, mode: str) -> str:
        """The backend of ``mode`` (one of the four modes)."""
        return {
            "baseline": self.baseline,
            "fast": self.fast,
            "furious": self.furious,
            "int8": self.int8,
        }[mode]


def _fp32_class(isa_class: str, measured: str | None, why: str) -> AutoRow:
    return AutoRow(isa_class, "eager", "eager", "eager", "openvino", measured, why)


AUTO_TABLE: tuple[AutoRow, ...] = (
    AutoRow(
        "amx",
        "eager",
        "eager",
        "openvino",
        "openvino",
        None,
        "not measured by this project (no AMX host yet): by analogy with avx512_bf16, where "
        "OpenVINO's bf16 encoder is 1.5-2.0x eager bf16 and torch.compile slower; OpenVINO's "
        "CPU plugin runs its matrix products on AMX tiles where the CPU has them, and "
        "issue 38 reports 441 ms for it against 778 ms eager bf16 on such a host",
    ),
    AutoRow(
        "avx512_bf16",
        "eager",
        "eager",
        "openvino",
        "openvino",
        "2026-12-06c, Zen 4, 2 threads",
        "the bf16 encoder, each path against eager bf16 in one process: OpenVINO 1.53x "
        "(2.0x on one core), torch.compile 1.20x, max-autotune 1.08x (without AMX its C++ "
        "GEMM template has no bf16 kernel and picks oneDNN's), channels-last 0.85x",
    ),
    _fp32_class(
        "avx512_vnni",
        None,
        "not measured between backends: no native bf16, so furious runs in float32 (fast's "
        "numerics), chosen as on avx2",
    ),
    _fp32_class(
        "avx512",
        None,
        "not measured: as avx512_vnni (no native bf16, so furious is float32)",
    ),
    _fp32_class(
        "avx2",
        "2026-11-24, AMD EPYC AVX2",
        "no native bf16 (emulated bf16 is slower than fp32): furious runs in float32, where "
        "OpenVINO from an export was 1.08x eager in SPS, within the host's noise, and eager "
        "converts nothing at start-up",
    ),
    _fp32_class(
        "other",
        None,
        "not measured: no AVX2, nothing native to pick a faster path by",
    ),
)

_BY_CLASS = {row.isa_class: row for row in AUTO_TABLE}


def auto_row(isa_class: str) -> AutoRow:
    """The row of ``isa_class`` (an unknown class reads as ``other``)."""
    return _BY_CLASS.get(isa_class, _BY_CLASS["other"])
