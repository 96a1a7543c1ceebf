"""Where a replica's ``sam2serve export`` artifacts come from: a local (or NFS) directory,
or an fsspec URI (``s3://``, ``gs://``, ``file://``, ...) copied once into a local cache.

A copy is keyed by the sha256 of the remote ``manifest.json``, written to a temporary
directory and renamed into place, so replicas starting together on one node never see a
half-written copy and a re-export under the same URI gets a fresh one. Either way the
files are then loaded with :func:`sam2serve.runtime.export.load_artifacts`, which checks
every file's sha256, the model, the mode and the runtime against the manifest.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from sam2serve.cache import cache_path
from sam2serve.runtime.export import MANIFEST, ArtifactError


@dataclass(frozen=True)
class LocalArtifacts:
    """A local directory holding the artifacts, and how it was obtained."""

    directory: Path
    source: str  # the path or URI the configuration named
    copied: bool  # True when fetched through fsspec on this start
    manifest_sha256: str
    fetch_s: float


def is_uri(location: str) -> bool:
    """True for ``scheme://...`` (fsspec), False for a plain path."""
    return "://" in location


def resolve_artifacts(location: str, cache_dir: str | Path | None = None) -> LocalArtifacts:
    """A local directory with the artifacts at ``location`` (path or fsspec URI)."""
    started = time.perf_counter()
    if not is_uri(location):
        directory = Path(location).expanduser()
        if not directory.is_dir():
            raise ArtifactError(
                f"artifacts directory {location!r} does not exist; make it with "
                "'sam2serve export --out DIR' on storage every replica can read"
            )
        manifest = directory / MANIFEST
        if not manifest.is_file():
            raise ArtifactError(
                f"no {MANIFEST} in artifacts directory {location!r}: not a 'sam2serve export' "
                "directory"
            )
        digest = hashlib.sha256(manifest.read_bytes()).hexdigest()
        return LocalArtifacts(directory, location, False, digest, time.perf_counter() - started)
    return _fetch(location, Path(cache_dir or cache_path("artifacts")), started)


def _fetch(uri: str, cache_dir: Path, started: float) -> LocalArtifacts:
    import fsspec

    try:
        fs, root = fsspec.core.url_to_fs(uri)
    except (ImportError, ValueError) as exc:  # unknown scheme, missing s3fs/gcsfs, ...
        raise ArtifactError(f"cannot open artifacts URI {uri!r}: {exc}") from None
    root = root.rstrip("/")
    try:
        manifest_bytes = fs.cat_file(f"{root}/{MANIFEST}")
    except FileNotFoundError:
        raise ArtifactError(
            f"no {MANIFEST} at artifacts URI {uri!r}: not a 'sam2serve export' directory"
        ) from None
    except OSError as exc:
        raise ArtifactError(f"cannot read {MANIFEST} at {uri!r}: {exc}") from None
    digest = hashlib.sha256(manifest_bytes).hexdigest()
    target = cache_dir / digest[:32]
    if (target / MANIFEST).is_file():
        return LocalArtifacts(target, uri, False, digest, time.perf_counter() - started)
    try:
        files = list(json.loads(manifest_bytes)["files"])
    except (ValueError, KeyError, TypeError) as exc:
        raise ArtifactError(f"{MANIFEST} at {uri!r} has no file list: {exc!r}") from None
    cache_dir.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{digest[:12]}-", dir=cache_dir))
    try:
        for name in files:
            if "/" in name or name.startswith("."):
                raise ArtifactError(f"{MANIFEST} at {uri!r} names an unsafe file {name!r}")
            try:
                fs.get_file(f"{root}/{name}", str(staging / name))
            except FileNotFoundError:
                raise ArtifactError(f"{name} is missing at artifacts URI {uri!r}") from None
        # The manifest last: a directory with a manifest is complete.
        (staging / MANIFEST).write_bytes(manifest_bytes)
        try:
            staging.rename(target)
        except OSError:  # another replica on this node renamed its copy first
            if not (target / MANIFEST).is_file():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return LocalArtifacts(target, uri, True, digest, time.perf_counter() - started)
