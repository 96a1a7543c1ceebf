"""``sam2serve track --text``: SAM 3's instances on one frame seed the tracked objects.
The flags are checked before any model loads; a run names each object by its phrase in
track.json and in every frame file, and its seeds are the engine's (concept_seeds)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from sam2serve.commands import track, track_concepts
from sam2serve.commands.common import EXIT_OK, EXIT_USAGE
from sam2serve.engine.rle import coco_to_rle, rle_to_mask
from sam2serve.samples import sample_clip
from tests.commands.test_track import SIZE, run_cli, write_prompts


@pytest.fixture(scope="module")
def two_frames(tmp_path_factory) -> Path:
    frames, _ = sample_clip(num_frames=2, size=SIZE)
    folder = tmp_path_factory.mktemp("frames2")
    for i, frame in enumerate(frames):
        Image.fromarray(frame).save(folder / f"{i}.png")
    return folder


@pytest.fixture
def no_models(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the inputs were checked")

    monkeypatch.setattr(track, "_load_predictor", refuse)
    monkeypatch.setattr(track_concepts, "find_seeds", refuse)


def test_concept_flags_are_checked_before_a_model_loads(no_models, two_frames, tmp_path):
    prompts = write_prompts(tmp_path / "p.json", {"0": {"1": {"points": [[10, 10]]}}})
    random = ("--random-weights", "--sam3-size", "tiny")
    cases = [
        (("--text", "cat", "--prompts", prompts), "--text and --prompts exclude each other"),
        (("--text", "cat,,dog", *random), "phrase 2: a phrase is empty"),
        (("--text", "cat, cat", *random), "phrase 'cat' is given twice"),
        (("--text", "x" * 65, *random), "65 characters; the limit is 64"),
        (("--text", "cat,c\u200bat", *random), "U+200B ZERO WIDTH SPACE (an invisible"),
        (("--text", "cat,a\u202eb", *random), "'a\\u202eb' has U+202E"),
        (("--text", '"salt, pepper', *random), "a double quote is not closed"),
        (("--text", "cat", "--score-thresh", "2", *random), "--score-thresh must be"),
        (("--text", "cat", "--score-thresh", "nan", *random), "--score-thresh: expected a number"),
        (("--text", "cat", "--max-instances", "0", *random), "--max-instances"),
        (("--text", "cat", "--concept-frame", "2", *random), "--concept-frame 2 is past"),
        (("--text", "cat", "--sam3-size", "tiny"), "random-weights only"),
        (("--prompts", prompts, "--concept-frame", "1"), "give --text PHRASES too"),
        (("--prompts", prompts, "--sam3-size", "tiny"), "give --text PHRASES too"),
    ]
    for argv, expected in cases:
        code, stderr = run_cli("track", two_frames, *argv, "--out", tmp_path / "o")
        assert code == EXIT_USAGE, (argv, stderr)
        assert expected in stderr and "Traceback" not in stderr, (argv, stderr)


def test_text_seeds_named_objects_and_tracks_them(two_frames, tmp_path, concepts_tiny, monkeypatch):
    """One frame (the tier-1 budget: tracking seeded objects through frames is
    tests/server/test_video_concepts.py's; the command's propagation is track's own). The
    command's spec must be the fixture's (random, tiny, seed 0): it gets that very model
    instead of building a second one."""
    from sam2serve.concepts.video_seed import concept_seeds
    from sam2serve.runtime import concepts as runtime_concepts

    specs = []

    def loaded(spec):
        specs.append(spec)
        return concepts_tiny

    # where the command's loader (runtime.concepts.load_concepts_in_mode) finds it
    monkeypatch.setattr(runtime_concepts, "load_concepts", loaded)

    one = tmp_path / "one"
    one.mkdir()
    (one / "0.png").write_bytes((two_frames / "0.png").read_bytes())
    out = tmp_path / "out"
    code, stderr = run_cli(
        "track",
        one,
        "--text",
        "disc,square",
        "--tracker",
        "sam2.1",
        "--out",
        out,
        "--random-weights",
        "--sam3-size",
        "tiny",
        "--score-thresh",
        "0",
        "--max-instances",
        "3",
    )
    assert code == EXIT_OK, stderr
    assert specs == [concepts_tiny.spec]
    assert "SAM 3 seeded 3 object(s) on frame 0" in stderr
    summary = json.loads((out / track.SUMMARY_NAME).read_text())
    assert summary["objects"] == [1, 2, 3]
    # The seeds are the engine's for the same frame, phrases and seed (random SAM 3, seed 0).
    frame0 = np.asarray(Image.open(one / "0.png").convert("RGB"))
    expected = concept_seeds(
        concepts_tiny, frame0, ["disc", "square"], score_thresh=0.0, max_instances=3
    )
    seeded = summary["concepts"]["objects"]
    assert [o["name"] for o in seeded] == [s.phrase for s in expected]
    assert [o["score"] for o in seeded] == pytest.approx([s.score for s in expected], abs=1e-6)
    assert summary["names"] == {str(o["obj_id"]): o["name"] for o in seeded}
    assert summary["concepts"]["phrases"] == ["disc", "square"]
    assert summary["concepts"]["frame"] == 0 and summary["concepts"]["score_thresh"] == 0.0
    for i in range(1):
        frame = json.loads((out / f"frame_{i:05d}.json").read_text())
        assert [(o["obj_id"], o["name"]) for o in frame["objects"]] == [
            (o["obj_id"], o["name"]) for o in seeded
        ]
        for obj in frame["objects"]:
            mask = rle_to_mask(coco_to_rle(obj["segmentation"]))
            assert mask.shape == SIZE and obj["area"] == int(mask.sum())
