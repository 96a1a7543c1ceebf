"""``sam2serve run`` checks its inputs before the model loads: a missing image, a directory
without images, a bad prompts file or a point outside its image is a usage error (exit 2)
found in milliseconds; an image that only decoding finds broken fails alone (exit 1)."""

from __future__ import annotations

import contextlib
import io
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from sam2serve import cli
from sam2serve.commands import inputs, model
from sam2serve.commands.common import EXIT_USAGE
from sam2serve.engine.prompts import Prompt


@pytest.fixture
def no_model(monkeypatch):
    """Fail the test if the command gets as far as loading the model."""

    def refuse(*args, **kwargs):
        raise AssertionError("the model was loaded before the inputs were checked")

    monkeypatch.setattr(model, "build", refuse)


def run_cli(*argv: str | Path) -> tuple[int, str]:
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr):
        code = cli.main([str(a) for a in argv])
    return code, stderr.getvalue()


def one_error(stderr: str) -> str:
    assert "Traceback" not in stderr
    [line] = [line for line in stderr.splitlines() if line.startswith("sam2serve: error: ")]
    return line


@pytest.fixture
def photo_dir(tmp_path) -> Path:
    directory = tmp_path / "photos"
    directory.mkdir()
    Image.fromarray(np.full((30, 40, 3), 128, np.uint8)).save(directory / "grey.png")
    return directory


def test_a_missing_image_stops_the_run_before_the_model_loads(no_model, photo_dir, tmp_path):
    out = tmp_path / "out"
    code, stderr = run_cli(
        "run", "--task", "amg", photo_dir, tmp_path / "missing.png", "--out", out
    )
    assert code == EXIT_USAGE
    assert f"image file not found: '{tmp_path / 'missing.png'}'" in one_error(stderr)
    assert not out.exists()


def test_a_directory_without_images_stops_the_run(no_model, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "notes.txt").write_text("no images here")
    code, stderr = run_cli("run", "--task", "amg", empty, "--out", tmp_path / "out")
    assert code == EXIT_USAGE
    assert "no image files" in one_error(stderr) and str(empty) in one_error(stderr)


def test_the_word_sample_gets_a_hint(no_model, tmp_path):
    code, stderr = run_cli("run", "--task", "amg", "sample", "--out", tmp_path / "out")
    assert code == EXIT_USAGE and "'samples' is the bundled photos" in one_error(stderr)


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        (None, "--prompts file not found"),
        ("{not json", "not valid JSON"),
        ('{"grey.png": [[1, true]]}', "point 0"),
        ('{"grey.png": [[10, 10]], "cat.jpg": [[1, 1]]}', "'cat.jpg'"),
        (
            '{"grey.png": [[41, 10]]}',
            "image 'grey.png', point 0: [41, 10] lies outside the 40x30 image",
        ),
        ('{"grey": [[10, -1]]}', "lies outside"),
    ],
)
def test_bad_prompts_stop_the_run_before_the_model_loads(
    no_model, photo_dir, tmp_path, content, fragment
):
    prompts = tmp_path / "prompts.json"
    if content is not None:
        prompts.write_text(content)
    code, stderr = run_cli(
        "run", "--task", "mps", photo_dir, "--out", tmp_path / "out", "--prompts", prompts
    )
    assert code == EXIT_USAGE
    assert fragment in one_error(stderr)


def test_exif_rotation_is_taken_into_account(no_model, tmp_path):
    """A 40x30 photo stored with EXIF orientation 6 decodes as 30x40: (35, 5) is outside."""
    path = tmp_path / "rotated.jpg"
    exif = Image.Exif()
    exif[0x0112] = 6
    Image.fromarray(np.zeros((30, 40, 3), np.uint8)).save(path, exif=exif)
    item = inputs.expand_images([str(path)])[0]
    assert item.size() == (40, 30)
    prompts = tmp_path / "p.json"
    prompts.write_text(json.dumps({"rotated.jpg": [[35, 5]]}))
    code, stderr = run_cli(
        "run", "--task", "sps", path, "--out", tmp_path / "o", "--prompts", prompts
    )
    assert code == EXIT_USAGE and "outside the 30x40 image" in one_error(stderr)


def test_amg_flag_values_are_checked_before_the_model_loads(no_model, photo_dir, tmp_path):
    code, stderr = run_cli(
        "run", "--task", "amg", photo_dir, "--out", tmp_path, "--crop-n-layers", "-1"
    )
    assert code == EXIT_USAGE and "--crop-n-layers must be an integer >= 0" in one_error(stderr)


def test_input_errors_need_no_torch(tmp_path):
    script = (
        "import sys\n"
        "from sam2serve.cli import main\n"
        "code = main(['run', '--task', 'amg', sys.argv[1], '--out', sys.argv[2]])\n"
        "assert 'torch' not in sys.modules\n"
        "sys.exit(code)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "nope.jpg"), str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == EXIT_USAGE, proc.stderr
    assert proc.stderr.startswith("sam2serve: error: image file not found")


@pytest.mark.parametrize(
    "data",
    [b"\xff\xd8 this is not a jpeg", b"GIF89a" + bytes(20), b"\x89PNG\r\n\x1a\n" + bytes(8)],
)
def test_image_errors_name_the_file_without_python_reprs(tmp_path, data):
    path = tmp_path / "broken.jpg"
    path.write_bytes(data)
    [item] = inputs.expand_images([str(path)])
    with pytest.raises(inputs.ItemFailure) as failure:
        item.decode(item.read())
    message = str(failure.value)
    assert "'" + str(path) + "'" in message
    assert "<_io" not in message and "object at 0x" not in message


# --------------------------------------------------------------------------- object prompts


def test_prompts_take_objects_with_boxes_and_negative_points(photo_dir, tmp_path):
    """Points, objects and the defaults of an object, normalised; the old form unchanged."""
    path = tmp_path / "prompts.json"
    path.write_text(
        json.dumps(
            {
                "grey": [
                    [3, 4],
                    {"points": [[10, 10], [20, 5]], "labels": [1, 0]},
                    {"box": [1, 2, 30, 25]},
                    {"points": [[5, 5]], "box": [0, 0, 40, 30]},
                ]
            }
        )
    )
    images = inputs.expand_images([str(photo_dir)])
    prompts = inputs.match_prompts(inputs.load_prompts(path), images, path)
    assert list(prompts) == ["grey.png"]
    click, *objects = prompts["grey.png"]
    assert click.bare_click and click == Prompt(((3.0, 4.0),), (1,))
    assert [(o.as_json(), o.bare_click) for o in objects] == [
        ({"points": [[10.0, 10.0], [20.0, 5.0]], "labels": [1, 0], "box": None}, False),
        ({"points": [], "labels": [], "box": [1.0, 2.0, 30.0, 25.0]}, False),
        ({"points": [[5.0, 5.0]], "labels": [1], "box": [0.0, 0.0, 40.0, 30.0]}, False),
    ]


@pytest.mark.parametrize(
    ("entry", "fragment"),
    [
        ([{"points": [[1, 2]], "labels": [2]}], "image 'grey.png', object 0, labels[0]: a label is 1 (foreground) or 0 (background), got 2"),
        ([[1, 1], {"points": [[1, 2]], "labels": [True]}], "object 1, labels[0]"),
        ([{"points": [[1, 2], [3, 4]], "labels": [1]}], "object 0: labels must be a list of one label per point (2), got [1]"),
        ([{"box": [10, 5, 10, 20]}], "object 0: box [10, 5, 10, 20] is empty: it needs x1 > x0 and y1 > y0"),
        ([{"box": [10, 5, 20]}], "object 0: box must be [x0, y0, x1, y1] with four finite numbers, got [10, 5, 20]"),
        ([{"points": [[1, "a"]]}], "object 0, points[0]: expected [x, y]"),
        ([{}], "object 0: an object needs at least one point or a box"),
        ([{"point": [[1, 2]]}], "object 0: unknown key 'point'; an object has points, labels, box"),
        ([{"points": [[1, 2]]}, {"points": [[41, 2]]}], "image 'grey.png', object 1, points[0]: [41, 2] lies outside the 40x30 image; accepted: 0 <= x <= 40"),
        ([{"box": [5, 5, 40, 31]}], "object 0, box: [5, 5, 40, 31] is not inside the 40x30 image; accepted: 0 <= x0 <= x1 <= 40"),
        (["x"], "prompt 0: expected [x, y] or an object"),
    ],
)  # fmt: skip
def test_bad_objects_stop_the_run_naming_the_image_object_and_value(
    no_model, photo_dir, tmp_path, entry, fragment
):
    prompts = tmp_path / "prompts.json"
    prompts.write_text(json.dumps({"grey.png": entry}))
    code, stderr = run_cli(
        "run", "--task", "mps", photo_dir, "--out", tmp_path / "out", "--prompts", prompts
    )
    assert code == EXIT_USAGE
    assert fragment in one_error(stderr)


# --------------------------------------------------------------------------- --coco, filters


@pytest.mark.parametrize(
    ("flags", "fragment"),
    [
        (["--min-score", "1.5"], "--min-score must be a number in [0, 1] (a predicted IoU), got 1.5"),
        (["--min-score", "nan"], "argument --min-score: expected a number, got 'nan'"),
        (["--max-masks", "0"], "--max-masks must be an integer >= 1, got 0"),
        (["--max-masks", "two"], "argument --max-masks: expected an integer, got 'two'"),
    ],
)  # fmt: skip
def test_bad_filters_stop_the_run(no_model, photo_dir, tmp_path, flags, fragment):
    code, stderr = run_cli("run", "--task", "amg", photo_dir, "--out", tmp_path / "out", *flags)
    assert code == EXIT_USAGE
    assert fragment in one_error(stderr)


def test_a_coco_file_that_cannot_be_written_stops_the_run(no_model, photo_dir, tmp_path):
    not_a_dir = tmp_path / "file.txt"
    not_a_dir.write_text("a file, not a directory")
    code, stderr = run_cli(
        "run", "--task", "amg", photo_dir, "--out", tmp_path / "out",
        "--coco", not_a_dir / "instances.json",
    )  # fmt: skip
    assert code == EXIT_USAGE
    assert f"--coco '{not_a_dir / 'instances.json'}': cannot write in directory" in one_error(
        stderr
    )
    code, stderr = run_cli(
        "run", "--task", "amg", photo_dir, "--out", tmp_path / "out", "--coco", tmp_path
    )
    assert code == EXIT_USAGE and "is a directory; give a file name" in one_error(stderr)
    # A directory that does not exist yet is made, and the probe file is gone.
    inputs.check_coco_file(tmp_path / "new" / "c.json")
    assert list((tmp_path / "new").iterdir()) == []
