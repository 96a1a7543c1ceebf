"""Fetch one file over HTTP(S) into place: resumed, retried, size-checked, verified, atomic.

``fetch(url, dest, deadline_s=..., verify=...)`` writes into ``dest`` + ``.part`` next to
the destination and renames it onto ``dest`` only once the whole file is there:

- **resume**: a ``.part`` left by a cut connection, a Ctrl-C or a killed process is
  continued with an HTTP ``Range`` request (a server that ignores it sends the whole file
  again, which replaces the part);
- **retries under one deadline**: refused or cut connections, stalls (no byte for
  ``read_timeout_s``) and 408/429/5xx answers are retried with exponential backoff until
  ``deadline_s`` has passed since the call; another 4xx is final at once;
- **size check**: the bytes received must be the size the server declared
  (``Content-Length``, or the total of ``Content-Range``) and ``expected_size`` if given;
- **verification**: ``verify(part)`` runs on the complete file before the rename (for a
  checkpoint: every official key and shape, :func:`sam2serve.checkpoint.verify_checkpoint`);
  a file that fails it is deleted;
- **one writer**: the ``.part`` is locked, so two processes fetching the same file (replicas
  starting together) do not interleave; the second waits for the first, then finds ``dest``.

A progress bar (tqdm) goes to stderr. Errors are :class:`DownloadError`, one line that
names the URL. Torch-free.
"""

from __future__ import annotations

import hashlib
import http.client
import os
import re
import socket
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import IO, BinaryIO

__all__ = ["DownloadError", "fetch", "part_path", "sha256_of"]

CHUNK = 1 << 20
# Waits between attempts: BACKOFF_S, doubled each time, at most BACKOFF_MAX_S (never past
# the deadline).
BACKOFF_S = 1.0
BACKOFF_MAX_S = 30.0
# HTTP statuses worth another attempt; any other error status is final.
RETRY_STATUSES = frozenset({408, 425, 429, 500, 502, 503, 504})
LOCK_POLL_S = 0.5
_CONTENT_RANGE = re.compile(r"bytes (\d+)-(\d+)/(\d+|\*)")


class DownloadError(OSError):
    """A download that did not complete; the message (one line) names the URL and why."""


class _Retry(Exception):
    """One attempt failed in a way another attempt may not; ``unreached``: no server
    answered (refused, unknown host, no route)."""

    def __init__(self, reason: str, unreached: bool = False) -> None:
        super().__init__(reason)
        self.unreached = unreached


def part_path(dest: Path) -> Path:
    """Where ``dest`` is assembled: ``dest`` + ``.part``, beside it."""
    return dest.with_name(dest.name + ".part")


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def fetch(
    url: str,
    dest: Path,
    *,
    deadline_s: float,
    read_timeout_s: float = 30.0,
    expected_size: int | None = None,
    verify: Callable[[Path], None] | None = None,
    progress: bool = True,
    label: str | None = None,
    retry_unreached: bool = True,
    replace: bool = False,
    token: str | None = None,
) -> Path:
    """Download ``url`` to ``dest`` (see the module's docstring); returns ``dest``.

    ``token``: sent as ``Authorization: Bearer`` to ``url``'s origin only (scheme, host,
    port); a redirect to another origin (a CDN) is followed without it.

    A ``dest`` that exists once the part is locked (another process renamed its download
    into place) is returned as it is, unless ``replace``.

    ``retry_unreached=False``: when the first attempt reaches no server (offline, refused,
    unknown host), fail at once rather than retry until the deadline (a download that
    was not asked for, on a machine that may be offline).

    ``verify`` raises to reject the complete file: the ``.part`` is deleted and its
    exception propagates. A :class:`DownloadError` leaves a partial ``.part`` for the next
    call to resume, except when the bytes were wrong (too many, or a size mismatch).
    """
    if deadline_s <= 0:
        raise ValueError(f"deadline_s must be > 0, got {deadline_s}")
    if not url.startswith(("http://", "https://")):
        raise DownloadError(f"{url}: not an http:// or https:// URL")
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = part_path(dest)
    end = time.monotonic() + deadline_s
    out = _open_locked(part, end, url, deadline_s)
    with out:
        if not replace and dest.is_file():  # another process fetched it meanwhile
            if not part.stat().st_size:
                part.unlink()  # the empty part this process opened
            return dest
        try:
            _download(
                url,
                part,
                out,
                end,
                deadline_s,
                read_timeout_s,
                progress,
                label or dest.name,
                retry_unreached,
                token,
            )
        except BaseException:
            out.flush()  # what arrived before a Ctrl-C is kept to resume
            if part.exists() and not part.stat().st_size:
                part.unlink()  # nothing to resume: leave nothing behind
            raise
        size = part.stat().st_size
        if expected_size is not None and size != expected_size:
            part.unlink(missing_ok=True)
            raise DownloadError(
                f"{url}: got {size} bytes, expected {expected_size}; the file was deleted"
            )
        try:
            if verify is not None:
                verify(part)
        except Exception:  # (not Ctrl-C: the complete part is kept, verified next time)
            part.unlink(missing_ok=True)
            raise
        os.replace(part, dest)  # under the lock: no other process is writing the part
    return dest


def _open_locked(part: Path, end: float, url: str, deadline_s: float) -> BinaryIO:
    """``part`` opened for appending and locked for this process, waiting until ``end``
    at most while another process holds it."""
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
            if time.monotonic() >= end:
                raise DownloadError(
                    f"{url}: another process is still downloading into {str(part)!r} after "
                    f"{deadline_s:g} s"
                ) from None
            time.sleep(LOCK_POLL_S)
            continue
        # The holder may have renamed or deleted the part meanwhile: lock the file that
        # is at the path now.
        if part.exists() and os.fstat(out.fileno()).st_ino == part.stat().st_ino:
            return out
        out.close()


def _download(
    url: str,
    part: Path,
    out: BinaryIO,
    end: float,
    deadline_s: float,
    read_timeout_s: float,
    progress: bool,
    label: str,
    retry_unreached: bool,
    token: str | None = None,
) -> None:
    attempts = 0
    wait = BACKOFF_S
    sizes: set[int] = set()  # the file sizes the server declared in this call
    while True:
        attempts += 1
        before = part.stat().st_size
        try:
            _attempt(url, part, out, end, read_timeout_s, progress, label, sizes, token)
            return
        except _Retry as exc:
            reason = str(exc)
            if exc.unreached and attempts == 1 and not retry_unreached:
                raise DownloadError(f"{url}: {reason}") from None
        left = end - time.monotonic()
        if left <= 0:
            raise DownloadError(
                f"{url}: gave up after {attempts} attempt(s) in {deadline_s:g} s "
                f"(the deadline); last: {reason}"
                + (
                    f"; {part.stat().st_size} bytes kept in {str(part)!r} to resume"
                    if part.stat().st_size
                    else ""
                )
            )
        if part.stat().st_size > before:
            wait = BACKOFF_S  # it moved: the link works, only this connection broke
        if progress:
            from tqdm import tqdm

            tqdm.write(
                f"sam2serve: {label}: {reason}; attempt {attempts + 1} in {min(wait, left):.2g} s",
                file=sys.stderr,
            )
        time.sleep(min(wait, left))
        wait = min(wait * 2, BACKOFF_MAX_S)


def _attempt(
    url: str,
    part: Path,
    out: BinaryIO,
    end: float,
    read_timeout_s: float,
    progress: bool,
    label: str,
    sizes: set[int],
    token: str | None = None,
) -> None:
    """One request: append the missing bytes to ``part`` (or rewrite it whole). ``sizes``:
    the sizes declared before; a resumed answer of another size starts the file again."""
    have = part.stat().st_size
    request = urllib.request.Request(url, headers={"User-Agent": "sam2serve"})
    if have:
        request.add_header("Range", f"bytes={have}-")
    timeout = max(0.1, min(read_timeout_s, end - time.monotonic()))
    open_url = urllib.request.urlopen
    if token:
        # unredirected: urllib does not copy it to a redirect; _SameOriginAuth re-adds it
        # when the redirect stays on this origin
        request.add_unredirected_header("Authorization", f"Bearer {token}")
        open_url = urllib.request.build_opener(_SameOriginAuth(url, token)).open
    try:
        response = open_url(request, timeout=timeout)
    except urllib.error.HTTPError as exc:
        exc.close()
        if exc.code == 416 and have:  # nothing after `have`: complete, or a stale part
            total = _total_of(exc.headers.get("Content-Range"))
            if total == have:
                return
            _truncate(out)
            raise _Retry(f"HTTP 416 for a part of {have} bytes: started again") from None
        if exc.code in RETRY_STATUSES:
            raise _Retry(f"HTTP {exc.code} {exc.reason}") from None
        raise DownloadError(f"{url}: HTTP {exc.code} {exc.reason}") from None
    except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
        raise _Retry(_reason(exc), unreached=True) from None
    with response:
        if response.status == 206:
            start, total = _content_range(response.headers.get("Content-Range"), url)
            if start != have:
                _truncate(out)
                raise _Retry(f"the server resumed at byte {start}, not {have}: started again")
            if total is not None and sizes and total not in sizes:
                sizes.add(total)
                _truncate(out)
                raise _Retry(f"the file's size changed on the server (now {total} bytes)")
        else:  # 200: the whole file (the server ignored the range, or there was no part)
            _truncate(out)
            have = 0
            length = response.headers.get("Content-Length")
            total = int(length) if length and length.isdigit() else None
        if total is not None:
            sizes.add(total)
        _receive(response, out, have, total, end, progress, label)
    got = part.stat().st_size
    if total is not None and got < total:
        raise _Retry(f"the connection ended after {got} of {total} bytes")
    if total is not None and got > total:
        _truncate(out)
        raise DownloadError(f"{url}: got more bytes than the {total} the server declared")


def _origin(url: str) -> tuple[str, str | None, int | None]:
    parts = urllib.parse.urlsplit(url)
    default = {"http": 80, "https": 443}.get(parts.scheme)
    return parts.scheme, parts.hostname, parts.port or default


class _SameOriginAuth(urllib.request.HTTPRedirectHandler):
    """Redirects keep the bearer token only while they stay on the first URL's origin."""

    def __init__(self, url: str, token: str) -> None:
        self.origin, self.token = _origin(url), token

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        new = super().redirect_request(req, fp, code, msg, headers, newurl)
        if new is not None and _origin(newurl) == self.origin:
            new.add_unredirected_header("Authorization", f"Bearer {self.token}")
        return new


def _receive(
    response: IO[bytes],
    out: BinaryIO,
    have: int,
    total: int | None,
    end: float,
    progress: bool,
    label: str,
) -> None:
    from tqdm import tqdm

    with tqdm(
        total=total,
        initial=have,
        unit="B",
        unit_scale=True,
        unit_divisor=1024,
        desc=f"download {label}",
        disable=not progress,
        file=sys.stderr,
        mininterval=0.5,
    ) as bar:
        received = have
        while True:
            if time.monotonic() > end:
                out.flush()
                raise _Retry("the deadline passed while receiving")
            try:
                chunk = response.read(CHUNK)
            except (OSError, http.client.HTTPException) as exc:
                out.flush()
                raise _Retry(_reason(exc)) from None
            if not chunk:
                break
            out.write(chunk)
            bar.update(len(chunk))
            received += len(chunk)
            if total is not None and received > total:
                break  # more than declared: reported by the caller
    out.flush()
    os.fsync(out.fileno())


def _truncate(out: BinaryIO) -> None:
    out.flush()
    out.truncate(0)  # the file is opened for appending: writes go to the new end


def _content_range(header: str | None, url: str) -> tuple[int, int | None]:
    match = _CONTENT_RANGE.fullmatch((header or "").strip())
    if match is None:
        raise DownloadError(f"{url}: a partial answer without a valid Content-Range ({header!r})")
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
    text = str(exc) or type(exc).__name__
    return " ".join(text.split())
