"""``sam2serve track --text PHRASE --click FRAME:OBJ:X,Y,LABEL[;...]``: clicks on SAM 3's
video objects after the pass, then Meta's partial pass; the frame files hold the final
answers (the predictor's own, in process), track.json records the clicks; bad values
refused in one line before a model loads."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from sam2serve.commands import track
from sam2serve.commands.common import EXIT_OK, EXIT_USAGE
from sam2serve.concepts.video_clicks import add_points, propagate
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
        (("--click", "1:0"), "--click '1:0': expected FRAME:OBJ:X,Y,LABEL"),
        (("--click", "a:0:5,5,1"), "FRAME and OBJ are whole numbers"),
        (("--click", "1:-2:5,5,1"), "FRAME and OBJ are >= 0"),
        (("--click", "1:0:5,5,2"), "LABEL is 1 (object) or 0 (background); got '2'"),
        (("--click", "1:0:5,5,1;7,x,0"), "X and Y are numbers; got '7,x,0'"),
        (("--click", "1:0:5,nan,1"), "X and Y are finite numbers"),
        (("--click", "1:0:5,5"), "X,Y,LABEL"),
        (("--click", "9:0:5,5,1"), "--click '9:0:5,5,1': click frame 9 is outside the clip's 0..2"),
        (("--click", "1:0:500,5,1"), "point (500, 5) is outside the"),
        # forward from frame 1: frame 0 is never answered, so there is nothing to refine
        (("--click", "0:0:5,5,1", "--concept-frame", "1"), "frame 0 has no answers yet"),
        (("--click", "1:0:5,5,1", "--tracker", "sam2.1"), "--click is a --tracker sam3 option"),
    ],
)
def test_bad_clicks_are_refused(three_frames, tmp_path, monkeypatch, argv, expected):
    from sam2serve.concepts import video_load
    from sam2serve.runtime import concepts as runtime_concepts

    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the request was checked")

    monkeypatch.setattr(video_load, "video_predictor", refuse)
    monkeypatch.setattr(runtime_concepts, "load_concepts", refuse)
    monkeypatch.setattr(track, "_load_predictor", refuse)
    argv = ("--text", "disc", *argv)
    code, stderr = run_cli("track", three_frames, *argv, *RANDOM, "--out", tmp_path / "o")
    assert code == EXIT_USAGE, stderr
    assert expected in stderr and "Traceback" not in stderr


def test_click_without_text_is_refused(three_frames, tmp_path):
    code, stderr = run_cli("track", three_frames, "--click", "0:0:5,5,1", "--out", tmp_path)
    assert code == EXIT_USAGE and "--click seeds objects from concepts" in stderr


def test_clicks_give_the_predictors_final_answers(
    three_frames, tmp_path, concepts_tiny, monkeypatch
):
    """A phrase forward from frame 1, clicks on frame 2 (an object found there: a positive and
    a negative point on its mask; a new object 99: one point): the frame files are the answers of the
    predictor's partial pass run in process on the same frames, and track.json records the
    clicks."""
    from sam2serve.commands.track_sam3 import thresholds
    from sam2serve.concepts.video_load import video_predictor
    from sam2serve.engine.rle import coco_to_rle, rle_to_mask
    from sam2serve.runtime import concepts as runtime_concepts

    monkeypatch.setattr(runtime_concepts, "load_concepts", lambda spec: concepts_tiny)
    frames = [np.asarray(Image.open(three_frames / f"{i}.png").convert("RGB")) for i in range(3)]
    args = type("Args", (), {"score_thresh": None, "random_weights": True, "max_instances": 20})
    predictor = video_predictor(concepts_tiny, thresholds(args))
    height, width = frames[0].shape[:2]
    state = predictor.start(3, height, width, "disc", interactive=True)
    first = list(propagate(predictor, state, frames.__getitem__, 1))
    on_two = first[-1]
    assert on_two.frame == 2 and on_two.obj_ids, "the scenario needs an object on frame 2"
    largest = int(on_two.masks.sum(axis=(1, 2)).argmax())  # overlaps may empty a mask
    obj = on_two.obj_ids[largest]
    ys, xs = np.nonzero(on_two.masks[largest])  # random weights: it may cover the frame
    inside = (int(xs[len(xs) // 2]), int(ys[len(ys) // 2]))
    outside = (int(xs[len(xs) // 5]), int(ys[len(ys) // 5]))  # a negative click on it
    add_points(predictor, state, 2, frames[2], obj, [inside, outside], [1, 0])
    add_points(predictor, state, 2, frames[2], 99, [outside], [1])
    final = list(propagate(predictor, state, frames.__getitem__, 1))
    assert [r.frame for r in final] == [1, 2]
    # the clicks changed the answers (files of the first pass alone would differ)
    assert any(
        a.obj_ids != b.obj_ids or (a.masks != b.masks).any()
        for a, b in zip(first, final, strict=True)
    )

    out = tmp_path / "out"
    clicks = [f"2:{obj}:{inside[0]},{inside[1]},1;{outside[0]},{outside[1]},0"]
    clicks.append(f"2:99:{outside[0]},{outside[1]},1")
    argv = ["--text", "disc", "--concept-frame", "1"]
    for click in clicks:
        argv += ["--click", click]
    code, stderr = run_cli("track", three_frames, *argv, *RANDOM, "--out", out)
    assert code == EXIT_OK, stderr
    summary = json.loads((out / track.SUMMARY_NAME).read_text())
    assert summary["concepts"]["clicks"] == [
        {
            "frame": 2,
            "obj_id": obj,
            "points": [list(map(float, inside)), list(map(float, outside))],
            "labels": [1, 0],
        },
        {"frame": 2, "obj_id": 99, "points": [list(map(float, outside))], "labels": [1]},
    ]
    assert summary["objects"] == sorted({obj for r in final for obj in r.obj_ids})
    for result in final:
        written = json.loads((out / f"frame_{result.frame:05d}.json").read_text())
        assert [o["obj_id"] for o in written["objects"]] == result.obj_ids
        for obj, mask in zip(result.obj_ids, result.masks, strict=True):
            record = next(o for o in written["objects"] if o["obj_id"] == obj)
            assert (rle_to_mask(coco_to_rle(record["segmentation"])) == mask).all()
