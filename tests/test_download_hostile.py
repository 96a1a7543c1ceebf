"""``sam2serve download`` against hostile and careless mirrors on loopback: a body or headers
dripped a byte at a time end at ``--timeout``; an endless body stops at the size cap; a
closed port, a malformed URL or a name that does not exist fail at once; the digest the
server publishes (Hugging Face's ``X-Linked-Etag``, an S3 single-part ``ETag``) and
``--sha256`` are checked, and a good file already there is never replaced by one that
fails (a bit-flipped mirror included)."""

from __future__ import annotations

import contextlib
import hashlib
import io
import socket
import threading
import urllib.parse
from pathlib import Path

import pytest
from checkpoint_server import Behaviour, CheckpointServer, fake_checkpoint

from sam2serve import checkpoint as ckpt
from sam2serve import cli
from sam2serve import download as downloader
from sam2serve.cache import CACHE_ENV
from sam2serve.commands.common import EXIT_FAILED, EXIT_OK, EXIT_USAGE
from sam2serve.download import DownloadError, fetch

TINY = "sam2.1_hiera_tiny.pt"
REAL_OPEN = downloader._open
# A hang detector, not a timing: a download cut off at --timeout ends well within this
# many times the timeout.
HANG_FACTOR = 10


@pytest.fixture(scope="module")
def tiny_bytes() -> bytes:
    return fake_checkpoint("tiny", seed=1)


@pytest.fixture(scope="module")
def other_bytes() -> bytes:
    """Another valid tiny checkpoint: passes the load check, is not the published file."""
    return fake_checkpoint("tiny", seed=2)


@pytest.fixture(scope="module")
def server():
    with CheckpointServer() as running:
        yield running


@pytest.fixture(autouse=True)
def loopback_only(monkeypatch, tmp_path, server):
    """A cache of the test's own, short waits between attempts, the server as the mirror,
    and every request of the downloader checked to stay on this machine."""
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.delenv(ckpt.OFFLINE_ENV, raising=False)
    monkeypatch.delenv(ckpt.SHA256_ENV, raising=False)
    monkeypatch.setenv(ckpt.URL_BASE_ENV, server.url_base)
    monkeypatch.setattr(downloader, "BACKOFF_S", 0.01)
    real_open = downloader._open

    def checked_open(call, request, *args, **kwargs):
        host = urllib.parse.urlsplit(request.full_url).hostname
        assert host == "127.0.0.1", f"a test tried the network: {request.full_url}"
        return real_open(call, request, *args, **kwargs)

    monkeypatch.setattr(downloader, "_open", checked_open)
    server.files.clear()


def run_main(*argv: str, limit_s: float = 60.0) -> tuple[int, str]:
    """``sam2serve ARGV`` in this process; fails (instead of hanging) if it has not ended
    after ``limit_s``."""
    err = io.StringIO()
    result: list[int] = []

    def main() -> None:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            result.append(cli.main(list(argv)))

    thread = threading.Thread(target=main, daemon=True)
    thread.start()
    thread.join(limit_s)
    assert result, f"sam2serve {' '.join(argv)} still running after {limit_s} s (a hang)"
    stderr = err.getvalue()
    assert "Traceback" not in stderr
    return result[0], stderr


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("sam2serve: error: ")]


def folder(tmp_path):
    return tmp_path / "cache" / "checkpoints"


def cache_files(tmp_path) -> list[str]:
    where = folder(tmp_path)
    return sorted(p.name for p in where.iterdir()) if where.exists() else []


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def md5(data: bytes) -> str:
    return hashlib.md5(data, usedforsecurity=False).hexdigest()


def place_good_file(server, tiny_bytes, tmp_path) -> None:
    """A first download of the good file (its digest recorded beside it)."""
    server.files[TINY] = Behaviour(tiny_bytes)
    code, stderr = run_main("download")
    assert code == EXIT_OK, stderr
    assert (folder(tmp_path) / f"{TINY}.sha256").read_text().split()[0] == sha256(tiny_bytes)


def assert_good_file_untouched(tmp_path, tiny_bytes) -> None:
    assert (folder(tmp_path) / TINY).read_bytes() == tiny_bytes
    assert (folder(tmp_path) / f"{TINY}.sha256").read_text().split()[0] == sha256(tiny_bytes)
    assert cache_files(tmp_path) == [TINY, f"{TINY}.sha256"]  # no part left


# --------------------------------------------------------------------------- the deadline


def test_a_dripped_body_ends_at_the_timeout_keeping_the_part(server, tiny_bytes, tmp_path):
    server.files[TINY] = Behaviour(tiny_bytes, drip_body=True, drip_s=0.5)
    code, stderr = run_main("download", "--timeout", "2", limit_s=2 * HANG_FACTOR)
    assert code == EXIT_FAILED
    [line] = error_lines(stderr)
    assert f"{server.url_base}/{TINY}: gave up after 1 attempt(s) in 2 s (the deadline)" in line
    assert "the deadline passed while receiving" in line and "to resume" in line
    kept = (folder(tmp_path) / f"{TINY}.part").read_bytes()
    assert kept and tiny_bytes.startswith(kept)  # what arrived, for the next run


def test_the_command_as_a_process_exits_at_the_timeout(server, tiny_bytes, tmp_path):
    """The real command line in its own process: nothing (no thread, no socket) keeps it
    alive past the deadline; one error line, no traceback."""
    import os
    import subprocess
    import sys

    server.files[TINY] = Behaviour(tiny_bytes, drip_body=True, drip_s=1.0)
    env = {**os.environ, CACHE_ENV: str(tmp_path / "cache"), ckpt.URL_BASE_ENV: server.url_base}
    root = str(Path(__file__).resolve().parents[1])  # this checkout's sam2serve
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
    done = subprocess.run(
        [sys.executable, "-m", "sam2serve", "download", "--timeout", "2"],
        check=False,
        env=env,
        capture_output=True,
        text=True,
        timeout=2 * HANG_FACTOR,
    )
    assert done.returncode == EXIT_FAILED and "Traceback" not in done.stderr
    [line] = error_lines(done.stderr)
    assert "gave up after 1 attempt(s) in 2 s (the deadline)" in line


def test_dripped_headers_end_at_the_timeout(server, tiny_bytes, tmp_path):
    server.files[TINY] = Behaviour(tiny_bytes, drip_headers=True, drip_s=0.5)
    code, stderr = run_main("download", "--timeout", "2", limit_s=2 * HANG_FACTOR)
    assert code == EXIT_FAILED
    [line] = error_lines(stderr)
    assert "gave up after 1 attempt(s) in 2 s (the deadline)" in line
    assert "the deadline passed before the server answered" in line
    assert cache_files(tmp_path) == []


def test_the_first_use_download_of_serve_has_the_same_deadline(server, tiny_bytes, monkeypatch):
    """``serve``'s first start fetches through the same code: a dripped body ends at its
    deadline too (set small here) with the one-line CheckpointError."""
    server.files[TINY] = Behaviour(tiny_bytes, drip_body=True, drip_s=0.5)
    monkeypatch.setattr(ckpt, "DOWNLOAD_DEADLINE_S", 1.5)
    result: list[BaseException] = []

    def load() -> None:
        try:
            ckpt.load_model("tiny")
        except ckpt.CheckpointError as exc:
            result.append(exc)

    thread = threading.Thread(target=load, daemon=True)
    thread.start()
    thread.join(1.5 * HANG_FACTOR)
    [error] = result
    assert "the download failed" in str(error) and "(the deadline)" in str(error)
    assert "\n" not in str(error)


# --------------------------------------------------------------------------- the size cap


def test_an_endless_body_stops_at_the_size_cap(server, tiny_bytes, tmp_path, monkeypatch):
    """No Content-Length and bytes without end: the download stops at the most a tiny
    checkpoint can have (made small here, as the real bound would take ~180 MB to reach),
    and no byte past it ever reaches the disk."""
    cap = len(tiny_bytes) + 4096
    monkeypatch.setattr(ckpt, "max_checkpoint_bytes", lambda size, sam21=True: cap)
    peak: list[int] = []
    real_truncate = downloader._truncate

    def truncate(out):  # the part's size when it is dropped: the most it ever held
        out.flush()
        peak.append(out.tell())
        real_truncate(out)

    monkeypatch.setattr(downloader, "_truncate", truncate)
    server.files[TINY] = Behaviour(tiny_bytes, endless=True)
    code, stderr = run_main("download", "--timeout", "30")
    assert code == EXIT_FAILED
    [line] = error_lines(stderr)
    assert f"the server sent more than the {cap} bytes such a file can have; stopped there" in line
    assert peak and max(peak) <= cap
    assert server.files[TINY].sent > cap  # it did send more than that
    assert cache_files(tmp_path) == []


def test_the_real_bound_of_a_checkpoint_holds_meta_files():
    """The bound is above the official files' sizes as Meta publishes them (fp32 tensors:
    the parameter count times four) and far below an endless body's 1.5 GB."""
    import torch

    from sam2serve.config import get_config
    from sam2serve.modeling.sam2_video import SAM2Video

    for size in ("tiny", "large"):
        with torch.device("meta"):
            tensors = sum(4 * v.numel() for v in SAM2Video(get_config(size)).state_dict().values())
        bound = ckpt.max_checkpoint_bytes(size)
        assert tensors < bound < 1.1 * tensors + (32 << 20)


def test_a_declared_size_above_the_bound_is_refused_before_the_body(
    server, tiny_bytes, tmp_path, monkeypatch
):
    monkeypatch.setattr(ckpt, "max_checkpoint_bytes", lambda size, sam21=True: 1000)
    server.files[TINY] = Behaviour(tiny_bytes)
    code, stderr = run_main("download")
    assert code == EXIT_FAILED
    [line] = error_lines(stderr)
    assert f"declares {len(tiny_bytes)} bytes, more than the 1000 such a file can have" in line
    assert server.files[TINY].sent == 0 and cache_files(tmp_path) == []


# --------------------------------------------------------------------------- fail fast


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_a_closed_port_fails_at_once(tmp_path):
    port = closed_port()
    code, stderr = run_main(
        "download", "--url-base", f"http://127.0.0.1:{port}/m", "--timeout", "600"
    )
    assert code == EXIT_FAILED
    [line] = error_lines(stderr)
    assert f"http://127.0.0.1:{port}/m/{TINY}: connection refused by 127.0.0.1:{port}" in line
    assert "not retried" in line
    assert "attempt 2" not in stderr  # no retry was announced
    assert cache_files(tmp_path) == []


def test_a_refusal_after_the_server_answered_is_retried(server, tiny_bytes, monkeypatch, tmp_path):
    """A server that answered, then refuses (it restarts): that is retried until the
    deadline, the part kept."""
    import urllib.error

    server.files[TINY] = Behaviour(tiny_bytes, cut_first=1, cut_at=1000)
    calls: list[int] = []

    def restarting(call, request, *args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            return REAL_OPEN(call, request, *args, **kwargs)
        raise urllib.error.URLError(ConnectionRefusedError(111, "Connection refused"))

    monkeypatch.setattr(downloader, "_open", restarting)
    dest = tmp_path / "out" / TINY
    with pytest.raises(DownloadError, match=r"gave up after \d+ attempt.*connection refused"):
        fetch(f"{server.url_base}/{TINY}", dest, deadline_s=0.5, progress=False)
    assert len(calls) > 2
    assert dest.with_name(f"{TINY}.part").read_bytes() == tiny_bytes[:1000]


def test_a_host_that_does_not_exist_fails_at_once(monkeypatch, tmp_path):
    """getaddrinfo says the name does not exist (answered here without a DNS query)."""
    calls: list[str] = []

    def no_such_name(host, *args, **kwargs):
        calls.append(host)
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(socket, "getaddrinfo", no_such_name)  # no query leaves the machine
    monkeypatch.setattr(downloader, "_open", REAL_OPEN)
    with pytest.raises(DownloadError, match=r"no such host 'mirror\.invalid'.*not retried"):
        fetch("http://mirror.invalid/x.pt", tmp_path / "out" / TINY, deadline_s=600, progress=False)
    assert calls == ["mirror.invalid"]


def test_a_temporary_dns_failure_is_retried(monkeypatch, tmp_path):
    calls: list[str] = []

    def try_again(host, *args, **kwargs):
        calls.append(host)
        raise socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")

    monkeypatch.setattr(socket, "getaddrinfo", try_again)  # no query leaves the machine
    monkeypatch.setattr(downloader, "_open", REAL_OPEN)
    with pytest.raises(DownloadError, match="gave up after .* Temporary failure"):
        fetch("http://mirror.invalid/x.pt", tmp_path / "out" / TINY, deadline_s=0.5, progress=False)
    assert len(calls) > 1


@pytest.mark.parametrize(
    ("url", "fragment"),
    [
        ("http://127.0.0.1:99999/x.pt", "malformed URL (Port out of range 0-65535)"),
        ("http://127.0.0.1:0/x.pt", "malformed URL (port 0)"),
        ("http://127.0.0.1:abc/x.pt", "malformed URL (Port could not be cast"),
        ("http://[::1/x.pt", "malformed URL (Invalid IPv6 URL)"),
        ("http:///x.pt", "malformed URL (no host)"),
        ("http://127.0.0.1/a b.pt", "malformed URL (a space or control character)"),
        ("ftp://127.0.0.1/x.pt", "not an http:// or https:// URL"),
    ],
)
def test_a_malformed_url_fails_at_once_in_one_line(url, fragment, tmp_path):
    with pytest.raises(DownloadError) as err:
        fetch(url, tmp_path / "out" / TINY, deadline_s=600, progress=False)
    assert fragment in str(err.value) and "\n" not in str(err.value)


def test_credentials_never_appear_in_a_message(tmp_path):
    with pytest.raises(DownloadError) as err:
        fetch(
            "http://user:s3cret@127.0.0.1:1/x.pt",
            tmp_path / "out" / TINY,
            deadline_s=600,
            progress=False,
        )
    message = str(err.value)
    assert "credentials in the URL" in message and "s3cret" not in message
    assert message.startswith("http://127.0.0.1:1/x.pt:")


def test_a_malformed_mirror_at_first_use_is_one_line(monkeypatch, tmp_path):
    """The first-use download reads the mirror from the environment at fetch time."""
    monkeypatch.setenv(ckpt.URL_BASE_ENV, "http://127.0.0.1:99999/m")
    with pytest.raises(ckpt.CheckpointError) as err:
        ckpt.load_model("tiny")
    assert "malformed URL (Port out of range" in str(err.value)
    assert "\n" not in str(err.value)


def test_a_missing_file_is_not_retried(server, tmp_path):
    code, stderr = run_main("download", "--timeout", "600")
    assert code == EXIT_FAILED
    [line] = error_lines(stderr)
    assert f"{TINY}: HTTP 404" in line
    assert "attempt 2" not in stderr  # no retry was announced


# --------------------------------------------------------------------------- digests


def test_a_hugging_face_digest_that_does_not_match_is_refused(
    server, tiny_bytes, other_bytes, tmp_path
):
    """As Hugging Face answers: a 302 carrying X-Linked-Etag (the file's sha256) to the
    CDN that sends the bytes. The bytes are another valid checkpoint: exit 2, both digests
    named, the good file and its record untouched."""
    place_good_file(server, tiny_bytes, tmp_path)
    server.files[TINY] = Behaviour(
        other_bytes, redirect_headers={"X-Linked-Etag": f'"{sha256(tiny_bytes)}"'}
    )
    code, stderr = run_main("download", "--force")
    assert code == EXIT_USAGE
    [line] = error_lines(stderr)
    assert f"sha256 of the download is {sha256(other_bytes)}" in line
    assert f"the server published (X-Linked-Etag) is {sha256(tiny_bytes)}" in line
    assert "was not touched" in line
    assert_good_file_untouched(tmp_path, tiny_bytes)


def test_a_hugging_face_digest_that_matches_is_recorded(server, tiny_bytes, tmp_path):
    server.files[TINY] = Behaviour(
        tiny_bytes,
        redirect_headers={
            "X-Linked-Etag": f'"{sha256(tiny_bytes)}"',
            "X-Linked-Size": str(len(tiny_bytes)),
        },
    )
    code, stderr = run_main("download")
    assert code == EXIT_OK, stderr
    assert f"sha256 {sha256(tiny_bytes)} (matches X-Linked-Etag)" in stderr
    assert_good_file_untouched(tmp_path, tiny_bytes)


def test_a_hugging_face_size_that_does_not_match_is_refused(server, tiny_bytes, tmp_path):
    server.files[TINY] = Behaviour(tiny_bytes, redirect_headers={"X-Linked-Size": "1000"})
    code, stderr = run_main("download")
    assert code == EXIT_FAILED
    [line] = error_lines(stderr)
    assert f"declares {len(tiny_bytes)} bytes, more than the 1000 it published" in line
    assert cache_files(tmp_path) == []


def test_an_s3_md5_etag_is_honoured(server, tiny_bytes, other_bytes, tmp_path):
    s3 = {"Server": "AmazonS3", "x-amz-request-id": "TEST"}
    server.files[TINY] = Behaviour(other_bytes, headers={**s3, "ETag": f'"{md5(tiny_bytes)}"'})
    code, stderr = run_main("download")
    assert code == EXIT_USAGE
    [line] = error_lines(stderr)
    assert f"md5 of the download is {md5(other_bytes)}" in line
    assert f"(ETag (MD5)) is {md5(tiny_bytes)}" in line and "nothing was kept" in line
    assert cache_files(tmp_path) == []
    server.files[TINY] = Behaviour(tiny_bytes, headers={**s3, "ETag": f'"{md5(tiny_bytes)}"'})
    code, stderr = run_main("download")
    assert code == EXIT_OK and "(matches ETag (MD5))" in stderr


@pytest.mark.parametrize(
    "headers",
    [
        {"Server": "AmazonS3", "ETag": '"0123456789abcdef0123456789abcdef-3"'},  # multipart
        {"Server": "AmazonS3", "ETag": 'W/"0123456789abcdef0123456789abcdef"'},  # weak
        {"Server": "nginx", "ETag": '"0123456789abcdef0123456789abcdef"'},  # not S3's
        {"ETag": '"' + "ab" * 32 + '"'},  # 64 hex, but not from Hugging Face
        {
            "Server": "AmazonS3",
            "x-amz-server-side-encryption": "aws:kms",  # KMS: S3's ETag is no MD5 then
            "ETag": '"0123456789abcdef0123456789abcdef"',
        },
    ],
    ids=["multipart", "weak", "not-s3", "not-hf", "s3-kms"],
)
def test_etags_that_are_no_digest_are_ignored(server, tiny_bytes, tmp_path, headers):
    server.files[TINY] = Behaviour(tiny_bytes, headers=headers)
    code, stderr = run_main("download")
    assert code == EXIT_OK, stderr
    assert "the server publishes no digest" in stderr
    assert_good_file_untouched(tmp_path, tiny_bytes)


def test_the_publishers_sha256_outranks_a_cdn_etag(server, tiny_bytes, tmp_path):
    """Hugging Face's sha256 on the redirect decides; the CDN's ETag beside it, here not
    the MD5 of the bytes, is not needed."""
    server.files[TINY] = Behaviour(
        tiny_bytes,
        redirect_headers={"X-Linked-Etag": f'"{sha256(tiny_bytes)}"', "X-Repo-Commit": "abc"},
        headers={"Server": "AmazonS3", "ETag": '"0123456789abcdef0123456789abcdef"'},
    )
    code, stderr = run_main("download")
    assert code == EXIT_OK, stderr
    assert "(matches X-Linked-Etag)" in stderr
    assert_good_file_untouched(tmp_path, tiny_bytes)


def test_a_hugging_face_etag_is_a_sha256(server, tiny_bytes, other_bytes, tmp_path):
    """A 64-hex ETag of the hub's own answer (it has X-Repo-Commit) is the sha256."""
    hub = {"X-Repo-Commit": "abc", "ETag": f'"{sha256(tiny_bytes)}"'}
    server.files[TINY] = Behaviour(other_bytes, headers=hub)
    code, stderr = run_main("download")
    assert code == EXIT_USAGE and "the server published (ETag) is" in stderr
    assert cache_files(tmp_path) == []


def test_a_pinned_sha256_refuses_another_file(server, tiny_bytes, other_bytes, tmp_path):
    server.files[TINY] = Behaviour(other_bytes)
    code, stderr = run_main("download", "--sha256", sha256(tiny_bytes).upper())
    assert code == EXIT_USAGE
    [line] = error_lines(stderr)
    assert f"sha256 of the download is {sha256(other_bytes)}" in line
    assert f"the pinned one (--sha256) is {sha256(tiny_bytes)}" in line
    assert cache_files(tmp_path) == []
    server.files[TINY] = Behaviour(tiny_bytes)
    code, stderr = run_main("download", "--sha256", sha256(tiny_bytes))
    assert code == EXIT_OK and "(matches --sha256)" in stderr
    assert_good_file_untouched(tmp_path, tiny_bytes)
    # there and matching: skipped without a request
    requests = len(server.files[TINY].requests)
    code, stderr = run_main("download", "--sha256", sha256(tiny_bytes))
    assert code == EXIT_OK and "skipped" in stderr
    assert len(server.files[TINY].requests) == requests


def test_a_file_there_that_is_not_the_pinned_one_is_replaced_only_by_it(
    server, tiny_bytes, other_bytes, tmp_path
):
    place_good_file(server, tiny_bytes, tmp_path)
    server.files[TINY] = Behaviour(tiny_bytes)  # the mirror still has the old file
    code, stderr = run_main("download", "--sha256", sha256(other_bytes))
    assert code == EXIT_USAGE and "not the pinned" in stderr
    assert_good_file_untouched(tmp_path, tiny_bytes)


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["--sha256", "abc"], "expected a sha256 (64 hex digits), got 'abc'"),
        (["--sha256", "g" * 64], "expected a sha256 (64 hex digits)"),
        (["--model", "all", "--sha256", "a" * 64], "--sha256 pins one file"),
    ],
)
def test_sha256_usage_errors(argv, fragment):
    code, stderr = run_main("download", *argv)
    assert code == EXIT_USAGE
    [line] = error_lines(stderr)
    assert fragment in line


# --------------------------------------------------------------------------- never worse


def flipped(data: bytes) -> bytes:
    """``data`` with one bit flipped in the middle (inside a tensor's bytes)."""
    middle = len(data) // 2
    return data[:middle] + bytes([data[middle] ^ 0x10]) + data[middle + 1 :]


def test_force_with_a_bit_flipped_mirror_keeps_the_good_file(server, tiny_bytes, tmp_path):
    """Same size, same keys and shapes: the load check alone passed it; the archive's
    CRC-32 does not."""
    place_good_file(server, tiny_bytes, tmp_path)
    server.files[TINY] = Behaviour(flipped(tiny_bytes))
    code, stderr = run_main("download", "--force")
    assert code == EXIT_FAILED
    [line] = error_lines(stderr)
    assert f"{server.url_base}/{TINY} is damaged" in line and "Bad CRC-32" in line
    assert "was not touched" in line
    assert_good_file_untouched(tmp_path, tiny_bytes)


def test_a_damaged_file_in_the_cache_is_fetched_again(server, tiny_bytes, tmp_path):
    place_good_file(server, tiny_bytes, tmp_path)
    (folder(tmp_path) / TINY).write_bytes(flipped(tiny_bytes))
    code, stderr = run_main("download")
    assert code == EXIT_OK and "is damaged" in stderr and "downloading it again" in stderr
    assert_good_file_untouched(tmp_path, tiny_bytes)


def test_a_cached_file_that_is_not_the_recorded_one_is_fetched_again(
    server, tiny_bytes, other_bytes, tmp_path
):
    place_good_file(server, tiny_bytes, tmp_path)
    (folder(tmp_path) / TINY).write_bytes(other_bytes)  # valid, but not what was fetched
    code, stderr = run_main("download")
    assert code == EXIT_OK
    assert f"not the {sha256(tiny_bytes)} recorded when it was downloaded" in stderr
    assert_good_file_untouched(tmp_path, tiny_bytes)


# --------------------------------------------------------------------------- first use


def test_the_first_use_pin_is_checked(server, tiny_bytes, other_bytes, tmp_path, monkeypatch):
    """$SAM2SERVE_CHECKPOINT_SHA256: the download must match it, and so must a cached
    file; a value that is no sha256 names the variable."""
    server.files[TINY] = Behaviour(other_bytes)
    monkeypatch.setenv(ckpt.SHA256_ENV, sha256(tiny_bytes))
    with pytest.raises(ckpt.CheckpointError) as err:
        ckpt.load_model("tiny")
    assert f"the pinned one ($SAM2SERVE_CHECKPOINT_SHA256) is {sha256(tiny_bytes)}" in str(
        err.value
    )
    assert cache_files(tmp_path) == []
    server.files[TINY] = Behaviour(tiny_bytes)
    assert ckpt.load_model("tiny").weights_info.path == str(folder(tmp_path) / TINY)
    monkeypatch.setenv(ckpt.SHA256_ENV, sha256(other_bytes))
    with pytest.raises(ckpt.CheckpointError, match=r"has sha256 .* but \$SAM2SERVE_CHECKPOINT"):
        ckpt.load_model("tiny")
    monkeypatch.setenv(ckpt.SHA256_ENV, "not-a-digest")
    with pytest.raises(ckpt.CheckpointError, match=r"\$SAM2SERVE_CHECKPOINT_SHA256: expected"):
        ckpt.load_model("tiny")
