"""``sam2serve embed``: usage errors before the model loads, batched encodes, resume
(stored images are not encoded again), broken images skipped with exit 1."""

from __future__ import annotations

from pathlib import Path

import pytest
from store_support import png_bytes

from sam2serve import cli
from sam2serve.commands.common import EXIT_FAILED, EXIT_OK, EXIT_USAGE
from sam2serve.engine.predictor import Predictor
from sam2serve.store.embedding_store import EmbeddingStore
from sam2serve.store.identity import StoreIdentity, image_id_of


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("sam2serve: error:")]


@pytest.fixture
def images(tmp_path) -> Path:
    folder = tmp_path / "photos"
    folder.mkdir()
    for seed in (1, 2):
        (folder / f"p{seed}.png").write_bytes(png_bytes(seed))
    return folder


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        ([], "--store"),  # required
        (["--store", "{tmp}/s", "--store-dtype", "int8"], "--store-dtype"),
        (["--store", "{tmp}/s", "--batch-size", "0"], "--batch-size"),
        (["--store", "{images}/p1.png"], "is a file"),
        (["--store", "nosuchproto://x"], "nosuchproto"),
        (["--store", "{tmp}/s", "--model", "huge"], "--model"),
    ],
)
def test_usage_errors_are_one_line_before_the_model_loads(
    extra, named, images, tmp_path, capsys, monkeypatch
):
    def no_model(*args, **kwargs):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr("sam2serve.commands.model.build", no_model)
    argv = ["embed", str(images), "--random-weights"]
    argv += [a.format(tmp=tmp_path, images=images) for a in extra]
    assert cli.main(argv) == EXIT_USAGE
    [line] = error_lines(capsys.readouterr().err)
    assert named in line


def test_a_missing_image_is_a_usage_error(tmp_path, capsys):
    code = cli.main(["embed", str(tmp_path / "nope.jpg"), "--store", str(tmp_path / "s")])
    assert code == EXIT_USAGE
    assert "nope.jpg" in error_lines(capsys.readouterr().err)[0]


class Counting:
    """Counts the images each encoder call gets."""

    def __init__(self) -> None:
        self.calls: list[int] = []

    def install(self, monkeypatch) -> None:
        original = Predictor.encode
        calls = self.calls

        def encode(predictor, images):
            calls.append(len(images))
            return original(predictor, images)

        monkeypatch.setattr(Predictor, "encode", encode)


def test_embed_batches_resumes_and_skips_broken_images(images, tmp_path, capsys, monkeypatch):
    counting = Counting()
    counting.install(monkeypatch)
    store_dir = tmp_path / "store"
    argv = [
        "embed",
        str(images),
        "--store",
        str(store_dir),
        "--random-weights",
        "--batch-size",
        "2",
    ]

    assert cli.main(argv) == EXIT_OK
    assert counting.calls == [2]  # both images in one encoder call
    err = capsys.readouterr().err
    assert "2 image(s) encoded" in err and "images/s" in err and "MiB per entry" in err

    store = EmbeddingStore(
        str(store_dir), StoreIdentity("tiny", "fast", "float32", "random seed 0")
    )
    for name in ("p1.png", "p2.png"):
        image_id = image_id_of((images / name).read_bytes())
        assert store.has(image_id)
        assert store.get(image_id).original_size == (96, 128)

    # A new image, a copy of a stored one under another name, and a broken file.
    (images / "p3.png").write_bytes(png_bytes(3))
    (images / "copy.png").write_bytes((images / "p1.png").read_bytes())
    (images / "broken.png").write_bytes(b"not a picture")
    assert cli.main(argv) == EXIT_FAILED
    assert counting.calls == [2, 1]  # only p3 was encoded
    err = capsys.readouterr().err
    assert "1 image(s) encoded" in err and "3 already stored" in err and "1 failed" in err
    [line] = error_lines(err)
    assert "broken.png" in line and "skipped" in line
    assert store.has(image_id_of((images / "p3.png").read_bytes()))


def test_another_seed_is_another_runtime(images, tmp_path, capsys, monkeypatch):
    counting = Counting()
    counting.install(monkeypatch)
    store_dir = str(tmp_path / "store")
    base = ["embed", str(images / "p1.png"), "--store", store_dir, "--random-weights"]
    assert cli.main(base) == EXIT_OK
    assert cli.main(base) == EXIT_OK  # stored: nothing to encode
    assert counting.calls == [1]
    assert cli.main([*base, "--seed", "1"]) == EXIT_OK  # other weights: encoded again
    assert counting.calls == [1, 1]
    roots = [p for p in Path(store_dir).iterdir() if p.is_dir()]
    assert len(roots) == 2  # one directory per runtime


def test_serve_names_a_store_it_cannot_use_before_the_model_loads(tmp_path, capsys, monkeypatch):
    def no_app(*args, **kwargs):
        raise AssertionError("the app was created")

    monkeypatch.setattr("sam2serve.server.app.create_app", no_app)
    a_file = tmp_path / "emb"
    a_file.write_text("not a directory")
    code = cli.main(["serve", "--random-weights", "--store", str(a_file), "--port", "1"])
    assert code == EXIT_USAGE
    [line] = error_lines(capsys.readouterr().err)
    assert line.startswith("sam2serve: error: --store:") and "is a file" in line
    code = cli.main(["serve", "--random-weights", "--store", "x", "--store-dtype", "int8"])
    assert code == EXIT_USAGE
    assert "--store-dtype" in error_lines(capsys.readouterr().err)[0]
