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

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, create_model, field_validator, model_validator

from sam2serve.engine import formats
from sam2serve.engine.amg_params import PARAM_SPECS, AMGParams, ParamSpec
from sam2serve.engine.prompts import Prompt
from sam2serve.server.errors import IMAGE_ID_PATTERN, MASK_ID_PATTERN
from sam2serve.server.settings import MAX_OBJECTS, MAX_POINTS_PER_OBJECT

# The wire formats of a mask: the JSON ones of engine.formats (binary_mask is not JSON).
MASK_FORMATS: tuple[str, ...] = formats.JSON_FORMATS
MaskFormat = Literal[MASK_FORMATS]  # type: ignore[valid-type]  # the names of MASK_FORMATS, kept in one place
MASK_FORMAT_DOC = "Form of each mask. " + " ".join(
    f"'{name}': {formats.FORMATS[name].description}." for name in MASK_FORMATS
)

FiniteFloat = Annotated[float, Field(allow_inf_nan=False)]
Coordinate = Annotated[float, Field(ge=0, allow_inf_nan=False)]

# The service's caps on AMG parameters, on top of the engine's own bounds (the engine has
# no upper bounds: these keep a request from asking for work or memory in proportion to
# a number it chose). The settings' max_amg_points and max_amg_crops bound a request's
# work further (server/prompts.py).
MAX_POINTS_PER_SIDE = 1024
MAX_POINTS_PER_BATCH = 4096
MAX_CROP_LAYERS = 4
MAX_DOWNSCALE_FACTOR = 64
MAX_GRID_POINTS = 65536  # points in one explicit grid; grids: one per crop layer at most
MAX_MIN_MASK_REGION_AREA = 2**31
AMG_CAPS: dict[str, int] = {
    "points_per_side": MAX_POINTS_PER_SIDE,
    "points_per_batch": MAX_POINTS_PER_BATCH,
    "crop_n_layers": MAX_CROP_LAYERS,
    "crop_n_points_downscale_factor": MAX_DOWNSCALE_FACTOR,
    "min_mask_region_area": MAX_MIN_MASK_REGION_AREA,
}

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
    def _is_a_prompt(self) -> ObjectPrompt:
        # The engine's checks (points or a box, the box's corners in order): a PromptError
        # is a ValueError, which pydantic reports at the object.
        Prompt.from_api(self)
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
    best_mask_only: bool = Field(
        False,
        description="With multimask_output: answer only each object's candidate with the "
        "highest score (what an annotation tool keeps for a single click). Only that mask "
        "is upsampled, encoded and sent, so the answer comes sooner and is a third of the "
        "size.",
    )
    mask_format: MaskFormat = Field("coco_rle", description=MASK_FORMAT_DOC)
    model: Literal["sam2", "sam3"] = Field(
        "sam2",
        description="Which model answers: 'sam2', the server's SAM 2.1; 'sam3', SAM 3's "
        "tracker heads over the image's SAM 3 encoding (a server started with --concepts; "
        "404 'concepts_disabled' otherwise), whose image_id is the one /v1/concepts returns: "
        "clicks refine a concept instance with the same model and encoding. A mask_id "
        "refines prompts of the model that issued it.",
    )


def _bounds(spec: ParamSpec) -> dict[str, Any]:
    """pydantic's constraints for a spec's bounds."""
    bounds: dict[str, Any] = {}
    if spec.low is not None:
        bounds["ge"] = spec.low
    if spec.high is not None:
        bounds["le" if spec.high_inclusive else "lt"] = spec.high
    return bounds


def _amg_field(name: str, spec: ParamSpec, default: Any) -> tuple[Any, Any]:
    """The API field of one AMG parameter: the engine's kind, bounds, default and
    description, with the service's cap (if any) on top."""
    if name in AMG_CAPS:
        spec = spec.capped(AMG_CAPS[name])
    if spec.kind == "point_grids":  # the bounds are each coordinate's
        coordinate = Annotated[float, Field(allow_inf_nan=False, **_bounds(spec))]
        point = Annotated[list[coordinate], Field(min_length=2, max_length=2)]
        grid = Annotated[list[point], Field(min_length=1, max_length=MAX_GRID_POINTS)]
        annotation: Any = Annotated[list[grid], Field(min_length=1, max_length=MAX_CROP_LAYERS + 1)]
    elif spec.kind == "float":
        annotation = Annotated[float, Field(allow_inf_nan=False, **_bounds(spec))]
    elif spec.kind == "int":
        annotation = Annotated[int, Field(**_bounds(spec))]
    elif spec.kind == "bool":
        annotation = bool
    else:
        raise TypeError(f"AMG parameter {name} ({spec.kind}) has no API form")
    if spec.nullable:
        annotation = annotation | None
    description = spec.help[0].upper() + spec.help[1:] + "."
    return annotation, Field(default, description=description)


# AMGParams fields the API does not take: the output form is chosen by mask_format.
AMG_FIELDS_NOT_IN_API = ("output_mode",)

AMGOptions = create_model(  # type: ignore[call-overload]  # fields built from AMGParams' specs
    "AMGOptions",
    __base__=_Strict,
    __module__=__name__,
    __doc__="Automatic mask generation parameters: Meta's SAM2AutomaticMaskGenerator's, with "
    "its defaults. Checked again by the engine, which names any bad combination.",
    **{
        name: _amg_field(name, spec, AMGParams.defaults()[name])
        for name, spec in PARAM_SPECS.items()
        if name not in AMG_FIELDS_NOT_IN_API
    },
)


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
    concepts: bool = Field(
        False,
        description="true: the server runs SAM 3 too (serve --concepts) and answers "
        "POST /v1/concepts; false: that endpoint answers 404 'concepts_disabled'.",
    )
    max_concept_phrases: int | None = Field(
        None,
        description="With concepts: the most phrases one /v1/concepts request may name "
        "(--max-concept-phrases); null without concepts.",
    )
    max_concept_boxes: int | None = Field(
        None,
        description="With concepts: the most exemplar boxes one /v1/concepts request may "
        "carry (--max-concept-boxes); null without concepts.",
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
    if mask_format not in MASK_FORMATS:
        raise ValueError(
            f"mask_format must be one of {', '.join(MASK_FORMATS)}, got {mask_format!r}"
        )
    return formats.encode_mask(rle, mask_format)


# The encoders live in engine.formats; these names stay importable from here.
mask_to_png_base64 = formats.mask_to_png_base64
mask_to_polygons = formats.mask_to_polygons
