"""Trackers: what runs video tracking, one registry, torch-free (the image path's backends
are :mod:`sam2serve.runtime.backends`).

Each tracker is listed once in :data:`TRACKERS` with the devices and video modes it runs,
whether it starts from ``sam2serve export`` output (and which export format), and its
builder: a function ``(spec, weights, *, feature_cache_frames) -> VideoPredictor`` named
``"module:function"`` and imported only when it builds. Which one runs is
:func:`sam2serve.runtime.backend_choice.choose_tracker`'s answer; the predictor is built
by :func:`sam2serve.runtime.video.build_video_predictor`. Adding a tracker is one builder
plus one line here (its name must also be a backend of the image registry, whose checks
every RuntimeSpec passes).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from sam2serve.runtime.modes import VIDEO_MODES

if TYPE_CHECKING:
    from sam2serve.engine.video.predictor import VideoPredictor
    from sam2serve.runtime.spec import RuntimeSpec, WeightsSource


class TrackerBuilder(Protocol):
    """A tracker's builder (mypy checks each registered one against it)."""

    def __call__(
        self, spec: RuntimeSpec, weights: WeightsSource, *, feature_cache_frames: int = ...
    ) -> VideoPredictor: ...


@dataclass(frozen=True)
class TrackerInfo:
    name: str
    description: str
    builder: str  # "module:function"
    devices: tuple[str, ...]
    modes: tuple[str, ...]  # the video modes it tracks in
    # The 'sam2serve export' format it runs (manifest "format"); None: it loads weights.
    export_format: str | None = None
    export_command: str | None = None  # the command that writes it (what messages name)

    @property
    def needs_artifacts(self) -> bool:
        return self.export_format is not None

    def load(self) -> TrackerBuilder:
        module, _, function = self.builder.partition(":")
        builder: TrackerBuilder = getattr(importlib.import_module(module), function)
        return builder


EAGER_TRACKER = "eager"
COMPILE_TRACKER = "compile"
ONNX_TRACKER = "onnxruntime"

TRACKERS: dict[str, TrackerInfo] = {
    info.name: info
    for info in (
        TrackerInfo(
            EAGER_TRACKER,
            "PyTorch eager, every video mode, from a checkpoint or random weights",
            "sam2serve.runtime.video:build_eager_tracker",
            ("cpu", "cuda"),
            VIDEO_MODES,
        ),
        TrackerInfo(
            ONNX_TRACKER,
            "the video graphs of 'sam2serve export --format onnx --video' through ONNX "
            "Runtime (mode fast; no mask prompts)",
            "sam2serve.runtime.ort_video:load_onnx_video_predictor",
            ("cpu", "cuda"),
            ("fast",),
            export_format="onnx",
            export_command="sam2serve export --format onnx --video",
        ),
        TrackerInfo(
            COMPILE_TRACKER,
            "the eager tracker on static memory banks, its frame step's parts through "
            "torch.compile (kept in the compile cache), every video mode",
            "sam2serve.runtime.video:build_eager_tracker",
            ("cpu", "cuda"),
            VIDEO_MODES,
        ),
    )
}


# The names a user may give (besides auto).
VIDEO_BACKENDS: tuple[str, ...] = tuple(TRACKERS)


def get_tracker_info(name: str) -> TrackerInfo:
    try:
        return TRACKERS[name]
    except KeyError:
        raise ValueError(
            f"video tracking runs on backend {' or '.join(map(repr, TRACKERS))}, not {name!r}"
        ) from None


__all__ = [
    "COMPILE_TRACKER",
    "EAGER_TRACKER",
    "ONNX_TRACKER",
    "TRACKERS",
    "VIDEO_BACKENDS",
    "TrackerInfo",
    "get_tracker_info",
]
