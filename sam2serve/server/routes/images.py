"""GET /v1/images, /v1/images/file: the server-side image folder of ``serve --images DIR``.

What the annotation page browses: the folder's image files (by extension, not hidden
files) and, on a server that tracks video (``serve --video``), its
video files and its subfolders (a video given as frames: ``?folder=NAME`` lists and reads
a subfolder's image files), listed by name with their kind, and one file's bytes by name
(a video's sent a chunk at a time, never held whole). Which names
are offered, and how a listing stays cheap (scanned on a thread of its own, kept until the
folder changes, capped), is :mod:`sam2serve.server.image_folder`'s: a name the listing
gives is a name this endpoint opens, and no crafted name or symbolic link reaches a file
outside the folder. The folder's path stays on the server: answers name only its last
component.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Query
from fastapi.responses import Response, StreamingResponse
from pydantic import BaseModel, Field

from sam2serve.server import schemas
from sam2serve.server.auth import require_api_key
from sam2serve.server.dependencies import ServiceDep, VideoSettingsDep
from sam2serve.server.errors import ApiError
from sam2serve.server.image_folder import (
    IMAGE_EXTENSIONS,
    IMAGE_MEDIA_TYPES,
    MAX_NAME_CHARS,
    MEDIA_TYPES,
    SCAN_LIMIT,
    FolderIndex,
    check_name,
    file_chunks,
    kind_of,
    read_image_file,
    subfolder,
)
from sam2serve.server.service import Service

DEFAULT_PAGE = 1000
MAX_PAGE = 10_000

router = APIRouter(
    prefix="/v1",
    dependencies=[Depends(require_api_key)],
    responses={
        status: {"model": schemas.ErrorResponse, "description": description}
        for status, description in {
            401: "Missing or wrong API key",
            404: "No image folder (serve --images), or no such file or subfolder in it",
            413: "The file is larger than the server accepts (max_upload_bytes; "
            "max_video_upload_bytes for a video)",
            422: "A bad query parameter (a name that is not a plain image file name)",
        }.items()
    },
)


class ImageEntry(BaseModel):
    name: str = Field(description="The file's name in the folder: pass it to /v1/images/file.")
    bytes: int = Field(description="The file's size in bytes (0 for a subfolder).")
    kind: Literal["image", "video", "frames"] = Field(
        "image",
        description="What the entry is: an image or a video file (by its extension), or "
        "frames: a subfolder, a video given as its frames (list them with ?folder=NAME). "
        "Videos and subfolders are listed only by a server that tracks video (serve --video).",
    )


class ImageFolder(BaseModel):
    """A page of the image folder's listing, sorted by name."""

    folder: str = Field(
        description="The folder's name (its last path component only), or the subfolder's."
    )
    total: int = Field(description="Files in the folder (in the listing).")
    offset: int = Field(description="Index of the first entry of this page.")
    images: list[ImageEntry] = Field(description="Up to `limit` files, by name.")
    truncated: bool = Field(
        False,
        description=f"The folder has more than {SCAN_LIMIT:,} entries: the listing covers "
        "those the file system gave first.",
    )


@router.get(
    "/images",
    response_model=ImageFolder,
    summary="List the server's image folder (serve --images DIR)",
)
async def list_images(
    service: ServiceDep,
    folder: Annotated[
        str | None,
        Query(
            min_length=1,
            max_length=MAX_NAME_CHARS,
            description="A subfolder from the listing (kind frames): list its image files.",
        ),
    ] = None,
    offset: Annotated[int, Query(ge=0, le=2**31, description="Entries to skip.")] = 0,
    limit: Annotated[
        int, Query(ge=1, le=MAX_PAGE, description="Entries in this page at most.")
    ] = DEFAULT_PAGE,
) -> ImageFolder:
    index = image_folder(service)
    root = index.root()
    if folder is not None:
        root = subfolder(root, frames_folder(index, folder))
        scan = await index.frames(root)
    else:
        scan = await index.listing(root)
    entries = await index.page(root, scan.names[offset : offset + limit])
    return ImageFolder(
        folder=root.name or str(root),
        total=len(scan.names),
        offset=offset,
        images=[
            ImageEntry(
                name=name,
                bytes=0 if name in scan.folders else size,
                kind="frames" if name in scan.folders else kind_of(name),
            )
            for name, size in entries
        ],
        truncated=scan.truncated,
    )


@router.get(
    "/images/file",
    summary="One image (or video) file of the server's image folder, by name",
    response_class=Response,
    responses={
        200: {
            "description": "The file's bytes, as stored.",
            "content": {
                media: {"schema": {"type": "string", "format": "binary"}}
                for media in sorted(set(MEDIA_TYPES.values()))
            },
        }
    },
)
async def read_image(
    service: ServiceDep,
    video: VideoSettingsDep,
    name: Annotated[
        str,
        Query(
            min_length=1,
            max_length=MAX_NAME_CHARS,
            description="A file name from /v1/images: a plain name (no '/', '\\', control "
            "characters or leading '.') with an image extension (or a video extension, on a "
            "server that tracks video).",
        ),
    ],
    folder: Annotated[
        str | None,
        Query(
            min_length=1,
            max_length=MAX_NAME_CHARS,
            description="The subfolder (kind frames) the image file is in.",
        ),
    ] = None,
) -> Response:
    index = image_folder(service)
    root = index.root()
    if folder is not None:  # a frame of a subfolder: image files only
        root = subfolder(root, frames_folder(index, folder))
        check_name(name)
        data = await asyncio.to_thread(read_image_file, root, name, service.limits.max_upload_bytes)
        return Response(
            data,
            media_type=MEDIA_TYPES[Path(name).suffix.lower()],
            headers={"Cache-Control": "private, no-cache", "X-Content-Type-Options": "nosniff"},
        )
    check_name(name, index.extensions)
    media_type = MEDIA_TYPES[Path(name).suffix.lower()]
    headers = {"Cache-Control": "private, no-cache", "X-Content-Type-Options": "nosniff"}
    if kind_of(name) == "video":
        limit = video.max_video_upload_bytes  # what a session would accept
        size, chunks = await asyncio.to_thread(file_chunks, root, name, limit, index.extensions)
        headers["Content-Length"] = str(size)
        return StreamingResponse(chunks, media_type=media_type, headers=headers)
    data = await asyncio.to_thread(read_image_file, root, name, service.limits.max_upload_bytes)
    return Response(data, media_type=media_type, headers=headers)


def frames_folder(index: FolderIndex, name: str) -> str:
    """``name``, when the server offers subfolders (it tracks video); else 422."""
    if not index.videos:
        raise ApiError(
            422,
            "invalid_request",
            "folder: this server offers no subfolders; they are videos given as frames, "
            "offered when the server tracks video (serve --video)",
        )
    return name


def image_folder(service: Service) -> FolderIndex:
    """The folder's index; 404 when the server has none."""
    if service.folder is None:
        raise ApiError(
            404,
            "no_image_folder",
            "this server has no image folder; start it with 'sam2serve serve --images DIR'",
        )
    return service.folder


__all__ = ["IMAGE_EXTENSIONS", "IMAGE_MEDIA_TYPES", "ImageFolder", "router"]
