"""``sam2serve track --text PHRASE --box X1,Y1,X2,Y2 --direction both``: SAM 3's video
predictor with an exemplar box and Meta's propagation directions; bad values refused in
one line before a model loads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from PIL import Image

from sam2serve.commands import track
from sam2serve.commands.common import EXIT_OK, EXIT_USAGE
from sam2serve.samples import sample_clip
from tests.commands.test_track import SIZE, run_cli

RANDOM = ("--random-weights", "--sam3-size", "tiny")


@pytest.fixture(scope="module")
def three_frames(tmp_path_factory) -> Path:
    frames, _ = sample_clip(num_frames=3, size=SIZE)
    folder = tmp_path_factory.mktemp("frames3")
    for i, frame in enumerate(frames):
        Image.fromarray(frame).save(folder / f"{i}.png")
    return folder


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (("--text", "disc", "--box", "1,2,3"), "--box must be four numbers X1,Y1,X2,Y2"),
        (("--text", "disc", "--box", "a,b,c,d"), "--box must be four numbers"),
        (("--text", "disc", "--box", "0,0,9999,10"), "--box: box [0.0, 0.0, 9999.0, 10.0] is "),
        (("--text", "disc", "--box", "5,5,2,9"), "is empty"),
        (("--text", "visual"), "--text visual is Meta's stand-in for the box alone"),
        (("--text", "disc", "--box", "0,0,4,4", "--tracker", "sam2.1"), "--tracker sam3 option"),
        (("--text", "disc", "--direction", "both", "--tracker", "sam2.1"), "sam3 option"),
        (("--box", "0,0,4,4"), "give --text PHRASES too"),
        (("--direction", "backward"), "give --text PHRASES too"),
        (("--text", "disc", "--direction", "sideways"), "invalid choice: 'sideways'"),
    ],
)
def test_bad_prompts_are_refused(three_frames, tmp_path, monkeypatch, argv, expected):
    from sam2serve.concepts import video_load

    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the request was checked")

    monkeypatch.setattr(video_load, "video_predictor", refuse)
    monkeypatch.setattr(track, "_load_predictor", refuse)
    code, stderr = run_cli("track", three_frames, *argv, *RANDOM, "--out", tmp_path / "o")
    assert code == EXIT_USAGE, stderr
    assert expected in stderr and "Traceback" not in stderr


def test_box_and_backward(three_frames, tmp_path, concepts_tiny, monkeypatch):
    """A box on frame 2, backward (Meta's pass: frames 1 and 0; frame 2's answer is the
    prompt's, not propagation's): their frame files, and track.json naming the prompt."""
    from sam2serve.runtime import concepts as runtime_concepts

    monkeypatch.setattr(runtime_concepts, "load_concepts", lambda spec: concepts_tiny)
    out = tmp_path / "out"
    argv = ("--text", "disc", "--box", "10,10,60,50", "--concept-frame", "2")
    code, stderr = run_cli("track", three_frames, *argv, "--direction", "backward",
                           "--max-instances", "2", *RANDOM, "--out", out)  # fmt: skip
    assert code == EXIT_OK, stderr
    summary = json.loads((out / track.SUMMARY_NAME).read_text())
    concepts = summary["concepts"]
    assert concepts["box"] == [10.0, 10.0, 60.0, 50.0] and concepts["direction"] == "backward"
    written = sorted(p.name for p in out.glob("frame_*.json"))
    assert written == ["frame_00000.json", "frame_00001.json"]
    for obj in concepts["objects"]:
        assert 0 <= obj["first_frame"] <= obj["last_frame"] <= 1


def test_directions_are_the_predictors():
    from sam2serve.commands.track_concepts import DIRECTIONS
    from sam2serve.concepts.video_prompts import DIRECTIONS as PREDICTOR_DIRECTIONS

    assert DIRECTIONS == PREDICTOR_DIRECTIONS  # the flag's choices, kept torch-free
