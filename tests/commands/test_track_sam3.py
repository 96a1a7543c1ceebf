"""``sam2serve track --text PHRASE`` (default ``--tracker sam3``): SAM 3's own video
predictor writes named objects per frame and records them in track.json; what it cannot
do yet is refused in one line before a model loads."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from sam2serve.commands import track
from sam2serve.commands.common import EXIT_OK, EXIT_USAGE
from sam2serve.engine.rle import coco_to_rle, rle_to_mask
from sam2serve.samples import sample_clip
from tests.commands.test_track import SIZE, run_cli

RANDOM = ("--random-weights", "--sam3-size", "tiny")


@pytest.fixture(scope="module")
def two_frames(tmp_path_factory) -> Path:
    frames, _ = sample_clip(num_frames=2, size=SIZE)
    folder = tmp_path_factory.mktemp("frames2")
    for i, frame in enumerate(frames):
        Image.fromarray(frame).save(folder / f"{i}.png")
    return folder


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (("--text", "disc,square", "--box", "1,1,9,9"), "--box goes with one phrase"),
        (("--text", "disc,visual"), "--text visual is Meta's stand-in for the box alone"),
        (("--text", "disc", "--overlay", "o.mp4"), "--overlay is drawn for --tracker sam2.1"),
    ],
)
def test_what_sam3_video_does_not_do_is_refused(two_frames, tmp_path, monkeypatch, argv, expected):
    from sam2serve.concepts import video_load

    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the request was checked")

    monkeypatch.setattr(video_load, "video_predictor", refuse)
    code, stderr = run_cli("track", two_frames, *argv, *RANDOM, "--out", tmp_path / "o")
    assert code == EXIT_USAGE, stderr
    assert expected in stderr and "Traceback" not in stderr


def test_sam3_tracks_every_instance_with_names(two_frames, tmp_path, concepts_tiny, monkeypatch):
    """Both frames through SAM 3's video predictor (random tiny SAM 3, the fixture's model):
    every frame file holds the objects with the phrase as name and valid masks, and
    track.json lists them with their first and last frames and the stage timings."""
    from sam2serve.runtime import concepts as runtime_concepts

    monkeypatch.setattr(runtime_concepts, "load_concepts", lambda spec: concepts_tiny)
    out = tmp_path / "out"
    code, stderr = run_cli("track", two_frames, "--text", "disc", *RANDOM, "--out", out)
    assert code == EXIT_OK, stderr
    summary = json.loads((out / track.SUMMARY_NAME).read_text())
    concepts = summary["concepts"]
    assert concepts["tracker"] == "sam3" and concepts["phrases"] == ["disc"]
    assert concepts["score_thresh"] == 0.0 and concepts["new_object_thresh"] == pytest.approx(0.2)
    ids = summary["objects"]
    assert ids and ids == sorted(ids) and summary["names"] == {str(i): "disc" for i in ids}
    assert set(concepts["stage_seconds"]) == {"detector", "tracker", "association"}
    spans = {o["obj_id"]: (o["first_frame"], o["last_frame"]) for o in concepts["objects"]}
    seen: dict[int, list[int]] = {}
    for i in range(2):
        frame = json.loads((out / f"frame_{i:05d}.json").read_text())
        for obj in frame["objects"]:
            assert obj["name"] == "disc"
            mask = rle_to_mask(coco_to_rle(obj["segmentation"]))
            # Meta drops empty masks before resolving overlaps: an object may end empty
            assert mask.shape == SIZE and obj["area"] == int(mask.sum())
            seen.setdefault(obj["obj_id"], []).append(i)
        masks = [rle_to_mask(coco_to_rle(o["segmentation"])) for o in frame["objects"]]
        if len(masks) > 1:  # Meta's output: no pixel claimed by two objects
            assert np.sum(masks, axis=0).max() <= 1
    assert {obj: (f[0], f[-1]) for obj, f in seen.items()} == spans


def test_sam3_tracks_several_phrases_each_object_named_by_its_own(
    two_frames, tmp_path, concepts_tiny, monkeypatch
):
    """--text "disc,square": one SAM 3 run per phrase (concepts/test_video_phrases.py proves
    each equals the phrase's run alone): ids i*2+k, each object named by its phrase in the
    frame files and track.json."""
    from sam2serve.runtime import concepts as runtime_concepts

    monkeypatch.setattr(runtime_concepts, "load_concepts", lambda spec: concepts_tiny)
    out = tmp_path / "out"
    code, stderr = run_cli("track", two_frames, "--text", "disc,square", *RANDOM, "--out", out)
    assert code == EXIT_OK, stderr
    summary = json.loads((out / track.SUMMARY_NAME).read_text())
    phrases = ["disc", "square"]
    assert summary["concepts"]["phrases"] == phrases
    names = {int(obj): name for obj, name in summary["names"].items()}
    assert set(names.values()) == set(phrases)  # random weights find both
    assert all(name == phrases[obj % 2] for obj, name in names.items())
    assert {o["obj_id"]: o["name"] for o in summary["concepts"]["objects"]} == names
    for i in range(2):
        frame = json.loads((out / f"frame_{i:05d}.json").read_text())
        assert frame["objects"] and all(
            o["name"] == phrases[o["obj_id"] % 2] for o in frame["objects"]
        )
