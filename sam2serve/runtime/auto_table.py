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

The tracker's table (:data:`TRACKER_OBJECTS_TABLE`) is the same idea for video: how many
objects one frame step batches on each class (``objects_per_call``, read by
:func:`sam2serve.runtime.video.objects_per_call_for`).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "AUTO_TABLE",
    "TRACKER_OBJECTS_TABLE",
    "AutoRow",
    "TrackerObjectsRow",
    "auto_row",
    "tracker_objects_row",
]


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


# --------------------------------------------------------------------------- tracking


@dataclass(frozen=True)
class TrackerObjectsRow:
    """How many tracked objects one frame step batches on CPUs of ``isa_class``
    (``VideoPredictor.objects_per_call``), by the frame step's precision, and on what
    evidence: ``fp32`` for baseline and fast (and furious where it resolves to float32),
    ``bf16`` for furious where bf16 is native. docs/benchmarks.md, "Objects per call by
    host class", holds the same table with the measurements behind it."""

    isa_class: str
    fp32: int
    bf16: int
    measured: str | None  # the dated measurement, docs/benchmarks.md; None: not timed
    why: str

    def objects_per_call(self, reduced: bool) -> int:
        """The batch of a frame step in bf16 (``reduced``) or in float32."""
        return self.bf16 if reduced else self.fp32


def _one_per_call(isa_class: str, why: str) -> TrackerObjectsRow:
    return TrackerObjectsRow(isa_class, 1, 1, None, why)


def _amx(why: str) -> TrackerObjectsRow:
    return TrackerObjectsRow("amx", 1, 3, None, why)


TRACKER_OBJECTS_TABLE: tuple[TrackerObjectsRow, ...] = (
    _amx(
        "not measured (no AMX host yet): by analogy with avx512_bf16, one per call in fp32 "
        "and 3 in bf16, where a batch of 3 saved the heads' and memory encoder's per-call "
        "cost while a batch of 8 gained nothing more",
    ),
    TrackerObjectsRow(
        "avx512_bf16",
        1,
        3,
        "2026-12-06 (fp32) and 2026-12-07 (bf16), Zen 4, 2 threads",
        "8 objects a frame. fp32: one per call against one batch of 8, each alone, "
        "14.5-19.7 s against 15.9-22.6 s a frame (a batch's activations leave the caches). "
        "bf16 (furious, bench/video_stages.py: 1, 3 and 8 per call interleaved frame by "
        "frame in one process, loaded): frames 2-3 211.6 / 161.9 / 170.0 s, 3 per call "
        "1.31x one per call; the heads and the memory encoder cost 1.7-1.9x less batched, and "
        "bf16 halves the batch's activations",
    ),
    _one_per_call(
        "avx512_vnni",
        "not measured between settings: float32 in every mode here, chosen as on "
        "avx512_bf16's float32, where one per call was faster",
    ),
    _one_per_call("avx512", "not measured: as avx512_vnni"),
    _one_per_call("avx2", "not measured: as avx512_vnni (float32, smaller caches)"),
    _one_per_call("other", "not measured: as avx2"),
)

_OBJECTS_BY_CLASS = {row.isa_class: row for row in TRACKER_OBJECTS_TABLE}


def tracker_objects_row(isa_class: str) -> TrackerObjectsRow:
    """The objects-per-call row of ``isa_class`` (an unknown class reads as ``other``)."""
    return _OBJECTS_BY_CLASS.get(isa_class, _OBJECTS_BY_CLASS["other"])
