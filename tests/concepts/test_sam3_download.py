"""``sam2serve download --model sam3``: the gated Hugging Face files over loopback — the
token goes to the configured origin only, 401/403 say how to get access, the checkpoint's
keys are checked strictly (reduced size) before it lands."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
if importlib.util.find_spec("sam3") is None:  # the fake file has the keys of Meta's model
    pytest.skip("Meta's sam3 is not installed", allow_module_level=True)
from meta_sam3 import build_meta_image_model, sam3_checkpoint, write_tokenizer_files

from sam2serve import cli
from sam2serve import download as downloader
from sam2serve.cache import CACHE_ENV
from sam2serve.concepts import weights
from sam2serve.concepts.model import Sam3Size
from sam2serve.concepts.runtime import load_weights

TOKEN = "hf_test_token_123"


class Server:
    """Loopback files under /files/NAME; /redirect/NAME answers 302 to ``redirect_to``;
    ``need_token``: 401 without the right bearer. Every request's Authorization is kept."""

    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}
        self.headers: dict[str, dict[str, str]] = {}  # extra headers of a file's answer
        self.need_token = False
        self.status: int | None = None
        self.redirect_to = ""
        self.seen: list[tuple[str, str | None]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                auth = self.headers.get("Authorization")
                outer.seen.append((self.path, auth))
                if outer.status is not None:
                    self.send_error(outer.status)
                    return
                if self.path.startswith("/redirect/"):
                    self.send_response(302)
                    self.send_header("Location", outer.redirect_to + self.path[len("/redirect") :])
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                if outer.need_token and auth != f"Bearer {TOKEN}":
                    self.send_error(401)
                    return
                body = outer.files.get(self.path.removeprefix("/files/"))
                if body is None:
                    self.send_error(404)
                    return
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                for key, value in outer.headers.get(self.path.removeprefix("/files/"), {}).items():
                    self.send_header(key, value)
                self.end_headers()
                self.wfile.write(body)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.origin = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, bytes]:
    tokens = write_tokenizer_files(tmp_path_factory.mktemp("tok"))
    bpe = tokens / "bpe_simple_vocab.txt.gz"
    meta = build_meta_image_model(Sam3Size.tiny().as_dict(), bpe, interactive=True)
    state = sam3_checkpoint(meta)  # the detector, the sam2 neck, the whole tracker
    buffer = io.BytesIO()
    torch.save({"model": state}, buffer)
    out = {name: (tokens / name).read_bytes() for name in weights.TOKENIZER_FILES}
    out[weights.CHECKPOINT] = buffer.getvalue()
    return out


@pytest.fixture
def servers(files, monkeypatch, tmp_path):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.setattr(weights, "EXPECTED_SIZE", Sam3Size.tiny())
    monkeypatch.setattr(downloader, "BACKOFF_S", 0.01)
    monkeypatch.delenv("HUGGING_FACE_HUB_TOKEN", raising=False)
    a, b = Server(), Server()
    a.files.update(files)
    b.files.update(files)
    yield a, b
    a.close()
    b.close()


def run_main(*argv: str) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = cli.main(list(argv))
    assert "Traceback" not in err.getvalue()
    return code, err.getvalue()


def test_token_reaches_the_origin_and_the_weights_load(servers, monkeypatch, tmp_path):
    a, _ = servers
    a.need_token = True
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    code, stderr = run_main("download", "--model", "sam3", "--url-base", f"{a.origin}/files")
    assert code == 0, stderr
    assert "SAM License" in stderr
    assert {auth for _, auth in a.seen} == {f"Bearer {TOKEN}"}
    folder = tmp_path / "cache" / "sam3"
    names = ["merges.txt", "sam3.pt", "vocab.json"]
    assert sorted(p.name for p in folder.iterdir()) == sorted(
        [*names, *(f"{n}.sha256" for n in names)]
    )
    model, tracker, tokenize = load_weights()
    assert tokenize("red cat")[0] == tokenize("dog")[0]  # the start token
    assert sum(p.numel() for p in model.parameters()) > 0
    assert sum(p.numel() for p in tracker.parameters()) > 0


def test_a_redirect_to_another_origin_gets_no_token(servers, monkeypatch):
    a, b = servers
    a.redirect_to = f"{b.origin}/files"
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    code, stderr = run_main("download", "--model", "sam3", "--url-base", f"{a.origin}/redirect")
    assert code == 0, stderr
    assert a.seen and all(auth == f"Bearer {TOKEN}" for _, auth in a.seen)
    assert b.seen and all(auth is None for _, auth in b.seen)


def test_a_redirect_on_the_same_origin_keeps_the_token(servers, monkeypatch):
    a, _ = servers
    a.redirect_to = f"{a.origin}/files"
    a.need_token = True
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    code, stderr = run_main("download", "--model", "sam3", "--url-base", f"{a.origin}/redirect")
    assert code == 0, stderr
    assert any(path.startswith("/files/") for path, _ in a.seen)


@pytest.mark.parametrize("status", [401, 403])
def test_gated_is_one_line_saying_what_to_do(servers, monkeypatch, status, tmp_path):
    a, _ = servers
    a.status = status
    monkeypatch.delenv("HF_TOKEN", raising=False)
    code, stderr = run_main("download", "--model", "sam3", "--url-base", f"{a.origin}/files")
    errors = [line for line in stderr.splitlines() if line.startswith("sam2serve: error: ")]
    assert code != 0 and len(errors) == 1
    assert f"HTTP {status}" in errors[0] and "huggingface.co/facebook/sam3" in errors[0]
    assert "HF_TOKEN" in errors[0] and "SAM License" in errors[0]


def test_a_checkpoint_with_wrong_keys_is_not_kept(servers, monkeypatch, tmp_path, files):
    a, _ = servers
    buffer = io.BytesIO()
    torch.save({"model": {"detector.something.else": torch.zeros(2)}}, buffer)
    a.files[weights.CHECKPOINT] = buffer.getvalue()
    code, stderr = run_main("download", "--model", "sam3", "--url-base", f"{a.origin}/files")
    assert code != 0 and "not a SAM 3 checkpoint" in stderr
    assert not (tmp_path / "cache" / "sam3" / "sam3.pt").exists()
    assert not (tmp_path / "cache" / "sam3" / "sam3.pt.part").exists()


def test_missing_weights_say_how_to_get_them(tmp_path, monkeypatch):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    with pytest.raises(weights.WeightsError, match="sam2serve download --model sam3"):
        weights.require()


def test_tokenizer_files_are_json_checked(servers, monkeypatch, tmp_path):
    a, _ = servers
    a.files["vocab.json"] = b"{not json"
    code, stderr = run_main("download", "--model", "sam3", "--url-base", f"{a.origin}/files")
    assert code != 0 and "vocab.json is not valid JSON" in stderr


def _sha256(data: bytes) -> str:
    import hashlib

    return hashlib.sha256(data).hexdigest()


def test_a_published_digest_that_does_not_match_keeps_the_good_weights(servers, files, tmp_path):
    """Hugging Face's X-Linked-Etag is sam3.pt's sha256: a mirror whose bytes do not match
    it is refused (exit 2, both digests named), and the weights already there stay."""
    a, _ = servers
    url = f"{a.origin}/files"
    a.headers[weights.CHECKPOINT] = {"X-Linked-Etag": f'"{_sha256(files[weights.CHECKPOINT])}"'}
    code, stderr = run_main("download", "--model", "sam3", "--url-base", url)
    assert code == 0, stderr
    good = tmp_path / "cache" / "sam3" / weights.CHECKPOINT
    assert good.read_bytes() == files[weights.CHECKPOINT]
    other = bytearray(files[weights.CHECKPOINT])
    other[len(other) // 2] ^= 1
    a.files[weights.CHECKPOINT] = bytes(other)
    code, stderr = run_main("download", "--model", "sam3", "--url-base", url, "--force")
    errors = [line for line in stderr.splitlines() if line.startswith("sam2serve: error: ")]
    assert code == 2 and len(errors) == 1
    assert f"sha256 of the download is {_sha256(bytes(other))}" in errors[0]
    assert f"(X-Linked-Etag) is {_sha256(files[weights.CHECKPOINT])}" in errors[0]
    assert good.read_bytes() == files[weights.CHECKPOINT]
    assert not good.with_name("sam3.pt.part").exists()


def test_a_bit_flipped_checkpoint_is_damaged_and_the_good_one_stays(servers, files, tmp_path):
    """No digest published: the archive's CRC-32 still sees a flipped bit."""
    a, _ = servers
    url = f"{a.origin}/files"
    assert run_main("download", "--model", "sam3", "--url-base", url)[0] == 0
    other = bytearray(files[weights.CHECKPOINT])
    other[len(other) // 2] ^= 1
    a.files[weights.CHECKPOINT] = bytes(other)
    code, stderr = run_main("download", "--model", "sam3", "--url-base", url, "--force")
    assert code == 1 and "is damaged" in stderr and "was not touched" in stderr
    good = tmp_path / "cache" / "sam3" / weights.CHECKPOINT
    assert good.read_bytes() == files[weights.CHECKPOINT]


def test_sha256_pins_the_checkpoint(servers, files, tmp_path):
    a, _ = servers
    url = f"{a.origin}/files"
    wrong = "0" * 64
    code, stderr = run_main("download", "--model", "sam3", "--url-base", url, "--sha256", wrong)
    assert code == 2 and f"the pinned one (--sha256) is {wrong}" in stderr
    assert not (tmp_path / "cache" / "sam3" / weights.CHECKPOINT).exists()
    right = _sha256(files[weights.CHECKPOINT])
    code, stderr = run_main("download", "--model", "sam3", "--url-base", url, "--sha256", right)
    assert code == 0, stderr
    recorded = (tmp_path / "cache" / "sam3" / "sam3.pt.sha256").read_text().split()[0]
    assert recorded == right
