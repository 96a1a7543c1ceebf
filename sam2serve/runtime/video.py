"""The video tracker under a RuntimeSpec: what a mode means for tracking, and the one
constructor of a VideoPredictor from a spec and weights (``sam2serve track --mode``,
``sam2serve bench --task video``).

The modes' video meaning is declared in :mod:`sam2serve.runtime.modes`
(``video_description``); here it becomes the predictor's settings:

- ``baseline`` and ``fast``: Meta's tracker in eager fp32 (fast has no change of its own
  for tracking yet: see the modes' module).
- ``furious``: the image encoder on bf16 weights (the image path's CPU rule,
  :func:`~sam2serve.runtime.build.encoder_precision`, on CUDA too: autocast would convert
  every weight on every frame, since it caches no cast under inference mode) and memory
  attention in it too, on a bf16 copy of its weights with its inputs converted once
  (:meth:`~sam2serve.modeling.sam2_video.SAM2Video.memory_attention_in`: a tracked frame
  converts a handful of tensors, ``tests/video/test_furious_dtypes.py``), and where that
  precision is bf16 the memory encoder on bf16 weights as well (its inputs converted once,
  its memories stored in bf16 anyway); TF32 on CUDA where the process allows it (the
  other modes keep it off for their calls). The dtype is resolved as for images
  (:func:`~sam2serve.runtime.build.resolve_dtype`): on a CPU without native bf16 it is
  float32, and furious tracks exactly as baseline does.

Every mode's frame step batches the objects ``objects_per_call`` at a time: on a CPU the
measured row of its class and precision
(:data:`~sam2serve.runtime.auto_table.TRACKER_OBJECTS_TABLE`: one in float32; three in
bf16 on avx512_bf16 and AMX CPUs), on an accelerator all of them (:func:`objects_per_call_for`).

Trackers (:mod:`sam2serve.runtime.trackers`, chosen by
:func:`sam2serve.runtime.backend_choice.choose_tracker`): eager (every mode above),
``compile`` (every mode above: the eager tracker on static memory banks with memory
attention, memory encoder and the decoder's transformer through torch.compile,
:mod:`sam2serve.engine.video.compiled`; ``--mode fast+compile``), and ``onnxruntime`` (mode
fast, from the artifacts of ``sam2serve export --format onnx --video``: the predictor's model
calls run by the video graphs, :mod:`sam2serve.runtime.ort_video`). All hand the predictor
a :class:`~sam2serve.engine.video.model.VideoModel`. The other exported and compiled
backends cover the image path only.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import torch

from sam2serve.checkpoint import load_video_model
from sam2serve.engine.video.predictor import VideoPredictor
from sam2serve.modeling.sam2_video import SAM2Video
from sam2serve.runtime.auto_table import tracker_objects_row
from sam2serve.runtime.backend_choice import choose_tracker
from sam2serve.runtime.build import encoder_precision, load_spec_model, resolve_dtype
from sam2serve.runtime.host import HostIsa, host_isa
from sam2serve.runtime.modes import get_mode, get_video_mode
from sam2serve.runtime.spec import RuntimeSpec, WeightsSource
from sam2serve.runtime.trackers import (
    COMPILE_TRACKER,
    EAGER_TRACKER,
    get_tracker_info,
)

if TYPE_CHECKING:
    from sam2serve.runtime.compile_cache import CompileReport
    from sam2serve.runtime.trackers import TrackerBuilder

__all__ = [
    "build_eager_tracker",
    "build_video_predictor",
    "check_video_spec",
    "objects_per_call_for",
    "video_predictor_for",
]


def check_video_spec(spec: RuntimeSpec) -> None:
    """A ValueError naming what the tracker cannot run."""
    get_video_mode(spec.mode)
    assert spec.backend is not None
    get_tracker_info(spec.backend)


def build_video_predictor(
    spec: RuntimeSpec, weights: WeightsSource | None = None, *, feature_cache_frames: int = 2
) -> VideoPredictor:
    """The VideoPredictor ``spec`` describes, with ``weights`` (default: the official
    checkpoint from the cache; an export directory for a tracker that runs one), built by
    the spec's tracker once :func:`~sam2serve.runtime.backend_choice.choose_tracker` has
    checked the combination. Nothing process-wide is set here: threads and TF32 are the
    entry point's (:func:`sam2serve.runtime.process.configure_process`)."""
    check_video_spec(spec)
    assert spec.backend is not None
    weights = weights or WeightsSource()
    choose_tracker(spec.backend, spec.mode, spec.device, weights.artifacts)
    build = get_tracker_info(spec.backend).load()
    predictor: VideoPredictor = build(spec, weights, feature_cache_frames=feature_cache_frames)
    return predictor


def build_eager_tracker(
    spec: RuntimeSpec, weights: WeightsSource, *, feature_cache_frames: int = 2
) -> VideoPredictor:
    """Tracker ``eager``: SAM 2's video model from a checkpoint or random weights."""
    spec = resolve_dtype(spec)
    model = load_spec_model(spec, weights, load_video_model)
    assert isinstance(model, SAM2Video)
    return video_predictor_for(model, spec, feature_cache_frames=feature_cache_frames)


def video_predictor_for(
    model: SAM2Video, spec: RuntimeSpec, *, feature_cache_frames: int = 2
) -> VideoPredictor:
    """A VideoPredictor running ``model`` the way ``spec``'s mode says (it may convert the
    model in place: furious on a bf16 CPU casts its image encoder); eager, or compiled (backend compile)."""
    check_video_spec(spec)
    if spec.backend not in (EAGER_TRACKER, COMPILE_TRACKER):
        raise ValueError(
            f"a loaded model tracks on backend {EAGER_TRACKER!r} or {COMPILE_TRACKER!r}, "
            f"not {spec.backend!r}"
        )
    spec = resolve_dtype(spec)
    assert spec.dtype is not None
    reduced = getattr(torch, spec.dtype)
    mode = get_mode(spec.mode)
    attention = reduced if mode.reduced_precision_memory_attention else None
    encoder_autocast = encoder_precision(model, spec)
    if encoder_autocast is not None:
        # CUDA: the tracker's encoder on reduced weights, as on the CPU, not autocast, which
        # under inference mode converts every weight again on every frame.
        assert model.image_encoder is not None  # the tracker's model has its image path
        model.image_encoder.to(encoder_autocast)
    if attention == torch.bfloat16:
        # The memory encoder (1.76x faster in bf16 on a Zen 4 core) writes bf16 memories
        # anyway; fp16 would risk overflow in its un-normalised convolutions, so bf16 only.
        model.memory_encoder.to(torch.bfloat16)
    predictor = VideoPredictor(
        model,
        feature_cache_frames=feature_cache_frames,
        encoder_autocast_dtype=None,
        memory_attention_dtype=None if attention == torch.float32 else attention,
        runtime=spec,
        allow_tf32=mode.allow_tf32,
        objects_per_call=objects_per_call_for(spec.device, attention == torch.bfloat16),
    )
    if spec.backend == COMPILE_TRACKER:
        compile_cached_tracker(predictor, spec)
    return predictor


def objects_per_call_for(device: str, bf16: bool, isa: HostIsa | None = None) -> int | None:
    """How many tracked objects one frame step batches for a tracker on ``device`` whose
    frame step runs in bf16 (``bf16``) or float32: on a CPU the measured row of its class
    (``isa``: this host's by default) in
    :data:`~sam2serve.runtime.auto_table.TRACKER_OBJECTS_TABLE`; elsewhere None, the
    predictor's default for the device (every object in one call on an accelerator)."""
    if not device.startswith("cpu"):
        return None
    return tracker_objects_row((isa or host_isa()).isa_class).objects_per_call(bf16)


def compile_cached_tracker(
    predictor: VideoPredictor, spec: RuntimeSpec, root: Path | None = None
) -> CompileReport:
    """Compile ``predictor`` (backend compile) and warm it up (one object) through the
    compile cache: the first process keeps its compilation in ``$SAM2SERVE_CACHE/compile``
    (or ``root``), a later one with the same identity loads it instead of compiling."""
    from sam2serve.engine.video.compiled import compile_tracker, warm_up
    from sam2serve.runtime.compile_cache import CompileCached, compile_identity

    compile_tracker(predictor)
    assert spec.dtype is not None
    identity = {
        **compile_identity(spec.model, spec.mode, spec.dtype, predictor.device),
        "task": "video tracker, warm-up with 1 object",
        "image_size": predictor.model.image_size,
    }
    cached = CompileCached(lambda: warm_up(predictor), identity, root=root)
    cached()
    return cached.report


if TYPE_CHECKING:  # the registered builders, checked against the protocol
    _EAGER: TrackerBuilder = build_eager_tracker
