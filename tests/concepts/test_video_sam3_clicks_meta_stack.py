"""Second tier: clicks on SAM 3's video objects against Meta's
``Sam3VideoInferenceWithInstanceInteractivity`` on its real stack (``meta_venv.py``;
``meta_video_oracle.py`` with clicks): a phrase on frame 0 of 5, forward; a click with
id 5 on frame 4 (a positive and a negative point) and one with a new id 20 on frame 2;
forward again (Meta's partial pass over both objects) - the same frames in the same
order, ids, scores to 1e-6, masks pixel for pixel, the clicks' answers too."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from meta_sam3_video import E2E_THRESHOLDS, META_NAMES
from meta_venv import venv_python

from sam2serve.concepts.checkpoint import load_strict, meta_to_transformers
from sam2serve.concepts.engine import model_pixels
from sam2serve.concepts.model import Sam3Size, build_model
from sam2serve.concepts.tokenizer import load_tokenizer
from sam2serve.concepts.tracker_heads import TrackerNeck, neck_state
from sam2serve.concepts.video_association import VideoThresholds
from sam2serve.concepts.video_clicks import add_points, propagate
from sam2serve.concepts.video_predictor import Sam3VideoPredictor
from sam2serve.concepts.video_tracker import Sam3Tracker, tracker_state
from sam2serve.samples import sample_clip

pytestmark = pytest.mark.extended

ORACLE = Path(__file__).resolve().parent / "meta_video_oracle.py"
FRAMES, HEIGHT, WIDTH, PHRASE = 5, 120, 160, "red disc"
# (frame, object id, points in the video's pixels, labels); an id the pass has not found
# is a new object either way, so the clicks need not know the pass's answers
CLICKS = [(4, 5, [(80.0, 60.0), (8.0, 8.0)], [1, 0]), (2, 20, [(40.0, 90.0)], [1])]


def _same(got, want) -> None:
    assert [r.frame for r in got] == [w["frame"] for w in want]
    for result, expected in zip(got, want, strict=True):
        assert result.obj_ids == expected["obj_ids"], result.frame
        np.testing.assert_allclose(result.scores, expected["probs"], atol=1e-6)
        assert (result.masks != expected["masks"]).sum() == 0, result.frame


def test_clicks_equal_meta_on_its_real_stack(tmp_path):
    size = Sam3Size.tiny()
    frames, _ = sample_clip(num_frames=FRAMES, size=(HEIGHT, WIDTH))
    detector = build_model(size)
    pixels = torch.cat([model_pixels(detector, [f]) for f in frames])
    np.save(tmp_path / "pixels.npy", pixels.numpy())
    request = {
        "size": size.as_dict(),
        "seed": 1,
        "pixels": str(tmp_path / "pixels.npy"),
        "height": HEIGHT,
        "width": WIDTH,
        "phrase": PHRASE,
        "frame": 0,
        "direction": "forward",
        "clicks": [
            (t, obj, [[x / WIDTH, y / HEIGHT] for x, y in points], labels)
            for t, obj, points, labels in CLICKS
        ],
        "settings": {META_NAMES[k]: v for k, v in E2E_THRESHOLDS.items()},
        "weights": str(tmp_path / "weights.pt"),
        "out": str(tmp_path / "meta.pt"),
    }
    (tmp_path / "request.json").write_text(json.dumps(request))
    done = subprocess.run(
        [str(venv_python()), str(ORACLE), str(tmp_path / "request.json")],
        capture_output=True,
        text=True,
        timeout=3000,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    state = torch.load(tmp_path / "weights.pt", weights_only=True)
    want_first, want_answers, want_second = torch.load(tmp_path / "meta.pt", weights_only=False)

    detector_state = {
        k: v for k, v in state.items() if k.startswith("detector.") and "sam2_convs" not in k
    }
    load_strict(detector, meta_to_transformers(detector_state))
    neck = TrackerNeck(size.vit_dim).eval()
    load_strict(neck, neck_state(state))
    tracker = Sam3Tracker(size.image_size).eval()
    load_strict(tracker, tracker_state(state))
    th = VideoThresholds(**E2E_THRESHOLDS)  # type: ignore[arg-type]  # a mixed dict
    predictor = Sam3VideoPredictor(detector.eval(), load_tokenizer(), neck, tracker, th)
    session = predictor.start(FRAMES, HEIGHT, WIDTH, PHRASE, interactive=True)
    first = list(propagate(predictor, session, frames.__getitem__, 0, "forward"))
    answers = [
        add_points(predictor, session, t, frames[t], obj, points, labels)
        for t, obj, points, labels in CLICKS
    ]
    second = list(propagate(predictor, session, frames.__getitem__, 0, "forward"))
    _same(first, want_first)
    _same(answers, want_answers)
    _same(second, want_second)
    assert any(r.obj_ids for r in second)  # something tracked after the clicks
