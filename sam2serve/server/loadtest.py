"""``sam2serve loadtest``: concurrent clients against a running server on this machine.

The workload is the interactive-annotation pattern the service is built for: every image
is uploaded once to /v1/embeddings (those uploads go out concurrently, so the server can
batch them), then the clients send /v1/segment requests by image_id — 1 to
``max_objects`` objects of 1 to ``max_points`` random clicks, some with a box — mixed
with re-uploads to /v1/embeddings (cache hits) at ``embeddings_fraction``. A segment that
gets 404 (the embedding was evicted) re-uploads its image and goes on.

It is bounded twice: at most ``requests`` requests and at most ``duration_s`` seconds of
issuing them. It only talks to loopback addresses (127.0.0.0/8, ::1, localhost).
Reported per endpoint: counts by status class, client latency p50/p90/p99 and the
server-reported queue time p50/p90/p99 (``queue_ms`` of each 200 answer).
"""

from __future__ import annotations

import asyncio
import csv
import io
import ipaddress
import os
import platform
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import numpy as np

from sam2serve.engine.formats import JSON_FORMATS
from sam2serve.options import OptionError, check_options, option

MAX_REQUESTS = 100_000
MAX_CONCURRENCY = 256
MAX_DURATION_S = 3600.0
PERCENTILES = (50, 90, 99)
SEGMENT, EMBEDDINGS = "/v1/segment", "/v1/embeddings"


class LoadtestError(ValueError):
    """A bad load-test setting; the message names it."""


def check_loopback_url(url: str) -> str:
    """``url`` without a trailing slash, if it is http(s) on a loopback address."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise LoadtestError(f"--url must be http://HOST:PORT, got {url!r}")
    host = parts.hostname
    if host != "localhost":
        try:
            address = ipaddress.ip_address(host)
        except ValueError:
            raise LoadtestError(
                f"--url host {host!r} is not a loopback address; the load test only targets "
                "this machine: 127.0.0.1 (or another 127.x.y.z), ::1 or localhost"
            ) from None
        if not address.is_loopback:
            raise LoadtestError(
                f"--url host {host} is not a loopback address; the load test only targets "
                "this machine: 127.0.0.1 (or another 127.x.y.z), ::1 or localhost"
            )
    return url.rstrip("/")


@dataclass(frozen=True)
class TestImage:
    name: str
    data: bytes  # the encoded file
    width: int
    height: int


def load_test_images(sources: Sequence[str], max_side: int | None) -> list[TestImage]:
    """Image files as they are, or the bundled samples ('samples') as PNG, downscaled so
    their longer side is at most ``max_side`` (None: as shipped)."""
    from PIL import Image

    from sam2serve.samples import SAMPLE_NAMES, load_sample

    images = []
    for source in sources:
        if source == "samples":
            for name in SAMPLE_NAMES:
                picture = Image.fromarray(load_sample(name))
                if max_side is not None and max(picture.size) > max_side:
                    picture.thumbnail((max_side, max_side))
                buffer = io.BytesIO()
                picture.save(buffer, format="PNG")
                images.append(TestImage(name, buffer.getvalue(), *picture.size))
            continue
        path = Path(source)
        try:
            data = path.read_bytes()
            with Image.open(io.BytesIO(data)) as probe:
                width, height = probe.size
        except OSError as exc:
            raise LoadtestError(f"cannot read image {source!r}: {exc}") from None
        images.append(TestImage(path.name, data, width, height))
    if not images:
        raise LoadtestError("give at least one image (a file, or 'samples')")
    return images


@dataclass(frozen=True)
class LoadtestConfig:
    """The workload; every field but the URL, the images and the key is a flag of
    ``sam2serve loadtest`` (sam2serve.options), checked here for the library too."""

    url: str
    images: list[TestImage]
    requests: int = option(
        300, help="requests in all, uploads included", metavar="N", low=1, high=MAX_REQUESTS
    )
    concurrency: int = option(
        4, help="concurrent clients", metavar="C", low=1, high=MAX_CONCURRENCY
    )
    duration_s: float = option(
        600.0,
        help="stop sending after this many seconds",
        flag="--duration",
        metavar="S",
        low=0,
        low_open=True,
        high=MAX_DURATION_S,
    )
    seed: int = option(0, help="seed of the workload", metavar="N")
    embeddings_fraction: float = option(
        0.1,
        help="share of requests that re-upload an image to /v1/embeddings",
        metavar="F",
        low=0,
        high=1,
    )
    max_objects: int = option(3, help="objects per /v1/segment request, 1 to N", metavar="N", low=1)
    max_points: int = option(3, help="clicks per object, 1 to N", metavar="N", low=1)
    mask_format: str = option(
        "coco_rle", help="mask_format of the segment requests", choices=JSON_FORMATS
    )
    request_timeout_s: float = option(
        300.0,
        help="client timeout per request",
        flag="--timeout",
        metavar="S",
        low=0,
        low_open=True,
    )
    api_key: str | None = None

    def __post_init__(self) -> None:
        check_loopback_url(self.url)
        try:
            check_options(self)
        except OptionError as exc:
            raise LoadtestError(exc.for_flag()) from None
        if self.requests < len(self.images):
            raise LoadtestError(
                f"--requests {self.requests} is fewer than the {len(self.images)} uploads the "
                "test starts with (one per image)"
            )


@dataclass(frozen=True)
class Sample:
    """One request as the client saw it."""

    endpoint: str
    status: int  # 0: no HTTP answer (connection error, client timeout)
    latency_s: float
    queue_ms: float | None = None
    inference_ms: float | None = None
    error: str | None = None


@dataclass
class LoadtestResult:
    config: LoadtestConfig
    samples: list[Sample] = field(default_factory=list)
    wall_s: float = 0.0
    stopped_by_time: bool = False
    server: dict[str, Any] = field(default_factory=dict)
    load_before: float | None = None  # the machine's 1-minute load average at the start

    @property
    def server_errors(self) -> int:
        """5xx answers and requests that got no answer at all."""
        return sum(1 for s in self.samples if s.status >= 500 or s.status == 0)

    def summary_rows(self) -> list[dict[str, Any]]:
        rows = []
        endpoints = sorted({s.endpoint for s in self.samples})
        for endpoint in [*endpoints, "all"]:
            chosen = [s for s in self.samples if endpoint in ("all", s.endpoint)]
            latency = [s.latency_s * 1000 for s in chosen]
            queue = [s.queue_ms for s in chosen if s.queue_ms is not None]
            row: dict[str, Any] = {
                "endpoint": endpoint,
                "concurrency": self.config.concurrency,
                "requests": len(chosen),
                "2xx": sum(1 for s in chosen if 200 <= s.status < 300),
                "4xx": sum(1 for s in chosen if 400 <= s.status < 500),
                "5xx": sum(1 for s in chosen if s.status >= 500),
                "no_answer": sum(1 for s in chosen if s.status == 0),
            }
            for p, value in zip(PERCENTILES, _percentiles(latency), strict=True):
                row[f"latency_p{p}_ms"] = value
            row["latency_max_ms"] = round(max(latency), 1) if latency else None
            for p, value in zip(PERCENTILES, _percentiles(queue), strict=True):
                row[f"queue_p{p}_ms"] = value
            row["throughput_rps"] = round(len(chosen) / self.wall_s, 2) if self.wall_s else None
            rows.append(row)
        return rows


def _percentiles(values: list[float]) -> list[float | None]:
    if not values:
        return [None] * len(PERCENTILES)
    return [round(float(v), 1) for v in np.percentile(values, PERCENTILES)]


class _Run:
    """The shared state of the clients: request budget, deadline, image ids."""

    def __init__(self, config: LoadtestConfig) -> None:
        self.config = config
        self.rng = random.Random(config.seed)
        self.remaining = config.requests
        self.deadline = time.monotonic() + config.duration_s
        self.image_ids: dict[str, str] = {}
        self.samples: list[Sample] = []
        self.stopped_by_time = False

    def take(self) -> bool:
        """Claim one request of the budget, unless it or the time is used up."""
        if self.remaining <= 0:
            return False
        if time.monotonic() >= self.deadline:
            self.stopped_by_time = True
            return False
        self.remaining -= 1
        return True


def _headers(config: LoadtestConfig) -> dict[str, str]:
    return {"Authorization": f"Bearer {config.api_key}"} if config.api_key else {}


async def _send(client: Any, run: _Run, endpoint: str, **kwargs: Any) -> tuple[Sample, Any]:
    import httpx

    started = time.perf_counter()
    try:
        response = await client.post(endpoint, **kwargs)
    except httpx.HTTPError as exc:
        sample = Sample(
            endpoint, 0, time.perf_counter() - started, error=f"{type(exc).__name__}: {exc}"
        )
        run.samples.append(sample)
        return sample, None
    latency = time.perf_counter() - started
    try:
        body = response.json()
    except ValueError:
        body = None
    if response.status_code == 200 and isinstance(body, dict):
        sample = Sample(endpoint, 200, latency, body.get("queue_ms"), body.get("inference_ms"))
    else:
        code = body.get("error", {}).get("code") if isinstance(body, dict) else None
        sample = Sample(endpoint, response.status_code, latency, error=code or response.text[:200])
    run.samples.append(sample)
    return sample, body


async def _upload(client: Any, run: _Run, image: TestImage) -> None:
    files = {"image": (image.name, image.data, "application/octet-stream")}
    sample, body = await _send(client, run, EMBEDDINGS, files=files)
    if sample.status == 200:
        run.image_ids[image.name] = body["image_id"]


def _segment_body(run: _Run, image: TestImage, image_id: str) -> dict[str, Any]:
    rng, config = run.rng, run.config
    objects = []
    for _ in range(rng.randint(1, config.max_objects)):
        points = [
            {
                "x": round(rng.uniform(0, image.width), 1),
                "y": round(rng.uniform(0, image.height), 1),
                "label": 1 if i == 0 else rng.randint(0, 1),
            }
            for i in range(rng.randint(1, config.max_points))
        ]
        obj: dict[str, Any] = {"points": points}
        if rng.random() < 0.3:
            x0, x1 = sorted(rng.uniform(0, image.width) for _ in range(2))
            y0, y1 = sorted(rng.uniform(0, image.height) for _ in range(2))
            obj["box"] = [round(v, 1) for v in (x0, y0, x1, y1)]
        objects.append(obj)
    return {
        "image_id": image_id,
        "objects": objects,
        "multimask_output": rng.random() < 0.5,
        "mask_format": config.mask_format,
    }


async def _client(client: Any, run: _Run) -> None:
    images = run.config.images
    while run.take():
        image = run.rng.choice(images)
        image_id = run.image_ids.get(image.name)
        if image_id is None or run.rng.random() < run.config.embeddings_fraction:
            await _upload(client, run, image)
            continue
        body = _segment_body(run, image, image_id)
        sample, _ = await _send(client, run, SEGMENT, json=body)
        if sample.status == 404 and sample.error == "unknown_image_id":
            run.image_ids.pop(image.name, None)  # evicted: the next turn uploads it again


async def run_loadtest(config: LoadtestConfig) -> LoadtestResult:
    """Run the load test; the result holds every request's sample."""
    import httpx

    load_before = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    run = _Run(config)
    limits = httpx.Limits(max_connections=config.concurrency)
    async with httpx.AsyncClient(
        base_url=config.url,
        timeout=config.request_timeout_s,
        limits=limits,
        headers=_headers(config),
    ) as client:
        server = await _server_info(client)
        started = time.perf_counter()
        # Every image once, all at once: the server can batch these encodes.
        uploads = [image for image in config.images if run.take()]
        await asyncio.gather(*(_upload(client, run, image) for image in uploads))
        await asyncio.gather(*(_client(client, run) for _ in range(config.concurrency)))
        wall = time.perf_counter() - started
    return LoadtestResult(config, run.samples, wall, run.stopped_by_time, server, load_before)


async def _server_info(client: Any) -> dict[str, Any]:
    import httpx

    try:
        response = await client.get("/readyz")
    except httpx.HTTPError as exc:
        raise LoadtestError(f"no server answers at {client.base_url}: {exc}") from None
    if response.status_code != 200:
        raise LoadtestError(
            f"the server at {client.base_url} is not ready (/readyz answered "
            f"{response.status_code}: {response.text[:200]})"
        )
    return response.json()


# --------------------------------------------------------------------------- reports

COLUMNS = (
    ("endpoint", "endpoint"),
    ("requests", "requests"),
    ("2xx", "2xx"),
    ("4xx", "4xx"),
    ("5xx", "5xx"),
    ("no_answer", "no answer"),
    ("latency_p50_ms", "latency p50 ms"),
    ("latency_p90_ms", "p90"),
    ("latency_p99_ms", "p99"),
    ("queue_p50_ms", "queue p50 ms"),
    ("queue_p90_ms", "p90"),
    ("queue_p99_ms", "p99"),
    ("throughput_rps", "req/s"),
)


def format_table(result: LoadtestResult) -> str:
    """A plain-text table for the terminal."""
    rows = result.summary_rows()
    headers = [title for _, title in COLUMNS]
    cells = [[_cell(row[key]) for key, _ in COLUMNS] for row in rows]
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(headers)]
    lines = ["  ".join(h.rjust(w) for h, w in zip(headers, widths, strict=True))]
    lines += ["  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)) for row in cells]
    return "\n".join(lines)


def _cell(value: Any) -> str:
    return "-" if value is None else str(value)


def machine_description() -> dict[str, str]:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    memory = "unknown"
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                memory = f"{int(line.split()[1]) / 1024 / 1024:.1f} GiB"
                break
    except OSError:
        pass
    try:
        import torch

        torch_version = str(torch.__version__)
    except ImportError:
        torch_version = "not installed"
    return {
        "cpu": cpu,
        "cores": str(os.cpu_count()),
        "memory": memory,
        "os": platform.platform(),
        "python": platform.python_version(),
        "torch": torch_version,
    }


def format_markdown(result: LoadtestResult, command: str) -> str:
    config = result.config
    machine = machine_description()
    server = result.server
    weights = server.get("weights", {})
    rows = result.summary_rows()
    image_list = ", ".join(f"{i.name} {i.width}x{i.height}" for i in config.images)
    lines = [
        "# sam2serve load test (CPU)",
        "",
        f"- command: `{command}`",
        f"- date: {datetime.now(UTC).strftime('%Y-%m-%d %H:%M UTC')}",
        (
            f"- machine: {machine['cpu']}, {machine['cores']} cores, {machine['memory']} RAM; "
            f"{machine['os']}; Python {machine['python']}, torch {machine['torch']}"
        ),
        f"- server: model {server.get('model')}, mode {server.get('mode')}, device "
        f"{server.get('device')}, dtype {server.get('dtype')}, weights "
        f"{weights.get('source')}"
        + (
            " (random: latency only, masks meaningless)"
            if weights.get("source") == "random"
            else ""
        ),
        f"- workload: {len(result.samples)} requests ({config.requests} asked"
        + (", stopped by --duration" if result.stopped_by_time else "")
        + f") from {config.concurrency} concurrent clients over {result.wall_s:.1f} s; "
        f"{len(config.images)} images ({image_list}) "
        f"uploaded once, then /v1/segment by image_id (1-{config.max_objects} objects of "
        f"1-{config.max_points} clicks, 30% with a box, mask_format {config.mask_format}) and "
        f"{config.embeddings_fraction:.0%} re-uploads to /v1/embeddings (cache hits)",
        (
            f"- machine load before the run (1-min load average, other processes included): "
            f"{_cell(None if result.load_before is None else round(result.load_before, 2))}"
        ),
        (
            "- latency: client-side, request sent to response read; queue: the server's "
            "`queue_ms` (time its model jobs waited for the model worker)"
        ),
        "",
        "| " + " | ".join(title for _, title in COLUMNS) + " |",
        "|" + "---|" * len(COLUMNS),
    ]
    lines += ["| " + " | ".join(_cell(row[key]) for key, _ in COLUMNS) + " |" for row in rows]
    lines += ["", f"5xx or unanswered requests: {result.server_errors}", ""]
    return "\n".join(lines)


def write_csv(result: LoadtestResult, path: Path) -> None:
    rows = result.summary_rows()
    with path.open("w", newline="", encoding="utf-8") as out:
        writer = csv.DictWriter(out, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
