"""Prometheus metrics of one app, in a registry of its own (two apps never share counts).

Request latency per endpoint, latency per stage (image decode, queue, encode, mask
decode, AMG, output formatting), queue wait per job kind, encoder batch sizes, errors by
code, requests in flight, client disconnects, cancelled jobs; cache counters, queue depth
per queue, process memory and its limit are read from their owners at scrape time. The
names are the contract of deploy/grafana and deploy/prometheus (a test checks them).
"""

from __future__ import annotations

import resource
import sys
import time
from collections.abc import Callable, Collection, Iterable
from typing import Protocol

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Info,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from sam2serve.server.cache import CacheStats
from sam2serve.server.memory import memory_limit_bytes

PREFIX = "sam2serve"
LATENCY_BUCKETS = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
)
BATCH_BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16, 32, 64)
OTHER_ENDPOINT = "other"  # every path that is not an endpoint, so labels stay bounded


class VideoSessionsView(Protocol):
    """What the metrics read of the video sessions (server.video_sessions.VideoSessions)."""

    expired: int

    def __len__(self) -> int: ...

    def held_bytes(self) -> int: ...


class _StateCollector(Collector):
    """Values owned elsewhere (caches, queue, memory), read when /metrics is scraped."""

    def __init__(
        self,
        caches: dict[str, Callable[[], CacheStats]],
        queue_depths: Callable[[], dict[str, int]],
        queue_capacities: dict[str, int],
    ) -> None:
        self._caches = caches
        self._queue_depths = queue_depths
        self._queue_capacities = queue_capacities
        self._memory_limit = memory_limit_bytes()

    def collect(self) -> Iterable[Metric]:
        def family(
            kind: type[CounterMetricFamily | GaugeMetricFamily], name: str, doc: str
        ) -> CounterMetricFamily | GaugeMetricFamily:
            return kind(f"{PREFIX}_{name}", doc, labels=["cache"])

        hits = family(CounterMetricFamily, "cache_hits", "Cache lookups that found the entry.")
        misses = family(CounterMetricFamily, "cache_misses", "Cache lookups that did not.")
        evictions = family(
            CounterMetricFamily,
            "cache_evictions",
            "Entries evicted to stay within the byte budget.",
        )
        size = family(GaugeMetricFamily, "cache_bytes", "Bytes held by the cache.")
        entries = family(GaugeMetricFamily, "cache_entries", "Entries in the cache.")
        budget = family(GaugeMetricFamily, "cache_budget_bytes", "The cache's byte budget.")
        for name, read in self._caches.items():
            stats = read()
            hits.add_metric([name], stats.hits)
            misses.add_metric([name], stats.misses)
            evictions.add_metric([name], stats.evictions)
            size.add_metric([name], stats.bytes)
            entries.add_metric([name], stats.entries)
            budget.add_metric([name], stats.budget)
        yield from (hits, misses, evictions, size, entries, budget)
        depth = GaugeMetricFamily(
            f"{PREFIX}_queue_depth",
            "Model jobs waiting to run, by queue (interactive: encodes and clicks; bulk: AMG).",
            labels=["queue"],
        )
        for queue, waiting in self._queue_depths().items():
            depth.add_metric([queue], waiting)
        yield depth
        capacity = GaugeMetricFamily(
            f"{PREFIX}_queue_capacity",
            "Jobs a queue may hold before new ones get 503 (max_queue, max_bulk_queue).",
            labels=["queue"],
        )
        for queue, limit in self._queue_capacities.items():
            capacity.add_metric([queue], limit)
        yield capacity
        peak = GaugeMetricFamily(
            f"{PREFIX}_process_peak_rss_bytes", "Peak resident memory of the server process."
        )
        peak.add_metric([], _peak_rss_bytes())
        yield peak
        memory_limit = GaugeMetricFamily(
            f"{PREFIX}_memory_limit_bytes",
            "Memory the process may use: its cgroup's limit, else the machine's memory.",
        )
        memory_limit.add_metric([], self._memory_limit)
        yield memory_limit


def _peak_rss_bytes() -> int:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # Linux reports KiB


class Metrics:
    """Every metric of one app, registered in ``self.registry``."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        ProcessCollector(registry=self.registry)  # process_resident_memory_bytes, cpu, fds
        r = self.registry
        self.request_latency = Histogram(
            f"{PREFIX}_request_duration_seconds",
            "Request latency by endpoint.",
            ["endpoint"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.requests = Counter(
            f"{PREFIX}_requests",
            "Requests by endpoint and HTTP status.",
            ["endpoint", "status"],
            registry=r,
        )
        self.inflight = Gauge(
            f"{PREFIX}_inflight_requests", "Requests being handled now.", registry=r
        )
        self.stage_latency = Histogram(
            f"{PREFIX}_stage_duration_seconds",
            "Time per stage: read_body, decode_image, encode, decode_masks, amg, format, "
            "concepts_encode, concepts_detect.",
            ["stage"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.queue_wait = Histogram(
            f"{PREFIX}_queue_wait_seconds",
            "Time model jobs waited in the queue, by job kind.",
            ["kind"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.batch_size = Histogram(
            f"{PREFIX}_batch_size",
            "Jobs run together, by job kind (encode jobs are batched).",
            ["kind"],
            buckets=BATCH_BUCKETS,
            registry=r,
        )
        self.errors = Counter(
            f"{PREFIX}_errors",
            "Error responses by code and HTTP status.",
            ["code", "status"],
            registry=r,
        )
        self.client_disconnects = Counter(
            f"{PREFIX}_client_disconnects",
            "Requests whose client closed the connection, by endpoint and stage (upload: "
            "during the body; processing: after it, the work was cancelled).",
            ["endpoint", "stage"],
            registry=r,
        )
        self.jobs_cancelled = Counter(
            f"{PREFIX}_jobs_cancelled",
            "Model jobs dropped from the queue or stopped early because nobody waited for "
            "them any more, by job kind.",
            ["kind"],
            registry=r,
        )
        self.ready = Gauge(f"{PREFIX}_ready", "1 once the model is loaded and warm.", registry=r)
        self.model_info = Info(f"{PREFIX}_model", "The model being served.", registry=r)

    def watch(
        self,
        caches: dict[str, Callable[[], CacheStats]],
        queue_depths: Callable[[], dict[str, int]],
        queue_capacities: dict[str, int],
    ) -> None:
        self.registry.register(_StateCollector(caches, queue_depths, queue_capacities))

    def watch_videos(self, sessions: VideoSessionsView) -> None:
        """Video sessions held, their bytes and the idle ones closed, read at scrape time."""
        r = self.registry
        Gauge(f"{PREFIX}_video_sessions", "Video tracking sessions held.", registry=r).set_function(
            lambda: len(sessions)
        )
        Gauge(
            f"{PREFIX}_video_session_bytes",
            "Bytes the video sessions hold: decoded frames and tracking memory.",
            registry=r,
        ).set_function(sessions.held_bytes)
        Gauge(
            f"{PREFIX}_video_sessions_expired",
            "Video sessions closed after video_idle_s without a request, since start.",
            registry=r,
        ).set_function(lambda: sessions.expired)

    def watch_decoding(self, held: Callable[[], int], waiting: Callable[[], int]) -> None:
        """The decode budget: bytes reserved by uploads in flight, and requests waiting."""
        r = self.registry
        Gauge(
            f"{PREFIX}_decoded_bytes_in_flight",
            "Bytes reserved by uploads being decoded or waiting for their encode "
            "(max_decoded_bytes_in_flight bounds it).",
            registry=r,
        ).set_function(held)
        Gauge(
            f"{PREFIX}_decode_waiting",
            "Requests waiting for room in the decode budget.",
            registry=r,
        ).set_function(waiting)

    def observe_batch(self, kind: str, size: int, queue_s: list[float], run_s: float) -> None:
        self.batch_size.labels(kind).observe(size)
        for waited in queue_s:
            self.queue_wait.labels(kind).observe(waited)
        stage = {
            "encode": "encode",
            "decode": "decode_masks",
            "amg": "amg",
            "concepts_encode": "concepts_encode",
            "concepts_detect": "concepts_detect",
        }.get(kind)
        if stage is not None:
            self.stage_latency.labels(stage).observe(run_s)

    def observe_error(self, status: int, code: str) -> None:
        self.errors.labels(code, str(status)).inc()

    def observe_disconnect(self, path: str, stage: str, endpoints: Collection[str]) -> None:
        self.client_disconnects.labels(endpoint_label(path, endpoints), stage).inc()

    def observe_cancel(self, kind: str) -> None:
        self.jobs_cancelled.labels(kind).inc()

    def render(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


def endpoint_label(path: str, endpoints: Collection[str]) -> str:
    """The metric label of a request path: the endpoint (its template for a path with
    parameters, e.g. ``/v1/videos/{session_id}``), or "other" (labels stay bounded)."""
    if path in endpoints:
        return path
    parts = path.split("/")
    for endpoint in endpoints:
        if "{" in endpoint and _matches(endpoint.split("/"), parts):
            return endpoint
    return OTHER_ENDPOINT


def _matches(template: list[str], parts: list[str]) -> bool:
    return len(template) == len(parts) and all(
        t == p or (t.startswith("{") and t.endswith("}") and p)
        for t, p in zip(template, parts, strict=True)
    )


class RequestMetricsMiddleware:
    """Counts requests, in-flight requests and their latency per endpoint (pure ASGI)."""

    def __init__(self, app: ASGIApp, metrics: Metrics, endpoints: Iterable[str]) -> None:
        self.app = app
        self.metrics = metrics
        self.endpoints = frozenset(endpoints)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        endpoint = endpoint_label(scope["path"], self.endpoints)
        status = 500  # if the app dies before answering, the server answers 500

        async def send_with_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        started = time.perf_counter()
        self.metrics.inflight.inc()
        try:
            await self.app(scope, receive, send_with_status)
        finally:
            self.metrics.inflight.dec()
            self.metrics.request_latency.labels(endpoint).observe(time.perf_counter() - started)
            self.metrics.requests.labels(endpoint, str(status)).inc()
