"""Reading a request body: JSON (the image base64) or multipart/form-data (the image as a
file part named ``image``, the other fields as JSON in a part named ``request``).

The endpoints read their bodies by hand rather than through FastAPI's parameters, so one
request model serves both encodings; :func:`validate` turns pydantic's errors into the
one error shape of :mod:`sam2serve.server.errors`.

A body can be large (a base64 image of up to ``max_upload_bytes``), so nothing that costs
time in proportion to it runs on the event loop: the JSON's structure is counted first
(``max_json_items``: a 20 MB list of objects is refused before it is parsed, since the
parse and the validation would hold the GIL for seconds), then parsing, validation and the
base64 decoding run in a worker thread. A client that hangs up mid-body is
:class:`~sam2serve.server.errors.ClientGone`, not a server error.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any, TypeVar

from fastapi import Request
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from sam2serve.server.errors import ApiError, ClientGone, short_repr, validation_error
from sam2serve.server.settings_groups import LimitSettings
from sam2serve.server.uploads import decode_base64_image

JSON_MEDIA = "application/json"
MULTIPART_MEDIA = "multipart/form-data"
IMAGE_PART = "image"
REQUEST_PART = "request"

# The multipart 'request' part (JSON of the other fields) and any part but the image file.
MAX_PART_BYTES = 1024 * 1024

ModelT = TypeVar("ModelT", bound=BaseModel)


async def parse_body(
    request: Request, model: type[ModelT], limits: LimitSettings
) -> tuple[ModelT, bytes | None]:
    """The request model and the image bytes, from a JSON or a multipart body."""
    media = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if media == JSON_MEDIA or media.endswith("+json"):
        try:
            raw = await request.body()
        except ClientDisconnect:
            raise ClientGone("upload") from None
        return await asyncio.to_thread(_from_json_body, raw, model, limits)
    if media == MULTIPART_MEDIA:
        try:
            return await _parse_multipart(request, model, limits)
        except ClientDisconnect:
            raise ClientGone("upload") from None
    raise ApiError(
        415,
        "unsupported_media_type",
        f"Content-Type {media or 'missing'!r} is not accepted; send application/json (image "
        f"base64) or multipart/form-data (file part '{IMAGE_PART}', JSON part "
        f"'{REQUEST_PART}')",
    )


async def parse_json_body(
    request: Request,
    model: type[ModelT],
    limits: LimitSettings,
    check: Callable[[Any], None] | None = None,
) -> ModelT:
    """The request model of a body that is JSON only (Label Studio's endpoints): the same
    limits as every body (size, JSON items and depth), parsed and validated off the event
    loop. ``check``: called with the parsed document before it is validated (validating
    holds the GIL throughout, so a count past a limit is refused before it)."""
    media = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if not (media == JSON_MEDIA or media.endswith("+json")):
        raise ApiError(
            415,
            "unsupported_media_type",
            f"Content-Type {media or 'missing'!r} is not accepted; send application/json",
        )
    try:
        raw = await request.body()
    except ClientDisconnect:
        raise ClientGone("upload") from None

    def parsed() -> ModelT:
        document = load_json(raw, limits, "the request body")
        if check is not None:
            check(document)
        return validate(model, document)

    return await asyncio.to_thread(parsed)


async def _parse_multipart(
    request: Request, model: type[ModelT], limits: LimitSettings
) -> tuple[ModelT, bytes | None]:
    try:
        form = await request.form(max_files=1, max_fields=1, max_part_size=MAX_PART_BYTES)
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
        if fields is not None and not isinstance(fields, str):
            raise ApiError(
                400,
                "invalid_multipart",
                f"part '{REQUEST_PART}' must be a JSON text field, not a file",
            )
        parsed = await asyncio.to_thread(_from_request_part, fields, model, limits)
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
        if len(image) > limits.max_upload_bytes:
            raise ApiError(
                413,
                "upload_too_large",
                f"image: {len(image)} bytes; the limit is "
                f"{limits.max_upload_bytes} bytes (max_upload_bytes)",
            )
        if not image:
            raise ApiError(400, "invalid_image", "image: the uploaded file is empty")
        return parsed, image
    finally:
        await form.close()


def _from_json_body(
    raw: bytes, model: type[ModelT], limits: LimitSettings
) -> tuple[ModelT, bytes | None]:
    """(In a worker thread.) The request model and the decoded image of a JSON body."""
    parsed = validate(model, load_json(raw, limits, "the request body"))
    image = getattr(parsed, "image", None)
    if image is None:
        return parsed, None
    return parsed, decode_base64_image(image, limits.max_upload_bytes)


def _from_request_part(fields: str | None, model: type[ModelT], limits: LimitSettings) -> ModelT:
    """(In a worker thread.) The request model from the multipart 'request' part."""
    where = f"part '{REQUEST_PART}'"
    data = {} if fields is None else load_json(fields.encode("utf-8"), limits, where)
    if isinstance(data, dict) and "image" in data:
        raise ApiError(
            422,
            "invalid_request",
            f"image: with multipart, send the image only as the file part "
            f"'{IMAGE_PART}', not inside '{REQUEST_PART}'",
        )
    return validate(model, data)


def load_json(raw: bytes, limits: LimitSettings, where: str) -> Any:
    """Parse JSON within the structure limits: at most ``max_json_items`` containers and
    separators (counted on the raw bytes, before parsing) and ``max_json_depth`` levels."""
    items = sum(
        part.count(b"{") + part.count(b"[") + part.count(b",")
        for part in (raw[i : i + _COUNT_SLICE] for i in range(0, len(raw), _COUNT_SLICE))
    )  # in slices: each count holds the GIL, and the event loop waits for it
    if items > limits.max_json_items:
        raise ApiError(
            413,
            "json_too_large",
            f"{where} has {items} JSON items (objects, arrays and separators); the limit is "
            f"{limits.max_json_items} (max_json_items); send fewer objects or points",
        )
    try:
        data = json.loads(raw, object_pairs_hook=_unique_keys)
    except RecursionError:
        data = _TOO_DEEP
    except (ValueError, UnicodeDecodeError) as exc:
        reason = str(exc)
        if "integer string conversion" in reason:  # Python's own advice is not the client's
            reason = "a number has more than 4300 digits"
        raise ApiError(400, "invalid_json", f"{where} is not valid JSON: {reason}") from None
    if data is _TOO_DEEP or json_depth(data, limits.max_json_depth) > limits.max_json_depth:
        raise ApiError(
            400,
            "json_too_deep",
            f"{where} nests arrays and objects more than {limits.max_json_depth} levels deep "
            "(max_json_depth); the API's own structure needs 6",
        )
    return data


_TOO_DEEP = object()


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object, refusing a key given twice: json keeps the last silently, so a proxy
    and this server could disagree about what a request asks."""
    data = dict(pairs)
    if len(data) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise ValueError(f"the key {short_repr(key)} appears more than once in one object")
            seen.add(key)
    return data


_COUNT_SLICE = 2 * 1024 * 1024


def json_depth(data: Any, stop_after: int) -> int:
    """Nesting depth of parsed JSON (a scalar is 0), without recursion; it stops counting
    once past ``stop_after``."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(data, 0)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, dict):
            children: Any = value.values()
        elif isinstance(value, list):
            children = value
        else:
            continue
        depth += 1
        deepest = max(deepest, depth)
        if deepest > stop_after:
            return deepest
        stack.extend((child, depth) for child in children)
    return deepest


def validate(model: type[ModelT], data: Any) -> ModelT:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise validation_error(exc, model) from None


def require_image(data: bytes | None, why: str = "") -> bytes:
    """The image bytes; 422 naming the missing image and the two ways to send one."""
    if data is None:
        raise ApiError(
            422,
            "invalid_request",
            f"image: field required (base64 'image', or a multipart file part '{IMAGE_PART}')"
            + why,
        )
    return data
