"""One error shape for everything: ``{"error": {"code", "message", "details"?}}``.

Handlers raise :class:`ApiError`; FastAPI's request validation errors, pydantic errors
from bodies validated by hand, Starlette's HTTP errors (404, 405) and anything
unexpected are all turned into that shape here. The message names the bad value and
what would be accepted; an unexpected exception is logged with its traceback and answered
with a generic 500 that leaks nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

log = logging.getLogger("sam2serve.server")

# Shown for at most this many validation errors in one message, and this many in
# "details" (a body of 10,000 bad values gets a short answer, not a 10,000-line one).
_MAX_ERRORS_IN_MESSAGE = 5
_MAX_ERROR_DETAILS = 20
_MAX_INPUT_REPR = 60
# What the API's string patterns mean, for messages a person can act on.
IMAGE_ID_PATTERN = "^[0-9a-f]{64}$"
MASK_ID_PATTERN = "^[A-Za-z0-9_-]{1,64}$"
_PATTERN_MEANINGS = {
    IMAGE_ID_PATTERN: "expected the 64-character hex id a previous response returned",
    MASK_ID_PATTERN: "expected a mask_id a previous response returned (letters, digits, "
    "'-' and '_', at most 64)",
}

# Status logged and counted for a request whose client went away (nginx's convention);
# nothing is sent, since nobody is listening.
CLIENT_CLOSED_REQUEST = 499


class ApiError(Exception):
    """An error answered to the client as ``status`` with ``{"error": {code, message}}``."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        *,
        headers: dict[str, str] | None = None,
        details: list[dict[str, Any]] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.headers = headers
        self.details = details


class ClientGone(Exception):
    """The client closed the connection; ``stage`` is 'upload' (during the body) or
    'processing' (after it). Not an error of ours: answered with nothing, logged quietly."""

    def __init__(self, stage: str) -> None:
        super().__init__(f"the client went away during {stage}")
        self.stage = stage


ErrorObserver = Callable[[int, str], None]
DisconnectObserver = Callable[[str, str], None]  # (path, stage)

_HTTP_CODES = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    413: "upload_too_large",
    415: "unsupported_media_type",
}


def error_body(code: str, message: str, details: list[dict[str, Any]] | None = None) -> dict:
    error: dict[str, Any] = {"code": code, "message": message}
    if details:
        error["details"] = details
    return {"error": error}


def error_response(
    status: int,
    code: str,
    message: str,
    headers: dict[str, str] | None = None,
    details: list[dict[str, Any]] | None = None,
) -> JSONResponse:
    return JSONResponse(error_body(code, message, details), status_code=status, headers=headers)


_MAX_FIELD_NAME = 60


def field_path(loc: Sequence[Any]) -> str:
    """pydantic's ``("body", "objects", 0, "points", 1, "x")`` -> ``objects[0].points[1].x``
    (a client's made-up field name is cut, so a 1 MB name is not echoed back)."""
    path = ""
    for part in loc:
        if part == "body" and not path:
            continue
        if isinstance(part, int):
            path += f"[{part}]"
        else:
            name = str(part)
            if len(name) > _MAX_FIELD_NAME:
                name = name[: _MAX_FIELD_NAME - 3] + "..."
            path += ("." if path else "") + name
    return path or "body"


def describe_validation_errors(
    errors: Sequence[Mapping[str, Any]], model: type[BaseModel] | None = None
) -> tuple[str, list[dict[str, Any]]]:
    """A one-line message and per-field details from pydantic's error list."""
    details = []
    for error in errors:
        where = field_path(error.get("loc", ()))
        message = str(error.get("msg", "invalid value"))
        if error.get("type") == "extra_forbidden":
            message = "unknown field" + _accepted_fields(model, error.get("loc", ()))
        elif error.get("type") == "missing":
            message = "field required"
        elif error.get("type") == "string_pattern_mismatch":
            meaning = _PATTERN_MEANINGS.get(str(error.get("ctx", {}).get("pattern")))
            shown = short_repr(error.get("input"))
            message = f"{meaning}, got {shown}" if meaning else f"{message}, got {shown}"
        elif "input" in error and error.get("type") not in ("model_type", "dict_type"):
            message = f"{message}, got {short_repr(error['input'])}"
        details.append({"field": where, "message": message})
    parts = [f"{d['field']}: {d['message']}" for d in details[:_MAX_ERRORS_IN_MESSAGE]]
    more = len(details) - _MAX_ERRORS_IN_MESSAGE
    if more > 0:
        parts.append(f"and {more} more (see details)")
    return "; ".join(parts), details[:_MAX_ERROR_DETAILS]


def short_repr(value: Any, limit: int = _MAX_INPUT_REPR) -> str:
    """``repr(value)`` cut to ``limit`` characters; an integer too long for Python to
    print (over 4300 digits) is described by its size instead of raising."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 4000:
        return f"an integer of about {int(value.bit_length() * 0.30103)} digits"
    if isinstance(value, (list, tuple, dict, str, bytes)) and len(value) > limit:
        # repr of a huge container costs time and memory: show its start only.
        head = value[:limit] if not isinstance(value, dict) else dict(list(value.items())[:4])
        shown = repr(head)
    else:
        try:
            shown = repr(value)
        except ValueError:  # a nested integer too long to print
            shown = f"a {type(value).__name__}"
    return shown if len(shown) <= limit else shown[: limit - 3] + "..."


def _accepted_fields(model: type[BaseModel] | None, loc: Sequence[Any]) -> str:
    """For an unknown field, the names accepted at that place in ``model``."""
    if model is None:
        return ""
    current: Any = model
    for part in [p for p in loc if p != "body"][:-1]:
        if isinstance(part, int):
            continue
        field = getattr(current, "model_fields", {}).get(part)
        if field is None:
            return ""
        current = _inner_model(field.annotation)
        if current is None:
            return ""
    names = list(getattr(current, "model_fields", {}))
    return f"; accepted: {', '.join(names)}" if names else ""


def _inner_model(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model inside ``list[Model]``, ``Model | None`` and the like."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()):
        found = _inner_model(arg)
        if found is not None:
            return found
    return None


def validation_error(exc: ValidationError, model: type[BaseModel] | None = None) -> ApiError:
    message, details = describe_validation_errors(exc.errors(), model)
    return ApiError(422, "invalid_request", message, details=details)


def install_error_handlers(
    app: FastAPI,
    observe: ErrorObserver | None = None,
    on_disconnect: DisconnectObserver | None = None,
) -> None:
    """Register the handlers that give every error the one shape (and count them)."""

    def respond(error: ApiError) -> JSONResponse:
        if observe is not None:
            observe(error.status, error.code)
        return error_response(error.status, error.code, error.message, error.headers, error.details)

    async def on_api_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, ApiError)
        return respond(exc)

    async def on_validation_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        message, details = describe_validation_errors(exc.errors())
        return respond(ApiError(422, "invalid_request", message, details=details))

    async def on_http_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        code = _HTTP_CODES.get(exc.status_code, "http_error")
        message = str(exc.detail)
        if exc.status_code == 404:
            message = f"no endpoint at {request.url.path!r}; see /docs for the API"
        elif exc.status_code == 405:
            message = f"{request.method} is not allowed on {request.url.path!r}; see /docs"
        headers = None if exc.headers is None else dict(exc.headers)
        return respond(ApiError(exc.status_code, code, message, headers=headers))

    async def on_client_gone(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, ClientGone)
        log.info("client went away during %s: %s %s", exc.stage, request.method, request.url.path)
        if on_disconnect is not None:
            on_disconnect(request.url.path, exc.stage)
        return Response(status_code=CLIENT_CLOSED_REQUEST)

    async def on_unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unexpected error on %s %s", request.method, request.url.path)
        return respond(ApiError(500, "internal_error", "internal server error; it has been logged"))

    app.add_exception_handler(ApiError, on_api_error)
    app.add_exception_handler(ClientGone, on_client_gone)
    app.add_exception_handler(RequestValidationError, on_validation_error)
    app.add_exception_handler(StarletteHTTPException, on_http_error)
    app.add_exception_handler(Exception, on_unexpected)
