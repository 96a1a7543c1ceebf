"""``sam2serve run --task concepts``: one real run as a subprocess (random tiny SAM 3,
threshold 0) checked against pycocotools and against the engine called directly; its input
errors in-process, before the model loads."""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import skimage.data
from PIL import Image
from user_text_cases import ACCEPTED_NAMES, REFUSED_NAMES

from sam2serve import cli
from sam2serve.commands import run, run_concepts
from sam2serve.commands.common import EXIT_FAILED, EXIT_USAGE
from sam2serve.commands.concept_prompts import MAX_PHRASE_CHARS, parse_text

ROOT = Path(__file__).resolve().parents[2]
TINY = ["--random-weights", "--sam3-size", "tiny"]
# Phrases of the run: --text, then the one image b.png adds in the prompts file.
TEXT = ["cat", "dog"]
B_TEXT = ["bird"]
B_BOXES = [
    {"box": [10, 8, 60, 50], "positive": True},
    {"box": [70, 20, 100, 60], "positive": False},
]


def photo() -> np.ndarray:
    return np.ascontiguousarray(skimage.data.chelsea()[::4, ::4])  # 75 x 113


@pytest.fixture(scope="module")
def concepts_run(tmp_path_factory):
    """a.png and b.png hold the same pixels; b.png has exemplar boxes and a phrase of its
    own in the prompts file; broken.png is not an image."""
    root = tmp_path_factory.mktemp("concepts")
    images = root / "images"
    images.mkdir()
    for name in ("a.png", "b.png"):
        Image.fromarray(photo()).save(images / name)
    (images / "broken.png").write_bytes(b"\x89PNG not really")
    prompts = root / "prompts.json"
    prompts.write_text(json.dumps({"b": {"boxes": B_BOXES, "text": B_TEXT}}))
    out = root / "out"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        "SAM2SERVE_CACHE": str(root / "cache"),
        "SAM2SERVE_OFFLINE": "1",
    }
    proc = subprocess.run(
        [
            sys.executable, "-m", "sam2serve", "run", "--task", "concepts",
            "--text", ",".join(TEXT), str(images), "--out", str(out),
            "--prompts", str(prompts), "--coco", str(out / "coco.json"), "--overlay",
            *TINY, "--score-thresh", "0",
        ],
        capture_output=True, text=True, timeout=300, env=env, check=False,
    )  # fmt: skip
    return proc, out


def load(path: Path) -> dict:
    return json.loads(path.read_text())


def test_run_writes_json_overlays_and_coco_and_skips_the_broken_image(concepts_run):
    proc, out = concepts_run
    assert proc.returncode == EXIT_FAILED, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    [error] = [line for line in proc.stderr.splitlines() if line.startswith("sam2serve: error:")]
    assert "broken.png" in error and "skipped" in error
    assert "sam2serve concepts:" in proc.stderr  # the progress bar
    assert "3 phrase(s) encoded once" in proc.stderr
    assert sorted(p.name for p in out.iterdir()) == [
        "a_concepts.json", "a_concepts.png", "b_concepts.json", "b_concepts.png", "coco.json",
    ]  # fmt: skip
    a, b = load(out / "a_concepts.json"), load(out / "b_concepts.json")
    assert (a["image"], a["width"], a["height"], a["task"]) == ("a.png", 113, 75, "concepts")
    assert a["phrases"] == TEXT and b["phrases"] == TEXT + B_TEXT
    assert a["boxes"] == [] and b["boxes"] == B_BOXES
    assert a["weights"]["random"] is True and a["params"]["score_thresh"] == 0.0
    for result in (a, b):
        assert [c["phrase"] for c in result["concepts"]] == result["phrases"]
        for concept in result["concepts"]:
            assert concept["category_id"] == (TEXT + B_TEXT).index(concept["phrase"]) + 1
            scores = [i["score"] for i in concept["instances"]]
            assert len(scores) == 20 and scores == sorted(scores, reverse=True)  # tiny: 20
    for name in ("a", "b"):
        overlay = Image.open(out / f"{name}_concepts.png")
        assert overlay.size == (113, 75)
        top = np.asarray(overlay.convert("RGB"))[1, 1]
        assert top[0] > 150 and top[1] < 60, top  # the red RANDOM WEIGHTS band


def test_coco_file_categories_are_the_phrases_and_annotations_match_their_rle(concepts_run):
    from pycocotools import mask as mask_utils
    from pycocotools.coco import COCO

    _, out = concepts_run
    with contextlib.redirect_stdout(io.StringIO()):
        coco = COCO(str(out / "coco.json"))
    assert [(c["id"], c["name"]) for c in coco.dataset["categories"]] == [
        (1, "cat"), (2, "dog"), (3, "bird"),
    ]  # fmt: skip
    assert [i["file_name"] for i in coco.dataset["images"]] == ["a.png", "b.png"]
    for image in coco.dataset["images"]:
        result = load(out / f"{Path(image['file_name']).stem}_concepts.json")
        expected = [
            (c["category_id"], i["segmentation"]["counts"], i["score"], i["area"], i["bbox"])
            for c in result["concepts"]
            for i in c["instances"]
        ]
        annotations = coco.loadAnns(coco.getAnnIds(imgIds=image["id"]))
        got = [
            (a["category_id"], a["segmentation"]["counts"], a["score"], a["area"], a["bbox"])
            for a in annotations
        ]
        assert got == expected
        for annotation in annotations:
            rle = annotation["segmentation"]
            assert annotation["area"] == int(mask_utils.area(rle))
            assert annotation["bbox"] == mask_utils.toBbox(rle).tolist()
    first = coco.dataset["annotations"][0]
    decoded = coco.annToMask(first)
    assert decoded.shape == (75, 113) and int(decoded.sum()) == first["area"] > 0


def instances(result: dict) -> dict[str, list[dict]]:
    return {c["phrase"]: c["instances"] for c in result["concepts"]}


def assert_same(cli_instances: list[dict], engine_instances: list) -> None:
    """The CLI's records equal the engine's instances (highest score first)."""
    from sam2serve.engine.rle import coco_to_rle, rle_to_mask

    ranked = sorted(engine_instances, key=lambda i: -i.score)
    assert len(cli_instances) == len(ranked)
    for record, instance in zip(cli_instances, ranked, strict=True):
        assert record["score"] == pytest.approx(instance.score, abs=1e-6)
        assert record["box"] == pytest.approx(list(instance.box), abs=1e-2)
        mask = rle_to_mask(coco_to_rle(record["segmentation"]))
        assert np.array_equal(mask, instance.mask)


def test_outputs_equal_the_engine_and_boxes_change_them(concepts_run, concepts_tiny):
    from sam2serve.concepts.engine import ExemplarBox

    _, out = concepts_run
    a, b = load(out / "a_concepts.json"), load(out / "b_concepts.json")
    # a.png: --text only, its rows of the run's one text encoding (cat, dog of cat, dog, bird).
    [plain] = concepts_tiny.segment([photo()], TEXT, (), 0.0)
    for phrase in TEXT:
        assert_same(instances(a)[phrase], plain[phrase])
    # b.png: the same pixels with the prompts file's boxes and phrase.
    boxes = [ExemplarBox(tuple(b_["box"]), b_["positive"]) for b_ in B_BOXES]
    [boxed] = concepts_tiny.segment([photo()], TEXT + B_TEXT, boxes, 0.0)
    for phrase in TEXT + B_TEXT:
        assert_same(instances(b)[phrase], boxed[phrase])
    a_scores = [i["score"] for i in instances(a)["cat"]]
    b_scores = [i["score"] for i in instances(b)["cat"]]
    assert max(abs(x - y) for x, y in zip(a_scores, b_scores, strict=True)) > 1e-4


# --------------------------------------------------------------------------- errors


@pytest.fixture
def no_model(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the model was loaded before the inputs were checked")

    monkeypatch.setattr(run_concepts, "_load", refuse)


def run_cli(*argv) -> tuple[int, str]:
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr):
        code = cli.main([str(a) for a in argv])
    return code, stderr.getvalue()


def one_error(stderr: str) -> str:
    assert "Traceback" not in stderr
    [line] = [line for line in stderr.splitlines() if line.startswith("sam2serve: error: ")]
    return line


@pytest.fixture
def image(tmp_path) -> Path:
    path = tmp_path / "grey.png"
    Image.fromarray(np.full((30, 40, 3), 128, np.uint8)).save(path)
    return path


LONG = "x" * (MAX_PHRASE_CHARS + 1)


@pytest.mark.parametrize(
    ("flags", "prompts", "fragments"),
    [
        (["--text", "cat,,dog"], None, ["--text 'cat,,dog'", "phrase 2", "empty"]),
        (["--text", f"cat,{LONG}"], None, ["phrase 2", "65 characters", "limit is 64"]),
        (["--text", "cat,cat"], None, ["'cat' is given twice"]),
        ([], None, ["--task concepts needs --text"]),
        (["--text", "cat", "--score-thresh", "1.5"], None, ["--score-thresh", "1.5"]),
        (["--text", "cat", "--max-instances", "0"], None, ["--max-instances", "got 0"]),
        (["--text", "cat", "--checkpoint", "x.pt"], None, ["--checkpoint is for --task amg"]),
        (["--text", "cat", "--backend", "openvino"], None, ["--backend openvino is SAM 2.1's"]),
        (["--text", "cat", "--points-per-side", "8"], None, ["--points-per-side is for"]),
        (["--text", "cat", "--sam3-size", "tiny"], None, ["'tiny'", "--random-weights only"]),
        (
            ["--text", "cat"],
            {"grey": {"boxes": [{"box": [5, 5, 41, 20]}]}},
            ["image 'grey.png', box 0", "[5, 5, 41, 20]", "outside the 40x30 image"],
        ),
        (
            ["--text", "cat"],
            {"grey": {"boxes": [{"box": [5, 5, 5, 20]}]}},
            ["box 0", "is empty"],
        ),
        (
            ["--text", "cat"],
            {"grey": {"boxes": [{"box": [1, 1, 9, 9], "positive": "yes"}]}},
            ["positive must be true or false", "'yes'"],
        ),
        (
            ["--text", "cat"],
            {"grey": {"boxes": [{"box": [-1, 5, 9, 20]}]}},
            ["box 0", "below 0"],
        ),
        (
            ["--text", "cat"],
            {"grey": {"text": ["a\u202eb"]}},
            ["image 'grey.png', text, phrase 1", "'a\\u202eb'", "U+202E RIGHT-TO-LEFT OVERRIDE"],
        ),
        (["--text", '"cat'], None, ["--text '\"cat'", "double quote is not closed"]),
        (["--text", '"a"b'], None, ["closing double quote"]),
        (["--text", "cat,dog" + " " * 300], None, ["phrase 2", "303 characters"]),
        (["--text", "cat", "--score-thresh", "nan"], None, ["--score-thresh", "nan"]),
        (["--text", "cat"], {"grey": {"labels": []}}, ["unknown key 'labels'"]),
        (["--text", "cat"], {"grey": {"text": [" "]}}, ["image 'grey.png', text", "empty"]),
        (["--text", "cat"], {"other.png": {"text": ["dog"]}}, ["'other.png'", "not given"]),
        ([], {"grey": {}}, ["nothing to find", "'grey.png'"]),
        (
            ["--text", "cat", "--image-decode", "host"],
            None,
            ["--image-decode is for --task amg, sps and mps (SAM 2.1)"],
        ),
    ],
)
def test_bad_inputs_are_one_line_usage_errors_before_the_model(
    no_model, image, tmp_path, flags, prompts, fragments
):
    extra = []
    if prompts is not None:
        path = tmp_path / "prompts.json"
        path.write_text(json.dumps(prompts))
        extra = ["--prompts", path]
    code, stderr = run_cli(
        "run", "--task", "concepts", image, "--out", tmp_path / "out", *flags, *extra
    )
    line = one_error(stderr)
    assert code == EXIT_USAGE, stderr
    for fragment in fragments:
        assert fragment in line, line


@pytest.mark.parametrize(("text", "named"), REFUSED_NAMES)
def test_a_hostile_phrase_is_one_line_naming_it(no_model, image, tmp_path, text, named):
    code, stderr = run_cli(
        "run", "--task", "concepts", image, "--out", tmp_path / "out", "--text", f"cat,{text}"
    )
    line = one_error(stderr)
    assert code == EXIT_USAGE, stderr
    assert line.startswith("sam2serve: error: --text 'cat,") and named in line, line
    assert line.isprintable(), line


@pytest.mark.parametrize("text", [t for t in ACCEPTED_NAMES if "," not in t and '"' not in t])
def test_every_readable_phrase_is_taken_as_the_service_takes_it(text):
    assert parse_text(f"first,{text}") == ("first", text)


def test_double_quotes_keep_a_comma_in_a_phrase():
    assert parse_text("cat,dog, red car") == ("cat", "dog", "red car")  # as before
    assert parse_text('cat,"salt, pepper"') == ("cat", "salt, pepper")
    assert parse_text('cat, "salt, pepper",dog') == ("cat", "salt, pepper", "dog")
    assert parse_text('"a ""big"" dog"') == ('a "big" dog',)
    assert parse_text('the "big" dog') == ('the "big" dog',)  # not at a phrase's start
    assert parse_text(None) == ()


@pytest.mark.parametrize("flags", [["--text", "cat"], ["--score-thresh", "0.3"]])
def test_concepts_flags_on_a_sam2_task_are_usage_errors(tmp_path, image, flags):
    code, stderr = run_cli("run", "--task", "amg", image, "--out", tmp_path / "out", *flags)
    assert code == EXIT_USAGE
    line = one_error(stderr)
    assert f"{flags[0]} is for --task concepts (SAM 3); --task amg is SAM 2.1" in line


def test_missing_weights_are_the_weights_error_line(tmp_path, image, monkeypatch):
    monkeypatch.setenv("SAM2SERVE_CACHE", str(tmp_path / "empty"))
    code, stderr = run_cli(
        "run", "--task", "concepts", "--text", "cat", image, "--out", tmp_path / "out"
    )
    assert code == EXIT_USAGE
    line = one_error(stderr)
    assert "SAM 3 weights not found in" in line and str(tmp_path / "empty") in line
    assert "sam2serve download --model sam3" in line and "HF_TOKEN" in line


# --------------------------------------------------------------------------- one place


def test_torch_free_constants_match_the_engine():
    from sam2serve.commands.concept_prompts import VISUAL_PHRASE
    from sam2serve.concepts import engine, phrases

    assert run_concepts.DEFAULT_SCORE_THRESH == engine.DEFAULT_SCORE_THRESH
    assert phrases.META_SCORE_THRESH == engine.DEFAULT_SCORE_THRESH
    assert VISUAL_PHRASE == engine.VISUAL_PHRASE


def test_every_flag_is_on_one_side_or_shared():
    """Each flag of run is SAM 2.1's, SAM 3's or shared: a new flag must be placed."""
    defaults, _ = run_concepts.flag_defaults(run.add_arguments)
    shared = {"help", "images", "task", "out", "prompts", "overlay", "coco", "device"}
    shared |= {"threads", "random_weights", "seed", "mode", "backend"}
    sides = set(run_concepts.SAM2_ONLY) | set(run_concepts.CONCEPTS_ONLY)
    assert set(defaults) == sides | shared
    assert not set(run_concepts.SAM2_ONLY) & set(run_concepts.CONCEPTS_ONLY)


def test_help_explains_the_task_and_its_flags():
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if hasattr(a, "choices") and a.choices)
    text = sub.choices["run"].format_help()
    for fragment in (
        "concepts  every instance of noun phrases",
        "concepts prompts (--prompts",
        "_concepts.json",
        "--text PHRASES",
        "--sam3-weights",
        "--max-instances",
    ):
        assert fragment in text, fragment  # fmt: skip
    assert run.RUN_TASKS[-1] == "concepts"


def test_mode_runs_sam3_in_its_precision(image, tmp_path, monkeypatch):
    """--mode reaches SAM 3: the JSON records it and the log names each part's precision
    (furious: bf16 where this CPU has it natively, fp32 where bf16 is emulated)."""
    from sam2serve.runtime.build import native_reduced_dtype

    monkeypatch.setenv("SAM2SERVE_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "out"
    code, stderr = run_cli(
        "run", "--task", "concepts", "--text", "cat", image, "--out", out,
        *TINY, "--mode", "furious",
    )  # fmt: skip
    assert code == 0, stderr
    expected = "bf16" if native_reduced_dtype("cpu") == "bfloat16" else "fp32"
    assert f"SAM 3 mode furious: backbone {expected}, text {expected}, detector {expected}" in (
        stderr
    )
    result = load(out / "grey_concepts.json")
    assert result["mode"] == "furious" and len(result["concepts"][0]["instances"]) == 20
