"""Where `serve` and `labelstudio` say they are: URLs a user can open. A wildcard address
(0.0.0.0, ::) is never printed as one to connect to; every URL printed passes the
server's own Host check (sam2serve.server.allowed_hosts), and the machine's name is
printed only where that check lets it through."""

from __future__ import annotations

import contextlib
import io
import ipaddress
import logging
import socket
from urllib.parse import urlsplit

import pytest
import uvicorn

from sam2serve import cli
from sam2serve.commands.common import EXIT_OK
from sam2serve.server.allowed_hosts import AllowedHosts
from sam2serve.server.http_server import urls_to_open, uvicorn_config, where_to_connect
from sam2serve.server.settings import ServerSettings

MACHINE = "annotation-box.example"
WILDCARDS = ("0.0.0.0", "::")


@pytest.fixture
def machine_name(monkeypatch):
    monkeypatch.setattr(socket, "gethostname", lambda: MACHINE)
    return MACHINE


def host_check_allows(bound: str, allowed: tuple[str, ...] | None, url: str) -> bool:
    """Whether the server's Host check answers a request sent to ``url``."""
    return AllowedHosts.for_server(bound, allowed).allows(urlsplit(url).netloc)


def test_a_specific_address_is_its_own_url():
    assert urls_to_open("127.0.0.1", 8000) == ["http://127.0.0.1:8000"]
    assert where_to_connect("127.0.0.1", 8000) == "http://127.0.0.1:8000"
    assert where_to_connect("::1", 9090) == "http://[::1]:9090"
    assert where_to_connect("10.1.2.3", 9090) == "http://10.1.2.3:9090"


@pytest.mark.parametrize("bound", WILDCARDS)
def test_a_wildcard_lists_loopback_and_says_all_interfaces(machine_name, bound):
    urls = urls_to_open(bound, 9090)
    loopback = "http://127.0.0.1:9090" if bound == "0.0.0.0" else "http://[::1]:9090"
    assert urls[:2] == [loopback, "http://localhost:9090"]
    line = where_to_connect(bound, 9090)
    assert f"listening on all interfaces, {bound}" in line
    # the wildcard is said, never offered as an address to open
    assert f"http://{bound}:" not in line and "http://[::]:" not in line
    for url in urls:
        assert host_check_allows(bound, None, url), url
        host = urlsplit(url).hostname
        assert host not in ("0.0.0.0", "::")
        if host not in ("127.0.0.1", "::1", "localhost"):
            # the machine's own address on its default route, never a loopback one
            assert not ipaddress.ip_address(host).is_loopback


def test_the_machine_name_is_listed_only_where_the_host_check_allows_it(machine_name):
    refused = urls_to_open("0.0.0.0", 8000)
    assert f"http://{MACHINE}:8000" not in refused
    assert f"add --allowed-hosts {MACHINE}" in where_to_connect("0.0.0.0", 8000)
    for allowed in ((MACHINE,), ("*",)):
        urls = urls_to_open("0.0.0.0", 8000, allowed)
        assert urls == ["http://127.0.0.1:8000", "http://localhost:8000", f"http://{MACHINE}:8000"]
        assert all(host_check_allows("0.0.0.0", allowed, url) for url in urls)
        assert "--allowed-hosts" not in where_to_connect("0.0.0.0", 8000, allowed)


def started_without_listening(monkeypatch) -> None:
    """uvicorn's Server.run as if it had served and stopped: the command prints its lines
    and returns, and nothing listens."""

    def run(self, sockets=None):
        self.started = True

    monkeypatch.setattr(uvicorn.Server, "run", run)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def command_lines(argv: list[str]) -> list[str]:
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr):
        assert cli.main(argv) == EXIT_OK, stderr.getvalue()
    return stderr.getvalue().splitlines()


def test_labelstudio_logs_urls_to_open_not_the_wildcard(monkeypatch, machine_name):
    started_without_listening(monkeypatch)
    monkeypatch.setenv("SAM2SERVE_API_KEY", "a-key")
    port = free_port()
    lines = command_lines(
        ["labelstudio", "--random-weights", "--model", "tiny", "--no-warmup"]
        + ["--host", "0.0.0.0", "--port", str(port), "--allowed-hosts", MACHINE]
    )
    [line] = [line for line in lines if "Label Studio ML backend:" in line]
    urls = f"http://127.0.0.1:{port}, http://localhost:{port}, http://{MACHINE}:{port}"
    assert f"on {urls} (listening on all interfaces, 0.0.0.0) - " in line, line
    assert "whichever URL Label Studio can reach" in line
    assert f"0.0.0.0:{port}" not in line


def test_serve_logs_urls_to_open_not_the_wildcard(monkeypatch, machine_name):
    started_without_listening(monkeypatch)
    monkeypatch.setenv("SAM2SERVE_API_KEY", "a-key")
    port = free_port()
    lines = command_lines(
        ["serve", "--random-weights", "--model", "tiny", "--no-warmup"]
        + ["--host", "0.0.0.0", "--port", str(port)]
    )
    [line] = [line for line in lines if "annotation page at /" in line]
    assert f"on http://127.0.0.1:{port}, http://localhost:{port}" in line
    assert "listening on all interfaces, 0.0.0.0" in line and f"0.0.0.0:{port}" not in line
    assert f"add --allowed-hosts {MACHINE}" in line


async def no_app(scope, receive, send) -> None:
    raise AssertionError("never called")


@pytest.mark.parametrize(
    ("bound", "shown"), [("0.0.0.0", False), ("::", False), ("127.0.0.1", True)]
)
def test_uvicorns_start_line_is_left_out_for_a_wildcard(bound, shown):
    """uvicorn's own "Uvicorn running on http://0.0.0.0:PORT" would name the wildcard as an
    address to open; a specific address it names as is."""
    server = uvicorn.Server(uvicorn_config(no_app, ServerSettings(), bound, 8000))
    server.config.load()  # as Server.serve does before it starts
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]  # collect, print nothing
    logger = logging.getLogger("uvicorn.error")
    logger.addHandler(handler)
    try:
        server._log_started_message([])  # uvicorn's own start line, as Server.startup logs it
    finally:
        logger.removeHandler(handler)
    lines = [record.getMessage() for record in records]
    assert any(line.startswith("Uvicorn running on http://") for line in lines) == shown, lines
