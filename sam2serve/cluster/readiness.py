"""How a replica becomes ready, and what it reports about it.

A replica is ready only when warm: its constructor fetches its model source (artifacts or
a checkpoint) to this node, loads it, runs one encode and one decode, and only then returns,
which is when Ray Serve marks it RUNNING and routes traffic to it. The time from the
replica's process start to that point is its cold start; it is kept per stage in a
:class:`ReplicaReport` and exported as Prometheus gauges (our ``/metrics``) and as Ray
Serve metrics (Ray's metrics endpoint, next to ``ray_serve_*``).
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any

# Ray Serve histogram boundaries for the cold start, in seconds.
START_BUCKETS_S = [1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0]
# The cold-start stages, in order: fetch_model and load_model are the model source's
# (sam2serve.cluster.model_source), warmup includes torch.compile's compilation if any.
STAGES = ("process_to_constructor", "fetch_model", "load_model", "warmup")


def process_start_time() -> float:
    """Wall-clock time this process started (Linux /proc), else now."""
    try:
        with open(f"/proc/{os.getpid()}/stat", encoding="ascii") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        start_ticks = int(fields[19])  # field 22 of stat: starttime, in clock ticks
        with open("/proc/stat", encoding="ascii") as f:
            boot = next(int(line.split()[1]) for line in f if line.startswith("btime "))
        return boot + start_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return time.time()


def compile_frames() -> int:
    """TorchDynamo frames compiled in this process (0: nothing was torch.compile'd)."""
    import torch._dynamo.utils as dynamo_utils

    return sum(dynamo_utils.counters["frames"].values())


@dataclass
class ReplicaReport:
    """Who this replica is, where its model came from, and how long it took to be ready."""

    replica: str
    deployment: str
    app: str
    model: str
    mode: str
    backend: str  # what runs the model (sam2serve.runtime.backends)
    device: str  # "cpu", or "cuda": the GPU Ray assigned this replica
    source_kind: str  # "artifacts" or "checkpoint"
    source_location: str  # the configured path or URI
    source_local: str  # the local directory (artifacts) or file (checkpoint) loaded
    source_copied: bool  # fetched through fsspec on this start
    source_sha256: str  # of the artifacts' manifest, or of the checkpoint file
    weights: dict[str, Any]
    compile_frames: int
    pid: int = field(default_factory=os.getpid)
    stages_s: dict[str, float] = field(default_factory=dict)

    @property
    def start_to_ready_s(self) -> float:
        return sum(self.stages_s.values())

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "start_to_ready_s": round(self.start_to_ready_s, 3)}


class ReadinessMetrics:
    """The cold start as Prometheus text for our /metrics, and as Ray Serve metrics."""

    def __init__(self, report: ReplicaReport) -> None:
        from prometheus_client import CollectorRegistry, Gauge, Info

        self.registry = CollectorRegistry()
        start = Gauge(
            "sam2serve_replica_start_to_ready_seconds",
            "Time from this replica's process start to ready (warm), by stage; "
            "stage 'total' is the sum.",
            ["replica", "stage"],
            registry=self.registry,
        )
        for stage, seconds in report.stages_s.items():
            start.labels(report.replica, stage).set(seconds)
        start.labels(report.replica, "total").set(report.start_to_ready_s)
        Gauge(
            "sam2serve_replica_compile_frames",
            "TorchDynamo frames this replica compiled (0 unless its backend is compile).",
            ["replica"],
            registry=self.registry,
        ).labels(report.replica).set(report.compile_frames)
        Info(
            "sam2serve_replica",
            "The replica, its deployment, what runs its model and where the model came from.",
            registry=self.registry,
        ).info(
            {
                "replica": report.replica,
                "deployment": report.deployment,
                "app": report.app,
                "backend": report.backend,
                "device": report.device,
                "source_kind": report.source_kind,
                "source_location": report.source_location,
                "source_sha256": report.source_sha256,
                "source_copied": str(report.source_copied).lower(),
            }
        )

    def render(self) -> bytes:
        from prometheus_client import generate_latest

        return generate_latest(self.registry)


def record_ray_metrics(report: ReplicaReport) -> tuple[Any, ...]:
    """The cold start as Ray Serve metrics (tagged with deployment and replica by Ray).

    Returns the metric objects: the caller keeps them, since Ray stops exporting a
    metric whose object is garbage-collected."""
    if "ray" not in sys.modules:
        return ()
    from ray.serve.metrics import Gauge, Histogram

    tags = {"model": report.model, "mode": report.mode}
    gauge = Gauge(
        "sam2serve_replica_start_to_ready_seconds",
        description="Time from replica process start to ready (warm).",
        tag_keys=("model", "mode"),  # type: ignore[arg-type]  # ray types tag_keys as tuple[str]
    )
    gauge.set(report.start_to_ready_s, tags=tags)
    histogram = Histogram(
        "sam2serve_replica_cold_start_seconds",
        description="Replica cold starts: process start to ready (warm).",
        boundaries=START_BUCKETS_S,
        tag_keys=("model", "mode"),  # type: ignore[arg-type]  # ray types tag_keys as tuple[str]
    )
    histogram.observe(report.start_to_ready_s, tags=tags)
    return gauge, histogram
