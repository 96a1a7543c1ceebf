"""Backend openvino's image path, converted once and kept in the cache.

Converting the image path to OpenVINO takes tens of seconds for tiny (minutes for large,
and int8's NNCF quantisation minutes more); compiling the converted model for this CPU
takes seconds, and importing an already compiled one less. So the first start of a given
image path converts it and writes the result to ``$SAM2SERVE_CACHE/openvino/KEY/``: the
OpenVINO IR and the model compiled for this CPU. Later starts import it. The key is the
SHA-256 of what decides the converted model: the image path's weights (their bytes), the
mode's precision and calibration, the input size and the OpenVINO (and NNCF) versions; a
compiled model is only imported on a CPU of the name it was compiled on (else the IR is
compiled). Every file is checked against the entry's manifest before use: a damaged or
partial entry is ignored and written again. An entry is written to a temporary folder
and renamed into place, so two processes starting at once cannot read a half-written
one. ``sam2serve export`` is the explicit form of the same thing (a directory you ship).
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from sam2serve.cache import cache_path
from sam2serve.runtime.cache_entry import checked_manifest, publish, staging_folder, write_manifest

log = logging.getLogger("sam2serve.runtime")

CACHE_NAME = "openvino"
ENTRY_FORMAT = 1
IR_XML = "image_encoder.xml"
IR_BIN = "image_encoder.bin"
BLOB = "image_encoder.cpu.blob"

__all__ = ["CACHE_NAME", "cache_key", "cached_image_path", "weights_digest"]


def weights_digest(module: torch.nn.Module) -> str:
    """SHA-256 of a module's parameters and buffers (names, dtypes, shapes and bytes)."""
    digest = hashlib.sha256()
    for name, tensor in sorted(module.state_dict().items()):
        data = tensor.detach().to("cpu").contiguous()
        digest.update(f"{name}:{data.dtype}:{tuple(data.shape)};".encode())
        digest.update(data.view(torch.uint8).numpy().tobytes() if data.numel() else b"")
    return digest.hexdigest()


def cache_key(weights: str, precision: str, identity: dict[str, Any]) -> str:
    """The entry of an image path: its weights' digest, its precision and whatever else
    changes the converted model (``identity``: input size, versions, calibration)."""
    text = json.dumps(
        {"format": ENTRY_FORMAT, "weights": weights, "precision": precision, **identity},
        sort_keys=True,
    )
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def cached_image_path(
    key: str,
    cpu: str,
    convert: Callable[[], object],
    compile_model: Callable[[object], object],
    import_model: Callable[[bytes], object],
) -> tuple[object, str]:
    """The compiled image path of entry ``key`` and where it came from: imported from the
    cache (compiled on this CPU before), compiled from the cached IR, or converted now by
    ``convert()`` (an ``openvino.Model``), compiled, and written to the cache."""
    import openvino as ov

    entry = cache_path(CACHE_NAME) / key
    files = _checked_files(entry)
    if files is not None:
        try:
            if files.get("cpu") == cpu:
                return import_model((entry / BLOB).read_bytes()), "imported from the cache"
            return compile_model(str(entry / IR_XML)), "compiled from the cached IR"
        except (OSError, RuntimeError) as exc:  # damaged beyond its checksums: rebuild
            log.warning("OpenVINO cache entry %s unusable (%s): converting again", entry, exc)
    converted = convert()
    compiled = compile_model(converted)
    try:
        _write_entry(entry, lambda folder: ov.save_model(converted, folder / IR_XML), compiled, cpu)
    except OSError as exc:  # a read-only or full cache costs the next start, not this one
        log.warning("could not keep the converted image path in %s: %s", entry, exc)
    return compiled, "converted at start-up, kept in the cache"


def _checked_files(entry: Path) -> dict[str, Any] | None:
    """The entry's manifest when every file it lists is there with its checksum."""
    manifest, problems = checked_manifest(entry, ENTRY_FORMAT)
    return None if problems else manifest


def _write_entry(entry: Path, save_ir: Callable[[Path], None], compiled: Any, cpu: str) -> None:
    """``compiled``: an openvino.CompiledModel (openvino ships no type information)."""
    with staging_folder(entry) as staging:
        save_ir(staging)
        (staging / BLOB).write_bytes(compiled.export_model().getvalue())
        write_manifest(staging, {"format": ENTRY_FORMAT, "cpu": cpu}, (IR_XML, IR_BIN, BLOB))
        # An entry that is there was damaged (a complete one was returned before converting).
        publish(staging, entry, ENTRY_FORMAT)
