"""Reading a request body: JSON (the image base64) or multipart/form-data (the image as a
file part named ``image``, the other fields as JSON in a part named ``request``).

The endpoints read their bodies by hand rather than through FastAPI's parameters, so one
request model serves both encodings; :func:`validate` turns pydantic's errors into the
one error shape of :mod:`sam2serve.server.errors`.
"""

from __future__ import annotations

import json
from typing import Any, TypeVar

from fastapi import Request
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from sam2serve.server.errors import ApiError, validation_error
from sam2serve.server.settings import ServerSettings
from sam2serve.server.uploads import decode_base64_image

JSON_MEDIA = "application/json"
MULTIPART_MEDIA = "multipart/form-data"
IMAGE_PART = "image"
REQUEST_PART = "request"

ModelT = TypeVar("ModelT", bound=BaseModel)


async def parse_body(
    request: Request, model: type[ModelT], settings: ServerSettings
) -> tuple[ModelT, bytes | None]:
    """The request model and the image bytes, from a JSON or a multipart body."""
    media = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if media == JSON_MEDIA or media.endswith("+json"):
        raw = await request.body()
        try:
            data = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as exc:
            raise ApiError(
                400,
                "invalid_json",
                f"the request body is not valid JSON: {exc}",
            ) from None
        parsed = validate(model, data)
        image = getattr(parsed, "image", None)
        if image is None:
            return parsed, None
        return parsed, decode_base64_image(image, settings.max_upload_bytes)
    if media == MULTIPART_MEDIA:
        return await _parse_multipart(request, model, settings)
    raise ApiError(
        415,
        "unsupported_media_type",
        f"Content-Type {media or 'missing'!r} is not accepted; send application/json (image "
        f"base64) or multipart/form-data (file part '{IMAGE_PART}', JSON part "
        f"'{REQUEST_PART}')",
    )


async def _parse_multipart(
    request: Request, model: type[ModelT], settings: ServerSettings
) -> tuple[ModelT, bytes | None]:
    try:
        form = await request.form(max_files=1, max_fields=1, max_part_size=1024 * 1024)
    except StarletteHTTPException as exc:
        raise ApiError(
            400,
            "invalid_multipart",
            f"cannot parse the multipart body: "
            f"{exc.detail} (send at most one file part '{IMAGE_PART}' and one "
            f"field '{REQUEST_PART}')",
        ) from None
    try:
        unknown = sorted(set(form.keys()) - {IMAGE_PART, REQUEST_PART})
        if unknown:
            raise ApiError(
                400,
                "invalid_multipart",
                f"unknown multipart part(s) {', '.join(map(repr, unknown))}; accepted: "
                f"a file part '{IMAGE_PART}' and a JSON field '{REQUEST_PART}'",
            )
        fields = form.get(REQUEST_PART)
        data: Any = {}
        if fields is not None:
            if not isinstance(fields, str):
                raise ApiError(
                    400,
                    "invalid_multipart",
                    f"part '{REQUEST_PART}' must be a JSON text field, not a file",
                )
            try:
                data = json.loads(fields)
            except ValueError as exc:
                raise ApiError(
                    400, "invalid_json", f"part '{REQUEST_PART}' is not valid JSON: {exc}"
                ) from None
        if isinstance(data, dict) and "image" in data:
            raise ApiError(
                422,
                "invalid_request",
                f"image: with multipart, send the image only as the file part "
                f"'{IMAGE_PART}', not inside '{REQUEST_PART}'",
            )
        parsed = validate(model, data)
        upload = form.get(IMAGE_PART)
        if upload is None:
            return parsed, None
        if isinstance(upload, str):
            raise ApiError(
                400,
                "invalid_multipart",
                f"part '{IMAGE_PART}' must be a file (filename=...), not a text field",
            )
        image = await upload.read()
        if len(image) > settings.max_upload_bytes:
            raise ApiError(
                413,
                "upload_too_large",
                f"image: {len(image)} bytes; the limit is "
                f"{settings.max_upload_bytes} bytes (max_upload_bytes)",
            )
        if not image:
            raise ApiError(400, "invalid_image", "image: the uploaded file is empty")
        return parsed, image
    finally:
        await form.close()


def validate(model: type[ModelT], data: Any) -> ModelT:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise validation_error(exc, model) from None


def require_image(data: bytes | None, why: str = "") -> None:
    """422 naming the missing image and the two ways to send one."""
    if data is None:
        raise ApiError(
            422,
            "invalid_request",
            f"image: field required (base64 'image', or a multipart file part '{IMAGE_PART}')"
            + why,
        )
