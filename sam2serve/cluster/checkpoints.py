"""Where a replica's checkpoint comes from: a local (or NFS) file, or an fsspec URI
(``s3://``, ``gs://``, ``file://``, ...) copied once into a local cache.

A copy is keyed by a digest of the URI and of what the storage reports about the file's
version (its size, and its ETag, generation or modification time where the filesystem
has one), so an unchanged file is fetched once per node and a file replaced under the
same URI gets a new copy. Reading the remote file only to hash it would double the
transfer of a checkpoint of up to 900 MB, so its sha256 is computed while it is copied
and kept next to it. The copy goes into a temporary directory that is renamed into place,
as :mod:`sam2serve.cluster.artifacts` does, so replicas starting together on one node
never load a half-written file.
"""

from __future__ import annotations

import hashlib
import json
import posixpath
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sam2serve.cache import cache_path
from sam2serve.checkpoint import CheckpointError
from sam2serve.cluster.artifacts import is_uri

SHA256_FILE = "sha256"  # written after the checkpoint: a copy with it is complete
CHUNK_BYTES = 8 << 20
# What fsspec filesystems report about a file's version (local: mtime; s3fs: ETag,
# LastModified; gcsfs: generation, md5Hash; ...). Any of them, with the size, keys a copy.
VERSION_KEYS = ("size", "ETag", "etag", "generation", "md5Hash", "LastModified", "mtime")


@dataclass(frozen=True)
class LocalCheckpoint:
    """A local checkpoint file, and how it was obtained."""

    path: Path
    source: str  # the path or URI the configuration named
    copied: bool  # True when fetched through fsspec on this start
    sha256: str  # of the file's bytes
    fetch_s: float


def resolve_checkpoint_file(location: str, cache_dir: str | Path | None = None) -> LocalCheckpoint:
    """A local file with the checkpoint at ``location`` (path or fsspec URI)."""
    started = time.perf_counter()
    if is_uri(location):
        return _fetch(location, Path(cache_dir or cache_path("checkpoints")), started)
    path = Path(location).expanduser()
    if not path.is_file():
        raise CheckpointError(
            f"checkpoint file {location!r} does not exist; put Meta's SAM 2.1 checkpoint on "
            "storage every replica can read, or give an fsspec URI"
        )
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(CHUNK_BYTES):
            digest.update(chunk)
    return LocalCheckpoint(path, location, False, digest.hexdigest(), time.perf_counter() - started)


def cache_key(uri: str, info: dict[str, Any]) -> str:
    """The cache directory name of ``uri`` in the version ``info`` (fsspec's ``info``)."""
    version = {key: str(info[key]) for key in VERSION_KEYS if key in info}
    text = json.dumps({"uri": uri, "version": version}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def _fetch(uri: str, cache_dir: Path, started: float) -> LocalCheckpoint:
    import fsspec

    try:
        fs, remote = fsspec.core.url_to_fs(uri)
    except (ImportError, ValueError) as exc:  # unknown scheme, missing s3fs/gcsfs, ...
        raise CheckpointError(f"cannot open checkpoint URI {uri!r}: {exc}") from None
    name = posixpath.basename(remote.rstrip("/"))
    try:
        info = fs.info(remote)
    except FileNotFoundError:
        raise CheckpointError(f"no checkpoint file at URI {uri!r}") from None
    except OSError as exc:
        raise CheckpointError(f"cannot read checkpoint URI {uri!r}: {exc}") from None
    if info.get("type") != "file" or not name or name.startswith("."):
        raise CheckpointError(f"checkpoint URI {uri!r} is not a file")
    target = cache_dir / cache_key(uri, info)
    if (target / SHA256_FILE).is_file() and (target / name).is_file():
        sha256 = (target / SHA256_FILE).read_text(encoding="ascii").strip()
        return LocalCheckpoint(target / name, uri, False, sha256, time.perf_counter() - started)
    cache_dir.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name[:12]}-", dir=cache_dir))
    copied = False
    try:
        digest = hashlib.sha256()
        try:
            with fs.open(remote, "rb") as source, (staging / name).open("wb") as out:
                while chunk := source.read(CHUNK_BYTES):
                    out.write(chunk)
                    digest.update(chunk)
        except OSError as exc:
            raise CheckpointError(f"cannot copy checkpoint URI {uri!r}: {exc}") from None
        # The digest last: a directory with it is complete.
        (staging / SHA256_FILE).write_text(digest.hexdigest(), encoding="ascii")
        try:
            staging.rename(target)
            copied = True
        except OSError:  # another replica on this node renamed its copy first: use that
            if not (target / SHA256_FILE).is_file():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    sha256 = (target / SHA256_FILE).read_text(encoding="ascii").strip()
    return LocalCheckpoint(target / name, uri, copied, sha256, time.perf_counter() - started)
