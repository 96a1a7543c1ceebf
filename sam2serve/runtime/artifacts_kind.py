"""What kind of 'sam2serve export' directory a path is, and so which backend runs it:
torch-free, so the CLI and the server settings can choose before anything loads.

An ONNX export (``export --format onnx``: manifest format ``onnx``) runs on backend
``onnxruntime``; any other directory on ``artifacts``, whose loader then names whatever is
wrong with it (a missing or unreadable manifest included).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

ONNX_FORMAT = "onnx"
MANIFEST = "manifest.json"


def _manifest(directory: str | Path) -> dict[str, Any] | None:
    try:
        manifest = json.loads((Path(directory) / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    return manifest if isinstance(manifest, dict) else None


def backend_for_artifacts(directory: str | Path) -> str:
    """``onnxruntime`` for an ONNX export, else ``artifacts`` (also for a URI or a
    directory that cannot be read here: the artifacts loader reports those)."""
    return "onnxruntime" if export_format(directory) == ONNX_FORMAT else "artifacts"


def export_format(directory: str | Path) -> str | None:
    """The manifest's ``format``; None for a directory (or URI) that cannot be read here."""
    manifest = _manifest(directory)
    if manifest is None:
        return None
    kind = manifest.get("format")
    return kind if isinstance(kind, str) else None


def has_video_graphs(directory: str | Path) -> bool:
    """Whether the export holds the video path's graphs (``export --format onnx --video``:
    the manifest's ``video`` section)."""
    manifest = _manifest(directory)
    return manifest is not None and manifest.get("video") is not None


__all__ = ["ONNX_FORMAT", "backend_for_artifacts", "export_format", "has_video_graphs"]
