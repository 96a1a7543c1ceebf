"""Helpers of the reliability suite (test_reliability.py): servers in subprocesses under a
memory cap, raw-socket clients, and the hostile-input corpus.

Servers run in a subprocess of their own (``python hostile.py CONFIG``), not in a thread
of the test process: a request that makes the server allocate gigabytes or spin for
minutes then hits the subprocess's address-space cap (RLIMIT_AS) or is killed with it,
instead of taking the test process and the machine with it; its log (stderr) is a file
the test reads for tracebacks; and a stalled event loop is measured from a process that
does not share its GIL. The subprocess starts the app through ``server_support``'s
``start_server`` (the same uvicorn configuration as every other server test), with the
real tiny model (random weights) and, by default, the stub encoder.

Over 500 lines on purpose: most of it is the corpus, one generator function per class of
hostile input, which reads best side by side.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import os
import re
import resource
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

import httpx

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
GiB = 1024**3
MiB = 1024**2
START_TIMEOUT_S = 120.0
LOOPBACK = "127.0.0.1"


# --------------------------------------------------------------------------- servers


def subprocess_env(**extra: str) -> dict[str, str]:
    """The environment of a server subprocess: this checkout's package and the test
    helpers first on the path, whatever copy of the package is installed."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(REPO), str(HERE), *filter(None, [env.get("PYTHONPATH")])]
    )
    env.update(extra)
    return env


def proc_status(pid: int) -> dict[str, int]:
    """VmRSS, VmHWM, VmSize... of a process in bytes, from /proc/PID/status."""
    values = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, rest = line.partition(":")
        parts = rest.split()
        if len(parts) == 2 and parts[1] == "kB":
            values[name] = int(parts[0]) * 1024
    return values


def reset_peak_rss(pid: int) -> bool:
    """Reset VmHWM to the current RSS (Linux clear_refs 5); False where not permitted."""
    try:
        Path(f"/proc/{pid}/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind((LOOPBACK, 0))
        return probe.getsockname()[1]


@dataclass
class SpawnedServer:
    """A server in a subprocess: its URL, process, and log file."""

    url: str
    proc: subprocess.Popen
    log_path: Path
    memory_cap: int | None = None

    @property
    def pid(self) -> int:
        return self.proc.pid

    def client(self, timeout: float = 30.0, **kwargs: Any) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=timeout, **kwargs)

    def alive(self, timeout: float = 3.0) -> bool:
        if self.proc.poll() is not None:
            return False
        try:
            with self.client(timeout=timeout) as client:
                return client.get("/healthz").status_code == 200
        except httpx.HTTPError:
            return False

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def collect_garbage(self, settle_s: float = 0.5) -> None:
        """A full garbage collection in a server of ``spawn_server``, and its free memory
        given back to the system (its SIGUSR1)."""
        os.kill(self.pid, signal.SIGUSR1)
        time.sleep(settle_s)

    def stop(self) -> None:
        """Terminate it (work it still has is abandoned) and remove its log."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                stream.close()
        self.log_path.unlink(missing_ok=True)


def _cap_address_space(pid: int, headroom: int) -> int:
    """Limit the process's address space to what it maps now plus ``headroom``: an
    allocation past that fails (MemoryError) instead of growing without bound."""
    cap = proc_status(pid)["VmSize"] + headroom
    resource.prlimit(pid, resource.RLIMIT_AS, (cap, cap))
    return cap


def _wait_for_url(proc: subprocess.Popen, log_path: Path, timeout: float) -> str:
    """The first stdout line of a server subprocess (its URL), or the log on failure."""
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    line = b""
    while time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stdout], [], [], 0.2)
        if ready:
            line = proc.stdout.readline()
            break
        if proc.poll() is not None:
            break
    if not line.startswith(b"http://"):
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        tail = log_path.read_text(errors="replace")[-3000:]
        log_path.unlink(missing_ok=True)
        raise RuntimeError(f"the server subprocess did not start; its log ends:\n{tail}")
    return line.decode().strip()


def spawn_server(
    settings: dict[str, Any],
    *,
    optional: dict[str, Any] | None = None,
    stub_encoder: bool = True,
    memory_headroom: int | None = 3 * GiB,
    labelstudio: dict[str, Any] | None = None,
) -> SpawnedServer:
    """Start ``create_app(ServerSettings.from_flat(**settings), predictor)`` in a subprocess.

    ``optional``: settings applied only where ServerSettings has the field (settings a
    fix adds, which the code under test may not know yet). ``memory_headroom``: the
    address space the server may map beyond what it maps once started (None: no cap).
    ``labelstudio``: serve the Label Studio backend's app instead, with
    ``LabelStudioOptions(**labelstudio["options"])`` (and its ``"optional"`` ones, as above).
    """
    config = {
        "settings": settings,
        "optional": optional or {},
        "stub_encoder": stub_encoder,
        "labelstudio": labelstudio,
    }
    proc, log_path = spawn_script(HERE / "hostile.py", json.dumps(config), "reliability")
    url = _wait_for_url(proc, log_path, START_TIMEOUT_S)
    cap = _cap_address_space(proc.pid, memory_headroom) if memory_headroom else None
    return SpawnedServer(url, proc, log_path, cap)


def spawn_script(script: Path, argument: str, name: str) -> tuple[subprocess.Popen, Path]:
    """``python script argument`` from the repository, its stderr in a log file of its own
    (``sam2serve-NAME-*.log``): the process and the log's path."""
    with tempfile.NamedTemporaryFile(
        prefix=f"sam2serve-{name}-", suffix=".log", delete=False
    ) as log_file:
        proc = subprocess.Popen(
            [sys.executable, str(script), argument],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log_file,
            # Few malloc arenas: each thread's arena would add 64 MiB of address space,
            # which the cap counts, without using it.
            env=subprocess_env(MALLOC_ARENA_MAX="2"),
            cwd=str(REPO),
        )
    return proc, Path(log_file.name)


def spawn_cli_server(args: list[str], memory_headroom: int | None = None) -> SpawnedServer:
    """``sam2serve serve ARGS --port P`` (the real command) on a free loopback port."""
    port = free_port()
    command = [sys.executable, "-m", "sam2serve", "serve", *args]
    command += ["--host", LOOPBACK, "--port", str(port), "--log-level", "warning"]
    env = subprocess_env()
    env.pop("SAM2SERVE_API_KEY", None)
    with tempfile.NamedTemporaryFile(
        prefix="sam2serve-reliability-cli-", suffix=".log", delete=False
    ) as log_file:
        log_path = Path(log_file.name)
        proc = subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=log_file, stderr=log_file, env=env, cwd=REPO
        )
    live = SpawnedServer(f"http://{LOOPBACK}:{port}", proc, log_path)
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        if proc.poll() is not None or time.monotonic() > deadline:
            tail = live.log()[-3000:]
            live.stop()
            raise RuntimeError(f"sam2serve serve did not start; its log ends:\n{tail}")
        try:
            with live.client(timeout=2) as client:
                if client.get("/readyz").status_code == 200:
                    break
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    if memory_headroom:
        live.memory_cap = _cap_address_space(proc.pid, memory_headroom)
    return live


def _known(kind: type, values: dict[str, Any], optional: dict[str, Any]) -> dict[str, Any]:
    """``values`` and those of ``optional`` that the dataclass ``kind`` has a field for."""
    from sam2serve.server.settings import ServerSettings, flat_keys

    fields = (
        set(flat_keys()) if kind is ServerSettings else {f.name for f in dataclasses.fields(kind)}
    )
    return {**values, **{k: v for k, v in optional.items() if k in fields}}


def _serve_forever(config: dict[str, Any]) -> None:
    """The subprocess: start the server, print its URL, run until stdin closes. With a
    ``labelstudio`` entry, the app is the Label Studio backend's, with those options."""
    from server_support import StubEncoderPredictor, start_app, wait_ready

    from sam2serve.checkpoint import load_model
    from sam2serve.engine.predictor import Predictor
    from sam2serve.server.app import create_app
    from sam2serve.server.settings import ServerSettings

    settings = ServerSettings.from_flat(
        **_known(ServerSettings, {"warmup": False, **config["settings"]}, config["optional"])
    )
    model = load_model("tiny", random_weights=True, seed=0)
    predictor = StubEncoderPredictor(model) if config["stub_encoder"] else Predictor(model)
    if config.get("labelstudio") is None:
        app = create_app(settings, predictor)
    else:
        from sam2serve.labelstudio.app import create_labelstudio_app
        from sam2serve.labelstudio.options import LabelStudioOptions

        ls = config["labelstudio"]
        options = _known(LabelStudioOptions, ls["options"], ls.get("optional", {}))
        app = create_labelstudio_app(settings, LabelStudioOptions(**options), predictor)
    live = start_app(app, settings)
    # SIGUSR1: a full garbage collection, so what objects log when they are collected
    # (asyncio's "Task was destroyed but it is pending", "Future exception was never
    # retrieved") is in the log when a test looks, then the allocator's free pages given
    # back, so a peak measured next starts from what the process really holds
    # (SpawnedServer.collect_garbage).
    from sam2serve.server.memory import release_free_memory

    def collect(*_: object) -> None:
        gc.collect()
        release_free_memory()

    signal.signal(signal.SIGUSR1, collect)
    wait_ready(live)
    print(live.url, flush=True)
    sys.stdin.read()  # until the test closes the pipe (or dies)
    live.stop()


# --------------------------------------------------------------------------- raw HTTP


def raw_request(
    method: str,
    path: str,
    body: bytes = b"",
    content_type: str | None = None,
    headers: dict[str, str] | None = None,
) -> bytes:
    """The bytes of an HTTP/1.1 request: the headers as given, Content-Length from the
    body unless ``headers`` sets one (to announce more than is sent)."""
    lines = [f"{method} {path} HTTP/1.1", f"Host: {LOOPBACK}"]
    if content_type is not None:
        lines.append(f"Content-Type: {content_type}")
    extra = dict(headers or {})
    lines += [f"{name}: {value}" for name, value in extra.items()]
    if not any(name.lower() == "content-length" for name in extra):
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def connect(url: str, timeout: float = 10.0) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=timeout)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def read_response(sock: socket.socket, timeout: float) -> tuple[int, dict[str, str], bytes]:
    """Status, headers and body of one HTTP/1.1 response (Content-Length framed; without
    a length, up to the close). A 1xx, 204 or 304 has no body (a 101 hands the socket over
    to the upgraded protocol, so nothing after its head is read)."""
    sock.settimeout(timeout)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError(f"connection closed before a response: {data[:200]!r}")
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in header_lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    status = int(status_line.split()[1])
    if status < 200 or status in (204, 304):
        return status, headers, body
    length = int(headers["content-length"]) if "content-length" in headers else None
    while length is None or len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    return status, headers, body


def closed_by_peer(sock: socket.socket, wait_s: float) -> bool:
    """True if the server has closed the connection (EOF or reset) within ``wait_s``."""
    ready, _, _ = select.select([sock], [], [], wait_s)
    if not ready:
        return False
    try:
        return sock.recv(65536, socket.MSG_PEEK) == b"" or _drained_to_eof(sock)
    except (ConnectionResetError, BrokenPipeError):
        return True


def _drained_to_eof(sock: socket.socket) -> bool:
    """Read what the server sent (e.g. a 408) and report whether EOF follows soon."""
    sock.settimeout(2.0)
    try:
        while sock.recv(65536):
            pass
    except TimeoutError:
        return False
    except (ConnectionResetError, BrokenPipeError):
        pass
    return True


@dataclass
class Answer:
    """One HTTP answer read off a raw socket."""

    status: int
    headers: dict[str, str]
    body: bytes
    seconds: float

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", "replace")

    def error(self) -> dict[str, Any]:
        """The error object, checking the one error shape ``{"error": {code, message}}``."""
        content_type = self.headers.get("content-type", "")
        assert content_type.startswith("application/json"), (content_type, self.text[:300])
        document = json.loads(self.body)
        assert isinstance(document, dict) and set(document) == {"error"}, self.text[:300]
        error = document["error"]
        assert isinstance(error.get("code"), str) and error["code"], error
        assert isinstance(error.get("message"), str) and error["message"], error
        return error


def exchange(
    url: str,
    method: str,
    path: str,
    body: bytes = b"",
    content_type: str | None = None,
    timeout: float = 30.0,
    headers: dict[str, str] | None = None,
) -> Answer:
    """Send one request exactly as given (no client-side checks) and read the answer.

    A server may answer before it has read the whole body and close: the answer is
    still read. Raises ConnectionError when the connection ends without an answer and
    TimeoutError when none comes within ``timeout``.
    """
    request = raw_request(
        method, path, body, content_type, {"Connection": "close", **(headers or {})}
    )
    started = time.perf_counter()
    with connect(url, timeout) as sock:
        try:
            sock.sendall(request)
        except (BrokenPipeError, ConnectionResetError):
            pass  # answered early: read what it said
        status, head, data = read_response(sock, timeout)
    return Answer(status, head, data, time.perf_counter() - started)


# --------------------------------------------------------------------------- metrics

# Label values are quoted and may hold braces (a path template: /v1/videos/{session_id}).
_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(?:[^"}]|"(?:[^"\\]|\\.)*")*\})?\s+(\S+)$')


def samples_of(text: str) -> dict[str, float]:
    out = {}
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if match:
            out[match.group(1) + (match.group(2) or "")] = float(match.group(3))
    return out


def total(samples: dict[str, float], name: str, **labels: str) -> float:
    """Sum of the samples of ``name`` whose labels include ``labels`` (others any)."""
    wanted = {f'{k}="{v}"' for k, v in labels.items()}
    found = 0.0
    for key, value in samples.items():
        base, _, rest = key.partition("{")
        if base == name and wanted <= set(rest.rstrip("}").split(",")):
            found += value
    return found


# --------------------------------------------------------------------------- stalls


@dataclass
class StallProbe:
    """Polls GET /healthz every ``period_s`` from a thread; records each latency."""

    url: str
    period_s: float = 0.02
    timeout_s: float = 60.0
    max_duration_s: float = 120.0
    latencies: list[float] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> Self:
        self._thread = threading.Thread(target=self._run, name="healthz-probe", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        assert self._thread is not None
        self._thread.join(self.timeout_s + 5)

    @property
    def worst_s(self) -> float:
        return max(self.latencies, default=0.0)

    def _run(self) -> None:
        deadline = time.monotonic() + self.max_duration_s
        with httpx.Client(base_url=self.url, timeout=self.timeout_s) as client:
            while not self._stop.is_set() and time.monotonic() < deadline:
                started = time.perf_counter()
                try:
                    status = client.get("/healthz").status_code
                    if status != 200:
                        self.failures.append(f"/healthz answered {status}")
                except httpx.HTTPError as exc:
                    self.failures.append(f"/healthz failed: {exc!r}")
                self.latencies.append(time.perf_counter() - started)
                self._stop.wait(self.period_s)


# --------------------------------------------------------------------------- the corpus

ROUTES = ("/v1/embeddings", "/v1/segment", "/v1/amg")
JSON = "application/json"
ANY_4XX = frozenset(range(400, 500))
# Where a body-level mistake is named: the JSON body, or the multipart 'request' part.
IN_BODY = ("body", "JSON", "json")
IN_PART = ("request", "body")
PART_LIMIT = 1024 * 1024  # Starlette's max_part_size as the server sets it


Rendered = tuple[str | None, bytes, tuple[str, ...]]  # content type, body, extra words


@dataclass(frozen=True)
class Hostile:
    """One hostile request: a body for one route over one body path ("json",
    "multipart" or "raw"), the statuses accepted (4xx), words of which the error message
    must contain at least one (the field it names), and how long the answer may take.

    The body is rendered on demand (some are megabytes): ``render()`` gives the content
    type, the body, and words also accepted for this rendering (a multipart 'request'
    part over Starlette's 1 MiB part limit may be refused as such, naming the part).
    """

    name: str
    route: str
    path: str
    make: Callable[[], Rendered] = field(repr=False, compare=False)
    where: tuple[str, ...]
    statuses: frozenset[int] = ANY_4XX
    max_seconds: float = 5.0

    @property
    def id(self) -> str:
        return f"{self.name}[{self.route.removeprefix('/v1/')},{self.path}]"

    def render(self) -> tuple[str | None, bytes, tuple[str, ...]]:
        content_type, body, extra = self.make()
        return content_type, body, (*self.where, *extra)


@dataclass(frozen=True)
class Seeds:
    """What the corpus builds on: a small image and the image_id the server has for it."""

    png: bytes
    image_id: str

    @property
    def png_b64(self) -> str:
        import base64

        return base64.b64encode(self.png).decode("ascii")


POINT = {"points": [{"x": 10, "y": 10}]}
SMALL_AMG = {"points_per_side": 2}  # 4 clicks: any server's max_amg_points allows it


def multipart(parts: list[tuple[str, bytes, str | None]]) -> tuple[str, bytes]:
    """(content type, body) of a multipart/form-data body of (name, data, filename)."""
    boundary = "reliability-7f3a9c"
    out = b""
    for name, data, filename in parts:
        disposition = f'form-data; name="{name}"'
        if filename is not None:
            disposition += f'; filename="{filename}"'
        head = f"--{boundary}\r\nContent-Disposition: {disposition}\r\n"
        if filename is not None:
            head += "Content-Type: application/octet-stream\r\n"
        out += head.encode() + b"\r\n" + data + b"\r\n"
    out += f"--{boundary}--\r\n".encode()
    return f"multipart/form-data; boundary={boundary}", out


def base_fields(route: str, seeds: Seeds) -> dict[str, Any]:
    """A valid body for ``route`` (JSON path), which the field cases then spoil."""
    if route == "/v1/embeddings":
        return {"image": seeds.png_b64}
    if route == "/v1/segment":
        return {"image_id": seeds.image_id, "objects": [POINT]}
    return {"image": seeds.png_b64, "params": dict(SMALL_AMG)}


_LITERAL = "\x00literal:"


def literal(text: str) -> str:
    """A JSON token written as given: ``dumps`` puts ``text`` in place of this string
    (for numbers Python will not write, such as an integer of 5001 digits)."""
    return _LITERAL + text


def dumps(value: Any) -> bytes:
    """JSON as Python writes it (NaN and Infinity literals included), literals spliced."""
    text = json.dumps(value, allow_nan=True).encode()
    return re.sub(rb'"\\u0000literal:([^"]*)"', lambda m: m.group(1), text)


BodyOf = Callable[[dict[str, Any]], bytes]


def over_paths(
    name: str,
    route: str,
    seeds: Seeds,
    body_of: BodyOf,
    where: tuple[str, ...],
    *,
    body_level: bool = False,
    statuses: frozenset[int] = ANY_4XX,
    max_seconds: float = 5.0,
) -> Iterator[Hostile]:
    """The case as a JSON body and as the 'request' part of a multipart body (with the
    image as a file part where the route's valid body has one). ``body_of(fields)``
    renders the hostile JSON text from the valid fields (without 'image' for multipart).
    """

    def as_json() -> Rendered:
        return JSON, body_of(base_fields(route, seeds)), IN_BODY if body_level else ()

    def as_multipart() -> Rendered:
        base = base_fields(route, seeds)
        part = body_of({k: v for k, v in base.items() if k != "image"})
        parts: list[tuple[str, bytes, str | None]] = [("request", part, None)]
        if "image" in base:
            parts.append(("image", seeds.png, "image.png"))
        content_type, body = multipart(parts)
        return content_type, body, IN_PART if body_level or len(part) > PART_LIMIT else ()

    yield Hostile(name, route, "json", as_json, where, statuses, max_seconds)
    yield Hostile(name, route, "multipart", as_multipart, where, statuses, max_seconds)


def with_fields(**changes: Any) -> BodyOf:
    return lambda fields: dumps({**fields, **changes})


def with_params(**changes: Any) -> BodyOf:
    return lambda fields: dumps({**fields, "params": {**SMALL_AMG, **changes}})


def with_objects(objects: list[Any]) -> BodyOf:
    return lambda fields: dumps({**fields, "objects": objects})


def _nested_lists(depth: int) -> str:
    return "[" * depth + "]" * depth


def _body_level_cases(route: str, seeds: Seeds) -> Iterator[Hostile]:
    def constant(text: str | bytes) -> BodyOf:
        data = text.encode() if isinstance(text, str) else text
        return lambda fields: data

    def first_field_nested(depth: int) -> BodyOf:
        def render(fields: dict[str, Any]) -> bytes:
            key = next(k for k in fields if k != "image") if len(fields) > 1 else "image"
            rest = dumps({k: v for k, v in fields.items() if k != key})[1:-1]
            return f'{{"{key}": {_nested_lists(depth)}{", " if rest else ""}{rest}}}'.encode()

        return render

    def duplicated_first_key(fields: dict[str, Any]) -> bytes:
        items = list(fields.items()) or [("image", None)]
        key, value = next(((k, v) for k, v in items if k != "image"), items[0])
        pairs = [(key, value), *items]  # the key twice, the first value shadowed
        return (
            "{" + ", ".join(f"{json.dumps(k)}: {dumps(v).decode()}" for k, v in pairs) + "}"
        ).encode()

    def with_invalid_utf8(fields: dict[str, Any]) -> bytes:
        return dumps({**fields, "mask_format": "PLACEHOLDER"}).replace(b"PLACEHOLDER", b"\xff\xfe")

    def truncated(fields: dict[str, Any]) -> bytes:
        text = dumps(fields)
        return text[: max(1, len(text) // 2)]

    cases: list[tuple[str, BodyOf, tuple[str, ...], frozenset[int]]] = [
        ("deep_lists_100k", constant(_nested_lists(100_000)), (), ANY_4XX),
        ("deep_objects_50k", constant('{"a":' * 50_000 + "1" + "}" * 50_000), (), ANY_4XX),
        ("deep_in_first_field_100k", first_field_nested(100_000), (), ANY_4XX),
        ("deep_in_first_field_40", first_field_nested(40), (), ANY_4XX),
        ("not_an_object_list", constant("[]"), (), ANY_4XX),
        ("not_an_object_string", constant('"s"'), (), ANY_4XX),
        ("not_an_object_number", constant("1"), (), ANY_4XX),
        ("not_an_object_null", constant("null"), (), ANY_4XX),
        ("empty_text", constant(""), (), ANY_4XX),
        ("truncated_json", truncated, (), ANY_4XX),
        ("trailing_garbage", lambda fields: dumps(fields) + b"}}]garbage", (), ANY_4XX),
        ("invalid_utf8", with_invalid_utf8, ("mask_format",), ANY_4XX),
        ("nan_as_unknown_field", constant('{"NaN": NaN}'), ("NaN",), ANY_4XX),
        ("duplicate_keys", duplicated_first_key, ("image_id", "image", "duplicate"), ANY_4XX),
        ("unknown_field_1mb_name", with_fields(**{"k" * PART_LIMIT: 1}), ("kkkkkkkk",), ANY_4XX),
        (
            "unknown_fields_50k",
            lambda fields: dumps({**fields, **{f"k{i}": 0 for i in range(50_000)}}),
            ("k0", "unknown"),
            ANY_4XX,
        ),
        ("lone_surrogate_field_name", with_fields(**{"\ud800": 1}), ("unknown", "ud800"), ANY_4XX),
    ]
    for name, body_of, where, statuses in cases:
        yield from over_paths(
            name, route, seeds, body_of, where, body_level=True, statuses=statuses
        )


UNPROCESSABLE = frozenset({422})


def _segment_cases(seeds: Seeds) -> Iterator[Hostile]:
    route = "/v1/segment"
    point0 = "objects[0].points[0]"

    def point(**changes: Any) -> BodyOf:
        return with_objects([{"points": [{"x": 10, "y": 10, **changes}]}])

    five_mb_of_objects = [POINT] * (5 * MiB // len(dumps(POINT)))
    cases: list[tuple[str, BodyOf, tuple[str, ...], frozenset[int], float]] = [
        # Loose types, accepted today: strict types answer 422 naming the field.
        ("x_as_string", point(x="10"), (f"{point0}.x",), UNPROCESSABLE, 5.0),
        ("label_as_bool", point(label=True), (f"{point0}.label",), UNPROCESSABLE, 5.0),
        ("multimask_as_string", with_fields(multimask_output="yes"), ("multimask_output",),
         UNPROCESSABLE, 5.0),
        ("multimask_as_int", with_fields(multimask_output=1), ("multimask_output",),
         UNPROCESSABLE, 5.0),
        ("box_as_strings", with_objects([{"box": ["0", "0", "9", "9"]}]), ("objects[0].box",),
         UNPROCESSABLE, 5.0),
        # Numbers that are not numbers.
        ("x_nan", point(x=float("nan")), (f"{point0}.x",), ANY_4XX, 5.0),
        ("y_infinity", point(y=float("inf")), (f"{point0}.y",), ANY_4XX, 5.0),
        ("box_minus_infinity", with_objects([{"box": [0, 0, 9, -float("inf")]}]),
         ("objects[0].box",), ANY_4XX, 5.0),
        ("x_401_digits", point(x=10**400), (f"{point0}.x",), ANY_4XX, 5.0),
        ("x_1e400", lambda f: point(x=1.0)(f).replace(b"1.0", b"1e400"), (f"{point0}.x",),
         ANY_4XX, 5.0),
        ("label_huge", point(label=10**30), (f"{point0}.label",), ANY_4XX, 5.0),
        # Sizes: refused before work proportional to them.
        ("objects_5mb", with_objects(five_mb_of_objects), ("objects", *IN_BODY), ANY_4XX, 2.0),
        ("points_200k", with_objects([{"points": [{"x": 1, "y": 1}] * 200_000}]),
         ("objects[0].points", *IN_BODY), ANY_4XX, 2.0),
        ("invalid_points_40k", with_objects([{"points": [{"x": "?", "y": 1}] * 40_000}]),
         ("objects[0].points", *IN_BODY), ANY_4XX, 3.0),
        ("objects_as_mapping", with_fields(objects={"0": POINT}), ("objects",), ANY_4XX, 5.0),
        ("mask_format_1mb", with_fields(mask_format="x" * PART_LIMIT), ("mask_format",),
         ANY_4XX, 5.0),
        # Ids.
        ("image_id_unicode", with_fields(image_id="é" * 64), ("image_id",), ANY_4XX, 5.0),
        ("image_id_control", with_fields(image_id="\x00\x1b[2J\r\n" * 9), ("image_id",),
         ANY_4XX, 5.0),
        ("image_id_bidi", with_fields(image_id="\u202e" + seeds.image_id[1:]), ("image_id",),
         ANY_4XX, 5.0),
        ("image_id_surrogates", with_fields(image_id="\ud800" * 64), ("image_id",), ANY_4XX, 5.0),
        ("image_id_uppercase", with_fields(image_id=seeds.image_id.upper()), ("image_id",),
         ANY_4XX, 5.0),
        ("image_id_10mb", with_fields(image_id="a" * (10 * MiB)), ("image_id",), ANY_4XX, 3.0),
        ("image_id_number", with_fields(image_id=12345), ("image_id",), ANY_4XX, 5.0),
        ("mask_id_unicode", with_objects([{**POINT, "mask_id": "ü" * 30}]),
         ("objects[0].mask_id",), ANY_4XX, 5.0),
        ("mask_id_control", with_objects([{**POINT, "mask_id": "\x00\x07\x1b" * 10}]),
         ("objects[0].mask_id",), ANY_4XX, 5.0),
        ("mask_id_surrogates", with_objects([{**POINT, "mask_id": "\udfff" * 10}]),
         ("objects[0].mask_id",), ANY_4XX, 5.0),
        ("mask_id_10mb", with_objects([{**POINT, "mask_id": "m" * (10 * MiB)}]),
         ("objects[0].mask_id",), ANY_4XX, 3.0),
    ]  # fmt: skip
    for name, body_of, where, statuses, seconds in cases:
        yield from over_paths(
            name, route, seeds, body_of, where, statuses=statuses, max_seconds=seconds
        )


def _amg_cases(seeds: Seeds) -> Iterator[Hostile]:
    route = "/v1/amg"
    pps = ("points_per_side",)
    grids_1m = [literal("[" + ", ".join(["[0.5, 0.5]"] * 1_500_000) + "]")]
    cases: list[tuple[str, BodyOf, tuple[str, ...], frozenset[int], float]] = [
        # Grid sizes: checked arithmetically before any grid is built.
        ("points_per_side_1e6", with_params(points_per_side=10**6), pps, ANY_4XX, 3.0),
        ("points_per_side_1e5", with_params(points_per_side=10**5), pps, ANY_4XX, 3.0),
        ("points_per_side_12000", with_params(points_per_side=12_000), pps, ANY_4XX, 3.0),
        ("points_per_side_4001_digits", with_params(points_per_side=10**4000), pps, ANY_4XX, 3.0),
        ("points_per_side_5001_digits", with_params(points_per_side=literal("1" + "0" * 5000)),
         (*pps, *IN_BODY), ANY_4XX, 3.0),
        ("points_per_side_minus_1e30", with_params(points_per_side=-(10**30)), pps, ANY_4XX, 3.0),
        ("points_per_batch_1e9", with_params(points_per_batch=10**9), ("points_per_batch",),
         ANY_4XX, 5.0),
        ("points_per_batch_1e30", with_params(points_per_batch=10**30), ("points_per_batch",),
         ANY_4XX, 5.0),
        ("crop_n_layers_5", with_params(crop_n_layers=5), ("crop_n_layers",), ANY_4XX, 3.0),
        ("crop_n_layers_10k", with_params(crop_n_layers=10_000), ("crop_n_layers",), ANY_4XX,
         3.0),
        ("crop_n_layers_1e7_downscale_2",
         with_params(crop_n_layers=10**7, crop_n_points_downscale_factor=2),
         ("crop_n_layers", "crop_n_points_downscale_factor"), ANY_4XX, 3.0),
        ("downscale_factor_1201_digits",
         with_params(crop_n_layers=4, crop_n_points_downscale_factor=10**1200),
         ("crop_n_layers", "crop_n_points_downscale_factor"), ANY_4XX, 3.0),
        ("point_grids_1_5m_points", with_params(points_per_side=None, point_grids=grids_1m),
         ("point_grids", *IN_BODY), ANY_4XX, 3.0),
        ("point_grids_9_layers",
         with_params(points_per_side=None, crop_n_layers=8, point_grids=[[[0.5, 0.5]]] * 9),
         ("point_grids", "crop_n_layers"), ANY_4XX, 3.0),
        ("point_grids_nan", with_params(points_per_side=None, point_grids=[[[float("nan"), 0.5]]]),
         ("point_grids",), ANY_4XX, 5.0),
        ("point_grids_flat", with_params(points_per_side=None, point_grids=[[0.5, 0.5]]),
         ("point_grids",), ANY_4XX, 5.0),
        ("stability_offset_infinity", with_params(stability_score_offset=float("inf")),
         ("stability_score_offset",), ANY_4XX, 5.0),
        ("pred_iou_thresh_nan", with_params(pred_iou_thresh=float("nan")), ("pred_iou_thresh",),
         ANY_4XX, 5.0),
        ("params_as_list", with_fields(params=[1, 2]), ("params",), ANY_4XX, 5.0),
        # Loose types, accepted today.
        ("points_per_side_as_string", with_params(points_per_side="2"), pps, UNPROCESSABLE, 5.0),
        ("points_per_side_as_bool", with_params(points_per_side=True), pps, UNPROCESSABLE, 5.0),
        ("multimask_as_string", with_params(multimask_output="yes"), ("multimask_output",),
         UNPROCESSABLE, 5.0),
        ("use_m2m_as_int", with_params(use_m2m=1), ("use_m2m",), UNPROCESSABLE, 5.0),
    ]  # fmt: skip
    for name, body_of, where, statuses, seconds in cases:
        yield from over_paths(
            name, route, seeds, body_of, where, statuses=statuses, max_seconds=seconds
        )


def _image_cases(seeds: Seeds) -> Iterator[Hostile]:
    """The base64 image (JSON path) and the image file part (multipart)."""
    text = seeds.png_b64
    values: list[tuple[str, Any]] = [
        ("not_base64", "!!!! not base64 !!!!"),
        ("data_url_without_base64", "data:image/png," + text),
        ("data_url_empty", "data:image/png;base64,"),
        ("base64_garbage_tail", text + "!!@@"),
        ("base64_mixed_alphabets", "ab+/cd-_" * 8),
        ("base64_whitespace_only", " \n\t " * 100),
        ("base64_of_text", "aGVsbG8sIHdvcmxk"),
        ("base64_10mb_of_zeros", "A" * (10 * MiB)),
        ("image_as_number", 12345),
        ("image_as_object", {"data": text}),
    ]
    truncated_png = seeds.png[: len(seeds.png) // 2]
    parts = (("empty", b""), ("garbage", b"\x00\xff" * 64), ("truncated", truncated_png))
    for route in ("/v1/embeddings", "/v1/amg"):
        for name, value in values:
            make = _image_json(route, seeds, value)
            yield Hostile(f"image_{name}", route, "json", make, ("image",))
        for name, data in parts:
            make = _image_part(route, seeds, data)
            yield Hostile(f"image_part_{name}", route, "multipart", make, ("image",))


def _image_json(route: str, seeds: Seeds, value: Any) -> Callable[[], Rendered]:
    return lambda: (JSON, dumps({**base_fields(route, seeds), "image": value}), ())


def _image_part(route: str, seeds: Seeds, data: bytes) -> Callable[[], Rendered]:
    def render() -> Rendered:
        fields = {k: v for k, v in base_fields(route, seeds).items() if k != "image"}
        content_type, body = multipart([("request", dumps(fields), None), ("image", data, "x.png")])
        return content_type, body, ()

    return render


def _content_type_cases(route: str, seeds: Seeds) -> Iterator[Hostile]:
    # A lenient multipart parser may read a body cut short as the parts it has: then the
    # request is refused for the field it lacks (image, objects), which is named.
    where = ("Content-Type", "content type", "multipart", "image", "objects")
    boundary = "multipart/form-data; boundary=zz"
    unterminated = b'--zz\r\nContent-Disposition: form-data; name="request"\r\n\r\n{}'
    two_requests = multipart([("request", b"{}", None), ("request", b"{}", None)])
    cases: list[tuple[str, str | None, bytes]] = [
        ("text_plain", "text/plain", JSON_BODY),
        ("form_urlencoded", "application/x-www-form-urlencoded", b"image=abc&objects=1"),
        ("xml", "application/xml", b"<image/>"),
        ("no_content_type", None, JSON_BODY),
        ("octet_stream", "application/octet-stream", seeds.png),
        ("content_type_garbage", ';;;===/"', JSON_BODY),
        ("multipart_without_boundary", "multipart/form-data", JSON_BODY),
        ("multipart_garbage", boundary, b"garbage" * 100),
        ("multipart_unterminated", boundary, unterminated),
        ("multipart_two_request_parts", *two_requests),
        ("multipart_header_1mb", boundary,
         b'--zz\r\nContent-Disposition: form-data; name="request"; x="' + b"x" * PART_LIMIT
         + b'"\r\n\r\n{}\r\n--zz--\r\n'),
    ]  # fmt: skip
    for name, content_type, data in cases:
        yield Hostile(name, route, "raw", _raw(route, seeds, content_type, data), where)


JSON_BODY = b"<the route's valid JSON body>"


def _raw(route: str, seeds: Seeds, content_type: str | None, data: bytes) -> Callable[[], Rendered]:
    def render() -> Rendered:
        body = dumps(base_fields(route, seeds)) if data is JSON_BODY else data
        return content_type, body, ()

    return render


def corpus(seeds: Seeds) -> list[Hostile]:
    """Every hostile request of the suite, each with a unique id."""
    cases: list[Hostile] = []
    for route in ROUTES:
        cases += _body_level_cases(route, seeds)
        cases += _content_type_cases(route, seeds)
    cases += _segment_cases(seeds)
    cases += _amg_cases(seeds)
    cases += _image_cases(seeds)
    ids = [case.id for case in cases]
    assert len(ids) == len(set(ids)), "duplicate case ids"
    return cases


if __name__ == "__main__":
    _serve_forever(json.loads(sys.argv[1]))
