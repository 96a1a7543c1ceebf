"""The burst benchmark: N images sent at once to the cluster, per task, while the
deployment autoscales, shaped like the published table.

For each task (AMG, SPS, MPS) every one of N distinct images (the bundled samples,
downscaled and made unique per task and index, so no answer comes from an embedding
cache) is sent at the same moment, each with the retrying client. Per request:

- execution time: the time the request spent in the replica (``x-sam2serve-replica-ms``,
  measured by the replica from the first byte of the request to its answer);
- queue time: end-to-end minus execution: the proxy, Ray Serve's queues, retries after
  back-pressure or a lost replica, and the network.

With a Ray address, the replicas by state are polled during the run (replicas over time)
and before each task the benchmark waits for the deployment to scale back down to
``min_replicas``, so every task starts from the same state. Each replica's cold start
(process start to warm) comes from its answers (``x-sam2serve-replica-ready-s``).
"""

from __future__ import annotations

import asyncio
import base64
import csv
import io
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

import numpy as np

from sam2serve.cluster.client import post_with_retries
from sam2serve.cluster.protocol import (
    MULTIPLEX_HEADER,
    READY_S_HEADER,
    REPLICA_HEADER,
    REPLICA_MS_HEADER,
    image_id,
)
from sam2serve.options import OptionError, check_options, option

TASKS = ("amg", "sps", "mps")
ENDPOINT = {"amg": "/v1/amg", "sps": "/v1/segment", "mps": "/v1/segment"}


class BurstError(ValueError):
    """A bad benchmark setting, named."""


def task_list(text: str) -> tuple[str, ...]:
    """``--tasks``: a comma-separated list of tasks (their names checked by the config)."""
    return tuple(t.strip() for t in text.split(",") if t.strip())


@dataclass(frozen=True)
class BurstConfig:
    url: str
    n: int = option(16, help="images per task", metavar="N", low=1, high=10_000)
    tasks: tuple[str, ...] = option(
        TASKS,
        help="comma-separated tasks, run in this order",
        type=task_list,
        metavar="LIST",
        default_text=",".join(TASKS),
    )
    points_per_side: int = option(
        8, help="AMG grid, N*N clicks per image", metavar="N", low=1, high=64
    )
    mps_points: int = option(
        8, help="MPS prompts per image, on a grid", metavar="N", low=1, high=64
    )
    max_side: int = option(
        512, help="downscale the sample photos to this longer side", metavar="PX", low=32
    )
    timeout_s: float = option(
        900.0,
        help="client timeout per request",
        flag="--timeout",
        metavar="S",
        low=0,
        low_open=True,
    )
    max_attempts: int = 6
    multiplex: bool = option(False, help="send each image's id as Ray Serve's multiplexed model id")
    ray_address: str | None = option(
        None,
        help="poll replicas over time and wait for min_replicas before each task (e.g. 'auto')",
        metavar="ADDR",
        default_text="no polling",
    )
    app: str | None = None  # the application to watch (default: all)
    min_replicas: int = 1
    settle_timeout_s: float = 240.0
    poll_s: float = 1.0

    def check(self, sources: dict[str, tuple[str, str]] | None = None) -> None:
        """BurstError naming the flag (or the variable, ``sources``) of a bad setting."""
        try:
            check_options(self)
        except OptionError as exc:
            raise BurstError(exc.for_flag(sources)) from None
        for task in self.tasks:
            if task not in TASKS:
                raise BurstError(f"--tasks: unknown task {task!r}; accepted: {', '.join(TASKS)}")
        if not self.tasks:
            raise BurstError("--tasks is empty; give e.g. amg,sps,mps")


@dataclass
class RequestRecord:
    task: str
    index: int
    status: int | str  # the final HTTP status, or the error of the last attempt
    attempts: int
    start_s: float  # since the benchmark started
    e2e_ms: float
    execution_ms: float | None
    replica: str | None
    replica_ready_s: float | None

    @property
    def ok(self) -> bool:
        return self.status == 200

    @property
    def queue_ms(self) -> float | None:
        return None if self.execution_ms is None else max(0.0, self.e2e_ms - self.execution_ms)


@dataclass
class BurstResult:
    config: BurstConfig
    records: list[RequestRecord] = field(default_factory=list)
    timeline: list[tuple[float, dict[str, int]]] = field(default_factory=list)
    windows: dict[str, tuple[float, float]] = field(default_factory=dict)
    settle_s: dict[str, float] = field(default_factory=dict)


# --------------------------------------------------------------------------- workload


def burst_images(n: int, task_index: int, max_side: int) -> list[bytes]:
    """N distinct JPEG images: the samples downscaled, one pixel row encoding (task, i)."""
    from PIL import Image

    from sam2serve.samples import SAMPLE_NAMES, load_sample

    bases = []
    for name in SAMPLE_NAMES:
        image = Image.fromarray(load_sample(name))
        image.thumbnail((max_side, max_side))
        bases.append(np.asarray(image.convert("RGB")))
    out = []
    for i in range(n):
        pixels = bases[i % len(bases)].copy()
        tag = np.frombuffer(f"{task_index}:{i}:".encode() * 8, dtype=np.uint8)
        pixels[0, : min(len(tag), pixels.shape[1]), 0] = tag[: pixels.shape[1]]
        buffer = io.BytesIO()
        Image.fromarray(pixels).save(buffer, format="JPEG", quality=92)
        out.append(buffer.getvalue())
    return out


def _size(data: bytes) -> tuple[int, int]:
    from PIL import Image

    with Image.open(io.BytesIO(data)) as image:
        return image.size


def payload(task: str, data: bytes, config: BurstConfig) -> dict[str, Any]:
    image = base64.b64encode(data).decode()
    if task == "amg":
        return {"image": image, "params": {"points_per_side": config.points_per_side}}
    width, height = _size(data)
    if task == "sps":
        return {"image": image, "objects": [{"points": [{"x": width / 2, "y": height / 2}]}]}
    side = int(np.ceil(np.sqrt(config.mps_points)))
    grid = [
        ((c + 0.5) * width / side, (r + 0.5) * height / side)
        for r in range(side)
        for c in range(side)
    ]
    return {
        "image": image,
        "objects": [{"points": [{"x": x, "y": y}]} for x, y in grid[: config.mps_points]],
    }


# --------------------------------------------------------------------------- replicas


class ReplicaPoller:
    """Replicas by state, every ``poll_s`` seconds, in a thread (Ray's status API)."""

    def __init__(self, read: Callable[[], dict[str, int]], poll_s: float, t0: float) -> None:
        self.read = read
        self.poll_s = poll_s
        self.t0 = t0
        self.samples: list[tuple[float, dict[str, int]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                counts = self.read()
            except Exception:  # noqa: BLE001 - a failed status call is not the benchmark's result
                counts = {}
            now = time.perf_counter() - self.t0
            if not self.samples or self.samples[-1][1] != counts:
                self.samples.append((round(now, 1), counts))
            self._stop.wait(self.poll_s)


def _ray_reader(config: BurstConfig) -> Callable[[], dict[str, int]] | None:
    if config.ray_address is None:
        return None
    from sam2serve.cluster.lifecycle import connect, replica_counts

    connect(config.ray_address)

    def read() -> dict[str, int]:
        total: dict[str, int] = {}
        for states in replica_counts(config.app).values():
            for state, count in states.items():
                total[state] = total.get(state, 0) + count
        return total

    return read


def _settle(read: Callable[[], dict[str, int]], config: BurstConfig) -> float:
    """Wait until only min_replicas replicas run (the deployment scaled back down)."""
    started = time.perf_counter()
    deadline = started + config.settle_timeout_s
    while time.perf_counter() < deadline:
        counts = read()
        if counts.get("RUNNING", 0) == config.min_replicas and sum(counts.values()) == (
            config.min_replicas
        ):
            break
        time.sleep(config.poll_s)
    return time.perf_counter() - started


# --------------------------------------------------------------------------- the run


async def _burst(
    task: str, images: list[bytes], config: BurstConfig, t0: float
) -> list[RequestRecord]:
    import httpx

    limits = httpx.Limits(max_connections=len(images), max_keepalive_connections=len(images))
    url = config.url.rstrip("/") + ENDPOINT[task]
    async with httpx.AsyncClient(timeout=config.timeout_s, limits=limits) as client:

        async def one(index: int, data: bytes) -> RequestRecord:
            headers = {MULTIPLEX_HEADER: image_id(data)} if config.multiplex else None
            answer = await post_with_retries(
                client,
                url,
                json=payload(task, data, config),
                headers=headers,
                max_attempts=config.max_attempts,
            )
            response = answer.response
            head = response.headers if response is not None else {}
            execution = head.get(REPLICA_MS_HEADER)
            ready = head.get(READY_S_HEADER)
            return RequestRecord(
                task=task,
                index=index,
                status=response.status_code if response is not None else str(answer.statuses[-1]),
                attempts=answer.attempts,
                start_s=answer.started - t0,
                e2e_ms=answer.elapsed_ms,
                execution_ms=float(execution) if execution else None,
                replica=head.get(REPLICA_HEADER),
                replica_ready_s=float(ready) if ready else None,
            )

        payloads = [one(i, data) for i, data in enumerate(images)]
        return list(await asyncio.gather(*payloads))


def run_burst(config: BurstConfig, say: Callable[[str], None] = print) -> BurstResult:
    config.check()
    read = _ray_reader(config)
    result = BurstResult(config)
    t0 = time.perf_counter()
    poller = ReplicaPoller(read, config.poll_s, t0) if read is not None else None
    if poller is not None:
        poller.__enter__()
    try:
        for task_index, task in enumerate(config.tasks):
            images = burst_images(config.n, task_index, config.max_side)
            if read is not None:
                say(f"burst: {task}: waiting for {config.min_replicas} replica(s)")
                result.settle_s[task] = _settle(read, config)
            say(f"burst: {task}: sending {config.n} requests at once")
            start = time.perf_counter() - t0
            records = asyncio.run(_burst(task, images, config, t0))
            result.windows[task] = (start, time.perf_counter() - t0)
            result.records += records
            ok = sum(r.ok for r in records)
            say(
                f"burst: {task}: {ok}/{len(records)} answered in {result.windows[task][1] - start:.1f} s"
            )
    finally:
        if poller is not None:
            poller.__exit__()
            result.timeline = poller.samples
    return result


# --------------------------------------------------------------------------- report


def _pct(values: list[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None


def task_rows(result: BurstResult) -> list[dict[str, Any]]:
    rows = []
    for task in result.config.tasks:
        records = [r for r in result.records if r.task == task]
        ok = [r for r in records if r.ok]
        execution = [r.execution_ms for r in ok if r.execution_ms is not None]
        queue = [r.queue_ms for r in ok if r.queue_ms is not None]
        e2e = [r.e2e_ms for r in ok]
        start, end = result.windows.get(task, (0.0, 0.0))
        rows.append(
            {
                "task": task,
                "requests": len(records),
                "answered": len(ok),
                "failed": len(records) - len(ok),
                "retried": sum(r.attempts > 1 for r in records),
                "replicas_answering": len({r.replica for r in ok if r.replica}),
                "execution_p50_ms": _pct(execution, 50),
                "execution_p90_ms": _pct(execution, 90),
                "queue_p50_ms": _pct(queue, 50),
                "queue_p90_ms": _pct(queue, 90),
                "e2e_p50_ms": _pct(e2e, 50),
                "e2e_p90_ms": _pct(e2e, 90),
                "wall_s": round(end - start, 2),
            }
        )
    return rows


def replica_cold_starts(result: BurstResult) -> dict[str, float]:
    starts: dict[str, float] = {}
    for r in result.records:
        if r.replica and r.replica_ready_s is not None:
            starts.setdefault(r.replica, r.replica_ready_s)
    return starts


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


def markdown(result: BurstResult, header: dict[str, str]) -> str:
    """The report: what ran, the per-task table, replicas over time, cold starts."""
    lines = ["# Burst benchmark on Ray Serve (CPU)", ""]
    lines += [f"- **{key}:** {value}" for key, value in header.items()]
    lines += [
        "",
        "## Execution and queue time per task",
        "",
        (
            "Execution = time in the replica; queue = end-to-end minus execution (proxy, "
            "Ray Serve queues, retries, network). Milliseconds, over answered requests."
        ),
        "",
        (
            "| task | requests | answered | failed | retried | replicas answering | "
            "execution p50 | execution p90 | queue p50 | queue p90 | end-to-end p50 | "
            "end-to-end p90 | wall (s) |"
        ),
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for row in task_rows(result):
        lines.append(
            f"| {row['task'].upper()} | {row['requests']} | {row['answered']} | {row['failed']} | "
            f"{row['retried']} | {row['replicas_answering']} | {_ms(row['execution_p50_ms'])} | "
            f"{_ms(row['execution_p90_ms'])} | {_ms(row['queue_p50_ms'])} | "
            f"{_ms(row['queue_p90_ms'])} | {_ms(row['e2e_p50_ms'])} | {_ms(row['e2e_p90_ms'])} | "
            f"{row['wall_s']:.1f} |"
        )
    lines += ["", "## Replicas over time", ""]
    if result.timeline:
        lines += [
            "Replicas by state, sampled every "
            f"{result.config.poll_s:g} s (a row when the counts change); task windows: "
            + ", ".join(f"{t.upper()} {a:.0f}-{b:.0f} s" for t, (a, b) in result.windows.items())
            + ".",
            "",
            "| t (s) | task | replicas |",
            "| ---: | --- | --- |",
        ]
        for t, counts in result.timeline:
            task = next((k for k, (a, b) in result.windows.items() if a <= t <= b), "")
            shown = ", ".join(f"{s} {c}" for s, c in sorted(counts.items())) or "-"
            lines.append(f"| {t:.1f} | {task.upper()} | {shown} |")
    else:
        lines.append("Not sampled (no --ray-address).")
    lines += ["", "## Replica cold start", ""]
    starts = replica_cold_starts(result)
    if starts:
        lines += ["Process start to ready (warm), as each replica reports it.", ""]
        lines += ["| replica | cold start (s) |", "| --- | ---: |"]
        lines += [f"| {rid} | {secs:.1f} |" for rid, secs in sorted(starts.items())]
    else:
        lines.append("No replica answered.")
    return "\n".join(lines) + "\n"


def write_csv(result: BurstResult, path: Path) -> None:
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(
            [
                "task",
                "index",
                "status",
                "attempts",
                "start_s",
                "e2e_ms",
                "execution_ms",
                "queue_ms",
                "replica",
                "replica_ready_s",
            ]
        )
        for r in result.records:
            writer.writerow(
                [
                    r.task,
                    r.index,
                    r.status,
                    r.attempts,
                    f"{r.start_s:.3f}",
                    f"{r.e2e_ms:.1f}",
                    "" if r.execution_ms is None else f"{r.execution_ms:.1f}",
                    "" if r.queue_ms is None else f"{r.queue_ms:.1f}",
                    r.replica or "",
                    "" if r.replica_ready_s is None else r.replica_ready_s,
                ]
            )
