"""Second tier: SAM 3's video predictor with a phrase and an exemplar box on a middle
frame, propagated both ways, against Meta's ``Sam3VideoPredictor`` passes on its real
stack (``meta_venv.py``; ``meta_video_oracle.py`` with a prompt frame, box and direction),
reduced size, the sample clip: the same frames in the same order, ids, scores to 1e-6,
masks pixel for pixel."""

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
from sam2serve.concepts.engine import ExemplarBox, model_pixels
from sam2serve.concepts.model import Sam3Size, build_model
from sam2serve.concepts.tokenizer import load_tokenizer
from sam2serve.concepts.tracker_heads import TrackerNeck, neck_state
from sam2serve.concepts.video_association import VideoThresholds
from sam2serve.concepts.video_predictor import Sam3VideoPredictor
from sam2serve.concepts.video_tracker import Sam3Tracker, tracker_state
from sam2serve.samples import sample_clip

pytestmark = pytest.mark.extended

ORACLE = Path(__file__).resolve().parent / "meta_video_oracle.py"
FRAMES, HEIGHT, WIDTH, PHRASE, START = 5, 120, 160, "red disc", 2
BOX = (40.0, 30.0, 120.0, 90.0)  # exact in normalised binary either way


def test_box_both_ways_equals_meta_on_its_real_stack(tmp_path):
    size = Sam3Size.tiny()
    frames, _ = sample_clip(num_frames=FRAMES, size=(HEIGHT, WIDTH))
    detector = build_model(size)
    pixels = torch.cat([model_pixels(detector, [f]) for f in frames])
    np.save(tmp_path / "pixels.npy", pixels.numpy())
    x1, y1, x2, y2 = BOX
    request = {
        "size": size.as_dict(),
        "seed": 1,
        "pixels": str(tmp_path / "pixels.npy"),
        "height": HEIGHT,
        "width": WIDTH,
        "phrase": PHRASE,
        "frame": START,
        "box_xywh": [x1 / WIDTH, y1 / HEIGHT, (x2 - x1) / WIDTH, (y2 - y1) / HEIGHT],
        "direction": "both",
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
    expected = torch.load(tmp_path / "meta.pt", weights_only=False)

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
    session = predictor.start(FRAMES, HEIGHT, WIDTH, PHRASE, [ExemplarBox(BOX)])
    got = list(predictor.propagate_clip(session, frames.__getitem__, START, "both"))

    order = [*range(START, FRAMES), *range(START - 1, -1, -1)]
    assert [r.frame for r in got] == [e["frame"] for e in expected] == order
    for result, want in zip(got, expected, strict=True):
        assert result.obj_ids == want["obj_ids"], result.frame
        np.testing.assert_allclose(result.scores, want["probs"], atol=1e-6)
        assert (result.masks != want["masks"]).sum() == 0, result.frame
    assert any(r.obj_ids for r in got if r.frame < START)  # the backward pass found some
