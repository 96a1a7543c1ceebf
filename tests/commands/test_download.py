"""``sam2serve download`` against a loopback server of fake checkpoints: the whole file,
resumed after a cut connection, retried until the deadline, wrong sizes and wrong files
never left in the cache, Hugging Face ids, and the one-line errors. Never the network:
every request the downloader makes is checked to go to 127.0.0.1."""

from __future__ import annotations

import contextlib
import io
import urllib.parse
import urllib.request

import pytest
from checkpoint_server import Behaviour, CheckpointServer, fake_checkpoint

from sam2serve import cli
from sam2serve import download as downloader
from sam2serve.cache import CACHE_ENV
from sam2serve.checkpoint import OFFLINE_ENV, URL_BASE_ENV
from sam2serve.cli import build_parser
from sam2serve.commands.common import EXIT_FAILED, EXIT_OK, EXIT_USAGE
from sam2serve.download import DownloadError, fetch

TINY = "sam2.1_hiera_tiny.pt"


@pytest.fixture(scope="module")
def tiny_bytes() -> bytes:
    return fake_checkpoint("tiny", seed=1)


@pytest.fixture(scope="module")
def server():
    with CheckpointServer() as running:
        yield running


@pytest.fixture(autouse=True)
def loopback_only(monkeypatch, tmp_path, server):
    """A cache of the test's own, no waits between attempts, the server as the mirror,
    and every request of the downloader checked to stay on this machine."""
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.delenv(OFFLINE_ENV, raising=False)
    monkeypatch.setenv(URL_BASE_ENV, server.url_base)
    monkeypatch.setattr(downloader, "BACKOFF_S", 0.01)
    real_open = downloader._open
    hosts: list[str] = []

    def checked_open(call, request, *args, **kwargs):
        url = request.full_url
        host = urllib.parse.urlsplit(url).hostname
        hosts.append(host)
        assert host == "127.0.0.1", f"a test tried the network: {url}"
        return real_open(call, request, *args, **kwargs)

    monkeypatch.setattr(downloader, "_open", checked_open)
    server.files.clear()
    yield hosts
    assert set(hosts) <= {"127.0.0.1"}


def run_main(*argv: str) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = cli.main(list(argv))
    stderr = err.getvalue()
    assert "Traceback" not in stderr
    return code, stderr


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("sam2serve: error: ")]


def cache_files(tmp_path) -> list[str]:
    folder = tmp_path / "cache" / "checkpoints"
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


def test_download_fetches_checks_and_places_the_file(server, tiny_bytes, tmp_path):
    server.files[TINY] = Behaviour(tiny_bytes)
    code, stderr = run_main("download")
    assert code == EXIT_OK, stderr
    assert (tmp_path / "cache" / "checkpoints" / TINY).read_bytes() == tiny_bytes
    assert cache_files(tmp_path) == [TINY, f"{TINY}.sha256"]  # no .part left
    assert f"{server.url_base}/{TINY}" in stderr and "sha256" in stderr
    # Present and valid: reported and skipped, no request.
    code, stderr = run_main("download", "--model", "tiny")
    assert code == EXIT_OK and "skipped" in stderr
    assert len(server.files[TINY].requests) == 1
    # --force: fetched again.
    code, _ = run_main("download", "--force")
    assert code == EXIT_OK and len(server.files[TINY].requests) == 2


def test_a_cut_connection_is_resumed_with_a_range_request(server, tiny_bytes, tmp_path):
    cut = len(tiny_bytes) // 3
    server.files[TINY] = Behaviour(tiny_bytes, cut_first=1, cut_at=cut)
    code, stderr = run_main("download", "--model", "facebook/sam2.1-hiera-tiny")
    assert code == EXIT_OK, stderr
    assert (tmp_path / "cache" / "checkpoints" / TINY).read_bytes() == tiny_bytes
    assert [r["range"] for r in server.files[TINY].requests] == [None, f"bytes={cut}-"]


def test_a_part_left_by_an_earlier_run_is_continued(server, tiny_bytes, tmp_path):
    folder = tmp_path / "cache" / "checkpoints"
    folder.mkdir(parents=True)
    (folder / f"{TINY}.part").write_bytes(tiny_bytes[:1000])
    server.files[TINY] = Behaviour(tiny_bytes)
    assert run_main("download")[0] == EXIT_OK
    assert server.files[TINY].requests == [{"range": "bytes=1000-"}]
    assert (folder / TINY).read_bytes() == tiny_bytes
    assert cache_files(tmp_path) == [TINY, f"{TINY}.sha256"]


def test_a_server_that_ignores_range_sends_the_whole_file_again(server, tiny_bytes, tmp_path):
    folder = tmp_path / "cache" / "checkpoints"
    folder.mkdir(parents=True)
    (folder / f"{TINY}.part").write_bytes(b"x" * 1000)  # not even the file's bytes
    server.files[TINY] = Behaviour(tiny_bytes, ignore_range=True)
    assert run_main("download")[0] == EXIT_OK
    assert (folder / TINY).read_bytes() == tiny_bytes


def test_a_part_longer_than_the_file_is_started_again(server, tiny_bytes, tmp_path):
    """The server's 416 names the real size: the stale part is dropped, not kept."""
    folder = tmp_path / "cache" / "checkpoints"
    folder.mkdir(parents=True)
    (folder / f"{TINY}.part").write_bytes(b"x" * (len(tiny_bytes) + 10))
    server.files[TINY] = Behaviour(tiny_bytes)
    assert run_main("download")[0] == EXIT_OK
    assert [r["range"] for r in server.files[TINY].requests] == [
        f"bytes={len(tiny_bytes) + 10}-",
        None,
    ]
    assert (folder / TINY).read_bytes() == tiny_bytes


def test_a_file_that_changed_size_on_the_server_is_started_again(server, tiny_bytes, tmp_path):
    """Resumed bytes of another file would make a file of two halves: the size the server
    declares changed, so the download starts again from byte 0."""
    cut = len(tiny_bytes) // 2
    server.files[TINY] = Behaviour(
        tiny_bytes + b"old", cut_first=1, cut_at=cut, later_body=tiny_bytes, later_after=1
    )
    assert run_main("download")[0] == EXIT_OK
    assert [r["range"] for r in server.files[TINY].requests] == [None, f"bytes={cut}-", None]
    assert (tmp_path / "cache" / "checkpoints" / TINY).read_bytes() == tiny_bytes


def test_errors_are_retried_then_the_deadline_gives_up(server, tiny_bytes, tmp_path):
    server.files[TINY] = Behaviour(tiny_bytes, fail_first=3)
    code, stderr = run_main("download")
    assert code == EXIT_OK, stderr
    assert len(server.files[TINY].requests) == 4  # three 503s, then the file
    server.files[TINY] = Behaviour(tiny_bytes, fail_first=10**9)
    code, stderr = run_main("download", "--force", "--timeout", "0.5")
    assert code == EXIT_FAILED
    [line] = error_lines(stderr)
    assert f"{server.url_base}/{TINY}: gave up after" in line and "HTTP 503" in line
    assert len(server.files[TINY].requests) > 1
    assert cache_files(tmp_path) == [TINY, f"{TINY}.sha256"]  # the valid file stays; no part


def test_a_missing_file_is_not_retried(server, tmp_path):
    code, stderr = run_main("download", "--model", "small")
    assert code == EXIT_FAILED
    [line] = error_lines(stderr)
    assert "sam2.1_hiera_small.pt: HTTP 404" in line
    assert cache_files(tmp_path) == []


def test_a_file_that_is_not_a_checkpoint_is_never_kept(server, tiny_bytes, tmp_path):
    server.files[TINY] = Behaviour(b"<html>a login page</html>" * 100)
    code, stderr = run_main("download")
    assert code == EXIT_FAILED
    [line] = error_lines(stderr)
    assert f"the file downloaded from {server.url_base}/{TINY} is not the tiny" in line
    assert "nothing was kept" in line and "weights_only" not in line
    assert cache_files(tmp_path) == []


def test_another_models_file_fails_the_load_check(server, tiny_bytes, tmp_path):
    server.files["sam2.1_hiera_small.pt"] = Behaviour(tiny_bytes)  # tiny's keys and shapes
    code, stderr = run_main("download", "--model", "small")
    assert code == EXIT_FAILED
    [line] = error_lines(stderr)
    assert "does not fit model 'small'" in line and "nothing was kept" in line
    assert len(line) < 2000  # hundreds of keys are summarised
    assert cache_files(tmp_path) == []


def test_a_body_always_cut_short_gives_up_at_the_deadline_keeping_the_part(
    server, tiny_bytes, tmp_path
):
    """A server that always cuts the body short: resumed until the deadline, then an
    error, and what arrived is kept for the next run to resume."""
    server.files[TINY] = Behaviour(tiny_bytes, cut_first=10**9, cut_at=1000)
    code, stderr = run_main("download", "--timeout", "1")
    assert code == EXIT_FAILED
    [line] = error_lines(stderr)
    assert "gave up after" in line and "to resume" in line
    kept = (tmp_path / "cache" / "checkpoints" / f"{TINY}.part").read_bytes()
    assert len(kept) >= 2000 and tiny_bytes.startswith(kept)  # resumed at least once
    assert cache_files(tmp_path) == [f"{TINY}.part"]


def test_fetch_checks_an_expected_size(server, tiny_bytes, tmp_path):
    server.files[TINY] = Behaviour(tiny_bytes)
    dest = tmp_path / "out" / TINY
    with pytest.raises(DownloadError, match=rf"declares {len(tiny_bytes)} bytes, more than the 5"):
        fetch(f"{server.url_base}/{TINY}", dest, deadline_s=30, expected_size=5, progress=False)
    assert not dest.exists() and not (tmp_path / "out" / f"{TINY}.part").exists()


def test_sam20_ids_fetch_sam20_files(server, tmp_path):
    name = "sam2_hiera_tiny.pt"
    server.files[name] = Behaviour(fake_checkpoint("tiny", seed=2, sam21=False))
    code, stderr = run_main("download", "--model", "facebook/sam2-hiera-tiny")
    assert code == EXIT_OK, stderr
    assert cache_files(tmp_path) == [name, f"{name}.sha256"]


def test_all_fetches_every_size_and_reports_each_failure(server, tiny_bytes, tmp_path):
    server.files[TINY] = Behaviour(tiny_bytes)
    code, stderr = run_main("download", "--model", "all")
    assert code == EXIT_FAILED  # the other three are not on this server
    assert len(error_lines(stderr)) == 3
    assert cache_files(tmp_path) == [TINY, f"{TINY}.sha256"]


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["--model", "huge"], "invalid choice: 'huge' (choose from tiny, small, base_plus, large, all, sam3, facebook/sam2.1-hiera-tiny"),
        (["--model", "facebook/sam3-hiera-tiny"], "invalid choice"),
        (["--timeout", "0"], "expected a number of seconds > 0, got '0'"),
        (["--timeout", "nan"], "expected a number of seconds > 0"),
        (["--url-base", "ftp://127.0.0.1/x"], "expected an http:// or https:// URL"),
    ],
)  # fmt: skip
def test_usage_errors(argv, fragment):
    code, stderr = run_main("download", *argv)
    assert code == EXIT_USAGE
    [line] = error_lines(stderr)
    assert fragment in line


def test_a_bad_mirror_variable_is_a_usage_error(monkeypatch):
    monkeypatch.setenv(URL_BASE_ENV, "mirror.example/sam2")
    code, stderr = run_main("download")
    assert code == EXIT_USAGE and f"${URL_BASE_ENV}" in error_lines(stderr)[0]


# --------------------------------------------------------------------------- --model ids


@pytest.mark.parametrize(
    "argv",
    [
        ["run", "--task", "amg", "x.jpg", "--out", "o"],
        ["track", "clip.mp4", "--out", "o"],
        ["embed", "x.jpg", "--store", "s"],
        ["bench", "--random-weights"],
        ["export", "--out", "o"],
        ["serve"],
        ["labelstudio"],
    ],
)
@pytest.mark.parametrize(
    ("name", "size"),
    [
        ("facebook/sam2.1-hiera-tiny", "tiny"),
        ("facebook/sam2.1-hiera-small", "small"),
        ("facebook/sam2.1-hiera-base-plus", "base_plus"),
        ("facebook/sam2.1-hiera-large", "large"),
        ("large", "large"),
    ],
)
def test_every_model_flag_takes_the_hugging_face_ids(argv, name, size):
    args = build_parser().parse_args([*argv, "--model", name])
    assert args.model == size


def test_an_unknown_or_sam20_model_is_one_line_naming_the_accepted_ones():
    code, stderr = run_main("export", "--out", "o", "--model", "facebook/sam2.1-hiera-huge")
    assert code == EXIT_USAGE
    [line] = error_lines(stderr)
    assert "invalid choice: 'facebook/sam2.1-hiera-huge'" in line
    assert "tiny, small, base_plus, large, facebook/sam2.1-hiera-tiny" in line
    code, stderr = run_main("export", "--out", "o", "--model", "facebook/sam2-hiera-large")
    assert code == EXIT_USAGE
    [line] = error_lines(stderr)
    assert "SAM 2.0" in line and "sam2serve download --model facebook/sam2-hiera-large" in line


def test_cluster_configs_take_the_hugging_face_ids():
    from sam2serve.cluster.args import ConfigError, ReplicaArgs

    args = ReplicaArgs.from_dict(
        {"model": "facebook/sam2.1-hiera-base-plus", "mode": "fast", "checkpoint": "x.pt"}
    )
    assert args.model == "base_plus"
    with pytest.raises(ConfigError, match=r"args\.model: 'facebook/sam2-hiera-tiny' is not a"):
        ReplicaArgs.from_dict({"model": "facebook/sam2-hiera-tiny", "mode": "fast"})


# --------------------------------------------------------------------------- one writer


def test_a_second_writer_waits_and_takes_the_first_ones_file(server, tiny_bytes, tmp_path):
    """Replicas starting together: while another process holds the part, fetch waits;
    when that one has renamed its file into place, fetch returns it without a request."""
    import fcntl
    import threading

    server.files[TINY] = Behaviour(tiny_bytes)
    dest = tmp_path / "out" / TINY
    dest.parent.mkdir()
    part = dest.with_name(f"{TINY}.part")
    holder = part.open("ab")
    fcntl.flock(holder.fileno(), fcntl.LOCK_EX)
    result: list[object] = []
    url = f"{server.url_base}/{TINY}"
    thread = threading.Thread(
        target=lambda: result.append(fetch(url, dest, deadline_s=60, progress=False))
    )
    thread.start()
    holder.write(tiny_bytes)
    holder.flush()
    part.replace(dest)  # the other process's rename, under its lock
    holder.close()  # releases the lock
    thread.join(60)
    assert [fetched.path for fetched in result] == [dest] and dest.read_bytes() == tiny_bytes
    assert server.files[TINY].requests == [] and not part.exists()


def test_a_writer_that_never_finishes_is_reported(server, tmp_path):
    import fcntl

    dest = tmp_path / "out" / TINY
    dest.parent.mkdir()
    part = dest.with_name(f"{TINY}.part")
    with part.open("ab") as holder:
        fcntl.flock(holder.fileno(), fcntl.LOCK_EX)
        with pytest.raises(DownloadError, match="another process is still downloading into"):
            fetch(f"{server.url_base}/{TINY}", dest, deadline_s=0.3, progress=False)


def test_ctrl_c_exits_130_and_the_next_run_resumes(server, tiny_bytes, tmp_path, monkeypatch):
    server.files[TINY] = Behaviour(tiny_bytes)
    monkeypatch.setattr(downloader, "CHUNK", 4096)
    checked_open = downloader._open  # the loopback check above

    def interrupted_after_one_chunk(*args, **kwargs):
        response = checked_open(*args, **kwargs)
        read, calls = response.read1, []

        def read_once(amount=None):
            calls.append(amount)
            if len(calls) > 1:
                raise KeyboardInterrupt
            return read(amount)

        response.read1 = read_once
        return response

    monkeypatch.setattr(downloader, "_open", interrupted_after_one_chunk)
    code, stderr = run_main("download")
    assert code == 130 and "interrupted" in stderr
    part = tmp_path / "cache" / "checkpoints" / f"{TINY}.part"
    assert part.read_bytes() == tiny_bytes[:4096]
    monkeypatch.setattr(downloader, "_open", checked_open)
    assert run_main("download")[0] == EXIT_OK
    assert server.files[TINY].requests[-1] == {"range": "bytes=4096-"}
    assert cache_files(tmp_path) == [TINY, f"{TINY}.sha256"]


def test_the_command_and_the_library_read_the_same_mirror_variable():
    from sam2serve import checkpoint
    from sam2serve.commands import download

    assert download.URL_BASE_ENV == checkpoint.URL_BASE_ENV
