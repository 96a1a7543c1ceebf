"""A cache entry on disk: a folder of files and a ``manifest.json`` naming the entry's
format and each file's SHA-256.

Both caches that outlive a process (the OpenVINO image path, ``runtime.openvino_cache``;
torch's compiled kernels, ``runtime.compile_cache``) and every export format use it the
same way: an entry is written to a sibling staging folder and renamed into place, so a
process reading the cache never sees half of one; it is used only when its manifest has
the expected format and every file it lists is there with its checksum.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

MANIFEST = "manifest.json"

__all__ = [
    "MANIFEST",
    "checked_manifest",
    "file_problems",
    "publish",
    "read_manifest",
    "sha256_file",
    "staging_folder",
    "write_manifest",
]


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def file_problems(directory: Path, files: dict[str, str]) -> list[str]:
    """What is wrong with ``files`` (name -> sha256) in ``directory``: each one missing or
    not matching its checksum."""
    problems = []
    for name, expected in files.items():
        path = directory / name
        if not path.is_file():
            problems.append(f"{name} is missing")
        elif sha256_file(path) != expected:
            problems.append(f"{name} does not match its sha256 in the manifest")
    return problems


def read_manifest(entry: Path, entry_format: int | str) -> dict[str, Any] | None:
    """The manifest of ``entry``, or None if it has none, an unreadable one or another
    format."""
    try:
        manifest = json.loads((entry / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(manifest, dict) or manifest.get("format") != entry_format:
        return None
    return manifest


def checked_manifest(
    entry: Path, entry_format: int | str, names: Iterable[str] | None = None
) -> tuple[dict[str, Any] | None, list[str]]:
    """The manifest of ``entry`` and what is wrong with its files: none may be missing or
    differ from its checksum, and (given ``names``) the manifest must list exactly those.
    The manifest is None when ``entry`` is no entry of ``entry_format`` at all."""
    manifest = read_manifest(entry, entry_format)
    if manifest is None:
        return None, ["no manifest of this format"]
    files = manifest.get("files")
    if not isinstance(files, dict) or (names is not None and set(files) != set(names)):
        return manifest, ["its manifest lists no files" if not files else "unexpected files"]
    return manifest, file_problems(entry, files)


@contextmanager
def staging_folder(destination: Path) -> Iterator[Path]:
    """An empty folder beside ``destination`` to write an entry into; removed on exit
    (after ``publish`` has renamed it, there is nothing left to remove)."""
    destination.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{destination.name}-", dir=destination.parent))
    try:
        yield staging
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def write_manifest(staging: Path, fields: dict[str, Any], names: Iterable[str]) -> dict[str, Any]:
    """Write the manifest: ``fields`` (``format`` among them) and the sha256 of ``names``."""
    manifest = {**fields, "files": {name: sha256_file(staging / name) for name in names}}
    (staging / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def publish(
    staging: Path,
    destination: Path,
    entry_format: int | str,
    replaceable: Callable[[Path], bool] = lambda _: True,
) -> None:
    """Rename ``staging`` to ``destination``. An existing ``destination`` is removed first
    if ``replaceable`` says so (else FileExistsError). If the rename fails because another
    process has just put a complete entry there, that entry stands."""
    if destination.exists():
        if not replaceable(destination):
            raise FileExistsError(f"{destination} exists and is not a cache entry")
        shutil.rmtree(destination, ignore_errors=True)
    try:
        staging.rename(destination)
    except OSError:
        if read_manifest(destination, entry_format) is None:  # not another process's entry
            raise
