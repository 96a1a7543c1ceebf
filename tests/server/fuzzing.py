"""schemathesis over a live server's OpenAPI document, shared by the reliability suites:
every operation (or those under some path prefixes), in positive and negative modes,
each response checked against the document (no 5xx; status, content type and body as
documented), every distinct failure kept with one example.

The server is a real one on loopback (``hostile.spawn_server``), reached over sockets, so
framing, the body-size middleware and disconnects behave as in production."""

from __future__ import annotations

import collections
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import hypothesis
import requests
import schemathesis
from hypothesis import HealthCheck, Phase
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.core.failures import FailureGroup
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]
# Examples per operation and mode: schema-valid bodies reach deeper, so they get more.
EXAMPLES = {GenerationMode.POSITIVE: 100, GenerationMode.NEGATIVE: 30}
REQUEST_TIMEOUT_S = 30.0

# Changes a drawn case before it is sent (real images, well-formed parts): (case,
# operation, mode, data).
Seeder = Callable[[schemathesis.Case, Any, GenerationMode, st.DataObject], None]


@dataclass
class FuzzReport:
    """What schemathesis sent and every distinct failure, with one example each."""

    deadline: float  # time.monotonic() past which no more requests are sent
    budget_s: float = 0.0
    statuses: collections.Counter = field(default_factory=collections.Counter)
    failures: dict[tuple[str, str], str] = field(default_factory=dict)

    @classmethod
    def within(cls, budget_s: float) -> FuzzReport:
        return cls(deadline=time.monotonic() + budget_s, budget_s=budget_s)

    def out_of_time(self) -> bool:
        if time.monotonic() < self.deadline:
            return False
        self.failures.setdefault(("all", "time"), f"stopped after {self.budget_s:g} s")
        return True

    def fail(self, where: str, problem: str, case: schemathesis.Case) -> None:
        first_line = problem.strip().splitlines()[0] if problem.strip() else "failure"
        key = (where, first_line[:200])
        if key not in self.failures:
            body = repr(case.body)[:300]
            self.failures[key] = f"{problem.strip()[:1500]}\n    request body: {body}"

    def describe(self) -> str:
        lines = [f"{len(self.failures)} distinct failure(s):"]
        for (where, _), example in self.failures.items():
            lines.append(f"- {where}: {example}")
        return "\n".join(lines)

    def summary(self) -> str:
        by_status: collections.Counter = collections.Counter()
        for (_, status), count in self.statuses.items():
            by_status[status] += count
        return f"{sum(by_status.values())} requests, by status {dict(sorted(by_status.items()))}"

    def status_list(self) -> list[int]:
        """Every status received, once per request (for the surfaces' tallies)."""
        return [status for (_, status), count in self.statuses.items() for _ in range(count)]


def fuzz_operation(
    operation: Any,
    mode: GenerationMode,
    url: str,
    headers: dict[str, str] | None,
    examples: int,
    report: FuzzReport,
    label: str,
    seed: Seeder | None = None,
) -> None:
    where = f"{label}: {operation.label} ({mode.value})"

    @hypothesis.settings(
        max_examples=examples,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
        phases=(Phase.explicit, Phase.generate),
    )
    @hypothesis.given(data=st.data())
    def run(data: st.DataObject) -> None:
        case = data.draw(operation.as_strategy(generation_mode=mode), label="case")
        if seed is not None:
            seed(case, operation, mode, data)
        # Past the budget, every case is still drawn (hypothesis refuses a test whose draws
        # change between runs: its FlakyStrategyDefinition hid the report) but not sent.
        if report.out_of_time():
            return
        try:
            response = case.call(base_url=url, headers=headers, timeout=REQUEST_TIMEOUT_S)
        except requests.RequestException as exc:  # a dropped connection or no answer in time
            report.fail(where, f"no answer: {exc!r}", case)
            return
        report.statuses[(where, response.status_code)] += 1
        try:
            case.validate_response(response, checks=CHECKS, headers=headers)
        except (AssertionError, FailureGroup) as exc:  # schemathesis' Failure(s)
            report.fail(where, f"{type(exc).__name__}: {exc}", case)

    try:
        run()
    except hypothesis.errors.Unsatisfiable:
        pass  # nothing to generate (negative mode on an operation without parameters)


def fuzz(
    url: str,
    report: FuzzReport,
    label: str,
    headers: dict[str, str] | None = None,
    modes: tuple[GenerationMode, ...] = (GenerationMode.POSITIVE, GenerationMode.NEGATIVE),
    examples: int | dict[GenerationMode, int] | None = None,
    seed: Seeder | None = None,
    paths: tuple[str, ...] | None = None,
) -> None:
    """Every operation of the live server's OpenAPI document (those whose path starts
    with one of ``paths``, when given), in every mode."""
    schema = schemathesis.openapi.from_url(f"{url}/openapi.json")
    for result in schema.get_all_operations():
        operation = result.ok()
        if paths is not None and not operation.path.startswith(paths):
            continue
        for mode in modes:
            if examples is None:
                count = EXAMPLES[mode]
            else:
                count = examples[mode] if isinstance(examples, dict) else examples
            fuzz_operation(operation, mode, url, headers, count, report, label, seed)
