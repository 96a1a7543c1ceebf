"""Fetch one file over HTTP(S) into place: resumed, retried, bounded, checked, atomic.

``fetch(url, dest, deadline_s=..., verify=...)`` writes into ``dest`` + ``.part`` next to
the destination and renames it onto ``dest`` only once the whole file is there and passed
every check, so a good file already at ``dest`` is never replaced by one that fails:

- **resume**: a ``.part`` left by a cut connection, a Ctrl-C or a killed process is
  continued with an HTTP ``Range`` request (a server that ignores it sends the whole file
  again, which replaces the part);
- **one deadline, really**: ``deadline_s`` is wall-clock time for the whole call. Every
  socket operation waits at most ``read_timeout_s`` and never past the deadline, the body
  is read as it arrives (a server that drips one byte a second is not waited on for a
  whole chunk), and a timer shuts the connection down when the deadline passes (a
  trickle of headers ends there too);
- **retries**: cut connections, stalls, a refused connection after the server had
  answered in this call, a temporary DNS failure and 408/425/429/5xx answers are retried
  with exponential backoff until the deadline. Final at once, with one line: a malformed
  URL, a host name that does not exist, a refused connection before any answer (nothing
  listens there: a wrong port), a TLS certificate that does not verify, any other 4xx;
- **size cap while streaming**: the bytes may not exceed the size the server declared
  (``Content-Length``, the total of ``Content-Range``, Hugging Face's ``X-Linked-Size``),
  ``expected_size`` or ``max_size``: the download stops at the first byte too many, and a
  declared size above the cap is refused before the body is read;
- **the publisher's digest**: what the server publishes about the file's bytes is checked
  on the complete file: Hugging Face's ``X-Linked-Etag`` (the sha256 of an LFS file, on the
  redirect to its CDN) and a 64-hex ``ETag`` of a Hugging Face answer are sha256 digests;
  a 32-hex ``ETag`` of an S3 or CloudFront answer (single-part upload) is an MD5; a
  multipart (``...-N``), weak or other server's ETag is no digest and is ignored.
  ``sha256``, when given (``--sha256``), pins the digest: it is then the one checked;
- **verification**: ``verify(part)`` runs on the complete file after the digests (for a
  checkpoint: every record's CRC-32 and every official key and shape,
  :func:`sam2serve.checkpoint.verify_checkpoint`); a file that fails is deleted;
- **the digest recorded**: the sha256 of the file that was renamed into place is written
  beside it, ``dest`` + ``.sha256`` (``sha256sum`` format);
- **one writer**: the ``.part`` is locked, so two processes fetching the same file (replicas
  starting together) do not interleave; the second waits for the first, then finds ``dest``.

A progress bar (tqdm) goes to stderr. Errors are :class:`DownloadError` (a digest that does
not match: :class:`DigestMismatch`), one line that names the URL without credentials.
Torch-free.
"""

from __future__ import annotations

import errno
import functools
import hashlib
import http.client
import os
import re
import socket
import ssl
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from email.message import Message
from pathlib import Path
from typing import Any, BinaryIO, NoReturn, Self

__all__ = [
    "DigestMismatch",
    "DownloadError",
    "Fetched",
    "digest_path",
    "fetch",
    "part_path",
    "record_sha256",
    "recorded_sha256",
    "sha256_of",
    "shown_url",
]

CHUNK = 1 << 20
# Waits between attempts: BACKOFF_S, doubled each time, at most BACKOFF_MAX_S (never past
# the deadline).
BACKOFF_S = 1.0
BACKOFF_MAX_S = 30.0
# HTTP statuses worth another attempt; any other error status is final.
RETRY_STATUSES = frozenset({408, 425, 429, 500, 502, 503, 504})
LOCK_POLL_S = 0.5
DECLARED = "Content-Length"  # the size an answer declares (or its Content-Range's total)
_CONTENT_RANGE = re.compile(r"bytes (\d+)-(\d+)/(\d+|\*)")
_HEX64 = re.compile(r"[0-9a-f]{64}")
_HEX32 = re.compile(r"[0-9a-f]{32}")
# getaddrinfo's answers that mean "this name does not exist" (not "no DNS right now")
_NO_SUCH_HOST = frozenset(
    code
    for code in (getattr(socket, "EAI_NONAME", None), getattr(socket, "EAI_NODATA", None))
    if code is not None
)


class DownloadError(OSError):
    """A download that did not complete; the message (one line) names the URL and why."""


class DigestMismatch(DownloadError):
    """The complete file's digest is not the one its server published or the one pinned:
    the bytes are not the file (nothing was kept)."""


@dataclass(frozen=True)
class Fetched:
    """A file in place: its sha256, and what it was checked against (``X-Linked-Etag``,
    ``ETag (MD5)``, ``--sha256``...; empty when nothing was published or pinned)."""

    path: Path
    sha256: str
    checked_against: tuple[str, ...] = ()


@dataclass
class _Published:
    """What the answers of one call said about the file: digests {algorithm: (hex,
    header)} and sizes (a server may declare the size in several places)."""

    digests: dict[str, tuple[str, str]] = field(default_factory=dict)
    sizes: dict[str, int] = field(default_factory=dict)  # {header: bytes}


class _Retry(Exception):
    """One attempt failed in a way another attempt may not; ``unreached``: no server
    answered (refused, unknown host, no route)."""

    def __init__(self, reason: str, unreached: bool = False) -> None:
        super().__init__(reason)
        self.unreached = unreached


def part_path(dest: Path) -> Path:
    """Where ``dest`` is assembled: ``dest`` + ``.part``, beside it."""
    return dest.with_name(dest.name + ".part")


def digest_path(dest: Path) -> Path:
    """Where the sha256 of the file at ``dest`` is recorded: ``dest`` + ``.sha256``."""
    return dest.with_name(dest.name + ".sha256")


def sha256_of(path: Path) -> str:
    return _hashes(path, md5=False)[0]


def recorded_sha256(dest: Path) -> str | None:
    """The sha256 recorded beside ``dest`` by the download that put it there, if any."""
    try:
        text = digest_path(dest).read_text(encoding="ascii")
    except (OSError, UnicodeDecodeError):
        return None
    words = text.split()
    return words[0].lower() if words and _HEX64.fullmatch(words[0].lower()) else None


def shown_url(url: str) -> str:
    """``url`` as messages show it: no ``user:password@``, no query (it may hold a
    signature), only printable characters."""
    try:
        parts = urllib.parse.urlsplit(url)
        netloc = parts.netloc.rpartition("@")[2]
        text = urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, "", ""))
        if parts.query:
            text += "?..."
    except ValueError:
        text = re.sub(r"//[^/]*@", "//", url).split("?", 1)[0]
    return _printable(text, 300)


def fetch(
    url: str,
    dest: Path,
    *,
    deadline_s: float,
    read_timeout_s: float = 30.0,
    expected_size: int | None = None,
    max_size: int | None = None,
    sha256: str | None = None,
    sha256_source: str = "--sha256",
    verify: Callable[[Path], None] | None = None,
    progress: bool = True,
    label: str | None = None,
    retry_unreached: bool = True,
    replace: bool = False,
    token: str | None = None,
) -> Fetched:
    """Download ``url`` to ``dest`` (see the module's docstring).

    ``expected_size``: the file's exact size; ``max_size``: the most it can be (both
    enforced while the bytes arrive). ``sha256``: the pinned digest (lowercase hex), named
    ``sha256_source`` in messages.

    ``token``: sent as ``Authorization: Bearer`` to ``url``'s origin only (scheme, host,
    port); a redirect to another origin (a CDN) is followed without it.

    A ``dest`` that exists once the part is locked (another process renamed its download
    into place) is returned as it is, unless ``replace``.

    ``retry_unreached=False``: when the first attempt reaches no server (offline, refused,
    unknown host, a timeout), fail at once rather than retry until the deadline (a
    download that was not asked for, on a machine that may be offline).

    ``verify`` raises to reject the complete file: the ``.part`` is deleted and its
    exception propagates. A :class:`DownloadError` leaves a partial ``.part`` for the next
    call to resume, except when the bytes were wrong (too many, a size or digest that does
    not match).
    """
    if deadline_s <= 0:
        raise ValueError(f"deadline_s must be > 0, got {deadline_s}")
    if sha256 is not None and not _HEX64.fullmatch(sha256):
        raise ValueError(f"sha256 must be 64 lowercase hex digits, got {sha256!r}")
    _check_url(url)
    shown = shown_url(url)
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = part_path(dest)
    deadline = _Deadline(deadline_s)
    out = _open_locked(part, deadline, shown)
    with out:
        if not replace and dest.is_file():  # another process fetched it meanwhile
            if not part.stat().st_size:
                part.unlink()  # the empty part this process opened
            return _present(dest, shown, sha256, sha256_source)
        published = _Published()
        try:
            _download(
                _Call(url, shown, part, out, deadline, read_timeout_s, progress, token),
                label or dest.name,
                retry_unreached,
                published,
                _Limits(expected_size, max_size),
            )
        except BaseException:
            out.flush()  # what arrived before a Ctrl-C is kept to resume
            if part.exists() and not part.stat().st_size:
                part.unlink()  # nothing to resume: leave nothing behind
            raise
        size = part.stat().st_size
        for declared, header in ((expected_size, "expected"), *_sizes(published)):
            if declared is not None and size != declared:
                part.unlink(missing_ok=True)
                raise DownloadError(
                    f"{shown}: got {size} bytes, {header} {declared}; the file was deleted"
                )
        try:
            actual, checked = _check_digests(part, shown, published, sha256, sha256_source, dest)
            if verify is not None:
                verify(part)
        except Exception:  # (not Ctrl-C: the complete part is kept, verified next time)
            part.unlink(missing_ok=True)
            raise
        # Under the lock: no other process is writing the part. The old record goes
        # first: a crash between the two renames leaves a file without a record, never a
        # record that describes another file.
        digest_path(dest).unlink(missing_ok=True)
        os.replace(part, dest)
        record_sha256(dest, actual)
    return Fetched(dest, actual, checked)


# --------------------------------------------------------------------------- one call


@dataclass(frozen=True)
class _Limits:
    expected_size: int | None
    max_size: int | None


class _Deadline:
    """The wall clock of one call."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.end = time.monotonic() + seconds

    def left(self) -> float:
        return self.end - time.monotonic()

    def timeout(self, read_timeout_s: float) -> float:
        """A socket timeout: ``read_timeout_s``, never past the deadline."""
        return max(0.05, min(read_timeout_s, self.left()))


@dataclass(frozen=True)
class _Call:
    url: str
    shown: str
    part: Path
    out: BinaryIO
    deadline: _Deadline
    read_timeout_s: float
    progress: bool
    token: str | None


class _Cutter:
    """Shuts the attempt's sockets down when the deadline passes, so that nothing (a body,
    headers or a TLS exchange that trickle) outlives it."""

    def __init__(self, deadline: _Deadline) -> None:
        self.lock = threading.Lock()
        self.sockets: list[socket.socket] = []
        self.fired = False
        self.timer = threading.Timer(max(0.0, deadline.left()), self._fire)
        self.timer.daemon = True

    def __enter__(self) -> Self:
        self.timer.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.timer.cancel()

    def track(self, sock: socket.socket) -> None:
        with self.lock:
            self.sockets.append(sock)
            if self.fired:
                _shut(sock)

    def set_timeout(self, seconds: float) -> None:
        """The timeout of the newest socket (the one the body comes on)."""
        with self.lock:
            sock = self.sockets[-1] if self.sockets else None
        if sock is not None:
            try:
                sock.settimeout(seconds)
            except OSError:
                pass  # closed: the read that follows says so

    def _fire(self) -> None:
        with self.lock:
            self.fired = True
            for sock in self.sockets:
                _shut(sock)


def _shut(sock: socket.socket) -> None:
    try:  # the plain socket's shutdown: a TLS socket's own would drop its state first
        socket.socket.shutdown(sock, socket.SHUT_RDWR)
    except OSError:
        pass  # closed meanwhile


# urllib closes the connection's socket reference once the answer is there (the answer
# keeps the socket): the socket is tracked when it is connected.
class _Watched:
    """Mixed into an HTTP(S) connection: its socket tracked by ``cutter`` once connected."""

    sock: socket.socket

    def __init__(self, *args: Any, cutter: _Cutter, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.cutter = cutter

    def connect(self) -> None:
        super().connect()  # type: ignore[misc]  # the connection class mixed in after this one
        self.cutter.track(self.sock)


class _WatchedHTTPConnection(_Watched, http.client.HTTPConnection):
    pass


class _WatchedHTTPSConnection(_Watched, http.client.HTTPSConnection):
    pass


class _WatchedHTTPHandler(urllib.request.HTTPHandler):
    def __init__(self, cutter: _Cutter) -> None:
        super().__init__()
        self.cutter = cutter

    def http_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(functools.partial(_WatchedHTTPConnection, cutter=self.cutter), req)


class _WatchedHTTPSHandler(urllib.request.HTTPSHandler):
    def __init__(self, cutter: _Cutter) -> None:
        super().__init__()  # urllib's default TLS context, as urlopen's
        self.cutter = cutter

    def https_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(functools.partial(_WatchedHTTPSConnection, cutter=self.cutter), req)


class _Redirects(urllib.request.HTTPRedirectHandler):
    """Keeps what each redirect publishes about the file (Hugging Face's ``X-Linked-Etag``
    and ``X-Linked-Size`` are on the answer that sends the client to its CDN), and the
    bearer token only while the redirects stay on the first URL's origin."""

    def __init__(self, url: str, token: str | None, found: _Published) -> None:
        self.origin, self.token, self.found = _origin(url), token, found

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        _read_published(headers, self.found)
        new = super().redirect_request(req, fp, code, msg, headers, newurl)
        if new is not None and self.token and _origin(newurl) == self.origin:
            new.add_unredirected_header("Authorization", f"Bearer {self.token}")
        return new


def _open(
    call: _Call, request: urllib.request.Request, cutter: _Cutter, found: _Published
) -> http.client.HTTPResponse:
    """Send ``request`` (redirects followed); the connections are watched by ``cutter``."""
    opener = urllib.request.build_opener(
        _WatchedHTTPHandler(cutter),
        _WatchedHTTPSHandler(cutter),
        _Redirects(call.url, call.token, found),
    )
    return opener.open(request, timeout=call.deadline.timeout(call.read_timeout_s))


def _download(
    call: _Call, label: str, retry_unreached: bool, published: _Published, limits: _Limits
) -> None:
    attempts = 0
    wait = BACKOFF_S
    answered = False  # a server answered in this call: a refusal now may be a restart
    while True:
        attempts += 1
        before = call.part.stat().st_size
        try:
            _attempt(call, label, published, limits, answered)
            return
        except _Retry as exc:
            reason = str(exc)
            if exc.unreached and attempts == 1 and not retry_unreached:
                raise DownloadError(f"{call.shown}: {reason}") from None
            answered = answered or not exc.unreached
        left = call.deadline.left()
        if call.part.stat().st_size > before:
            wait = BACKOFF_S  # it moved: the link works, only this connection broke
        if left <= wait:  # the next attempt would start at the deadline: none
            kept = call.part.stat().st_size
            raise DownloadError(
                f"{call.shown}: gave up after {attempts} attempt(s) in "
                f"{call.deadline.seconds:g} s (the deadline); last: {reason}"
                + (f"; {kept} bytes kept in {str(call.part)!r} to resume" if kept else "")
            )
        if call.progress:
            from tqdm import tqdm

            tqdm.write(
                f"sam2serve: {label}: {reason}; attempt {attempts + 1} in {wait:.2g} s",
                file=sys.stderr,
            )
        time.sleep(wait)
        wait = min(wait * 2, BACKOFF_MAX_S)


def _attempt(
    call: _Call, label: str, published: _Published, limits: _Limits, answered: bool
) -> None:
    """One request: append the missing bytes to the part (or rewrite it whole).
    ``published``: what earlier answers of this call declared; an answer that declares
    another size or digest starts the file again."""
    have = call.part.stat().st_size
    request = urllib.request.Request(call.url, headers={"User-Agent": "sam2serve"})
    if have:
        request.add_header("Range", f"bytes={have}-")
    if call.token:
        # unredirected: urllib does not copy it to a redirect; _Redirects re-adds it when
        # the redirect stays on this origin
        request.add_unredirected_header("Authorization", f"Bearer {call.token}")
    found = _Published()
    with _Cutter(call.deadline) as cutter:
        try:
            response = _open(call, request, cutter, found)
        except urllib.error.HTTPError as exc:
            exc.close()
            _http_error(call, exc, have)  # raises, unless the part is the whole file
            return
        except Exception as exc:  # noqa: BLE001 - network errors, a malformed redirect: sorted below
            if cutter.fired or call.deadline.left() <= 0:
                raise _Retry("the deadline passed before the server answered") from None
            _connection_error(call, exc, answered)
        with response:
            total = _start(call, response, have, found, published, limits)
            if response.status != 206:
                have = 0
            cap = _cap(total, published, limits)
            cap_name = _cap_name(total, published, limits)
            _receive(call, response, cutter, have, total, (cap, cap_name), label)
    got = call.part.stat().st_size
    if total is not None and got < total:
        raise _Retry(f"the connection ended after {got} of {total} bytes")


def _http_error(call: _Call, exc: urllib.error.HTTPError, have: int) -> None:
    """Raise the final error or the _Retry that an error status calls for; return when a
    416 says the part already is the whole file."""
    status = f"HTTP {exc.code} {_printable(str(exc.reason), 80)}".rstrip()
    if exc.code == 416 and have:  # nothing after `have`: complete, or a stale part
        if _total_of(exc.headers.get("Content-Range")) == have:
            return
        _truncate(call.out)
        raise _Retry(f"HTTP 416 for a part of {have} bytes: started again") from None
    if exc.code in RETRY_STATUSES:
        raise _Retry(status) from None
    raise DownloadError(f"{call.shown}: {status}") from None


def _connection_error(call: _Call, exc: BaseException, answered: bool) -> NoReturn:
    """Raise the final error or the _Retry that ``exc`` (no answer) calls for."""
    inner = exc.reason if isinstance(exc, urllib.error.URLError) else exc
    where = _host_port(call.url)
    if isinstance(inner, ConnectionRefusedError) and not answered:
        raise DownloadError(
            f"{call.shown}: connection refused by {where} (nothing listens there: is the "
            "port right?); not retried"
        ) from None
    if isinstance(inner, socket.gaierror) and inner.errno in _NO_SUCH_HOST:
        raise DownloadError(
            f"{call.shown}: no such host {urllib.parse.urlsplit(call.url).hostname!r} "
            f"({_reason(inner)}); not retried"
        ) from None
    if isinstance(inner, ssl.SSLCertVerificationError):
        raise DownloadError(f"{call.shown}: {_reason(inner)}; not retried") from None
    if isinstance(inner, (ValueError, OverflowError, http.client.InvalidURL, str)):
        raise DownloadError(f"{call.shown}: malformed URL ({_reason(exc)})") from None
    if isinstance(inner, (OSError, http.client.HTTPException)):
        raise _Retry(_reason(inner), unreached=True) from None
    raise exc


def _start(
    call: _Call,
    response: http.client.HTTPResponse,
    have: int,
    found: _Published,
    published: _Published,
    limits: _Limits,
) -> int | None:
    """Check the answer's headers before its body; the file's total size if declared."""
    _read_published(response.headers, found)
    if response.status == 206:
        start, total = _content_range(response.headers.get("Content-Range"), call.shown)
        if start != have:
            _truncate(call.out)
            raise _Retry(f"the server resumed at byte {start}, not {have}: started again")
    else:  # 200: the whole file (the server ignored the range, or there was no part)
        _truncate(call.out)
        length = response.headers.get("Content-Length")
        total = int(length) if length and length.isascii() and length.isdigit() else None
    if total is not None:
        found.sizes[DECLARED] = total
    if response.status == 206:  # the bytes before `have` must be of the same file
        changed = _changes(published, found)
        published.digests.update(found.digests)
        published.sizes.update(found.sizes)
        if changed:
            _truncate(call.out)
            raise _Retry(f"the file changed on the server ({changed}): started again")
    else:  # a whole file: what this answer says is all that counts
        published.digests, published.sizes = found.digests, found.sizes
    cap = _cap(total, published, limits)
    if total is not None and cap is not None and total > cap:
        _truncate(call.out)
        raise DownloadError(
            f"{call.shown}: the server declares {total} bytes, more than the {cap} "
            f"{_cap_name(total, published, limits)}; nothing was kept"
        )
    return total


def _changes(published: _Published, found: _Published) -> str:
    """What ``found`` declares differently from the answers before it ('' if nothing)."""
    for algorithm, (value, header) in found.digests.items():
        before = published.digests.get(algorithm)
        if before is not None and before[0] != value:
            return f"its {header} is now {value}"
    known = set(published.sizes.values())
    for header, size in found.sizes.items():
        if known and size not in known:
            return f"its {header} is now {size} bytes"
    return ""


def _sizes(published: _Published) -> list[tuple[int, str]]:
    """The sizes a complete file must have besides the declared one (checked as the
    bytes arrive): Hugging Face's ``X-Linked-Size``."""
    return [(size, f"the server published {header}") for header, size in
            published.sizes.items() if header != DECLARED]  # fmt: skip


def _cap(total: int | None, published: _Published, limits: _Limits) -> int | None:
    """The most bytes the file may have."""
    bounds = [total, limits.expected_size, limits.max_size, *published.sizes.values()]
    known = [b for b in bounds if b is not None]
    return min(known) if known else None


def _cap_name(total: int | None, published: _Published, limits: _Limits) -> str:
    cap = _cap(total, published, limits)
    if cap == limits.expected_size:
        return "expected"
    if cap == limits.max_size:
        return "such a file can have"
    if cap == total:
        return "it declared"
    return "it published"


def _receive(
    call: _Call,
    response: http.client.HTTPResponse,
    cutter: _Cutter,
    have: int,
    total: int | None,
    cap: tuple[int | None, str],
    label: str,
) -> None:
    """Append the body to the part as it arrives, never past ``cap`` bytes in all, never
    past the deadline."""
    from tqdm import tqdm

    with tqdm(
        total=total,
        initial=have,
        unit="B",
        unit_scale=True,
        unit_divisor=1024,
        desc=f"download {label}",
        disable=not call.progress,
        file=sys.stderr,
        mininterval=0.5,
    ) as bar:
        received = have
        while True:
            if cutter.fired or call.deadline.left() <= 0:
                call.out.flush()
                raise _Retry(f"the deadline passed while receiving ({received} bytes in all)")
            try:
                cutter.set_timeout(call.deadline.timeout(call.read_timeout_s))
                chunk = response.read1(CHUNK)  # what has arrived: no wait for a full chunk
            except (OSError, ValueError, http.client.HTTPException) as exc:
                call.out.flush()
                if cutter.fired or call.deadline.left() <= 0:  # (the timeout was the time left)
                    raise _Retry(
                        f"the deadline passed while receiving ({received} bytes in all)"
                    ) from None
                raise _Retry(_reason(exc)) from None
            if not chunk:
                if cutter.fired or call.deadline.left() <= 0:  # a shut-down socket reads as the end
                    call.out.flush()
                    raise _Retry(f"the deadline passed while receiving ({received} bytes in all)")
                break
            if cap[0] is not None and received + len(chunk) > cap[0]:
                _truncate(call.out)  # (what is on disk never went past the cap)
                call.part.unlink(missing_ok=True)
                raise DownloadError(
                    f"{call.shown}: the server sent more than the {cap[0]} bytes {cap[1]}; "
                    "stopped there, nothing was kept"
                )
            call.out.write(chunk)
            bar.update(len(chunk))
            received += len(chunk)
    call.out.flush()
    os.fsync(call.out.fileno())


# --------------------------------------------------------------------------- the digests


def _read_published(headers: Message, found: _Published) -> None:
    """The digests and sizes an answer's headers publish about the file."""
    linked = _etag_value(headers.get("X-Linked-Etag"))
    if linked is not None and _HEX64.fullmatch(linked):
        found.digests["sha256"] = (linked, "X-Linked-Etag")
    linked_size = (headers.get("X-Linked-Size") or "").strip()
    if linked_size.isascii() and linked_size.isdigit():
        found.sizes["X-Linked-Size"] = int(linked_size)
    etag = _etag_value(headers.get("ETag"))
    if etag is None:
        return
    if _HEX64.fullmatch(etag) and _from_hugging_face(headers):
        found.digests.setdefault("sha256", (etag, "ETag"))
    elif _HEX32.fullmatch(etag) and _from_s3(headers):
        found.digests["md5"] = (etag, "ETag (MD5)")


def _etag_value(value: str | None) -> str | None:
    """A strong entity tag without its quotes, lowercase; None for a weak one."""
    if not value:
        return None
    value = value.strip()
    if value.startswith("W/"):
        return None  # weak: "equivalent", not "the same bytes"
    return value.strip('"').lower()


def _from_hugging_face(headers: Message) -> bool:
    """An answer of the Hugging Face hub itself (not of a storage behind it, whose 64-hex
    tags may be other hashes)."""
    return headers.get("X-Repo-Commit") is not None


def _from_s3(headers: Message) -> bool:
    """An answer of Amazon S3 or CloudFront, whose single-part ETag is the MD5 of the
    bytes (a multipart upload's has a ``-N`` suffix, which the caller never matches)."""
    names = {name.lower() for name in headers}
    encryption = (headers.get("x-amz-server-side-encryption") or "").lower()
    if "kms" in encryption or "x-amz-server-side-encryption-customer-algorithm" in names:
        return False  # an object encrypted with KMS or a customer key: its ETag is no MD5
    server = (headers.get("Server") or "").lower()
    via = " ".join(headers.get_all("Via") or []).lower()
    cache = (headers.get("X-Cache") or "").lower()
    return (
        any(name.startswith("x-amz-") for name in names)
        or "amazons3" in server
        or "cloudfront" in server
        or "cloudfront" in via
        or "cloudfront" in cache
    )


def _check_digests(
    part: Path,
    shown: str,
    published: _Published,
    pinned: str | None,
    pinned_source: str,
    dest: Path,
) -> tuple[str, tuple[str, ...]]:
    """The part's sha256 and what it was checked against, once it matches the pinned one, else the published sha256, else
    the published MD5 (the strongest claim decides; a CDN's MD5 beside the publisher's
    sha256 adds nothing); DigestMismatch otherwise."""
    if pinned:
        wanted = {"sha256": (pinned, pinned_source)}
    elif "sha256" in published.digests:
        wanted = {"sha256": published.digests["sha256"]}
    else:
        wanted = dict(published.digests)
    sha256, md5 = _hashes(part, md5="md5" in wanted)
    actual = {"sha256": sha256, "md5": md5}
    for algorithm, (expected, source) in wanted.items():
        if actual[algorithm] != expected:
            untouched = f"{str(dest)!r} was not touched" if dest.exists() else "nothing was kept"
            raise DigestMismatch(
                f"{shown}: {algorithm} of the download is {actual[algorithm]}, but "
                f"{'the pinned one' if pinned else 'the server published'} ({source}) is "
                f"{expected}; the download was deleted, {untouched}"
            )
    return sha256, tuple(source for _, source in wanted.values())


def _hashes(path: Path, md5: bool) -> tuple[str, str | None]:
    """The sha256 (and the MD5 when asked) of the file, in one pass."""
    sha = hashlib.sha256()
    other = hashlib.md5(usedforsecurity=False) if md5 else None
    with path.open("rb") as f:
        while chunk := f.read(CHUNK):
            sha.update(chunk)
            if other is not None:
                other.update(chunk)
    return sha.hexdigest(), None if other is None else other.hexdigest()


def record_sha256(dest: Path, sha256: str) -> None:
    """Write ``dest``'s digest beside it (``sha256sum -c`` reads it), atomically."""
    record = digest_path(dest)
    temporary = record.with_name(record.name + ".tmp")
    temporary.write_text(f"{sha256}  {dest.name}\n", encoding="ascii")
    os.replace(temporary, record)


def _present(dest: Path, shown: str, pinned: str | None, pinned_source: str) -> Fetched:
    """The file another process put in place; it must match the pinned digest too."""
    sha256 = recorded_sha256(dest) or sha256_of(dest)
    if pinned and sha256 != pinned:
        raise DigestMismatch(
            f"{shown}: the file another process put at {str(dest)!r} has sha256 {sha256}, "
            f"but the pinned one ({pinned_source}) is {pinned}"
        )
    return Fetched(dest, sha256, (pinned_source,) if pinned else ())


# --------------------------------------------------------------------------- helpers


def _open_locked(part: Path, deadline: _Deadline, shown: str) -> BinaryIO:
    """``part`` opened for appending and locked for this process, waiting until the
    deadline at most while another process holds it."""
    try:
        import fcntl
    except ImportError:  # not POSIX: one process at a time is the user's business
        return part.open("ab")
    while True:
        out = part.open("ab")
        try:
            fcntl.flock(out.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            out.close()
            if deadline.left() <= 0:
                raise DownloadError(
                    f"{shown}: another process is still downloading into {str(part)!r} after "
                    f"{deadline.seconds:g} s"
                ) from None
            time.sleep(LOCK_POLL_S)
            continue
        # The holder may have renamed or deleted the part meanwhile: lock the file that
        # is at the path now.
        if part.exists() and os.fstat(out.fileno()).st_ino == part.stat().st_ino:
            return out
        out.close()


def _check_url(url: str) -> None:
    """A DownloadError (one line) unless ``url`` is a well-formed http(s) URL: a host, a
    port in 1-65535 if any, no credentials, no spaces or control characters."""
    shown = shown_url(url)
    if not url.startswith(("http://", "https://")):
        raise DownloadError(f"{shown}: not an http:// or https:// URL")
    if any(c.isspace() or not c.isprintable() for c in url):
        raise DownloadError(f"{shown}: malformed URL (a space or control character)")
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise DownloadError(f"{shown}: malformed URL ({exc})") from None
    if not parts.hostname:
        raise DownloadError(f"{shown}: malformed URL (no host)")
    if port == 0:
        raise DownloadError(f"{shown}: malformed URL (port 0)")
    if parts.username is not None or parts.password is not None:
        raise DownloadError(
            f"{shown}: credentials in the URL (user:password@) are not supported; use a "
            "mirror that needs none"
        )


def _origin(url: str) -> tuple[str, str | None, int | None]:
    parts = urllib.parse.urlsplit(url)
    default = {"http": 80, "https": 443}.get(parts.scheme)
    try:
        port = parts.port
    except ValueError:
        port = -1  # matches no well-formed origin
    return parts.scheme, parts.hostname, port or default


def _host_port(url: str) -> str:
    _, host, port = _origin(url)
    return f"{host}:{port}" if host and ":" not in host else f"[{host}]:{port}"


def _truncate(out: BinaryIO) -> None:
    out.flush()
    out.truncate(0)  # the file is opened for appending: writes go to the new end


def _content_range(header: str | None, shown: str) -> tuple[int, int | None]:
    match = _CONTENT_RANGE.fullmatch((header or "").strip())
    if match is None:
        raise DownloadError(
            f"{shown}: a partial answer without a valid Content-Range "
            f"({_printable(repr(header), 80)})"
        )
    total = match.group(3)
    return int(match.group(1)), None if total == "*" else int(total)


def _total_of(header: str | None) -> int | None:
    """The total of ``bytes */TOTAL`` (a 416's Content-Range)."""
    match = re.fullmatch(r"bytes \*/(\d+)", (header or "").strip())
    return None if match is None else int(match.group(1))


def _reason(exc: BaseException) -> str:
    """One line for a network error (URLError wraps the socket's)."""
    inner = getattr(exc, "reason", None)
    if isinstance(exc, urllib.error.URLError) and isinstance(inner, BaseException):
        exc = inner
    if isinstance(exc, (socket.timeout, TimeoutError)):
        return "no data for the read timeout"
    if isinstance(exc, OSError) and exc.errno == errno.ECONNREFUSED:
        return "connection refused"
    return _printable(str(exc) or type(exc).__name__, 200)


def _printable(text: str, limit: int) -> str:
    """``text`` on one line of printable characters, at most ``limit`` of them (a
    server's words go into our messages)."""
    text = " ".join("".join(c if c.isprintable() else " " for c in text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."
