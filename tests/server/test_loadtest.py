"""``loadtest`` against the live main server, and ``serve`` as a real subprocess."""

from __future__ import annotations

import csv
import os
import signal
import socket
import subprocess
import sys
import time

import httpx
import pytest
from server_support import error_of, metric, scrape

from sam2serve.cli import main
from sam2serve.commands.common import EXIT_OK, EXIT_USAGE
from sam2serve.server.loadtest import LoadtestError, check_loopback_url

LOADTEST_REQUESTS = 240
LOADTEST_CONCURRENCY = 4


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:8000",
        "http://localhost:1/",
        "http://127.3.2.1:80",
        "http://[::1]:8000",
        "https://127.0.0.1",
    ],
)
def test_loopback_urls_are_accepted(url):
    assert check_loopback_url(url) == url.rstrip("/")


@pytest.mark.parametrize(
    "url",
    [
        "http://10.0.0.1:8000",
        "http://192.168.1.10",
        "http://8.8.8.8",
        "http://example.com",
        "http://localhost.example.com",
        "http://0.0.0.0:8000",
        "ftp://127.0.0.1",
        "127.0.0.1:8000",
    ],
)
def test_other_urls_are_refused(url):
    with pytest.raises(LoadtestError):
        check_loopback_url(url)


def test_loadtest_command_refuses_a_remote_url(capsys):
    status = main(["loadtest", "--url", "http://192.168.0.2:8000", "--requests", "5"])
    assert status == EXIT_USAGE
    assert "not a loopback address" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--requests", "0"),
        ("--requests", "1000001"),
        ("--concurrency", "0"),
        ("--duration", "0"),
        ("--duration", "99999"),
    ],
)
def test_loadtest_bounds(flag, value, capsys):
    status = main(["loadtest", "--url", "http://127.0.0.1:9", flag, value])
    assert status == EXIT_USAGE
    assert flag in capsys.readouterr().err


@pytest.mark.extended  # minutes of load against a real server
def test_loadtest_against_a_live_server(main_server, photos, tmp_path, capsys):
    """A few hundred requests from several concurrent clients: zero 5xx, and the report
    has the latency and queue-time percentiles."""
    paths = []
    for name in ("chelsea", "astronaut", "coffee"):
        path = tmp_path / f"{name}.png"
        path.write_bytes(photos[name])
        paths.append(str(path))
    out, table = tmp_path / "loadtest.md", tmp_path / "loadtest.csv"
    with main_server.client() as client:
        before = scrape(client)
    status = main(
        [
            "loadtest",
            "--url",
            main_server.url,
            "--images",
            *paths,
            "--requests",
            str(LOADTEST_REQUESTS),
            "--concurrency",
            str(LOADTEST_CONCURRENCY),
            "--max-objects",
            "2",
            "--max-points",
            "2",
            "--duration",
            "600",
            "--out",
            str(out),
            "--csv",
            str(table),
        ]
    )
    printed = capsys.readouterr().out
    assert status == EXIT_OK, printed
    assert "latency p50 ms" in printed and "queue p50 ms" in printed
    with table.open() as f:
        rows = {row["endpoint"]: row for row in csv.DictReader(f)}
    assert set(rows) == {"/v1/embeddings", "/v1/segment", "all"}
    assert int(rows["all"]["requests"]) == LOADTEST_REQUESTS
    assert int(rows["all"]["5xx"]) == 0 and int(rows["all"]["no_answer"]) == 0
    assert int(rows["all"]["2xx"]) == LOADTEST_REQUESTS  # every random prompt is valid
    assert int(rows["/v1/segment"]["requests"]) > LOADTEST_REQUESTS // 2
    for key in ("latency_p50_ms", "latency_p90_ms", "latency_p99_ms", "queue_p99_ms"):
        assert float(rows["all"][key]) >= 0
    report = out.read_text()
    assert "| /v1/segment |" in report and "command: `sam2serve loadtest" in report
    assert "5xx or unanswered requests: 0" in report
    with main_server.client() as client:
        after = scrape(client)
    decodes = "sam2serve_batch_size_count"
    assert metric(after, decodes, kind="decode") - metric(before, decodes, kind="decode") == int(
        rows["/v1/segment"]["requests"]
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_serve_command_in_a_subprocess(tmp_path):
    """``serve`` loads the model, answers on loopback, and stops cleanly on SIGINT."""
    port = free_port()
    env = {**os.environ, "SAM2SERVE_API_KEY": "k"}
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "sam2serve",
            "serve",
            "--random-weights",
            "--no-warmup",
            "--port",
            str(port),
            "--log-level",
            "warning",
            "--max-objects",
            "2",
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 180
        while True:
            assert server.poll() is None, server.stdout.read()
            try:
                if httpx.get(f"{url}/readyz", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "serve did not become ready"
            time.sleep(0.2)
        ready = httpx.get(f"{url}/readyz").json()
        assert ready["model"] == "tiny" and ready["weights"]["source"] == "random"
        refused = httpx.post(f"{url}/v1/embeddings", json={})
        assert refused.status_code == 401 and error_of(refused)["code"] == "unauthorized"
        bad = httpx.post(
            f"{url}/v1/segment",
            headers={"x-api-key": "k"},
            json={"image_id": "ab" * 32, "objects": [{"box": [0, 0, 1, 1]}] * 3},
        )
        assert bad.status_code == 422  # --max-objects 2
        assert error_of(bad)["code"] == "too_many_prompts"
    finally:
        server.send_signal(signal.SIGINT)
        try:
            output, _ = server.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
            output, _ = server.communicate()
    assert server.returncode == 0, output
    assert "RANDOM WEIGHTS" in output  # the banner says the masks are meaningless


def test_serve_command_names_the_bad_flag(capsys):
    status = main(["serve", "--random-weights", "--max-queue", "0"])
    assert status == EXIT_USAGE
    assert "--max-queue must be an integer >= 1, got 0" in capsys.readouterr().err


def test_serve_command_reports_a_missing_checkpoint(tmp_path, capsys):
    status = main(
        ["serve", "--checkpoint", str(tmp_path / "missing.pt"), "--port", str(free_port())]
    )
    assert status == EXIT_USAGE
    assert "checkpoint file not found" in capsys.readouterr().err
