"""The operators' files in deploy/ against what sam2serve and Ray Serve really export.

- Every metric the Grafana dashboard (deploy/grafana/sam2serve-dashboard.json) and the
  Prometheus rules (deploy/prometheus/sam2serve-alerts.yml) name must exist, with every
  label they select, group by or print: ``sam2serve_*`` and ``process_*`` as a real server's
  /metrics shows them after a few requests (embedding, segment, bad request, a client
  that goes away during its upload and one that goes away while its job waits), the
  replicas' readiness metrics as :class:`ReadinessMetrics` renders them, ``ray_*`` as the
  installed ``ray`` package's source and ``sam2serve.cluster`` define them (read, not run:
  no Ray cluster is started), recording rules as the rules file defines them.
- promtool (Prometheus' own parser) checks the rules, runs their unit tests
  (deploy/prometheus/sam2serve-alerts.test.yml) and parses every dashboard query. It is
  taken from $PROMTOOL or PATH, else unpacked from Debian's ``prometheus`` package
  (``apt-get download``, not installed; kept in pytest's cache), else, as root, installed
  with ``apt-get install prometheus``; else the tests are skipped naming what to install.
- The dashboard is importable as is: every panel has a title, the templated Prometheus
  datasource, queries, a unique id and a place on the grid; no datasource UID is
  hard-coded.

The server's encoder is the stub of ``server_support`` (zero embeddings, behind a gate the
test holds to keep a job waiting in the queue): everything that counts is real.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import re
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families
from server_support import (
    LiveServer,
    StubEncoderPredictor,
    b64,
    scrape,
    start_server,
    wait_ready,
)

from sam2serve.cluster.readiness import STAGES, ReadinessMetrics, ReplicaReport
from sam2serve.server.settings import ServerSettings

REPO = Path(__file__).resolve().parents[2]
DASHBOARD = REPO / "deploy" / "grafana" / "sam2serve-dashboard.json"
RULES = REPO / "deploy" / "prometheus" / "sam2serve-alerts.yml"
RULE_TESTS = REPO / "deploy" / "prometheus" / "sam2serve-alerts.test.yml"
OPERATIONS_DOC = REPO / "docs" / "operations.md"
CLUSTER_CODE = REPO / "sam2serve" / "cluster"

DATASOURCE = {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}
GRID_COLUMNS = 24
SEVERITIES = {"critical", "warning", "info"}
TARGET_LABELS = {"job", "instance"}  # added by Prometheus to every scraped series
# Series Prometheus itself writes for every scrape target.
PROMETHEUS_SERIES = {
    "up",
    "scrape_duration_seconds",
    "scrape_samples_scraped",
    "scrape_samples_post_metric_relabeling",
    "scrape_series_added",
}
# Labels Ray Serve adds to the metrics created through ray.serve.metrics in a replica.
RAY_SERVE_CONTEXT_LABELS = {"deployment", "replica", "application"}
EVENT_WAIT_S = 5.0  # how long to wait for a disconnect or a cancellation to be counted

# --------------------------------------------------------------------------- PromQL

AGGREGATIONS = {
    "sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values",
    "bottomk", "topk", "quantile", "limitk", "limit_ratio",
}  # fmt: skip
FUNCTIONS = {
    "abs", "absent", "absent_over_time", "acos", "acosh", "asin", "asinh", "atan", "atanh",
    "avg_over_time", "ceil", "changes", "clamp", "clamp_max", "clamp_min", "cos", "cosh",
    "count_over_time", "day_of_month", "day_of_week", "day_of_year", "days_in_month", "deg",
    "delta", "deriv", "double_exponential_smoothing", "end", "exp", "floor",
    "histogram_avg", "histogram_count", "histogram_fraction", "histogram_quantile",
    "histogram_stddev", "histogram_stdvar", "histogram_sum", "holt_winters", "hour",
    "idelta", "increase", "irate", "label_join", "label_replace", "last_over_time", "ln",
    "log10", "log2", "mad_over_time", "max_over_time", "min_over_time", "minute", "month",
    "pi", "predict_linear", "present_over_time", "quantile_over_time", "rad", "rate",
    "resets", "round", "scalar", "sgn", "sin", "sinh", "sort", "sort_by_label",
    "sort_by_label_desc", "sort_desc", "sqrt", "start", "stddev_over_time",
    "stdvar_over_time", "sum_over_time", "tan", "tanh", "time", "timestamp", "vector", "year",
}  # fmt: skip
LABEL_LIST_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right"}
OTHER_KEYWORDS = {"and", "or", "unless", "bool", "offset", "atan2", "inf", "nan"}
MATCH_OPS = {"=", "!=", "=~", "!~"}

_TOKEN = re.compile(
    r"""
    (?P<space>\s+)
    | (?P<comment>\#[^\n]*)
    | (?P<string>"(?:\\.|[^"\\])*"|'(?:\\.|[^'\\])*'|`[^`]*`)
    | (?P<variable>\$\{[^}]*\}|\$\w+)
    | (?P<number>(?:0x[0-9a-fA-F]+|\d+(?:\.\d+)?(?:[eE][+-]?\d+)?)(?:ms|[smhdwy])*)
    | (?P<ident>[a-zA-Z_:][a-zA-Z0-9_:]*)
    | (?P<op>=~|!~|!=|==|>=|<=|[-+*/%^=<>(){}\[\],@])
    """,
    re.VERBOSE,
)


@dataclass
class Query:
    """What one PromQL expression names.

    ``uses`` pairs label names with the metrics that must carry them: a selector's
    matchers with its metric, an aggregation's ``by``/``without`` list with the metrics it
    aggregates, a ``on``/``ignoring``/``group_*`` list with every metric of the expression.
    ``grouping`` is what ``by``/``group_left``/``group_right`` lists keep in the result."""

    text: str
    metrics: set[str] = field(default_factory=set)
    uses: list[tuple[frozenset[str], frozenset[str]]] = field(default_factory=list)
    grouping: set[str] = field(default_factory=set)

    @property
    def labels(self) -> set[str]:
        return {label for labels, _ in self.uses for label in labels}


def tokenize(expr: str) -> list[tuple[str, str]]:
    tokens, position = [], 0
    while position < len(expr):
        match = _TOKEN.match(expr, position)
        if match is None:
            raise ValueError(f"cannot tokenize {expr[position : position + 20]!r} in {expr!r}")
        kind = match.lastgroup
        assert kind is not None
        if kind not in ("space", "comment"):
            tokens.append((kind, match.group()))
        position = match.end()
    return tokens


def _closing(tokens: list[tuple[str, str]], at: int, expr: str) -> int:
    """Index of the bracket that closes the one at ``at``."""
    opening = tokens[at][1]
    closing = {"(": ")", "{": "}", "[": "]"}[opening]
    depth = 0
    for i in range(at, len(tokens)):
        depth += {opening: 1, closing: -1}.get(tokens[i][1], 0)
        if depth == 0:
            return i
    raise ValueError(f"unclosed {opening} in {expr!r}")


def parse_promql(expr: str) -> Query:
    """Metric names and label names of a PromQL expression (Grafana variables allowed).

    An identifier is a metric name unless it is a function or aggregation (followed by
    ``(``, or an aggregation followed by ``by``/``without``), a keyword, a label name
    inside ``{...}`` or in a ``by (...)``-style list, or inside a ``[...]`` range."""
    query = Query(expr)
    tokens = tokenize(expr)
    metric_at: dict[int, str] = {}
    label_lists: dict[int, tuple[str, frozenset[str]]] = {}  # keyword index -> list
    selectors: list[tuple[int, frozenset[str]]] = []  # (metric index or -1, matchers)
    aggregations: list[tuple[int, int]] = []  # (keyword index of its list, args span end)
    spans: dict[int, tuple[int, int]] = {}

    def text_at(at: int) -> str:
        return tokens[at][1] if at < len(tokens) else ""

    i = 0
    while i < len(tokens):
        kind, text = tokens[i]
        if text == "{":
            end = _closing(tokens, i, expr)
            matchers = frozenset(
                tokens[j][1]
                for j in range(i + 1, end)
                if tokens[j][0] == "ident" and text_at(j + 1) in MATCH_OPS
            )
            selectors.append((i - 1 if i - 1 in metric_at else -1, matchers))
            i = end
        elif text == "[":
            i = _closing(tokens, i, expr)
        elif kind == "ident" and text in LABEL_LIST_KEYWORDS:
            if text_at(i + 1) == "(":
                end = _closing(tokens, i + 1, expr)
                names = frozenset(t for k, t in tokens[i + 2 : end] if k == "ident")
                label_lists[i] = (text, names)
                if text in ("by", "group_left", "group_right"):
                    query.grouping |= names
                i = end
        elif kind == "ident" and text in AGGREGATIONS:
            # sum by (l) (args)  or  sum (args) by (l)
            args = i + 1
            if text_at(args) in ("by", "without"):
                args = _closing(tokens, args + 1, expr) + 1
            if text_at(args) == "(":
                end = _closing(tokens, args, expr)
                spans[i] = (args, end)
                if text_at(i + 1) in ("by", "without"):
                    aggregations.append((i + 1, i))
                elif text_at(end + 1) in ("by", "without"):
                    aggregations.append((end + 1, i))
        elif kind == "ident" and text not in OTHER_KEYWORDS:
            if text_at(i + 1) == "(":
                if text not in FUNCTIONS:
                    raise ValueError(f"unknown PromQL function {text!r} in {expr!r}")
            else:
                metric_at[i] = text
        i += 1

    query.metrics = set(metric_at.values())
    everything = frozenset(query.metrics)
    for at, matchers in selectors:
        query.uses.append((matchers, frozenset([metric_at[at]]) if at >= 0 else everything))
    aggregated = set()
    for list_at, aggregation_at in aggregations:
        first, last = spans[aggregation_at]
        inside = frozenset(name for at, name in metric_at.items() if first < at < last)
        query.uses.append((label_lists[list_at][1], inside))
        aggregated.add(list_at)
    for at, (_, names) in label_lists.items():
        if at not in aggregated:
            query.uses.append((names, everything))
    return query


_LABEL_VALUES = re.compile(r"^\s*label_values\((?P<expr>.*),\s*(?P<label>\w+)\s*\)\s*$", re.DOTALL)


def parse_variable_query(text: str) -> Query:
    """A Grafana Prometheus variable query: ``label_values(expr, label)`` or PromQL."""
    match = _LABEL_VALUES.match(text)
    if match is None:
        return parse_promql(text)
    query = parse_promql(match["expr"])
    query.uses.append((frozenset([match["label"]]), frozenset(query.metrics)))
    query.text = text
    return query


def test_the_promql_reader_on_known_cases():
    """The reader itself, on expressions whose answer is known."""
    query = parse_promql(
        "histogram_quantile(0.95, sum by (le, endpoint) "
        '(rate(a_bucket{job=~"$job", endpoint!="/v1/amg"}[$__rate_interval])))'
        " / on (endpoint) group_left b:target > 2 # a comment naming c"
    )
    assert query.metrics == {"a_bucket", "b:target"}
    assert query.labels == {"le", "endpoint", "job"}
    assert query.grouping == {"le", "endpoint"}
    assert set(query.uses) == {
        (frozenset({"job", "endpoint"}), frozenset({"a_bucket"})),
        (frozenset({"le", "endpoint"}), frozenset({"a_bucket"})),
        (frozenset({"endpoint"}), frozenset({"a_bucket", "b:target"})),
    }
    query = parse_promql("sum(rate(x_total[5m] offset 1h)) without (instance) or vector(0)")
    assert query.metrics == {"x_total"} and query.labels == {"instance"}
    assert query.uses == [(frozenset({"instance"}), frozenset({"x_total"}))]
    assert query.grouping == set()
    query = parse_promql("max by (q) (depth) / on (q) group_left capacity")
    assert (frozenset({"q"}), frozenset({"depth"})) in query.uses
    query = parse_variable_query('label_values(up{job="a"}, instance)')
    assert query.metrics == {"up"} and query.labels == {"job", "instance"}
    with pytest.raises(ValueError, match="unknown PromQL function"):
        parse_promql("rato(x[5m])")


# --------------------------------------------------------------------------- the files


@dataclass
class Expression:
    where: str  # e.g. 'panel 12 "Queue depth by queue" A', 'alert SAM2ServeDown'
    query: Query
    shown_labels: set[str]  # labels a legend or annotation template prints


def load_dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def load_rules() -> dict[str, Any]:
    return yaml.safe_load(RULES.read_text())


def all_panels(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in dashboard["panels"]:
        yield panel
        yield from panel.get("panels", [])  # the panels of a collapsed row


def rules_of(rules: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for group in rules["groups"]:
        yield from group["rules"]


_LEGEND_LABEL = re.compile(r"\{\{\s*(\w+)\s*\}\}")
_TEMPLATE_LABEL = re.compile(r"\$labels\.(\w+)")


def dashboard_expressions() -> list[Expression]:
    dashboard = load_dashboard()
    found = []
    for panel in all_panels(dashboard):
        for target in panel.get("targets", []):
            where = f'panel {panel["id"]} "{panel["title"]}" {target["refId"]}'
            legend = target.get("legendFormat", "")
            found.append(
                Expression(where, parse_promql(target["expr"]), set(_LEGEND_LABEL.findall(legend)))
            )
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            text = variable["query"]
            text = text["query"] if isinstance(text, dict) else text
            found.append(
                Expression(f"variable ${variable['name']}", parse_variable_query(text), set())
            )
    return found


def rule_expressions() -> list[Expression]:
    found = []
    for rule in rules_of(load_rules()):
        name = rule.get("alert") or rule["record"]
        kind = "alert" if "alert" in rule else "record"
        templates = " ".join(rule.get("annotations", {}).values())
        shown = set(_TEMPLATE_LABEL.findall(templates))
        found.append(Expression(f"{kind} {name}", parse_promql(rule["expr"]), shown))
    return found


def recorded_series() -> dict[str, set[str]]:
    """Recording rules of the rules file: name -> the labels their series carry."""
    recorded: dict[str, set[str]] = {}
    for rule in rules_of(load_rules()):
        if "record" in rule:
            labels = set(rule.get("labels", {})) | parse_promql(rule["expr"]).grouping
            recorded.setdefault(rule["record"], set()).update(labels)
    return recorded


# --------------------------------------------------------------------------- a real server


def families_of(text: str) -> dict[str, set[str]]:
    """Prometheus text -> {sample name: label names seen on it}."""
    names: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            names.setdefault(sample.name, set()).update(sample.labels)
    return names


def send_raw(url: str, head: str, body: bytes) -> socket.socket:
    """Open a connection and send a request head and (part of) a body; the caller closes."""
    host, port = url.removeprefix("http://").split(":")
    conn = socket.create_connection((host, int(port)), timeout=10)
    conn.sendall(head.encode("ascii") + body)
    return conn


def json_head(path: str, length: int) -> str:
    return (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {length}\r\n\r\n"
    )


def wait_for_sample(live: LiveServer, name: str) -> bool:
    """Whether a sample of ``name`` with a value > 0 appears in /metrics within EVENT_WAIT_S."""
    deadline = time.monotonic() + EVENT_WAIT_S
    with live.client() as client:
        while time.monotonic() < deadline:
            samples = scrape(client)
            if any(k.partition("{")[0] == name and v > 0 for k, v in samples.items()):
                return True
            time.sleep(0.1)
    return False


def exercise(live: LiveServer, stub: StubEncoderPredictor, photos: dict[str, bytes]) -> None:
    """Requests that make the labelled series exist: an embedding, a segment, bad requests,
    a client gone during its upload, a client gone while its encode job waits."""
    with live.client() as client:
        answer = client.post("/v1/embeddings", json={"image": b64(photos["chelsea"])})
        assert answer.status_code == 200, answer.text
        image_id = answer.json()["image_id"]
        objects = [{"points": [{"x": 60, "y": 40}]}]
        answer = client.post("/v1/segment", json={"image_id": image_id, "objects": objects})
        assert answer.status_code == 200, answer.text
        answer = client.post("/v1/segment", json={"image_id": image_id, "objects": "all"})
        assert answer.status_code == 422, answer.text
        assert client.get("/v1/no-such-endpoint").status_code == 404

    # Gone during the upload: the first 1000 bytes of the body, then the connection closes.
    upload = json.dumps({"image": b64(photos["rocket"])}).encode()
    send_raw(live.url, json_head("/v1/embeddings", len(upload)), upload[:1000]).close()

    # Gone while its job waits: the worker is held in another encode (the stub's gate),
    # a second upload queues behind it, and its client closes the connection.
    stub.gate.clear()
    stub.entered.clear()
    first: dict[str, Any] = {}

    def post_first() -> None:
        with live.client() as client:
            first["answer"] = client.post(
                "/v1/embeddings", json={"image": b64(photos["astronaut"])}
            )

    runner = threading.Thread(target=post_first)
    runner.start()
    try:
        assert stub.entered.wait(30), "the first encode never started"
        second = json.dumps({"image": b64(photos["coffee"])}).encode()
        conn = send_raw(live.url, json_head("/v1/embeddings", len(second)), second)
        try:
            queued = False
            deadline = time.monotonic() + 30
            with live.client() as client:
                while not queued and time.monotonic() < deadline:
                    samples = scrape(client)
                    queued = any(
                        k.startswith("sam2serve_queue_depth") and v >= 1 for k, v in samples.items()
                    )
                    time.sleep(0.05)
            assert queued, "the second encode never waited in the queue"
        finally:
            conn.close()
        wait_for_sample(live, "sam2serve_jobs_cancelled_total")  # a missing one is reported below
    finally:
        stub.gate.set()
        runner.join(60)
    assert first["answer"].status_code == 200, first["answer"].text
    wait_for_sample(live, "sam2serve_client_disconnects_total")


def readiness_families() -> dict[str, set[str]]:
    """What a replica appends to /metrics (its cold start), rendered for a made-up replica."""
    report = ReplicaReport(
        replica="r1",
        deployment="sam2_tiny_fast",
        app="tiny-fast",
        model="tiny",
        mode="fast",
        backend="artifacts",
        device="cpu",
        source_kind="artifacts",
        source_location="/artifacts",
        source_local="/artifacts",
        source_copied=False,
        source_sha256="0" * 64,
        weights={"source": "random"},
        compile_frames=0,
        stages_s=dict.fromkeys(STAGES, 1.0),
    )
    return families_of(ReadinessMetrics(report).render().decode())


@pytest.fixture(scope="module")
def service_series(predictor, photos) -> dict[str, set[str]]:
    """Every sample name (with its labels) a server and a replica export, after
    ``exercise``."""
    stub = StubEncoderPredictor(predictor.model)
    live = start_server(ServerSettings.from_flat(max_wait_ms=5, request_timeout_s=60), stub)
    try:
        wait_ready(live)
        exercise(live, stub, photos)
        with live.client() as client:
            text = client.get("/metrics").text
    finally:
        stub.gate.set()
        live.stop()
    series = families_of(text)
    for name, labels in readiness_families().items():
        series.setdefault(name, set()).update(labels)
    return series


# --------------------------------------------------------------------------- Ray's names


@dataclass
class RayMetric:
    pattern: re.Pattern[str]  # the exported name; f-string parts match [a-z0-9]+
    labels: set[str]
    source: str


def _string_of(node: ast.expr) -> str | None:
    """A name argument as a regex: constants escaped, f-string fields as [a-z0-9]+."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return re.escape(node.value)
    if isinstance(node, ast.JoinedStr):
        parts = []
        for value in node.values:
            if isinstance(value, ast.Constant):
                parts.append(re.escape(str(value.value)))
            else:
                parts.append("[a-z0-9]+")
        return "".join(parts)
    return None


def _strings_in(node: ast.AST) -> set[str]:
    return {
        n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)
    }


RAY_METRIC_MODULES = ("ray.util.metrics", "ray.serve.metrics")
SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)


def _in_scope(node: ast.AST) -> Iterator[ast.AST]:
    """The nodes of one function (or module) body, not those of the functions within."""
    for child in ast.iter_child_nodes(node):
        yield child
        if not isinstance(child, SCOPES):
            yield from _in_scope(child)


def _bind(node: ast.AST, bound: dict[str, str]) -> dict[str, str]:
    """``bound`` updated by the imports of this scope: local names of Ray's metric modules
    and classes -> the module they come from (other imports shadow them)."""
    local = dict(bound)
    for child in _in_scope(node):
        if isinstance(child, ast.ImportFrom):
            for alias in child.names:
                name = alias.asname or alias.name
                module = f"{child.module}.{alias.name}"
                if module in RAY_METRIC_MODULES:
                    local[name] = module
                elif child.module in RAY_METRIC_MODULES:
                    local[name] = child.module
                else:
                    local.pop(name, None)
        elif isinstance(child, ast.Import):
            for alias in child.names:
                local.pop(alias.asname or alias.name.partition(".")[0], None)
    return local


def _metric_calls(node: ast.AST, bound: dict[str, str]) -> Iterator[tuple[ast.Call, str, str]]:
    """(call, module, kind) of every Counter/Gauge/Histogram of Ray's created in a scope."""
    local = _bind(node, bound)
    for child in _in_scope(node):
        if isinstance(child, SCOPES):
            yield from _metric_calls(child, local)
        elif isinstance(child, ast.Call):
            func = child.func
            if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
                module, kind = local.get(func.value.id), func.attr
            elif isinstance(func, ast.Name):
                module, kind = local.get(func.id), func.id
            else:
                continue
            if module is not None and kind in ("Counter", "Gauge", "Histogram"):
                yield child, module, kind


def ray_metrics_in(path: Path) -> list[RayMetric]:
    """Counters, gauges and histograms a module creates through Ray's metrics API, with
    the names Ray's Prometheus endpoint gives them (``ray_`` prefix, ``_total`` on counters,
    ``_bucket``/``_sum``/``_count`` on histograms) and the labels they carry."""
    tree = ast.parse(path.read_text(), str(path))
    assigned: dict[str, set[str]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    assigned.setdefault(target.id, set()).update(_strings_in(node.value))
    found = []
    for call, module, kind in _metric_calls(tree, {}):
        arguments = {k.arg: k.value for k in call.keywords}
        name_node = call.args[0] if call.args else arguments.get("name")
        name = _string_of(name_node) if name_node is not None else None
        if name is None:
            continue
        tag_node = arguments.get("tag_keys")
        if tag_node is None:
            labels = set()
        elif isinstance(tag_node, ast.Name):
            labels = assigned.get(tag_node.id, set(RAY_SERVE_CONTEXT_LABELS))
        else:
            labels = _strings_in(tag_node)
        if module == "ray.serve.metrics":
            labels |= RAY_SERVE_CONTEXT_LABELS
        labels |= TARGET_LABELS
        if kind == "Counter":
            names = [name.removesuffix("_total") + "_total"]
        elif kind == "Histogram":
            names = [name + "_bucket", name + "_sum", name + "_count"]
        else:
            names = [name]
        where = f"{path.name}:{call.lineno}"
        for exported in names:
            extra = {"le"} if exported.endswith("_bucket") else set()
            found.append(RayMetric(re.compile(f"ray_{exported}"), labels | extra, where))
    return found


@pytest.fixture(scope="module")
def ray_series() -> list[RayMetric]:
    spec = importlib.util.find_spec("ray")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("ray is not installed: pip install 'ray[serve]==2.60.0'")
    serve_source = Path(next(iter(spec.submodule_search_locations))) / "serve"
    found = []
    for path in sorted(serve_source.rglob("*.py")):
        if "tests" not in path.relative_to(serve_source).parts:
            found += ray_metrics_in(path)
    ray_names = [m for m in found if "ray_serve_" in m.pattern.pattern]
    assert len(ray_names) > 50, "Ray Serve's metrics were not found in its source"
    for path in sorted(CLUSTER_CODE.glob("*.py")):
        found += ray_metrics_in(path)
    return found


def ray_metric(series: list[RayMetric], name: str) -> RayMetric | None:
    return next((m for m in series if m.pattern.fullmatch(name)), None)


# --------------------------------------------------------------------------- names, labels


def expressions() -> list[Expression]:
    return dashboard_expressions() + rule_expressions()


def test_every_service_metric_is_exported(service_series):
    """sam2serve_*/process_* names as a real server and a replica export them."""
    recorded = recorded_series()
    missing = set()
    for expression in expressions():
        for name in expression.query.metrics:
            if ":" in name:
                assert name in recorded, f"{expression.where}: no recording rule makes {name}"
            elif name.startswith("ray_") or name in PROMETHEUS_SERIES:
                continue
            elif not name.startswith(("sam2serve_", "process_")):
                pytest.fail(f"{expression.where}: {name} is neither sam2serve's nor Ray's")
            elif name not in service_series:
                missing.add(name)
    assert not missing, f"not exported by the server: {sorted(missing)}"


def test_every_ray_metric_exists_in_ray_serve(ray_series):
    """ray_* names as Ray Serve 2.60 (and sam2serve.cluster) define them."""
    missing = set()
    for expression in expressions():
        for name in expression.query.metrics:
            if name.startswith("ray_") and ray_metric(ray_series, name) is None:
                missing.add(f"{name} ({expression.where})")
    assert not missing, f"not defined in Ray Serve or sam2serve.cluster: {sorted(missing)}"


def test_every_label_exists_on_its_metrics(service_series, ray_series):
    """Every label an expression selects, groups by or prints (legend, annotation) is one
    its metrics carry: a label that does not exist selects nothing or prints nothing."""
    recorded = recorded_series()

    def known(name: str) -> set[str]:
        if name in recorded:
            return recorded[name] | TARGET_LABELS
        if name.startswith("ray_"):
            metric = ray_metric(ray_series, name)
            return metric.labels if metric is not None else set()
        return service_series.get(name, set()) | TARGET_LABELS

    wrong = []
    for expression in expressions():
        query = expression.query
        for labels, metrics in query.uses:
            carried = set().union(*(known(name) for name in metrics)) if metrics else set()
            for label in sorted(labels - carried):
                wrong.append(f"{expression.where}: label {label!r} on {sorted(metrics)}")
        # What a legend or an annotation prints must survive the aggregation.
        if query.grouping:
            kept = query.grouping - {"le"}
        else:
            kept = set(TARGET_LABELS).union(*(known(name) for name in query.metrics))
        for label in sorted(expression.shown_labels - kept):
            wrong.append(f"{expression.where}: prints {label!r}, the result has {sorted(kept)}")
    assert not wrong, "\n".join(wrong)


# --------------------------------------------------------------------------- promtool

PROMTOOL_HINT = (
    "promtool is needed: put it on PATH (Debian/Ubuntu: `apt-get install prometheus`, or "
    "promtool from the release archive at https://prometheus.io/download/) or set "
    "PROMTOOL=/path/to/promtool"
)
APT_TIMEOUT_S = 300


def _works(binary: Path | str) -> bool:
    try:
        result = subprocess.run(
            [str(binary), "--version"], capture_output=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return result.returncode == 0


def _run(command: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        command, capture_output=True, text=True, timeout=APT_TIMEOUT_S, check=False, **kwargs
    )


def promtool_from_debian_package(dest: Path) -> str:
    """Download Debian's ``prometheus`` package (``apt-get download``: no install, no
    daemon) and unpack only promtool from it; as root, refresh apt's lists if needed."""
    if not (shutil.which("apt-get") and shutil.which("dpkg-deb")):
        raise OSError("no apt-get / dpkg-deb on this machine")
    with tempfile.TemporaryDirectory() as tmp:
        download = ["apt-get", "download", "prometheus"]
        result = _run(download, cwd=tmp)
        if result.returncode != 0 and os.geteuid() == 0:
            _run(["apt-get", "update"])
            result = _run(download, cwd=tmp)
        debs = list(Path(tmp).glob("prometheus_*.deb"))
        if result.returncode != 0 or not debs:
            raise OSError(f"apt-get download prometheus: {result.stderr.strip()[-300:]}")
        unpacked = Path(tmp) / "unpacked"
        result = _run(["dpkg-deb", "-x", str(debs[0]), str(unpacked)])
        if result.returncode != 0:
            raise OSError(f"dpkg-deb -x: {result.stderr.strip()[-300:]}")
        dest.parent.mkdir(parents=True, exist_ok=True)
        partial = dest.with_name(f"{dest.name}.{os.getpid()}.part")
        shutil.copy2(unpacked / "usr" / "bin" / "promtool", partial)
        os.replace(partial, dest)  # whole, even with another session fetching it too
    return str(dest)


def promtool_from_apt_install() -> str:
    """``apt-get install prometheus`` (root only); promtool comes with it."""
    if not shutil.which("apt-get"):
        raise OSError("no apt-get")
    if os.geteuid() != 0:
        raise OSError("apt-get install needs root")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = ["apt-get", "install", "-y", "--no-install-recommends", "prometheus"]
    result = _run(install, env=env)
    if result.returncode != 0:
        _run(["apt-get", "update"], env=env)
        result = _run(install, env=env)
    found = shutil.which("promtool")
    if result.returncode != 0 or found is None:
        raise OSError(f"apt-get install prometheus: {result.stderr.strip()[-300:]}")
    return found


@pytest.fixture(scope="session")
def promtool(request, tmp_path_factory) -> str:
    """promtool: $PROMTOOL, PATH, a copy kept in pytest's cache, else fetched (see above)."""
    for candidate in (os.environ.get("PROMTOOL"), shutil.which("promtool")):
        if candidate and _works(candidate):
            return candidate
    cache = getattr(request.config, "cache", None)
    home = Path(cache.mkdir("promtool")) if cache is not None else tmp_path_factory.mktemp("pt")
    kept = home / "promtool"
    if _works(kept):
        return str(kept)
    failures = []
    for fetch in (lambda: promtool_from_debian_package(kept), promtool_from_apt_install):
        started = time.monotonic()
        try:
            found = fetch()
        except (OSError, subprocess.TimeoutExpired) as exc:
            failures.append(str(exc))
            continue
        if _works(found):
            print(f"promtool: {found}, fetched in {time.monotonic() - started:.1f} s")
            return found
        failures.append(f"{found} does not run")
    pytest.skip(f"{PROMTOOL_HINT} ({'; '.join(failures)})")


def run_promtool(promtool: str, *args: str, cwd: Path = REPO) -> str:
    result = subprocess.run(
        [promtool, *args], cwd=cwd, capture_output=True, text=True, timeout=120, check=False
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    return output


def test_promtool_checks_the_rules(promtool):
    output = run_promtool(promtool, "check", "rules", str(RULES.relative_to(REPO)))
    assert "SUCCESS" in output, output


def test_promtool_runs_the_rules_unit_tests(promtool):
    output = run_promtool(promtool, "test", "rules", RULE_TESTS.name, cwd=RULE_TESTS.parent)
    assert "SUCCESS" in output, output


_GRAFANA_VARIABLE = re.compile(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)")


def as_promql(grafana_expr: str) -> str:
    """A dashboard query with Grafana's variables replaced: intervals by 5m, the others
    (always inside a regex matcher) by '.*'."""

    def value(match: re.Match[str]) -> str:
        name = match[1] or match[2]
        return "5m" if name.startswith("__") else ".*"

    return _GRAFANA_VARIABLE.sub(value, grafana_expr)


def test_promtool_parses_every_dashboard_query(promtool, tmp_path):
    """Each dashboard query as a recording rule: promtool parses it with Prometheus' parser."""
    rules = [
        {"record": f"dashboard:query_{i}", "expr": as_promql(e.query.text)}
        for i, e in enumerate(dashboard_expressions())
        if not e.where.startswith("variable")
    ]
    path = tmp_path / "dashboard-queries.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    output = run_promtool(promtool, "check", "rules", str(path))
    assert f"SUCCESS: {len(rules)} rules found" in output, output


# --------------------------------------------------------------------------- the rules


def test_every_alert_is_actionable_and_tested():
    """for, severity, summary, description and a runbook section in docs/operations.md;
    and a unit test in which it fires."""
    doc_headings = {
        line.lstrip("#").strip()
        for line in OPERATIONS_DOC.read_text().splitlines()
        if line.startswith("#")
    }
    tests = yaml.safe_load(RULE_TESTS.read_text())
    fired = {
        case["alertname"]
        for test in tests["tests"]
        for case in test.get("alert_rule_test", [])
        if case.get("exp_alerts")
    }
    alerts = [rule for rule in rules_of(load_rules()) if "alert" in rule]
    assert len({rule["alert"] for rule in alerts}) == len(alerts), "duplicate alert names"
    for rule in alerts:
        name = rule["alert"]
        assert re.fullmatch(r"\d+[smh]", str(rule.get("for", ""))), f"{name}: no 'for'"
        assert rule["labels"]["severity"] in SEVERITIES, name
        annotations = rule["annotations"]
        assert annotations["summary"] and annotations["description"], name
        assert annotations["runbook"] == f"docs/operations.md#{name.lower()}", name
        assert name in doc_headings, f"{name}: no section in docs/operations.md"
        assert name in fired, f"{name}: no unit test in which it fires"
    names = {rule["alert"] for rule in alerts}
    assert {"SAM2ServeErrorRateHigh", "SAM2ServeNotReady"} <= names


# --------------------------------------------------------------------------- the dashboard


def test_the_dashboard_is_importable():
    dashboard = load_dashboard()
    assert dashboard["title"] and dashboard["schemaVersion"] >= 36
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    source = variables["DS_PROMETHEUS"]
    assert (source["type"], source["query"]) == ("datasource", "prometheus")
    ids: list[int] = []
    cells: dict[tuple[int, int], int] = {}
    panels = list(all_panels(dashboard))
    for panel in panels:
        ids.append(panel["id"])
        assert panel.get("title"), f"panel {panel['id']} has no title"
        grid = panel["gridPos"]
        assert all(isinstance(grid[k], int) for k in "hwxy"), panel["title"]
        assert 0 <= grid["x"] and grid["x"] + grid["w"] <= GRID_COLUMNS, panel["title"]
        for y in range(grid["y"], grid["y"] + grid["h"]):
            for x in range(grid["x"], grid["x"] + grid["w"]):
                other = cells.setdefault((x, y), panel["id"])
                assert other == panel["id"], f"panels {other} and {panel['id']} overlap"
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == DATASOURCE, panel["title"]
        assert panel.get("description"), f"{panel['title']}: no description"
        assert panel["fieldConfig"]["defaults"].get("unit"), f"{panel['title']}: no unit"
        targets = panel["targets"]
        assert targets, f"{panel['title']}: no queries"
        assert len({t["refId"] for t in targets}) == len(targets), panel["title"]
        for target in targets:
            assert target["expr"].strip(), f"{panel['title']}: empty query"
            assert target["datasource"] == DATASOURCE, panel["title"]
    assert len(set(ids)) == len(ids), "panel ids are not unique"
    assert sum(p["type"] == "row" for p in panels) >= 5


def test_the_dashboard_hard_codes_no_datasource():
    def datasources(node: Any) -> Iterator[Any]:
        if isinstance(node, dict):
            for key, value in node.items():
                if key == "datasource":
                    yield value
                yield from datasources(value)
        elif isinstance(node, list):
            for value in node:
                yield from datasources(value)

    for found in datasources(load_dashboard()):
        assert found in (DATASOURCE, {"type": "grafana", "uid": "-- Grafana --"}), found
