"""Checkpoint resolution and loading: exact keys, clear errors, seeded random weights."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from sam2serve import checkpoint as ckpt
from sam2serve.checkpoint import CheckpointError, load_model, random_state_dict
from sam2serve.config import get_config


def test_official_shaped_file_loads_and_video_keys_are_skipped(tiny_checkpoint):
    saved = torch.load(tiny_checkpoint, weights_only=True)["model"]
    video = [k for k in saved if ckpt.is_video_key(k)]
    assert video, "the fixture must carry Meta's video keys"
    model = load_model("tiny", checkpoint=tiny_checkpoint)
    ours = model.state_dict()
    assert set(ours) == set(saved) - set(video)
    for key, value in ours.items():
        assert torch.equal(value, saved[key]), key
    assert model.weights_info.path == str(tiny_checkpoint)
    assert not model.weights_info.is_random


def _save_modified(tmp_path, source, edit) -> str:
    state = dict(torch.load(source, weights_only=True)["model"])
    edit(state)
    path = tmp_path / "edited.pt"
    torch.save({"model": state}, path)
    return str(path)


def test_missing_key_is_named(tmp_path, tiny_checkpoint):
    path = _save_modified(
        tmp_path, tiny_checkpoint, lambda s: s.pop("sam_mask_decoder.iou_token.weight")
    )
    with pytest.raises(CheckpointError, match=r"missing keys: sam_mask_decoder\.iou_token\.weight"):
        load_model("tiny", checkpoint=path)


def test_unexpected_key_is_named(tmp_path, tiny_checkpoint):
    path = _save_modified(
        tmp_path, tiny_checkpoint, lambda s: s.update({"extra.head": torch.zeros(1)})
    )
    with pytest.raises(CheckpointError, match=r"unexpected keys: extra\.head"):
        load_model("tiny", checkpoint=path)


def test_wrong_size_is_reported(tiny_checkpoint):
    with pytest.raises(CheckpointError, match="does not fit model 'small'"):
        load_model("small", checkpoint=tiny_checkpoint)


def test_not_a_checkpoint(tmp_path):
    path = tmp_path / "garbage.pt"
    path.write_bytes(b"not a pickle")
    with pytest.raises(CheckpointError, match="cannot read checkpoint"):
        load_model("tiny", checkpoint=path)
    torch.save({"state": {}}, path)
    with pytest.raises(CheckpointError, match="expected a dict with a 'model'"):
        load_model("tiny", checkpoint=path)


def test_explicit_missing_path_is_an_error(tmp_path):
    with pytest.raises(CheckpointError, match="checkpoint file not found: '.*nope.pt'"):
        load_model("tiny", checkpoint=tmp_path / "nope.pt")


def test_cache_dir_resolution_prefers_sam21(tmp_path, monkeypatch):
    """$SAM2SERVE_CACHE is the cache root: checkpoints live in its checkpoints/ folder."""
    monkeypatch.setenv(ckpt.CACHE_ENV, str(tmp_path))
    cfg = get_config("tiny")
    folder = tmp_path / "checkpoints"
    folder.mkdir()
    (folder / "sam2_hiera_tiny.pt").write_bytes(b"x")
    assert ckpt.resolve_checkpoint(cfg, None) == folder / "sam2_hiera_tiny.pt"
    (folder / "sam2.1_hiera_tiny.pt").write_bytes(b"x")
    assert ckpt.resolve_checkpoint(cfg, None) == folder / "sam2.1_hiera_tiny.pt"


def test_one_cache_root_for_checkpoints_artifacts_and_the_cluster(tmp_path, monkeypatch):
    """Every surface reads the root when it needs it, not at import time."""
    from sam2serve.cache import cache_path, cache_root

    monkeypatch.setenv(ckpt.CACHE_ENV, str(tmp_path))
    assert cache_root() == tmp_path
    assert ckpt.cache_dir() == cache_path("checkpoints") == tmp_path / "checkpoints"
    monkeypatch.delenv(ckpt.CACHE_ENV)
    assert cache_root() == Path("~/.cache/sam2serve").expanduser()


def test_offline_message_says_where_to_put_the_file(tmp_path, monkeypatch):
    monkeypatch.setenv(ckpt.CACHE_ENV, str(tmp_path))
    monkeypatch.setenv(ckpt.OFFLINE_ENV, "1")
    monkeypatch.delenv(ckpt.URL_BASE_ENV, raising=False)
    with pytest.raises(CheckpointError) as err:
        load_model("large")
    message = str(err.value)
    assert "\n" not in message
    assert "sam2.1_hiera_large.pt" in message and str(tmp_path / "checkpoints") in message
    assert (
        "https://dl.fbaipublicfiles.com/segment_anything_2/092824/sam2.1_hiera_large.pt" in message
    )
    assert "'sam2serve download --model large'" in message
    assert "--random-weights" in message and "SAM2SERVE_OFFLINE=1" in message


def test_failed_download_is_a_clear_error(tmp_path, monkeypatch):
    """Nothing answers: one attempt (a download nobody asked for does not retry an
    unreachable host for an hour), the URL and the command to fetch it, no file left."""
    monkeypatch.setenv(ckpt.CACHE_ENV, str(tmp_path))
    monkeypatch.delenv(ckpt.OFFLINE_ENV, raising=False)
    monkeypatch.setenv(ckpt.URL_BASE_ENV, "http://127.0.0.1:9/mirror")  # closed port
    with pytest.raises(CheckpointError) as err:
        load_model("tiny")
    message = str(err.value)
    assert "the download failed (http://127.0.0.1:9/mirror/sam2.1_hiera_tiny.pt: " in message
    assert "'sam2serve download --model tiny'" in message and "\n" not in message
    assert not list(tmp_path.rglob("*.pt*")), "no partial file may be left behind"


def test_a_mirror_that_is_not_a_url_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv(ckpt.CACHE_ENV, str(tmp_path))
    monkeypatch.delenv(ckpt.OFFLINE_ENV, raising=False)
    monkeypatch.setenv(ckpt.URL_BASE_ENV, "mirror.example/sam2")
    with pytest.raises(CheckpointError, match="mirror.example/sam2/sam2.1_hiera_tiny.pt: not an"):
        load_model("tiny")


def test_a_cache_that_cannot_be_written_is_a_clear_error(tmp_path, monkeypatch):
    root = tmp_path / "a-file"
    root.write_text("not a folder")
    monkeypatch.setenv(ckpt.CACHE_ENV, str(root))
    monkeypatch.delenv(ckpt.OFFLINE_ENV, raising=False)
    monkeypatch.setenv(ckpt.URL_BASE_ENV, "http://127.0.0.1:9/mirror")
    with pytest.raises(CheckpointError, match=r"the download failed \(\[Errno 20\] Not a direct"):
        load_model("tiny")


def test_first_use_downloads_checks_and_loads(tmp_path, monkeypatch):
    """The first use fetches the file through the downloader (here from a loopback
    server), renames it into the cache and loads exactly its tensors."""
    from checkpoint_server import Behaviour, CheckpointServer, fake_checkpoint

    monkeypatch.setenv(ckpt.CACHE_ENV, str(tmp_path))
    monkeypatch.delenv(ckpt.OFFLINE_ENV, raising=False)
    body = fake_checkpoint("tiny", seed=3)
    with CheckpointServer() as server:
        assert server.url_base.startswith("http://127.0.0.1:")
        monkeypatch.setenv(ckpt.URL_BASE_ENV, server.url_base)
        server.files["sam2.1_hiera_tiny.pt"] = Behaviour(body, cut_first=1, cut_at=4096)
        model = load_model("tiny")
        assert len(server.files["sam2.1_hiera_tiny.pt"].requests) == 2  # cut, then resumed
        # A file that is not a checkpoint: refused, nothing kept.
        server.files["sam2.1_hiera_small.pt"] = Behaviour(b"\x00" * 4096)
        with pytest.raises(CheckpointError, match="is not the small model's checkpoint"):
            load_model("small")
    path = tmp_path / "checkpoints" / "sam2.1_hiera_tiny.pt"
    assert model.weights_info.path == str(path) and path.read_bytes() == body
    saved = torch.load(path, weights_only=True)["model"]
    for key, value in model.state_dict().items():
        assert torch.equal(value, saved[key]), key
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name, f"{path.name}.sha256"]


def test_the_cli_reports_a_missing_checkpoint_in_one_line(tmp_path, monkeypatch, capsys):
    from sam2serve import cli

    monkeypatch.setenv(ckpt.CACHE_ENV, str(tmp_path))
    monkeypatch.setenv(ckpt.OFFLINE_ENV, "1")
    monkeypatch.delenv(ckpt.URL_BASE_ENV, raising=False)
    code = cli.main(
        ["export", "--out", str(tmp_path / "out"), "--model", "facebook/sam2.1-hiera-small"]
    )
    stderr = capsys.readouterr().err
    assert code == 2 and "Traceback" not in stderr
    [line] = stderr.splitlines()
    assert line.startswith("sam2serve: error: no checkpoint for model 'small'")
    assert "/092824/sam2.1_hiera_small.pt with 'sam2serve download --model small'" in line


def test_the_model_lookup_takes_hugging_face_ids():
    assert get_config("facebook/sam2.1-hiera-base-plus").name == "base_plus"
    assert get_config("FACEBOOK/SAM2.1-HIERA-LARGE").name == "large"
    with pytest.raises(ValueError, match="names SAM 2.0 weights"):
        get_config("facebook/sam2-hiera-tiny")


def test_unknown_size():
    with pytest.raises(ValueError, match="unknown model 'huge'; expected one of tiny"):
        get_config("huge")


def test_random_weights_are_seeded_and_every_tensor_is_perturbed():
    cfg = get_config("tiny")
    a, b, c = random_state_dict(cfg, 1), random_state_dict(cfg, 1), random_state_dict(cfg, 2)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert any(not torch.equal(a[k], c[k]) for k in a)
    # No tensor is left at a constant (zeros / ones of the default init).
    assert all(v.numel() == 1 or v.std() > 0 for v in a.values())
    model = load_model("tiny", random_weights=True, seed=1)
    assert model.weights_info.is_random and "RANDOM WEIGHTS" in model.weights_info.describe()
