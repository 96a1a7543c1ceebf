"""One rule for which tracker runs a video mode (runtime.backend_choice.choose_tracker),
asked by `sam2serve track`, `bench --task video`, build_video_predictor and the server:
every combination that tracks answers as before the rule was shared, every other is
refused with a message naming the value."""

from __future__ import annotations

import argparse
import json

import pytest

from sam2serve.bench.runner import BenchError
from sam2serve.bench.video import _plan_video_modes
from sam2serve.bench.worker import tracker_spec
from sam2serve.commands.common import UsageError
from sam2serve.commands.track import video_spec
from sam2serve.runtime import backend_choice
from sam2serve.runtime.backend_choice import (
    BackendChoiceError,
    TrackerChoice,
    choose_tracker,
    tracker_beside_images,
)
from sam2serve.runtime.host import HostIsa
from sam2serve.runtime.spec import RuntimeSpec, WeightsSource
from sam2serve.runtime.trackers import TRACKERS
from sam2serve.runtime.video import build_video_predictor


@pytest.fixture
def exports(tmp_path):
    """Export directories by kind (manifests only: the rule reads nothing else)."""
    manifests = {
        "onnx-video": {"format": "onnx", "mode": "fast", "video": {"graphs": {}}},
        "onnx-image": {"format": "onnx", "mode": "fast", "video": None},
        "onnx-int8": {"format": "onnx", "mode": "int8", "video": None},
        "artifacts": {"format": "sam2serve-artifacts"},
    }
    paths = {None: None, "missing": str(tmp_path / "missing")}
    for kind, manifest in manifests.items():
        folder = tmp_path / kind
        folder.mkdir()
        (folder / "manifest.json").write_text(json.dumps(manifest))
        paths[kind] = str(folder)
    return paths


VIDEO_MODES = ("baseline", "fast", "furious")
# (requested backend, mode, device, export kind) -> the tracker, as `track` chose it before.
TRACKS = [
    *[(req, mode, dev, None, "eager") for req in (None, "auto", "eager") for mode in VIDEO_MODES
      for dev in ("cpu", "cuda", "cuda:1")],
    *[(req, "fast", dev, "onnx-video", "onnxruntime") for req in (None, "auto", "onnxruntime")
      for dev in ("cpu", "cuda")],
    # An export not readable here, or without the video graphs: its loader says why.
    (None, "fast", "cpu", "missing", "onnxruntime"),
    ("onnxruntime", "fast", "cpu", "missing", "onnxruntime"),
    (None, "fast", "cpu", "onnx-image", "onnxruntime"),
    # The compiled tracker (backend compile): every video mode, from weights.
    *[("compile", mode, dev, None, "compile") for mode in VIDEO_MODES for dev in ("cpu", "cuda")],
]  # fmt: skip
# (requested backend, mode, device, export kind) -> what the refusal names.
REFUSED = [
    (None, "int8", "cpu", None, "runs the modes baseline, fast, furious, not 'int8'"),
    ("eager", "int8", "cpu", None, "not 'int8'"),
    (None, "turbo", "cpu", None, "unknown mode 'turbo'"),
    ("openvino", "fast", "cpu", None, "'eager' or 'onnxruntime' or 'compile', not 'openvino'"),
    ("compile", "fast", "cpu", "onnx-video", "compile tracking loads a checkpoint or random"),
    ("bogus", "fast", "cpu", None, "not 'bogus'"),
    ("eager", "fast", "tpu", None, "tracks on cpu, cuda, not on 'tpu'"),
    ("onnxruntime", "fast", "cpu", None, "give its directory as the artifacts"),
    ("onnxruntime", "baseline", "cpu", "onnx-video", "tracks in mode fast, not 'baseline'"),
    (None, "furious", "cpu", "onnx-video", "backend 'onnxruntime' tracks in mode fast"),
    ("eager", "fast", "cpu", "onnx-video", "eager tracking loads a checkpoint or random weights"),
    (None, "fast", "cpu", "artifacts", "--format sam2serve-artifacts' output, which no tracker"),
    ("onnxruntime", "fast", "cpu", "artifacts", "tracks with --format onnx's"),
]


@pytest.mark.parametrize(("requested", "mode", "device", "kind", "expected"), TRACKS)
def test_the_combinations_that_track(exports, requested, mode, device, kind, expected):
    assert choose_tracker(requested, mode, device, exports[kind]) == expected
    args = argparse.Namespace(
        model="tiny", mode=mode, backend=requested, device=device, threads=None,
        artifacts=exports[kind],
    )  # fmt: skip
    assert video_spec(args).backend == expected  # `sam2serve track` asks the same rule


@pytest.mark.parametrize(("requested", "mode", "device", "kind", "message"), REFUSED)
def test_the_combinations_refused_name_the_value(exports, requested, mode, device, kind, message):
    with pytest.raises(BackendChoiceError, match=message.replace("(", r"\(")):
        choose_tracker(requested, mode, device, exports[kind])
    args = argparse.Namespace(
        model="tiny", mode=mode, backend=requested, device=device, threads=None,
        artifacts=exports[kind],
    )  # fmt: skip
    with pytest.raises(UsageError):
        video_spec(args)


def test_build_video_predictor_asks_the_rule_before_loading(exports):
    """Refused before any weights or graphs are read."""
    spec = RuntimeSpec(model="tiny", mode="fast", backend="eager")
    with pytest.raises(BackendChoiceError, match="eager tracking loads a checkpoint"):
        build_video_predictor(spec, WeightsSource(artifacts=exports["onnx-video"]))
    onnx = RuntimeSpec(model="tiny", mode="fast", backend="onnxruntime")
    with pytest.raises(BackendChoiceError, match="tracks with --format onnx's"):
        build_video_predictor(onnx, WeightsSource(artifacts=exports["artifacts"]))


def test_the_bench_tracks_the_rows_the_rule_gives_from_weights():
    assert _plan_video_modes(["baseline", "fast", "furious"], [], "cpu")
    assert _plan_video_modes(["baseline", "fast+compile", "furious+compile"], [], "cpu")
    for label in ("int8", "fast+onnxruntime", "fast+openvino"):
        with pytest.raises(BenchError, match=f"cannot run mode\\(s\\) {label.replace('+', '.')}"):
            _plan_video_modes(["baseline", label], [], "cpu")


@pytest.mark.parametrize(
    ("requested", "mode", "device"),
    [(req, mode, dev) for req, mode, dev, kind, _ in TRACKS if kind is None],
)
def test_the_bench_builds_the_tracker_track_builds(requested, mode, device):
    """A bench row (MODE, MODE+BACKEND) runs the spec `sam2serve track` runs for the same
    --mode, --backend and --device, from weights."""
    label = mode if requested is None else f"{mode}+{requested}"
    args = argparse.Namespace(
        model="small", mode=mode, backend=requested, device=device, threads=2, artifacts=None
    )
    assert tracker_spec(label, "small", device, 2) == video_spec(args)


def test_a_bench_auto_row_tracks_as_track_auto_on_a_bf16_cpu(monkeypatch):
    """Where the image rule's auto picks OpenVINO (furious on a CPU with native bf16), a
    video row MODE+auto still runs auto's tracker, as `sam2serve track --backend auto`."""
    monkeypatch.setattr(backend_choice, "host_isa", lambda: HostIsa(frozenset({"avx512_bf16"})))
    assert backend_choice.auto_backend("furious", "cpu") == "openvino"  # the image rule
    notes: list[str] = []
    assert _plan_video_modes(["baseline", "furious+auto"], notes, "cpu") == ["baseline", "furious"]
    args = argparse.Namespace(
        model="tiny", mode="furious", backend="auto", device="cpu", threads=None, artifacts=None
    )
    assert tracker_spec("furious", "tiny", "cpu", None) == video_spec(args)
    assert any("furious+auto ran as furious" in note for note in notes)


# (image mode, device, export kind) -> the server's tracker, as before (eager from the image
# model's weights, a mode the tracker does not run as fast) but for an export with the
# video graphs, which it now tracks with.
BESIDE_IMAGES = [
    ("baseline", "cpu", None, TrackerChoice("eager", "baseline")),
    ("fast", "cuda", None, TrackerChoice("eager", "fast")),
    ("furious", "cpu", None, TrackerChoice("eager", "furious")),
    ("int8", "cpu", None, TrackerChoice("eager", "fast")),
    ("int8", "cpu", "onnx-int8", TrackerChoice("eager", "fast")),
    ("fast", "cpu", "onnx-image", TrackerChoice("eager", "fast")),
    ("fast", "cpu", "artifacts", TrackerChoice("eager", "fast")),
    ("int8", "cpu", "artifacts", TrackerChoice("eager", "fast")),
    ("fast", "cpu", "missing", TrackerChoice("eager", "fast")),
    ("fast", "cpu", "onnx-video", "onnxruntime"),
    ("fast", "cuda:0", "onnx-video", "onnxruntime"),
]


@pytest.mark.parametrize(("mode", "device", "kind", "expected"), BESIDE_IMAGES)
def test_the_server_tracks_beside_its_images(exports, mode, device, kind, expected):
    choice = tracker_beside_images(mode, device, exports[kind])
    if expected == "onnxruntime":
        expected = TrackerChoice("onnxruntime", "fast", exports[kind])
    assert choice == expected


def test_every_tracker_is_an_image_backend_name_a_spec_accepts():
    """A RuntimeSpec checks its backend against the image registry: a tracker's name must
    pass there, in each mode it tracks in."""
    for info in TRACKERS.values():
        for mode in info.modes:
            assert RuntimeSpec(mode=mode, backend=info.name).backend == info.name
