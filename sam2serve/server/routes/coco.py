"""POST /v1/coco: masks a client holds -> one COCO instances file, by the engine's writer.

The annotation page's export: its accepted objects (masks it received, merged or edited,
as RLE) go in with their names, and the COCO file comes back, written by
:class:`~sam2serve.engine.coco.CocoWriter`, the writer of ``sam2serve run --coco``, so
both exports are the same format (compressed RLE, COCO's bbox, area, score, iscrowd 0).
Each distinct object name is a category, in order of first appearance. Names follow the
one rule for names, ``file_name`` the one for dataset file names
(:mod:`sam2serve.engine.user_text`): a 422 names the field and what is wrong.

No model work: the masks are checked (size, runs that cover the image exactly, the
server's ``max_pixels``) and re-encoded off the event loop, their runs read in pieces
(a hostile string is refused at its first bad run) within the process's decode budget.
"""

from __future__ import annotations

import asyncio
import json
from typing import Annotated, Any

from fastapi import Request
from fastapi.responses import Response
from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from sam2serve.engine.coco import CocoWriter, coco_info
from sam2serve.engine.user_text import (
    FILE_NAME_RULE,
    MAX_FILE_NAME_BYTES,
    NAME_RULE,
    check_file_name,
    check_name,
)
from sam2serve.server.dependencies import LimitsDep, ServiceDep
from sam2serve.server.errors import ApiError
from sam2serve.server.memory import release_free_memory
from sam2serve.server.request_body import JSON_MEDIA
from sam2serve.server.routes.common import inline_schema, read_body, v1_router

MAX_IMAGES = 256
MAX_OBJECTS_PER_IMAGE = 4096
MAX_SIDE = 1_000_000
DEFAULT_CATEGORY_NAME = "object"
MAX_CATEGORY_CHARS = 200
# What checking and re-encoding masks holds, per run (a run takes a char at least, so a
# string's length bounds its runs): an image's runs as int64 (twice while they are
# joined), and the strings written back, kept for the answer.
HELD_BYTES_PER_RUN = 24
# Writing one mask as a compressed string: the encoder's table of up to 7 int64 chars per
# run and its masks, about 100 bytes a run, for the longest mask at a time.
ENCODE_BYTES_PER_RUN = 104
# A string is read a piece (engine.rle.PIECE_CHARS chars) at a time: its temporaries.
PIECE_BYTES_PER_CHAR = 64

router = v1_router()


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


Side = Annotated[int, Field(ge=1, le=MAX_SIDE)]


def _category_name(name: str) -> str:
    return check_name(name, "the name", MAX_CATEGORY_CHARS)


# An object's name (its category) and an image's file name, as every export takes them:
# the one rule for names (longer: a category is no phrase), the one for file names.
CategoryName = Annotated[
    str,
    Field(
        min_length=1,
        max_length=MAX_CATEGORY_CHARS,
        description="The object's name: its category (objects of one name share one); "
        f"1..{MAX_CATEGORY_CHARS} characters after stripping: {NAME_RULE}.",
    ),
    AfterValidator(_category_name),
]
DatasetFileName = Annotated[
    str,
    Field(min_length=1, max_length=MAX_FILE_NAME_BYTES),
    AfterValidator(check_file_name),
]


class RleIn(_Strict):
    """A mask as run lengths, column-major, starting with a run of zeros: COCO's compressed
    string (``counts`` a str, as pycocotools writes it) or the runs themselves."""

    size: list[Side] = Field(min_length=2, max_length=2, description="[height, width]")
    counts: str | list[Annotated[int, Field(ge=0, le=2**40)]] = Field(
        description="pycocotools' compressed string, or the run lengths (summing to h*w)"
    )


class CocoObjectIn(_Strict):
    name: CategoryName = DEFAULT_CATEGORY_NAME
    segmentation: RleIn = Field(description="The mask, the size of the image.")
    score: float | None = Field(
        None,
        allow_inf_nan=False,
        description="The model's predicted IoU of the mask, if any (a merged mask has none).",
    )


class CocoImageIn(_Strict):
    file_name: DatasetFileName = Field(description=f"The image's file name: {FILE_NAME_RULE}.")
    width: Side = Field(description="Image width in pixels.")
    height: Side = Field(description="Image height in pixels.")
    objects: list[CocoObjectIn] = Field(
        default_factory=list,
        max_length=MAX_OBJECTS_PER_IMAGE,
        description="The image's objects, in annotation order.",
    )


class CocoRequest(_Strict):
    """Images and their masks, to be written as one COCO instances file."""

    images: list[CocoImageIn] = Field(min_length=1, max_length=MAX_IMAGES)
    description: str = Field(
        "annotated with the sam2serve page", max_length=1000, description="COCO info.description."
    )


class CocoImageOut(BaseModel):
    id: int
    file_name: str
    width: int
    height: int


class CocoRleOut(BaseModel):
    size: list[int] = Field(description="[height, width]")
    counts: str = Field(description="pycocotools' compressed run-length string")


class CocoAnnotation(BaseModel):
    id: int
    image_id: int
    category_id: int
    segmentation: CocoRleOut
    area: int = Field(description="Pixels in the mask.")
    bbox: list[float] = Field(description="[x, y, width, height], as pycocotools' toBbox.")
    iscrowd: int
    score: float | None = Field(None, description="Predicted IoU, when the mask has one.")


class CocoCategory(BaseModel):
    id: int
    name: str
    supercategory: str


class CocoFile(BaseModel):
    """A COCO instances file (pycocotools.coco.COCO loads it)."""

    info: dict[str, Any]
    licenses: list[Any]
    images: list[CocoImageOut]
    annotations: list[CocoAnnotation]
    categories: list[CocoCategory]


@router.post(
    "/coco",
    response_model=CocoFile,
    summary="A COCO instances file of the masks sent (the annotation page's export)",
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {JSON_MEDIA: {"schema": inline_schema(CocoRequest)}},
        }
    },
)
async def coco(request: Request, service: ServiceDep, limits: LimitsDep) -> Response:
    body, image = await read_body(request, CocoRequest, service)
    if image is not None:
        raise ApiError(422, "invalid_request", "image: /v1/coco takes masks, not an image")
    reservation = await service.decoding.reserve(decode_bytes(body), "the masks' runs")
    with reservation:
        text = await asyncio.to_thread(dataset_json, body, limits.max_pixels)
    return Response(text, media_type=JSON_MEDIA)


def decode_bytes(body: CocoRequest) -> int:
    """What checking and re-encoding the request's masks holds at most, from their sizes."""
    from sam2serve.engine.rle import PIECE_CHARS

    lengths = [len(obj.segmentation.counts) for image in body.images for obj in image.objects]
    longest = max(lengths, default=0)
    return (
        HELD_BYTES_PER_RUN * sum(lengths)
        + ENCODE_BYTES_PER_RUN * longest
        + PIECE_BYTES_PER_CHAR * min(longest, PIECE_CHARS)
    )


def dataset_json(body: CocoRequest, max_pixels: int) -> str:
    """(In a worker thread.) The COCO file of the request as JSON text (the writer's own
    dict: an annotation without a score has no "score" key)."""
    try:
        return json.dumps(build_dataset(body, max_pixels), allow_nan=False)
    finally:
        release_free_memory()  # the runs' arrays: give their pages back now


def build_dataset(body: CocoRequest, max_pixels: int) -> dict[str, Any]:
    """(In a worker thread.) The COCO dict of the request, or a 422 naming the bad mask."""
    names: dict[str, int] = {}
    for image in body.images:
        for obj in image.objects:
            names.setdefault(obj.name, len(names) + 1)
    categories = [
        {"id": index, "name": name, "supercategory": DEFAULT_CATEGORY_NAME}
        for name, index in (names or {DEFAULT_CATEGORY_NAME: 1}).items()
    ]
    writer = CocoWriter(coco_info(body.description), categories)
    for i, image in enumerate(body.images):
        where = f"images[{i}]"
        if image.width * image.height > max_pixels:
            raise ApiError(
                422,
                "invalid_request",
                f"{where}: {image.width}x{image.height} pixels; the limit is "
                f"{max_pixels} (max_pixels)",
            )
        records = [
            {
                "segmentation": checked_rle(obj.segmentation, image, f"{where}.objects[{j}]"),
                "score": obj.score,
            }
            for j, obj in enumerate(image.objects)
        ]
        try:
            writer.add_image(image.file_name, image.width, image.height, records)
        except ValueError as exc:
            raise ApiError(422, "invalid_request", f"{where}: {exc}") from None
        # The writer gives every annotation its first category; each object has its name's.
        first = len(writer.annotations) - len(image.objects)
        for annotation, obj in zip(writer.annotations[first:], image.objects, strict=True):
            annotation["category_id"] = names[obj.name]
    return writer.dataset()


def checked_rle(rle: RleIn, image: CocoImageIn, where: str) -> dict[str, Any]:
    """The mask as the engine's uncompressed RLE: the image's size, runs >= 0 that cover
    exactly height x width pixels (422 naming ``where`` otherwise)."""
    height, width = rle.size
    if (height, width) != (image.height, image.width):
        raise ApiError(
            422,
            "invalid_request",
            f"{where}.segmentation.size: {rle.size} is not the image's [height, width] "
            f"{[image.height, image.width]}",
        )
    from sam2serve.engine.rle import checked_counts

    try:
        counts = checked_counts(rle.counts, height, width)
    except ValueError as exc:  # UnicodeError too: a string of other than COCO's chars
        raise ApiError(
            422,
            "invalid_request",
            f"{where}.segmentation.counts: {exc} (runs >= 0, none of length 0 but the first "
            f"and the last, covering the {height}x{width} image exactly)",
        ) from None
    return {"size": [height, width], "counts": counts}


__all__ = ["CocoFile", "CocoRequest", "build_dataset", "dataset_json", "router"]
