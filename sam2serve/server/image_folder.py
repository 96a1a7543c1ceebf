"""The server-side image folder of ``serve --images DIR``: which names it offers, listed
cheaply and read safely.

A name is offered when it is a plain, visible file name with an image extension (or a
video extension, when the server tracks video: ``serve --video``; then the folder's
subfolders are offered too, as videos given as frames, each listed and read like the
folder itself, one level deep) (no
separator, no control character, valid UTF-8, at most 255 characters) naming a regular
file of the folder itself: a symbolic link is offered only if it resolves to a file of the
folder. One predicate decides it for listing and for reading, so every name the listing
gives opens.

Listing a folder of 100,000 files must not cost a request seconds, nor take the worker
threads other requests need: :class:`FolderIndex` scans the folder on a thread of its own
(one scan at a time; concurrent listings wait for it and share its result), reads only
the directory entries (no per-file ``stat`` except for symbolic links), keeps the sorted
names until the folder changes (its modification time) or ``MAX_AGE_S`` passes, and stops
after ``SCAN_LIMIT`` entries (the listing then says it is truncated). A page's sizes are
read for that page only.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from sam2serve.server.errors import ApiError
from sam2serve.server.settings import MiB

# The files the folder offers, as `sam2serve run` reads directories (commands/inputs.py
# has the same list; the server may not import the command line).
IMAGE_MEDIA_TYPES: dict[str, str] = {
    ".jpg": "image/jpeg",
    ".jpeg": "image/jpeg",
    ".png": "image/png",
    ".webp": "image/webp",
    ".bmp": "image/bmp",
    ".tif": "image/tiff",
    ".tiff": "image/tiff",
}
IMAGE_EXTENSIONS = tuple(IMAGE_MEDIA_TYPES)
# Video files, offered when the server tracks video (engine.video_io.VIDEO_EXTENSIONS:
# the server may not import the decoder here; a test keeps both lists equal).
VIDEO_MEDIA_TYPES: dict[str, str] = {
    ".mp4": "video/mp4",
    ".m4v": "video/mp4",
    ".mov": "video/quicktime",
    ".mkv": "video/x-matroska",
    ".avi": "video/x-msvideo",
    ".webm": "video/webm",
    ".gif": "image/gif",
}
VIDEO_EXTENSIONS = tuple(VIDEO_MEDIA_TYPES)
MEDIA_TYPES = {**IMAGE_MEDIA_TYPES, **VIDEO_MEDIA_TYPES}
MAX_NAME_CHARS = 255  # a file name's limit on Linux
# Directory entries one scan reads at most; a larger folder lists those the file system
# gives first (sorted by name), and says the listing is truncated.
SCAN_LIMIT = 200_000
# A listing older than this is scanned again even if the folder's time did not change
# (file systems whose directory times are coarse or not kept).
MAX_AGE_S = 30.0
CHUNK_BYTES = 1024 * 1024  # a video file is sent a chunk at a time

T = TypeVar("T")


def kind_of(name: str) -> str:
    """``"video"`` for a name with a video extension, else ``"image"``."""
    return "video" if Path(name).suffix.lower() in VIDEO_MEDIA_TYPES else "image"


def plain_name(name: str, extensions: tuple[str, ...] = IMAGE_EXTENSIONS) -> bool:
    """True when ``name`` is one the folder may offer: visible, no path, no control
    character, valid UTF-8, one of ``extensions``, at most MAX_NAME_CHARS characters."""
    if not 0 < len(name) <= MAX_NAME_CHARS or name.startswith("."):
        return False
    if any(ch in "/\\" or ord(ch) < 32 or ord(ch) == 127 for ch in name):
        return False
    try:
        name.encode("utf-8")  # a name the file system could not decode cannot go into JSON
    except UnicodeError:
        return False
    return Path(name).suffix.lower() in extensions


def check_name(name: str, extensions: tuple[str, ...] = IMAGE_EXTENSIONS) -> None:
    """422 unless ``name`` is a plain name of a file the folder offers (what
    :func:`plain_name` says), naming what is wrong with it."""
    if plain_name(name, extensions):
        return
    if Path(name).suffix.lower() not in extensions:
        what = "an image or video" if VIDEO_EXTENSIONS[0] in extensions else "an image"
        raise ApiError(
            422,
            "invalid_request",
            f"name: not {what} file; accepted extensions: {' '.join(extensions)}",
        )
    raise ApiError(
        422,
        "invalid_request",
        "name: expected a plain file name from /v1/images (no path, not hidden, no control "
        f"characters, at most {MAX_NAME_CHARS} characters)",
    )


def admissible(
    root: Path, name: str, extensions: tuple[str, ...] = IMAGE_EXTENSIONS
) -> Path | None:
    """The file ``name`` names if it is an offered file of ``root`` itself, else None.

    The resolved path must be a regular file directly in the resolved folder: a symbolic
    link that leads elsewhere is not offered."""
    if not plain_name(name, extensions):
        return None
    try:
        path = (root / name).resolve()
    except (OSError, RuntimeError, ValueError):
        return None
    if path.parent != root or not path.is_file():
        return None
    return path


def plain_folder_name(name: str) -> bool:
    """True when ``name`` may name a subfolder: what :func:`plain_name` asks of a file's
    name, but any extension."""
    return plain_name(name, (Path(name).suffix.lower(),))


def subfolder(root: Path, name: str) -> Path:
    """The subfolder ``name`` of ``root`` (resolved: a link that leads out of ``root`` is
    none); 422 for a name that is no plain folder name, 404 for no such subfolder."""
    if not plain_folder_name(name):
        raise ApiError(
            422,
            "invalid_request",
            "folder: expected a plain folder name from /v1/images (no path, not hidden, no "
            f"control characters, at most {MAX_NAME_CHARS} characters)",
        )
    try:
        path = (root / name).resolve()
    except (OSError, RuntimeError, ValueError):
        path = None
    if path is None or path.parent != root or not path.is_dir():
        raise ApiError(404, "unknown_folder", f"folder: no folder {name!r} in the image folder")
    return path


@dataclass(frozen=True)
class Scan:
    names: list[str]  # sorted (files and, when asked, subfolders)
    truncated: bool
    key: tuple[int, int]  # the folder's (inode, modification time) when scanned
    at: float  # time.monotonic() of the scan
    folders: frozenset[str] = frozenset()  # those of the names that are subfolders


def scan_folder(
    root: Path, extensions: tuple[str, ...] = IMAGE_EXTENSIONS, folders: bool = False
) -> Scan:
    """The names of ``root``'s offered files (and subfolders, with ``folders``), from its
    directory entries alone."""
    key = _folder_key(root)
    names: list[str] = []
    found: set[str] = set()
    truncated = False
    try:
        with os.scandir(root) as entries:
            for count, entry in enumerate(entries):
                if count >= SCAN_LIMIT:
                    truncated = True
                    break
                if folders and _is_subfolder(root, entry):
                    names.append(entry.name)
                    found.add(entry.name)
                    continue
                if not plain_name(entry.name, extensions):
                    continue
                try:
                    if entry.is_symlink():
                        offered = admissible(root, entry.name, extensions) is not None
                    else:
                        offered = entry.is_file(follow_symlinks=False)
                except OSError:
                    continue
                if offered:
                    names.append(entry.name)
    except OSError as exc:
        raise ApiError(
            404, "no_image_folder", f"cannot read the image folder {root.name!r}: {exc.strerror}"
        ) from None
    names.sort()
    return Scan(names, truncated, key, time.monotonic(), frozenset(found))


def _is_subfolder(root: Path, entry: os.DirEntry[str]) -> bool:
    if not plain_folder_name(entry.name):
        return False
    try:
        if entry.is_symlink():
            subfolder(root, entry.name)
            return True
        return entry.is_dir(follow_symlinks=False)
    except (OSError, ApiError):
        return False


def _folder_key(root: Path) -> tuple[int, int]:
    try:
        stat = root.stat()
    except OSError as exc:
        raise ApiError(
            404, "no_image_folder", f"cannot read the image folder {root.name!r}: {exc.strerror}"
        ) from None
    return stat.st_ino, stat.st_mtime_ns


def sizes_of(root: Path, names: list[str]) -> list[tuple[str, int]]:
    """(name, bytes) of those ``names`` still there."""
    entries = []
    for name in names:
        try:
            entries.append((name, (root / name).stat().st_size))
        except OSError:
            continue
    return entries


def read_image_file(
    root: Path, name: str, max_bytes: int, extensions: tuple[str, ...] = IMAGE_EXTENSIONS
) -> bytes:
    """The bytes of file ``name`` of ``root``: 404 if it is not one, 413 if too large."""
    path = admissible(root, name, extensions)
    missing = ApiError(404, "unknown_image", f"name: no file {name!r} in the image folder")
    if path is None:
        raise missing
    try:
        size = path.stat().st_size
        if size > max_bytes:
            raise ApiError(
                413,
                "upload_too_large",
                f"name: {name!r} has {size / MiB:.1f} MiB; this server accepts images of at "
                f"most {max_bytes / MiB:g} MiB (--max-upload-mib)",
            )
        with path.open("rb") as file:
            data = file.read(max_bytes + 1)
    except OSError:
        raise missing from None
    if len(data) > max_bytes:  # grew since the stat
        raise ApiError(413, "upload_too_large", f"name: {name!r} is larger than the limit")
    return data


def file_chunks(
    root: Path, name: str, max_bytes: int, extensions: tuple[str, ...]
) -> tuple[int, Iterator[bytes]]:
    """File ``name`` of ``root`` read a chunk at a time (a video may be hundreds of MiB:
    never held whole): its size and its chunks, from the file opened here, so what is
    sent is the file that was checked. 404 if it is not offered, 413 if too large."""
    path = admissible(root, name, extensions)
    missing = ApiError(404, "unknown_image", f"name: no file {name!r} in the image folder")
    if path is None:
        raise missing
    try:
        file = path.open("rb")
    except OSError:
        raise missing from None
    size = os.fstat(file.fileno()).st_size
    if size > max_bytes:
        file.close()
        raise ApiError(
            413,
            "upload_too_large",
            f"name: {name!r} has {size / MiB:.1f} MiB; this server accepts {kind_of(name)}s of "
            f"at most {max_bytes / MiB:g} MiB (--max-video-upload-mib)",
        )

    def chunks() -> Iterator[bytes]:
        with file:
            left = size  # what was announced, even if the file grows meanwhile
            while left > 0 and (chunk := file.read(min(CHUNK_BYTES, left))):
                left -= len(chunk)
                yield chunk

    return size, chunks()


class FolderIndex:
    """The folder's listing, scanned on a thread of its own and kept until it changes."""

    def __init__(self, root: str, videos: bool = False) -> None:
        self.root_dir = root
        # Videos (files, and subfolders of frames) are offered only by a server that can
        # open them (serve --video).
        self.videos = videos
        self.extensions = IMAGE_EXTENSIONS + (VIDEO_EXTENSIONS if videos else ())
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="image-folder")
        self._lock = asyncio.Lock()
        self._scan: Scan | None = None

    def root(self) -> Path:
        """The folder, resolved; 404 when it has gone."""
        root = Path(self.root_dir).resolve()
        if not root.is_dir():
            raise ApiError(404, "no_image_folder", f"the image folder {root.name!r} is gone")
        return root

    async def listing(self, root: Path) -> Scan:
        """The current scan: the kept one while the folder has not changed, else a new one
        (one at a time: callers that arrive during a scan get its result)."""
        key = await self._run(_folder_key, root)
        async with self._lock:
            scan = self._scan
            if scan is None or scan.key != key or time.monotonic() - scan.at > MAX_AGE_S:
                scan = self._scan = await self._run(scan_folder, root, self.extensions, self.videos)
            return scan

    async def frames(self, folder: Path) -> Scan:
        """A subfolder's image files (scanned each time, on the folder's one thread)."""
        return await self._run(scan_folder, folder, IMAGE_EXTENSIONS)

    async def page(self, root: Path, names: list[str]) -> list[tuple[str, int]]:
        return await self._run(sizes_of, root, names)

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)


__all__ = [
    "IMAGE_EXTENSIONS",
    "IMAGE_MEDIA_TYPES",
    "MEDIA_TYPES",
    "VIDEO_EXTENSIONS",
    "VIDEO_MEDIA_TYPES",
    "FolderIndex",
    "admissible",
    "check_name",
    "file_chunks",
    "kind_of",
    "plain_folder_name",
    "plain_name",
    "read_image_file",
    "scan_folder",
    "subfolder",
]
