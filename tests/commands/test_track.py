"""``sam2serve track``: its inputs are checked before the model loads (a usage error that
names the bad value), and a run writes one COCO RLE file per frame, the run's summary and
an overlay, with the masks the video predictor gives for the same prompts."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from sam2serve import cli
from sam2serve.commands import track
from sam2serve.commands.common import EXIT_OK, EXIT_USAGE
from sam2serve.engine.rle import coco_to_rle, rle_to_mask
from sam2serve.runtime.backend_choice import AUTO
from sam2serve.runtime.trackers import TRACKERS
from sam2serve.samples import sample_clip

SIZE = (64, 96)  # (height, width): small frames, the model resizes to 1024 anyway


def run_cli(*argv: str | Path) -> tuple[int, str]:
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr):
        code = cli.main([str(a) for a in argv])
    return code, stderr.getvalue()


@pytest.fixture
def no_model(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the model was loaded before the inputs were checked")

    monkeypatch.setattr(track, "_load_predictor", refuse)


@pytest.fixture(scope="module")
def frame_dir(tmp_path_factory) -> Path:
    frames, _ = sample_clip(num_frames=3, size=SIZE)
    folder = tmp_path_factory.mktemp("frames")
    for i, frame in enumerate(frames):
        Image.fromarray(frame).save(folder / f"{i}.png")
    return folder


def write_prompts(path: Path, data: object) -> Path:
    path.write_text(json.dumps(data))
    return path


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ([1, 2], "must hold a JSON object"),
        ({"x": {"1": {"points": [[1, 2]]}}}, "frame 'x' is not a non-negative integer"),
        ({"0": {"one": {"points": [[1, 2]]}}}, "object id 'one' is not a non-negative integer"),
        ({"0": {"1": {"points": [[1, "a"]]}}}, "expected [x, y] with two finite numbers"),
        ({"0": {"1": {"box": [5, 5, 1, 1]}}}, "is empty"),
        ({"0": {"1": {"points": [[1, 2]], "labels": [3]}}}, "a label is 1"),
        ({"7": {"1": {"points": [[1, 2]]}}}, "frame 7 is past the video's last frame"),
        (
            {"0": {"1": {"points": [[500, 2]]}}},
            "frame 0, object 1, points[0]: [500, 2] lies outside the 96x64 frame",
        ),
    ],
)
def test_bad_prompts_are_usage_errors(no_model, frame_dir, tmp_path, data, expected):
    prompts = write_prompts(tmp_path / "p.json", data)
    code, stderr = run_cli("track", frame_dir, "--prompts", prompts, "--out", tmp_path / "o")
    assert code == EXIT_USAGE
    assert expected in stderr and "Traceback" not in stderr


def test_bad_sources_and_flags_are_usage_errors(no_model, frame_dir, tmp_path):
    prompts = write_prompts(tmp_path / "p.json", {"0": {"1": {"points": [[10, 10]]}}})
    out = tmp_path / "o"
    cases = [
        (("track", tmp_path / "none.mp4", "--prompts", prompts), "no such video"),
        (("track", frame_dir), "--prompts FILE is required"),
        (("track", frame_dir, "--prompts", prompts, "--overlay", "x.png"), "must end in .mp4"),
        (("track", frame_dir, "--prompts", tmp_path / "missing.json"), "not found"),
        (("track", frame_dir, "--prompts", prompts, "--max-frames", "2"), "more than the limit"),
        (
            ("track", frame_dir, "--prompts", prompts, "--backend", "onnxruntime"),
            "give its directory as the artifacts (--artifacts DIR)",
        ),
        (
            ("track", frame_dir, "--prompts", prompts, "--backend", "eager", "--artifacts", out),
            "eager tracking loads a checkpoint or random weights, not artifacts",
        ),
        (
            ("track", frame_dir, "--prompts", prompts, "--artifacts", out, "--mode", "furious"),
            "backend 'onnxruntime' tracks in mode fast, not 'furious'",
        ),
    ]
    for argv, expected in cases:
        code, stderr = run_cli(*argv, "--out", out)
        assert code == EXIT_USAGE, stderr
        assert expected in stderr and "Traceback" not in stderr


@pytest.fixture(scope="module")
def tracked(frame_dir, tmp_path_factory):
    """One run: object 2 boxed on frame 0, object 1 clicked (one positive, one negative
    point) on frame 1."""
    tmp = tmp_path_factory.mktemp("track")
    prompts = {
        "1": {"1": {"points": [[35, 32], [80, 10]], "labels": [1, 0]}},
        "0": {"2": {"box": [60, 8, 90, 40]}},
    }
    path = write_prompts(tmp / "prompts.json", prompts)
    out = tmp / "out"
    code, stderr = run_cli(
        "track",
        frame_dir,
        "--prompts",
        path,
        "--out",
        out,
        "--random-weights",
        "--overlay",
        out / "clip.gif",
    )
    return code, stderr, out, prompts


def test_a_run_writes_every_frame_and_a_summary(tracked):
    code, stderr, out, _ = tracked
    assert code == EXIT_OK, stderr
    assert "RANDOM WEIGHTS" in stderr and "frames/s" in stderr
    files = sorted(out.glob("frame_*.json"))
    assert [f.name for f in files] == [f"frame_{i:05d}.json" for i in range(3)]
    for i, path in enumerate(files):
        frame = json.loads(path.read_text())
        assert frame["frame"] == i and frame["name"] == f"{i}.png"
        assert [o["obj_id"] for o in frame["objects"]] == [1, 2]
        for obj in frame["objects"]:
            mask = rle_to_mask(coco_to_rle(obj["segmentation"]))
            assert mask.shape == SIZE and obj["area"] == int(mask.sum())
    summary = json.loads((out / track.SUMMARY_NAME).read_text())
    assert summary["frames"] == 3 and summary["objects"] == [1, 2]
    assert summary["weights"]["random"] is True
    assert summary["timings"]["frames_tracked"] >= 3
    gif = Image.open(out / "clip.gif")
    assert gif.n_frames == 3 and gif.size == (SIZE[1], SIZE[0])


def test_the_masks_are_the_video_predictors(tracked, frame_dir):
    """The command adds the prompts and propagates both ways as the library does."""
    from sam2serve.checkpoint import load_video_model
    from sam2serve.engine.video.predictor import VideoPredictor
    from sam2serve.engine.video_io import read_frames

    _, _, out, _ = tracked
    frames = read_frames(frame_dir).frames
    predictor = VideoPredictor(load_video_model("tiny", random_weights=True, seed=0))
    state = predictor.init_state(frames)
    predictor.add_points(state, 0, 2, box=[60, 8, 90, 40])
    predictor.add_points(state, 1, 1, [[35, 32], [80, 10]], [1, 0])
    expected = {}
    for result in predictor.propagate(state, 0):
        order = np.argsort(result.obj_ids)  # the files list objects by id
        expected[result.frame_idx] = result.masks.numpy()[order]
    for i in range(3):
        frame = json.loads((out / f"frame_{i:05d}.json").read_text())
        got = np.stack([rle_to_mask(coco_to_rle(o["segmentation"])) for o in frame["objects"]])
        np.testing.assert_array_equal(got, expected[i])


def test_mode_must_be_a_video_mode(no_model, frame_dir, tmp_path):
    prompts = write_prompts(tmp_path / "p.json", {"0": {"1": {"points": [[10, 10]]}}})
    code, stderr = run_cli(
        "track", frame_dir, "--prompts", prompts, "--out", tmp_path / "o", "--mode", "int8"
    )
    assert code == EXIT_USAGE and "Traceback" not in stderr
    assert "--mode" in stderr and "'int8'" in stderr and "furious" in stderr


def test_mode_runs_the_tracker_that_way_and_is_recorded(tmp_path):
    """One frame (no tracked frame: the mode's plumbing, not its numerics) in furious:
    its dtype is the device's native reduced precision, float32 on a CPU without bf16."""
    from sam2serve.runtime.build import native_reduced_dtype

    folder = tmp_path / "frames"
    folder.mkdir()
    frames, _ = sample_clip(num_frames=1, size=SIZE)
    Image.fromarray(frames[0]).save(folder / "0.png")
    prompts = write_prompts(tmp_path / "p.json", {"0": {"1": {"points": [[35, 32]]}}})
    out = tmp_path / "out"
    code, stderr = run_cli(
        "track", folder, "--prompts", prompts, "--out", out, "--random-weights", "--mode", "furious"
    )
    assert code == EXIT_OK, stderr
    runtime = json.loads((out / track.SUMMARY_NAME).read_text())["runtime"]
    assert runtime["mode"] == "furious" and runtime["backend"] == "eager"
    assert runtime["dtype"] == native_reduced_dtype("cpu")
    assert f"mode furious, {runtime['dtype']}" in stderr


def test_a_video_file_is_decoded_on_demand_with_bounded_retention(monkeypatch, tmp_path):
    """A video file is read through VideoFileFrames (a few decoded frames held, never the
    whole clip), forward and back from the prompted frame, every frame written once. The
    network is stubbed (its cost is seconds a frame here; the masks are checked above)."""
    import torch

    from sam2serve.checkpoint import load_video_model
    from sam2serve.engine.video.predictor import VideoPredictor
    from sam2serve.engine.video.sources import VideoFileFrames
    from sam2serve.engine.video.state import FrameOutput
    from sam2serve.engine.video_io import write_video

    class StubNetwork(VideoPredictor):
        def init_state(self, frames, **kwargs):
            self.source = frames
            return super().init_state(frames, **kwargs)

        def frame_features(self, state, frame_idx):
            state.source.frame(frame_idx)
            self.held.append(state.source.held_frames())

        def _track_frame(self, state, tracks, frame_idx, **kwargs):
            self.frame_features(state, frame_idx)
            low_res = torch.ones(len(tracks), 1, 4, 4)
            outs = [
                FrameOutput(low_res[i : i + 1], torch.zeros(1, 8), torch.ones(1, 1), torch.zeros(1))
                for i in range(len(tracks))
            ]
            return outs, low_res

    stub = StubNetwork(load_video_model("tiny", random_weights=True, seed=0))
    stub.runtime = type("Runtime", (), {"as_dict": lambda self: {"stub": True}})()
    stub.held = []
    monkeypatch.setattr(track, "_load_predictor", lambda args, spec: (stub, {"random": True}))
    clip = tmp_path / "clip.mp4"
    write_video(clip, sample_clip(num_frames=30, size=SIZE)[0], fps=10)
    prompts = write_prompts(tmp_path / "p.json", {"12": {"1": {"points": [[30, 30]]}}})
    out = tmp_path / "out"
    code, stderr = run_cli(
        "track", clip, "--prompts", prompts, "--out", out, "--retention", "bounded"
    )
    assert code == EXIT_OK, stderr
    assert isinstance(stub.source, VideoFileFrames)
    assert max(stub.held) <= stub.source.window < 30
    files = sorted(out.glob("frame_*.json"))
    assert [f.name for f in files] == [f"frame_{i:05d}.json" for i in range(30)]
    summary = json.loads((out / track.SUMMARY_NAME).read_text())
    assert summary["frames"] == 30 and summary["retention"] == "bounded"
    assert "tracked 30 frames" in stderr


def test_backend_help_names_every_tracker_of_the_registry(capsys):
    """--backend's choices and help come from runtime.trackers: each tracker is offered
    and described there, with its devices (a tracker added to the registry cannot be left
    out of the help)."""
    assert cli.main(["track", "--help"]) == EXIT_OK
    help_text = " ".join(capsys.readouterr().out.split())
    assert f"--backend {{{','.join((AUTO, *TRACKERS))}}}" in help_text
    for info in TRACKERS.values():
        described = f"{info.name}: {info.description}, on {', '.join(info.devices)}"
        assert " ".join(described.split()) in help_text, info.name
