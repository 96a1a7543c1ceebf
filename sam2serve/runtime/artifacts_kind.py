"""What kind of 'sam2serve export' directory a path is, and so which backend runs it:
torch-free, so the CLI and the server settings can choose before anything loads.

An ONNX export (``export --format onnx``: manifest format ``onnx``) runs on backend
``onnxruntime``; any other directory on ``artifacts``, whose loader then names whatever is
wrong with it (a missing or unreadable manifest included).
"""

from __future__ import annotations

import json
from pathlib import Path

ONNX_FORMAT = "onnx"
MANIFEST = "manifest.json"


def backend_for_artifacts(directory: str | Path) -> str:
    """``onnxruntime`` for an ONNX export, else ``artifacts`` (also for a URI or a
    directory that cannot be read here: the artifacts loader reports those)."""
    try:
        manifest = json.loads((Path(directory) / MANIFEST).read_text())
    except (OSError, ValueError):
        return "artifacts"
    if isinstance(manifest, dict) and manifest.get("format") == ONNX_FORMAT:
        return "onnxruntime"
    return "artifacts"


__all__ = ["ONNX_FORMAT", "backend_for_artifacts"]
