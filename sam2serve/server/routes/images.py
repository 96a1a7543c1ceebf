"""GET /v1/images, /v1/images/file: the server-side image folder of ``serve --images DIR``.

What the annotation page browses: the folder's image files (by extension, not its
subfolders, not hidden files), listed by name, and one file's bytes by name. A name is a
plain file name and nothing else: no separator, no ``..``, no control character, and the
file it names must resolve to an entry of the folder itself, so neither a crafted name nor
a symbolic link that leads out of the folder reaches another file. The folder's path stays
on the server: answers name only its last component.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, Depends, Query
from fastapi.responses import Response
from pydantic import BaseModel, Field

from sam2serve.server import schemas
from sam2serve.server.auth import require_api_key
from sam2serve.server.dependencies import SettingsDep
from sam2serve.server.errors import ApiError
from sam2serve.server.settings import MiB, ServerSettings

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
MAX_NAME_CHARS = 255  # a file name's limit on Linux
DEFAULT_PAGE = 1000
MAX_PAGE = 10_000

router = APIRouter(
    prefix="/v1",
    dependencies=[Depends(require_api_key)],
    responses={
        status: {"model": schemas.ErrorResponse, "description": description}
        for status, description in {
            401: "Missing or wrong API key",
            404: "No image folder (serve --images), or no such image in it",
            413: "The image file is larger than the server accepts (max_upload_bytes)",
            422: "A bad query parameter (a name that is not a plain image file name)",
        }.items()
    },
)


class ImageEntry(BaseModel):
    name: str = Field(description="The file's name in the folder: pass it to /v1/images/file.")
    bytes: int = Field(description="The file's size in bytes.")


class ImageFolder(BaseModel):
    """A page of the image folder's listing, sorted by name."""

    folder: str = Field(description="The folder's name (its last path component only).")
    total: int = Field(description="Image files in the folder.")
    offset: int = Field(description="Index of the first entry of this page.")
    images: list[ImageEntry] = Field(description="Up to `limit` image files, by name.")


@router.get(
    "/images",
    response_model=ImageFolder,
    summary="List the server's image folder (serve --images DIR)",
)
async def list_images(
    settings: SettingsDep,
    offset: Annotated[int, Query(ge=0, le=2**31, description="Entries to skip.")] = 0,
    limit: Annotated[
        int, Query(ge=1, le=MAX_PAGE, description="Entries in this page at most.")
    ] = DEFAULT_PAGE,
) -> ImageFolder:
    root = image_folder(settings)
    entries = await asyncio.to_thread(list_folder, root)
    return ImageFolder(
        folder=root.name or str(root),
        total=len(entries),
        offset=offset,
        images=[ImageEntry(name=name, bytes=size) for name, size in entries[offset:][:limit]],
    )


@router.get(
    "/images/file",
    summary="One image file of the server's image folder, by name",
    response_class=Response,
    responses={
        200: {
            "description": "The file's bytes, as stored.",
            "content": {
                media: {"schema": {"type": "string", "format": "binary"}}
                for media in sorted(set(IMAGE_MEDIA_TYPES.values()))
            },
        }
    },
)
async def read_image(
    settings: SettingsDep,
    name: Annotated[
        str,
        Query(
            min_length=1,
            max_length=MAX_NAME_CHARS,
            description="A file name from /v1/images: a plain name (no '/', '\\', control "
            "characters or leading '.') with an image extension.",
        ),
    ],
) -> Response:
    root = image_folder(settings)
    check_name(name)
    data = await asyncio.to_thread(read_file, root, name, settings.max_upload_bytes)
    return Response(
        data,
        media_type=IMAGE_MEDIA_TYPES[Path(name).suffix.lower()],
        headers={"Cache-Control": "private, no-cache", "X-Content-Type-Options": "nosniff"},
    )


# --------------------------------------------------------------------------- the folder


def image_folder(settings: ServerSettings) -> Path:
    """The folder, resolved; 404 when the server has none (or it has gone)."""
    if settings.images_dir is None:
        raise ApiError(
            404,
            "no_image_folder",
            "this server has no image folder; start it with 'sam2serve serve --images DIR'",
        )
    root = Path(settings.images_dir).resolve()
    if not root.is_dir():
        raise ApiError(404, "no_image_folder", f"the image folder {root.name!r} is gone")
    return root


def check_name(name: str) -> None:
    """422 unless ``name`` is a plain, visible file name with an image extension."""
    if (
        name in (".", "..")
        or name.startswith(".")
        or any(ch in name for ch in "/\\")
        or any(ord(ch) < 32 or ord(ch) == 127 for ch in name)
    ):
        raise ApiError(
            422,
            "invalid_request",
            "name: expected a plain file name from /v1/images (no path, not hidden)",
        )
    if Path(name).suffix.lower() not in IMAGE_EXTENSIONS:
        raise ApiError(
            422,
            "invalid_request",
            f"name: not an image file; accepted extensions: {' '.join(IMAGE_EXTENSIONS)}",
        )


def admissible(root: Path, name: str) -> Path | None:
    """The file ``name`` names if it is an image file of ``root`` itself, else None.

    The resolved path must be a regular file directly in the resolved folder: a symbolic
    link that leads elsewhere is not offered."""
    if name.startswith(".") or Path(name).suffix.lower() not in IMAGE_EXTENSIONS:
        return None
    try:
        name.encode("utf-8")  # a name the file system could not decode cannot go into JSON
        path = (root / name).resolve()
    except (UnicodeError, OSError, RuntimeError, ValueError):
        return None
    if path.parent != root or not path.is_file():
        return None
    return path


def list_folder(root: Path) -> list[tuple[str, int]]:
    """(name, bytes) of every admissible image file of ``root``, sorted by name."""
    entries: list[tuple[str, int]] = []
    try:
        with os.scandir(root) as scan:
            names = [entry.name for entry in scan]
    except OSError as exc:
        raise ApiError(
            404, "no_image_folder", f"cannot read the image folder {root.name!r}: {exc.strerror}"
        ) from None
    for name in sorted(names):
        path = admissible(root, name)
        if path is None:
            continue
        try:
            entries.append((name, path.stat().st_size))
        except OSError:
            continue
    return entries


def read_file(root: Path, name: str, max_bytes: int) -> bytes:
    """The bytes of image ``name`` of ``root``: 404 if it is not one, 413 if too large."""
    path = admissible(root, name)
    missing = ApiError(404, "unknown_image", f"name: no image file {name!r} in the image folder")
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


__all__ = ["IMAGE_EXTENSIONS", "IMAGE_MEDIA_TYPES", "ImageFolder", "router"]
