"""The HTTP API contract: pydantic models for every request and response body.

Coordinates are pixels of the original image, x to the right and y down; boxes are
``[x0, y0, x1, y1]`` on input (as the library takes them) and mask ``bbox`` is
``[x, y, width, height]`` on output (as COCO and the library's AMG records give them).
Unknown fields are errors, so a misspelt option is reported instead of ignored, and types
are strict: ``"x": "10"``, ``"label": true`` or ``"multimask_output": "yes"`` are errors,
not coerced (an integer is still a number). Every list and string has an upper bound here,
so no request can ask for work or memory in proportion to a number it chose; the server's
settings (``max_objects`` and the like) may only lower them.
"""

from __future__ import annotations

import dataclasses
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from sam2serve.engine.amg import AMGParams
from sam2serve.server.errors import IMAGE_ID_PATTERN, MASK_ID_PATTERN
from sam2serve.server.settings import MAX_OBJECTS, MAX_POINTS_PER_OBJECT

MaskFormat = Literal["coco_rle", "uncompressed_rle", "png_base64", "polygon"]
MASK_FORMATS: tuple[str, ...] = ("coco_rle", "uncompressed_rle", "png_base64", "polygon")

FiniteFloat = Annotated[float, Field(allow_inf_nan=False)]
Coordinate = Annotated[float, Field(ge=0, allow_inf_nan=False)]
UnitFloat = Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)]

# Upper bounds of the schema (the settings' limits may only lower MAX_OBJECTS and
# MAX_POINTS_PER_OBJECT, see settings.py).
MAX_POINTS_PER_SIDE = 1024
MAX_POINTS_PER_BATCH = 4096
MAX_CROP_LAYERS = 4
MAX_DOWNSCALE_FACTOR = 64
MAX_GRID_POINTS = 65536

IMAGE_BASE64_DOC = (
    "The image file (JPEG, PNG, WebP, BMP, TIFF, ...) base64-encoded, optionally as a "
    "data URL ('data:image/png;base64,...'). With a multipart/form-data request, send the "
    "file as the part named 'image' instead."
)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


# --------------------------------------------------------------------------- requests


class EmbeddingRequest(_Strict):
    """Encode an image and keep its embedding in the cache for later prompts."""

    image: str | None = Field(None, description=IMAGE_BASE64_DOC)


class Point(_Strict):
    """One click on the image."""

    x: Coordinate = Field(description="Column in pixels, 0 <= x <= image width.")
    y: Coordinate = Field(description="Row in pixels, 0 <= y <= image height.")
    label: Literal[0, 1] = Field(
        1, description="1: this point is on the object (foreground), 0: it is not (background)."
    )

    @field_validator("label", mode="before")
    @classmethod
    def _label_is_an_integer(cls, value: Any) -> Any:
        # Literal[0, 1] alone takes true and 1.0 (they compare equal to 1).
        if type(value) is not int:
            raise ValueError("must be the integer 0 or 1")
        return value


class ObjectPrompt(_Strict):
    """The prompts for one object: points and/or a box, optionally a previous mask.

    Every object of a request is decoded in one decoder call: objects with fewer prompt
    points are padded with SAM's "not a point" label (-1) to the longest one.
    """

    points: list[Point] = Field(
        default_factory=list,
        max_length=MAX_POINTS_PER_OBJECT,
        description="Clicks on the image (at most max_points_per_object).",
    )
    box: list[FiniteFloat] | None = Field(
        None,
        min_length=4,
        max_length=4,
        description="Box around the object as [x0, y0, x1, y1] in pixels (x0 <= x1, y0 <= y1), "
        "inside the image.",
    )
    mask_id: str | None = Field(
        None,
        pattern=MASK_ID_PATTERN,
        description="Refine a previous answer: the mask_id of a mask this server returned for "
        "the same image. Its low-res logits go in as the mask prompt. Needs points or a box too.",
    )

    @model_validator(mode="after")
    def _has_prompt(self) -> ObjectPrompt:
        if not self.points and self.box is None:
            raise ValueError("give at least one point or a box for each object")
        if self.box is not None:
            x0, y0, x1, y1 = self.box
            if x0 > x1 or y0 > y1:
                raise ValueError(
                    f"box must be [x0, y0, x1, y1] with x0 <= x1 and y0 <= y1, got {self.box}"
                )
        return self


class SegmentRequest(_Strict):
    """Masks for one or more objects of one image."""

    image: str | None = Field(
        None, description=IMAGE_BASE64_DOC + " Give either image or image_id."
    )
    image_id: str | None = Field(
        None,
        pattern=IMAGE_ID_PATTERN,
        description="The image_id a previous response returned: reuse its cached embedding "
        "(404 'unknown_image_id' once evicted: send the image again).",
    )
    objects: list[ObjectPrompt] = Field(
        min_length=1,
        max_length=MAX_OBJECTS,
        description="One prompt group per object (at most max_objects).",
    )
    multimask_output: bool = Field(
        True,
        description="true: 3 candidate masks per object (whole, part, subpart); false: the "
        "one mask SAM picks (best for several clicks on one object).",
    )
    mask_format: MaskFormat = Field(
        "coco_rle",
        description="'coco_rle' {size, counts: str} (pycocotools' compressed form), "
        "'uncompressed_rle' {size, counts: [int]} (column-major runs, zeros first), "
        "'png_base64' (a 1-bit PNG, base64), or 'polygon' (outer boundaries as COCO "
        "polygons [[x0, y0, x1, y1, ...], ...]; holes are not represented).",
    )


def _amg_default(name: str) -> Any:
    return next(f.default for f in dataclasses.fields(AMGParams) if f.name == name)


class AMGOptions(_Strict):
    """Automatic mask generation parameters: Meta's SAM2AutomaticMaskGenerator's, with its
    defaults. Checked again by the engine, which names any bad combination."""

    points_per_side: int | None = Field(
        _amg_default("points_per_side"),
        ge=1,
        le=MAX_POINTS_PER_SIDE,
        description="Points per side of the click grid on the whole image "
        "(points_per_side**2 clicks); null when point_grids is given.",
    )
    points_per_batch: int = Field(
        _amg_default("points_per_batch"),
        ge=1,
        le=MAX_POINTS_PER_BATCH,
        description="Clicks decoded together. Memory stays within the server's budget "
        "whatever this says: a batch too large for it is decoded in smaller parts.",
    )
    pred_iou_thresh: float = Field(
        _amg_default("pred_iou_thresh"),
        ge=0,
        le=1,
        description="Keep masks whose predicted IoU is above this (0 turns the filter off).",
    )
    stability_score_thresh: float = Field(
        _amg_default("stability_score_thresh"),
        ge=0,
        le=1,
        description="Keep masks whose stability score is at least this (0 turns it off).",
    )
    stability_score_offset: float = Field(
        _amg_default("stability_score_offset"),
        ge=0,
        allow_inf_nan=False,
        description="Logit shift either side of mask_threshold that the stability score compares.",
    )
    mask_threshold: FiniteFloat = Field(
        _amg_default("mask_threshold"), description="Logit above which a pixel is in a mask."
    )
    box_nms_thresh: float = Field(
        _amg_default("box_nms_thresh"),
        ge=0,
        le=1,
        description="Box IoU above which the lower-scoring of two masks of one crop is dropped.",
    )
    crop_n_layers: int = Field(
        _amg_default("crop_n_layers"),
        ge=0,
        le=MAX_CROP_LAYERS,
        description="Extra crop layers: layer i adds (2**i)**2 overlapping crops, each "
        "encoded again (slow).",
    )
    crop_nms_thresh: float = Field(
        _amg_default("crop_nms_thresh"),
        ge=0,
        le=1,
        description="Box IoU above which a mask from a larger crop loses to one from a "
        "smaller crop.",
    )
    crop_overlap_ratio: float = Field(
        _amg_default("crop_overlap_ratio"),
        ge=0,
        lt=1,
        description="Overlap of neighbouring layer-1 crops as a fraction of the image's "
        "short side.",
    )
    crop_n_points_downscale_factor: int = Field(
        _amg_default("crop_n_points_downscale_factor"),
        ge=1,
        le=MAX_DOWNSCALE_FACTOR,
        description="Crop layer i gets points_per_side / factor**i points per side.",
    )
    point_grids: (
        Annotated[
            list[
                Annotated[
                    list[Annotated[list[UnitFloat], Field(min_length=2, max_length=2)]],
                    Field(min_length=1, max_length=MAX_GRID_POINTS),
                ]
            ],
            Field(min_length=1, max_length=MAX_CROP_LAYERS + 1),
        ]
        | None
    ) = Field(
        _amg_default("point_grids"),
        description="Explicit click grids instead of points_per_side: one list of [x, y] "
        "(normalised to [0, 1]) per crop layer.",
    )
    min_mask_region_area: int = Field(
        _amg_default("min_mask_region_area"),
        ge=0,
        le=2**31,
        description="If > 0, fill holes and remove islands smaller than this many pixels.",
    )
    use_m2m: bool = Field(
        _amg_default("use_m2m"),
        description="Refine each mask once by decoding its click again with its own logits.",
    )
    multimask_output: bool = Field(
        _amg_default("multimask_output"),
        description="Three masks per click (whole, part, subpart); false: one per click.",
    )


# AMGParams fields the API does not take: the output form is chosen by mask_format.
AMG_FIELDS_NOT_IN_API = ("output_mode",)


class AMGRequest(_Strict):
    """Segment everything in an image."""

    image: str | None = Field(None, description=IMAGE_BASE64_DOC)
    params: AMGOptions = Field(
        default_factory=AMGOptions, description="AMG parameters; omitted ones keep Meta's defaults."
    )
    mask_format: MaskFormat = Field(
        "coco_rle", description="Form of each record's segmentation; see /v1/segment."
    )


# --------------------------------------------------------------------------- responses


class CocoRle(BaseModel):
    size: list[int] = Field(description="[height, width]")
    counts: str = Field(description="pycocotools' compressed run-length string")


class UncompressedRle(BaseModel):
    size: list[int] = Field(description="[height, width]")
    counts: list[int] = Field(
        description="Run lengths in column-major order, starting with a run of zeros"
    )


Segmentation = CocoRle | UncompressedRle | str | list[list[float]]
SEGMENTATION_DOC = (
    "The mask in the requested mask_format: a COCO RLE object, an uncompressed RLE "
    "object, a base64 PNG string (1-bit, image size), or a list of polygons."
)


class ImageInfo(BaseModel):
    image_id: str = Field(
        description="Server-issued id of the image (SHA-256 of its bytes): pass it as "
        "image_id to /v1/segment while it stays cached."
    )
    width: int = Field(description="Image width in pixels (after EXIF orientation).")
    height: int = Field(description="Image height in pixels (after EXIF orientation).")
    model: str = Field(description="Model size that produced the embedding.")
    cached: bool = Field(
        description="true: the embedding was already cached, no encoder run was needed."
    )
    inference_ms: float = Field(
        description="Model time for this request: its encoder batch (0 on a cache hit) plus "
        "its mask decoding."
    )
    queue_ms: float = Field(description="Time its model jobs waited in the model queue.")


class EmbeddingResponse(ImageInfo):
    """The image is encoded and its embedding cached."""


class MaskOut(BaseModel):
    mask_id: str = Field(
        description="Reference to this mask's low-res logits: pass it as an object's mask_id "
        "to refine the mask (kept in a bounded cache; 404 once evicted)."
    )
    score: float = Field(description="The model's predicted IoU of this mask.")
    bbox: list[float] = Field(description="Box around the mask, [x, y, width, height].")
    area: int = Field(description="Pixels in the mask.")
    segmentation: Segmentation = Field(description=SEGMENTATION_DOC)


class ObjectOut(BaseModel):
    masks: list[MaskOut] = Field(
        description="3 candidates (multimask_output) or 1, in the model's order; pick by score."
    )


class SegmentResponse(ImageInfo):
    """Masks for each object, in the order of the request's objects."""

    objects: list[ObjectOut] = Field(description="One entry per requested object, in order.")


class AMGRecord(BaseModel):
    """One generated mask, with the fields of the library's AMG records."""

    segmentation: Segmentation = Field(description=SEGMENTATION_DOC)
    area: int = Field(description="Pixels in the mask.")
    bbox: list[float] = Field(description="[x, y, width, height] around the mask.")
    predicted_iou: float = Field(description="The model's own estimate of the mask's quality.")
    point_coords: list[list[float]] = Field(description="[[x, y]]: the click that made it.")
    stability_score: float | None = Field(
        description="IoU of the mask thresholded at +- offset; null for an empty mask (0/0)."
    )
    crop_box: list[float] = Field(description="[x, y, width, height] of the crop it came from.")


class AMGResponse(ImageInfo):
    """Every mask AMG kept, in the library's order."""

    params: dict[str, Any] = Field(description="The AMG parameters used, defaults filled in.")
    masks: list[AMGRecord] = Field(
        description="The generated masks, in the library's order (by crop, then by NMS)."
    )


class Health(BaseModel):
    status: Literal["ok"] = Field("ok", description="Always 'ok': the process answers.")


class Ready(BaseModel):
    status: Literal["ready"] = Field("ready", description="'ready': loaded and warmed up.")
    model: str = Field(description="Model size.")
    mode: str = Field(
        description="What answers: baseline, fast or furious (sam2serve.runtime.modes)."
    )
    backend: str = Field(
        description="What executes the mode: eager, compile, openvino or artifacts "
        "(sam2serve.runtime.backends)."
    )
    device: str = Field(description="Where the model runs, e.g. 'cpu'.")
    dtype: str = Field(description="The model's dtype, e.g. 'float32'.")
    weights: dict[str, Any] = Field(
        description="Where the weights came from: source ('checkpoint' or 'random'), the "
        "checkpoint's file name (never its path) and the seed of random weights."
    )


class ErrorDetail(BaseModel):
    field: str = Field(description="Path of the bad field, e.g. objects[0].points[1].x")
    message: str = Field(description="What is wrong with it and what is accepted.")


class ErrorInfo(BaseModel):
    code: str = Field(description="Machine-readable error code, e.g. 'unknown_image_id'.")
    message: str = Field(description="What was wrong and what is accepted.")
    details: list[ErrorDetail] | None = Field(None, description="Per-field validation errors.")


class ErrorResponse(BaseModel):
    """Every error has this shape."""

    error: ErrorInfo = Field(description="What went wrong.")


# --------------------------------------------------------------------------- mask output


def encode_segmentation(rle: dict[str, Any], mask_format: str) -> Any:
    """One mask, given as the engine's uncompressed RLE, in the wire ``mask_format``."""
    from sam2serve.engine.rle import rle_to_coco, rle_to_mask

    if mask_format == "uncompressed_rle":
        return {"size": list(rle["size"]), "counts": list(rle["counts"])}
    if mask_format == "coco_rle":
        return rle_to_coco(rle)
    if mask_format == "png_base64":
        return mask_to_png_base64(rle_to_mask(rle))
    if mask_format == "polygon":
        return mask_to_polygons(rle_to_mask(rle))
    raise ValueError(f"mask_format must be one of {', '.join(MASK_FORMATS)}, got {mask_format!r}")


def mask_to_png_base64(mask: Any) -> str:
    """A 1-bit PNG of the (H, W) bool mask, base64-encoded."""
    import base64
    import io

    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(mask).save(buffer, format="PNG", optimize=False)  # bool -> mode "1"
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def mask_to_polygons(mask: Any) -> list[list[float]]:
    """Outer boundaries of the mask's regions as COCO polygons ``[x0, y0, x1, y1, ...]``.

    Contours run through the pixel edges' midpoints (marching squares at level 0.5 on the
    mask padded by one pixel), counter-clockwise around set pixels; hole boundaries, which
    wind the other way, are left out as in COCO's polygon format.
    """
    import numpy as np
    from skimage.measure import find_contours

    padded = np.pad(mask.astype(np.uint8), 1)
    polygons = []
    for contour in find_contours(padded, 0.5, positive_orientation="high"):
        rows, cols = contour[:, 0] - 1, contour[:, 1] - 1
        # Shoelace area in (x=col, y=row): negative for the outer boundaries (holes: positive).
        signed = 0.5 * float(np.dot(cols, np.roll(rows, -1)) - np.dot(rows, np.roll(cols, -1)))
        if signed >= 0 or len(contour) < 3:
            continue
        xy = np.stack([cols, rows], axis=1)
        polygons.append([round(float(v), 2) for v in xy[:-1].reshape(-1)])
    return polygons
