"""Which backend runs a mode, for images and for tracking: the one seam every surface asks
(torch-free).

Images (:func:`choose_backend`): the CLI's ``--backend``, the server's settings and a
cluster replica's config all hand their request here, and get back the backend name or
one error that names what is wrong:

- a backend named explicitly is checked against the source of the weights: the backends
  that run ``sam2serve export`` output (``artifacts``, ``onnxruntime``) need an export
  directory, the others need weights, and an ONNX export runs on ``onnxruntime`` only;
- none, or ``auto``: an export directory runs on the backend its manifest calls for
  (:func:`~sam2serve.runtime.artifacts_kind.backend_for_artifacts`); otherwise the mode's
  backend for this device and this host's ISA class (:func:`auto_backend`).

Tracking (:func:`choose_tracker`, the registry :mod:`sam2serve.runtime.trackers`): the same
rule over the trackers (``sam2serve track``, ``bench --task video``,
:func:`sam2serve.runtime.video.build_video_predictor`), with the mode and the device
checked against the tracker: none or ``auto`` is the tracker of the export directory's
format (``onnxruntime`` for an ONNX export; a directory not readable here too, whose
loader then says why), else ``eager``. A server tracks beside its images
(:func:`tracker_beside_images`): with the video graphs of the ONNX export it serves, on
``onnxruntime``; otherwise ``eager`` from the image model's weights, in the server's mode
(a mode the tracker does not run, int8, tracks as fast).
"""

from __future__ import annotations

from dataclasses import dataclass

from sam2serve.runtime.artifacts_kind import backend_for_artifacts, export_format, has_video_graphs
from sam2serve.runtime.auto_table import auto_row
from sam2serve.runtime.backends import BACKENDS
from sam2serve.runtime.host import HostIsa, host_isa
from sam2serve.runtime.modes import MODES, VIDEO_MODES, get_video_mode
from sam2serve.runtime.spec import default_backend
from sam2serve.runtime.trackers import EAGER_TRACKER, TRACKERS, TrackerInfo, get_tracker_info

__all__ = [
    "AUTO",
    "AUTO_DESCRIPTION",
    "BACKEND_CHOICES",
    "BackendChoiceError",
    "TrackerChoice",
    "auto_backend",
    "choose_backend",
    "choose_tracker",
    "tracker_beside_images",
]

AUTO = "auto"
AUTO_DESCRIPTION = (
    "the backend an export directory's manifest calls for (with --artifacts), else the "
    "fastest measured for the mode on this device and CPU class: openvino for furious on "
    "CPUs with native bf16 (AVX512-BF16, AMX) and for int8, eager otherwise "
    "(docs/benchmarks.md, 'Backend auto')"
)
# What a user may ask for: auto, or a backend of the registry.
BACKEND_CHOICES: tuple[str, ...] = (AUTO, *BACKENDS)


class BackendChoiceError(ValueError):
    """A backend that cannot run what was asked; the message names both."""


def auto_backend(mode: str, device: str, isa: HostIsa | None = None) -> str:
    """The backend ``auto`` picks for ``mode`` on ``device`` (``isa``: this host's CPU by
    default) without an export directory: the row of the CPU's class in
    :data:`~sam2serve.runtime.auto_table.AUTO_TABLE` (docs/benchmarks.md, 'Backend auto':
    OpenVINO for furious where bf16 is native, and for int8; eager otherwise). Off the CPU
    the mode's default backend."""
    if not device.startswith("cpu"):
        return default_backend(mode)
    row = auto_row((isa or host_isa()).isa_class)
    return row.backend(mode) if mode in MODES else default_backend(mode)


def choose_backend(requested: str | None, mode: str, device: str, artifacts: str | None) -> str:
    """The backend that runs ``mode`` on ``device`` from ``artifacts`` (an export
    directory) or from weights (``artifacts`` None)."""
    if requested is None or requested == AUTO:
        if artifacts is not None:
            return backend_for_artifacts(artifacts)
        return auto_backend(mode, device)
    if requested not in BACKENDS:
        raise BackendChoiceError(
            f"unknown backend {requested!r}; expected one of {', '.join(BACKEND_CHOICES)}"
        )
    runs_exports = BACKENDS[requested].needs_artifacts
    if runs_exports and artifacts is None:
        from_weights = ", ".join(n for n, info in BACKENDS.items() if not info.needs_artifacts)
        raise BackendChoiceError(
            f"backend {requested!r} runs 'sam2serve export' output: give the export "
            f"directory (artifacts), or a backend that starts from weights: {from_weights}"
        )
    if artifacts is not None and not runs_exports:
        raise BackendChoiceError(
            f"backend {requested!r} starts from weights, but {artifacts!r} is 'sam2serve "
            f"export' output: run it with backend {backend_for_artifacts(artifacts)!r} "
            "(or auto)"
        )
    if artifacts is not None and backend_for_artifacts(artifacts) != requested:
        raise BackendChoiceError(
            f"{artifacts!r} is run by backend {backend_for_artifacts(artifacts)!r}, not "
            f"{requested!r} (or leave the backend to auto)"
        )
    return requested


# --------------------------------------------------------------------------- tracking


@dataclass(frozen=True)
class TrackerChoice:
    """A server's tracker: its backend, its mode, and the export it runs (None: it loads
    the image model's weights)."""

    backend: str
    mode: str
    artifacts: str | None = None


def choose_tracker(requested: str | None, mode: str, device: str, artifacts: str | None) -> str:
    """The tracker that runs ``mode`` on ``device`` from ``artifacts`` (an export
    directory) or from weights (``artifacts`` None)."""
    try:
        get_video_mode(mode)
    except ValueError as exc:
        raise BackendChoiceError(str(exc)) from None
    if requested is None or requested == AUTO:
        info = (
            _tracker_for_artifacts(artifacts) if artifacts is not None else TRACKERS[EAGER_TRACKER]
        )
    else:
        try:
            info = get_tracker_info(requested)
        except ValueError as exc:
            raise BackendChoiceError(str(exc)) from None
    _check_tracker(info, mode, device, artifacts)
    return info.name


def tracker_beside_images(mode: str, device: str, artifacts: str | None) -> TrackerChoice:
    """The tracker of a server whose images run ``mode`` on ``device`` (from ``artifacts``,
    or from weights): the export's own tracker where the export holds the video graphs
    and that tracker runs the mode, else eager from the image model's weights."""
    video_mode = mode if mode in VIDEO_MODES else "fast"
    if artifacts is not None and has_video_graphs(artifacts):
        kind = export_format(artifacts)
        for info in TRACKERS.values():
            if (
                info.export_format == kind
                and video_mode in info.modes
                and device.split(":", 1)[0] in info.devices
            ):
                return TrackerChoice(info.name, video_mode, artifacts)
    return TrackerChoice(choose_tracker(None, video_mode, device, None), video_mode)


def _tracker_for_artifacts(artifacts: str) -> TrackerInfo:
    """The tracker of an export directory's format; one not readable here goes to the
    first tracker that runs exports, whose loader names what is wrong with it."""
    kind = export_format(artifacts)
    runners = [info for info in TRACKERS.values() if info.needs_artifacts]
    if kind is None:
        return runners[0]
    for info in runners:
        if info.export_format == kind:
            return info
    raise BackendChoiceError(
        f"{artifacts!r} is 'sam2serve export --format {kind}' output, which no tracker runs: "
        f"track from {_export_runners()}, or from a checkpoint or random weights "
        f"(backend {EAGER_TRACKER!r})"
    )


def _check_tracker(info: TrackerInfo, mode: str, device: str, artifacts: str | None) -> None:
    if mode not in info.modes:
        raise BackendChoiceError(
            f"backend {info.name!r} tracks in mode {' or '.join(info.modes)}, not {mode!r}"
        )
    if device.split(":", 1)[0] not in info.devices:
        raise BackendChoiceError(
            f"backend {info.name!r} tracks on {', '.join(info.devices)}, not on {device!r}"
        )
    if info.needs_artifacts and artifacts is None:
        raise BackendChoiceError(
            f"backend {info.name!r} tracks with the output of '{info.export_command}': give "
            "its directory as the artifacts (--artifacts DIR)"
        )
    if not info.needs_artifacts and artifacts is not None:
        raise BackendChoiceError(
            f"{info.name} tracking loads a checkpoint or random weights, not artifacts "
            f"({artifacts!r}): an export is tracked by {_export_runners()}"
        )
    kind = None if artifacts is None else export_format(artifacts)
    if info.needs_artifacts and kind is not None and kind != info.export_format:
        raise BackendChoiceError(
            f"{artifacts!r} is 'sam2serve export --format {kind}' output; backend "
            f"{info.name!r} tracks with --format {info.export_format}'s"
        )


def _export_runners() -> str:
    return " or ".join(
        f"backend {info.name!r} ('{info.export_command}')"
        for info in TRACKERS.values()
        if info.needs_artifacts
    )
