"""The ONNX video export: docs/video.md's plain onnxruntime + numpy loop, run where neither
sam2serve nor torch can be imported, tracks a click and a box through a clip as the engine's
VideoPredictor does on the same weights; the graphs answer as the model's own methods where
the loop does not reach (no pointers, a mask input, single-mask output); the manifest
describes them; the command's flags."""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

pytest.importorskip("onnxruntime")
from sam2serve.checkpoint import load_video_model, random_state_dict
from sam2serve.config import get_config
from sam2serve.engine.video import VideoPredictor
from sam2serve.engine.video.predictor import VideoPromptError
from sam2serve.modeling.sam2_video import FrameFeatures, SAM2Video, SpatialMemory
from sam2serve.modeling.sine_encoding import grid_sine_encoding
from sam2serve.runtime.build import build_predictor
from sam2serve.runtime.cache_entry import sha256_file
from sam2serve.runtime.onnx_export import OnnxArtifactError, check_onnx_manifest, export_onnx
from sam2serve.runtime.onnx_video import (
    FRAME_ENCODER_ONNX,
    MEMORY_ATTENTION_ONNX,
    VIDEO_DECODER_ONNX,
    VIDEO_GRAPHS,
    signatures,
)
from sam2serve.runtime.ort_video import OrtVideoModel
from sam2serve.runtime.spec import RuntimeSpec, WeightsSource
from sam2serve.runtime.video import build_video_predictor
from sam2serve.samples import sample_clip, sample_clip_prompts

ROOT = Path(__file__).resolve().parents[2]
LOOP = ROOT / "docs" / "onnx_video_loop.py"
SEED = 0
# Three frames: frame 2 reads two memories and two pointers (their order and temporal
# slots matter); the extended test below slides the whole 7-memory window.
NUM_FRAMES = 3
FRAME_SIZE = (96, 128)
LOGIT_ATOL = 1e-4
MIN_IOU = 0.99

# The tests that need the video graphs exported (about a minute on 2 cores, and each tracks
# a clip twice): the second tier. The image graphs are tested in the first (test_onnx.py).
EXPORTED = pytest.mark.extended


def memory_sensitive_checkpoint(path: Path) -> Path:
    """Seeded random weights (Meta's key set) with the memory path's temporal embeddings
    and pointer projections scaled up: at the seeded 0.02 scale a memory's temporal slot
    or a pointer's position moves the logits by less than LOGIT_ATOL, so a loop that read
    the wrong slots would still pass; scaled, each moves them by ~1e-3 or more."""
    state = random_state_dict(get_config("tiny"), SEED, video=True)
    state["maskmem_tpos_enc"] = state["maskmem_tpos_enc"] * 30
    for key in ("obj_ptr_tpos_proj", "obj_ptr_proj.layers.2"):
        for part in ("weight", "bias"):
            state[f"{key}.{part}"] = state[f"{key}.{part}"] * 10
    torch.save({"model": state}, path)
    return path


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    return memory_sensitive_checkpoint(tmp_path_factory.mktemp("ckpt") / "sam2.1_hiera_tiny.pt")


@pytest.fixture(scope="module")
def exported(checkpoint, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("onnx") / "tiny-video"
    export_onnx("tiny", "fast", out, checkpoint=str(checkpoint), video=True, command="test")
    return out


def write_clip(directory: Path, num_frames: int) -> tuple[list[str], list[np.ndarray], dict]:
    """The sample clip as PNG files (what the loop reads), the frames read back, and its
    prompts (a click on the disc, a box around the square, frame 0)."""
    frames, truth = sample_clip(num_frames, FRAME_SIZE)
    paths = []
    for i, frame in enumerate(frames):
        paths.append(str(directory / f"{i:05d}.png"))
        Image.fromarray(frame).save(paths[-1])
    frames = [np.asarray(Image.open(path).convert("RGB")) for path in paths]
    return paths, frames, sample_clip_prompts(truth)


def engine_logits(checkpoint: Path, frames: list[np.ndarray], prompts: dict) -> np.ndarray:
    """(frames, objects, 1, H, W): the engine's tracked logits, propagated from frame 0."""
    predictor = VideoPredictor(load_video_model("tiny", checkpoint))
    state = predictor.init_state(frames)
    with torch.inference_mode():
        predictor.add_points(state, 0, 1, points=prompts[1]["points"], labels=[1])
        predictor.add_points(state, 0, 2, box=prompts[2]["box"])
        return np.stack([out.mask_logits.numpy() for out in predictor.propagate(state)])


# Runs the loop as a script where sam2serve, torch and Meta's sam2 cannot be imported (they
# are installed here, so a finder refuses them), and checks that none was imported.
ISOLATED = textwrap.dedent(
    """
    import importlib.abc
    import runpy
    import sys

    class Refuse(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.partition(".")[0] in {"sam2serve", "torch", "sam2"}:
                raise ImportError(f"{name} is not available to the plain loop")
            return None

    sys.meta_path.insert(0, Refuse())
    try:
        import sam2serve  # noqa: F401
    except ImportError:
        pass
    else:
        raise SystemExit("sam2serve is importable")
    sys.argv = sys.argv[1:]
    runpy.run_path(sys.argv[0], run_name="__main__")
    assert not {"sam2serve", "torch"} & set(sys.modules)
    """
)


def run_loop(exported: Path, paths: list[str], prompts: dict, out: Path) -> str:
    click, box = prompts[1]["points"][0], prompts[2]["box"]
    args = [str(LOOP), str(exported), *paths, "--click", *map(str, click)]
    args += ["--box", *map(str, box), "--out", str(out)]
    run = subprocess.run(
        [sys.executable, "-I", "-c", ISOLATED, *args],
        cwd=out.parent,
        capture_output=True,
        text=True,
        timeout=1200,
        check=False,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    return run.stdout


def assert_tracks_alike(loop: np.ndarray, engine: np.ndarray) -> None:
    assert loop.shape == engine.shape
    for frame_idx, (ours, ref) in enumerate(zip(loop, engine)):
        diff = np.abs(ours - ref).max()
        assert diff <= LOGIT_ATOL, f"frame {frame_idx}: logits differ by {diff:.3g}"
        for row in range(len(ref)):
            a, b = ours[row, 0] > 0, ref[row, 0] > 0
            assert b.any(), f"frame {frame_idx} object {row}: the engine's mask is empty"
            iou = (a & b).sum() / (a | b).sum()
            assert iou >= MIN_IOU, f"frame {frame_idx} object {row}: IoU {iou:.4f}"


@pytest.fixture(scope="module")
def clip(tmp_path_factory) -> tuple[list[str], list[np.ndarray], dict]:
    return write_clip(tmp_path_factory.mktemp("clip"), NUM_FRAMES)


@pytest.fixture(scope="module")
def engine_tracked(checkpoint, clip) -> np.ndarray:
    _, frames, prompts = clip
    return engine_logits(checkpoint, frames, prompts)


@EXPORTED
def test_plain_loop_tracks_as_the_engine(exported, clip, engine_tracked, tmp_path):
    paths, _, prompts = clip
    stdout = run_loop(exported, paths, prompts, tmp_path / "masks.npz")
    assert re.search(rf"{NUM_FRAMES} frames in [\d.]+ s", stdout), stdout
    loop = np.load(tmp_path / "masks.npz")["logits"]
    assert_tracks_alike(loop, engine_tracked)


def onnx_video_predictor(exported: Path) -> VideoPredictor:
    spec = RuntimeSpec(model="tiny", mode="fast", backend="onnxruntime")
    predictor = build_video_predictor(spec, WeightsSource(artifacts=str(exported)))
    assert isinstance(predictor.model, OrtVideoModel)
    assert predictor.runtime is not None and predictor.runtime.backend == "onnxruntime"
    return predictor


def backend_logits(exported: Path, frames: list[np.ndarray], prompts: dict) -> np.ndarray:
    """engine_logits with backend onnxruntime."""
    predictor = onnx_video_predictor(exported)
    state = predictor.init_state(frames)
    predictor.add_points(state, 0, 1, points=prompts[1]["points"], labels=[1])
    predictor.add_points(state, 0, 2, box=prompts[2]["box"])
    return np.stack([out.mask_logits.numpy() for out in predictor.propagate(state)])


@EXPORTED
def test_onnxruntime_backend_tracks_as_the_engine(exported, clip, engine_tracked):
    """build_video_predictor with backend onnxruntime and the export as artifacts: the
    VideoPredictor with its model calls in ORT, the same tracks as eager."""
    _, frames, prompts = clip
    assert_tracks_alike(backend_logits(exported, frames, prompts), engine_tracked)
    # Mask prompts have no graph: refused, named.
    predictor = onnx_video_predictor(exported)
    state = predictor.init_state(frames)
    with pytest.raises(VideoPromptError, match="mask prompts have no ONNX graph"):
        predictor.add_mask(state, 1, 3, np.ones(FRAME_SIZE, bool))


@EXPORTED
def test_onnxruntime_tracking_needs_the_video_graphs(exported, tmp_path):
    """An export without --video, no artifacts, artifacts with eager: each refused, named."""
    image_only = tmp_path / "image-only"
    image_only.mkdir()
    manifest = json.loads((exported / "manifest.json").read_text())
    for name in manifest["files"]:
        (image_only / name).symlink_to(exported / name)
    (image_only / "manifest.json").write_text(json.dumps({**manifest, "video": None}))
    spec = RuntimeSpec(model="tiny", mode="fast", backend="onnxruntime")
    with pytest.raises(OnnxArtifactError, match="has no video graphs: export it with --video"):
        build_video_predictor(spec, WeightsSource(artifacts=str(image_only)))
    with pytest.raises(ValueError, match="give its directory as the artifacts"):
        build_video_predictor(spec, WeightsSource(random_weights=True))
    eager = RuntimeSpec(model="tiny", mode="fast")
    with pytest.raises(ValueError, match="eager tracking loads a checkpoint"):
        build_video_predictor(eager, WeightsSource(artifacts=str(exported)))


@pytest.mark.extended
@pytest.mark.slow
def test_plain_loop_tracks_as_the_engine_through_a_full_memory_window(
    exported, checkpoint, tmp_path
):
    """Nine frames: from frame 7 on the bank holds the prompted frame and the 6 frames
    before (num_maskmem 7), frame 8's no longer frame 1's; 8 pointers by then. The loop
    and backend onnxruntime both."""
    paths, frames, prompts = write_clip(tmp_path, 9)
    run_loop(exported, paths, prompts, tmp_path / "masks.npz")
    loop = np.load(tmp_path / "masks.npz")["logits"]
    engine = engine_logits(checkpoint, frames, prompts)
    assert_tracks_alike(loop, engine)
    assert_tracks_alike(backend_logits(exported, frames, prompts), engine)


def test_docs_show_the_loop_that_is_tested():
    text = (ROOT / "docs" / "video.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.DOTALL)
    assert LOOP.read_text() in blocks


# ---------------------------------------------------------------- graphs and manifest


@pytest.fixture(scope="module")
def sessions(exported):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    return {
        name: ort.InferenceSession(
            str(exported / name), options, providers=["CPUExecutionProvider"]
        )
        for name in VIDEO_GRAPHS
    }


@EXPORTED
def test_graphs_answer_as_the_model_where_the_loop_does_not_reach(checkpoint, sessions):
    """Memory attention with no pointers (tracking from before the only prompted frame),
    the decoder with a mask input and single-mask output, against the engine's calls."""
    model = load_video_model("tiny", checkpoint)
    cpu = torch.device("cpu")
    generator = torch.Generator().manual_seed(1)
    vision_feats = torch.randn(1, 256, 64, 64, generator=generator)
    memories = torch.randn(1, 2, 64, 64, 64, generator=generator).bfloat16()
    unused = (torch.empty(0), torch.empty(0))  # the high-res features: heads only
    frame = FrameFeatures(vision_feats, grid_sine_encoding(256, 64, 64, cpu), unused)
    with torch.inference_mode():
        ref = model.condition_on_memory(
            frame,
            1,
            [SpatialMemory(memories[:, 0], 6), SpatialMemory(memories[:, 1], 0)],
            model.memory_position(cpu),
            None,
        )
    (ours,) = sessions[MEMORY_ATTENTION_ONNX].run(
        None,
        {
            "vision_feats": vision_feats.numpy(),
            "memory_features": memories.float().numpy(),
            "memory_tpos_index": np.array([6, 0]),
            "obj_ptrs": np.zeros((1, 0, 256), np.float32),
            "obj_ptr_tpos": np.zeros(0, np.float32),
        },
    )
    np.testing.assert_allclose(ours, ref.numpy(), atol=LOGIT_ATOL)

    pix_feat = torch.randn(2, 256, 64, 64, generator=generator)
    high_res = (
        torch.randn(1, 32, 256, 256, generator=generator),
        torch.randn(1, 64, 128, 128, generator=generator),
    )
    coords = torch.tensor([[[300.0, 400.0], [700.0, 650.0]], [[100.0, 900.0], [500.0, 80.0]]])
    labels = torch.tensor([[1, 0], [1, 1]], dtype=torch.int32)
    mask_input = 3 * torch.randn(2, 1, 256, 256, generator=generator)
    with torch.inference_mode():
        heads = model.forward_heads(pix_feat, high_res, coords, labels, mask_input, False)
    feeds = [pix_feat, *high_res, coords, labels.float(), mask_input, torch.ones(2)]
    feeds += [torch.tensor(False), torch.tensor([120, 90])]
    decoder = sessions[VIDEO_DECODER_ONNX]
    names = [i.name for i in decoder.get_inputs()]
    masks, low_res, obj_ptr, score = decoder.run(
        None, {name: t.numpy() for name, t in zip(names, feeds)}
    )
    np.testing.assert_allclose(low_res, heads.low_res_masks.numpy(), atol=LOGIT_ATOL)
    np.testing.assert_allclose(obj_ptr, heads.obj_ptr.numpy(), atol=LOGIT_ATOL)
    np.testing.assert_allclose(score, heads.object_score_logits.numpy(), atol=LOGIT_ATOL)
    assert masks.shape == (2, 1, 120, 90)


@EXPORTED
def test_manifest_describes_the_video_graphs(exported, sessions):
    manifest = json.loads((exported / "manifest.json").read_text())
    video = manifest["video"]
    assert video["graphs"] == signatures(SAM2Video(get_config("tiny")))
    assert list(video["graphs"]) == list(VIDEO_GRAPHS)
    for name, session in sessions.items():
        inputs, outputs = video["graphs"][name]["inputs"], video["graphs"][name]["outputs"]
        assert [i.name for i in session.get_inputs()] == list(inputs)
        assert [o.name for o in session.get_outputs()] == list(outputs)
        for graph_input in session.get_inputs():  # the dynamic axes are the graph's own
            assert graph_input.shape == inputs[graph_input.name], graph_input.name
    attention = video["graphs"][MEMORY_ATTENTION_ONNX]["inputs"]
    assert attention["memory_features"] == ["num_objects", "num_memories", 64, 64, 64]
    assert attention["obj_ptrs"] == ["num_objects", "num_pointers", 256]
    assert video["graphs"][FRAME_ENCODER_ONNX]["outputs"]["vision_feats"] == [1, 256, 64, 64]
    tracking = video["tracking"]
    assert (tracking["num_maskmem"], tracking["prompted_memory_tpos_index"]) == (7, 6)
    assert (tracking["max_obj_ptrs_in_encoder"], tracking["memory_temporal_stride"]) == (16, 1)
    for name in (*VIDEO_GRAPHS, "image_encoder.onnx", "heads.pt"):
        assert manifest["files"][name] == sha256_file(exported / name)
    check_onnx_manifest(manifest, exported, "tiny", "fast")
    # The image graphs beside them still serve images (heads.pt holds the image keys only).
    spec = RuntimeSpec(model="tiny", mode="fast", backend="onnxruntime")
    assert build_predictor(spec, WeightsSource(artifacts=str(exported))).model.image_encoder is None


def test_export_command_video_flag(monkeypatch, capsys, tmp_path):
    from sam2serve.cli import main
    from sam2serve.commands.common import EXIT_OK, EXIT_USAGE
    from sam2serve.runtime import onnx_export

    export = ["export", "--random-weights", "--out", str(tmp_path / "x")]
    assert main([*export, "--video"]) == EXIT_USAGE
    assert "--video exports ONNX graphs: use it with --format onnx" in capsys.readouterr().err
    assert main([*export, "--format", "onnx", "--video", "--mode", "int8"]) == EXIT_USAGE
    assert "tracking has no int8 path" in capsys.readouterr().err
    calls = []

    def fake_export(*args, **kwargs):
        calls.append(kwargs)
        return {
            "model": "tiny",
            "mode": "fast",
            "precision": "f32",
            "opset": 17,
            "video": {},
            "export_seconds": 1.0,
        }

    monkeypatch.setattr(onnx_export, "export_onnx", fake_export)
    assert main([*export, "--format", "onnx", "--video"]) == EXIT_OK
    assert calls[-1]["video"] is True
    assert "with the video graphs" in capsys.readouterr().err


# --------------------------------------------------------------------------- one seam


@EXPORTED
def test_both_models_track_through_the_engines_state(exported, checkpoint, clip, engine_tracked):
    """SAM2Video and OrtVideoModel are each a VideoModel (engine/video/model.py): a state
    built on each tracks a click and a box through the clip alike, and counts the same
    bytes per object and frame."""
    from sam2serve.engine.video.model import VideoModel
    from sam2serve.engine.video.state import object_frame_bytes

    _, frames, prompts = clip
    eager = load_video_model("tiny", checkpoint)
    ort = onnx_video_predictor(exported).model
    assert isinstance(eager, VideoModel) and isinstance(ort, VideoModel)
    assert object_frame_bytes(ort) == object_frame_bytes(eager)
    tracked = []
    for model in (eager, ort):
        predictor = VideoPredictor(model)
        state = predictor.init_state(frames)
        predictor.add_points(state, 0, 1, points=prompts[1]["points"], labels=[1])
        predictor.add_points(state, 0, 2, box=prompts[2]["box"])
        tracked.append(np.stack([out.mask_logits.numpy() for out in predictor.propagate(state)]))
    assert_tracks_alike(tracked[0], engine_tracked)
    assert_tracks_alike(tracked[1], engine_tracked)


@EXPORTED
def test_serve_video_tracks_with_the_onnx_export(exported, clip, engine_tracked):
    """`serve --video --backend onnxruntime --artifacts DIR` (the app built in process from
    its settings): the tracker is the export's video graphs, and an object clicked and
    propagated over HTTP gets the engine's masks."""
    from fastapi.testclient import TestClient

    from sam2serve.engine.rle import coco_to_rle, rle_to_mask
    from sam2serve.server.app import create_app
    from sam2serve.server.settings import ServerSettings

    _, frames, prompts = clip
    settings = ServerSettings.from_flat(
        model="tiny",
        mode="fast",
        backend="onnxruntime",
        artifacts=str(exported),
        video=True,
        warmup=False,
    )
    app = create_app(settings)
    videos = app.state.service.videos
    assert isinstance(videos.predictor.model, OrtVideoModel)
    assert videos.predictor.runtime.backend == "onnxruntime"
    files = []
    for i, frame in enumerate(frames):
        buffer = io.BytesIO()
        Image.fromarray(frame).save(buffer, format="PNG")
        files.append(("frame", (f"{i:05d}.png", buffer.getvalue(), "image/png")))
    ((x, y),) = prompts[1]["points"]
    click = {"frame_idx": 0, "obj_id": 1, "points": [{"x": x, "y": y}]}
    with TestClient(app) as client:
        created = client.post("/v1/videos", files=files)
        assert created.status_code == 201, created.text
        sid = created.json()["session_id"]
        prompted = client.post(f"/v1/videos/{sid}/prompts", json=click)
        assert prompted.status_code == 200, prompted.text
        with client.stream("POST", f"/v1/videos/{sid}/propagate", json={}) as stream:
            lines = [line for line in stream.iter_lines() if line.startswith("data: ")]
    events = [json.loads(line[len("data: ") :]) for line in lines]
    tracked = [event for event in events if "frame_idx" in event and "objects" in event]
    assert [event["frame_idx"] for event in tracked] == list(range(NUM_FRAMES))
    for event, want in zip(tracked, engine_tracked, strict=True):
        (obj,) = event["objects"]
        got = rle_to_mask(coco_to_rle(obj["segmentation"]))
        ref = want[0, 0] > 0
        iou = (got & ref).sum() / (got | ref).sum()
        assert iou >= MIN_IOU, f"frame {event['frame_idx']}: IoU {iou:.4f}"
