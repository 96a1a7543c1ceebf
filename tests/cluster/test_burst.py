"""The burst benchmark's workload and arithmetic, without a cluster."""

from __future__ import annotations

from sam2serve.cluster.burst import (
    BurstConfig,
    BurstResult,
    RequestRecord,
    burst_images,
    markdown,
    payload,
    task_rows,
)
from sam2serve.cluster.protocol import image_id


def test_images_are_distinct_within_and_across_tasks():
    first, second = burst_images(6, 0, 64), burst_images(6, 1, 64)
    ids = {image_id(data) for data in first + second}
    assert len(ids) == 12  # no answer can come from an embedding cache


def test_payloads_match_the_tasks():
    config = BurstConfig(url="http://x", points_per_side=4, mps_points=5)
    data = burst_images(1, 0, 64)[0]
    assert payload("amg", data, config)["params"] == {"points_per_side": 4}
    assert len(payload("sps", data, config)["objects"]) == 1
    assert len(payload("mps", data, config)["objects"]) == 5


def record(task: str, e2e: float, execution: float | None, status=200, attempts=1):
    return RequestRecord(task, 0, status, attempts, 0.0, e2e, execution, "r1", 12.5)


def test_queue_is_end_to_end_minus_execution():
    result = BurstResult(BurstConfig(url="http://x", tasks=("sps",)))
    result.records = [
        record("sps", 1000, 400),
        record("sps", 3000, 1000, attempts=2),
        record("sps", 50, None, status=503),
    ]
    result.windows = {"sps": (0.0, 3.0)}
    (row,) = task_rows(result)
    assert (row["answered"], row["failed"], row["retried"]) == (2, 1, 1)
    assert row["execution_p50_ms"] == 700 and row["queue_p50_ms"] == 1300
    text = markdown(result, {"command": "`x`"})
    assert "| SPS | 3 | 2 | 1 | 1 | 1 | 700 |" in text and "| r1 | 12.5 |" in text
