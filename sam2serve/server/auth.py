"""The API key: a FastAPI dependency that accepts it as a bearer token or in X-API-Key.

The routers that need it declare it (``dependencies=[Depends(require_api_key)]``); the key
itself comes from the app's access settings (:func:`~sam2serve.server.dependencies.get_access`),
so the check follows whichever app answers the request. A WebSocket (the live frames)
is checked by :func:`websocket_allowed` before it is accepted: the same key, and from a
browser an allowed origin.
"""

from __future__ import annotations

import secrets
from typing import Annotated

from fastapi import Security, WebSocket
from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer

from sam2serve.server.allowed_hosts import SCOPE_KEY as ALLOWED_HOSTS_KEY
from sam2serve.server.allowed_hosts import origin_allowed
from sam2serve.server.dependencies import AccessDep
from sam2serve.server.errors import ApiError
from sam2serve.server.settings_groups import AccessSettings

API_KEY_HEADER = APIKeyHeader(
    name="X-API-Key", auto_error=False, description="The server's API key (when it has one)."
)
BEARER = HTTPBearer(auto_error=False, description="Authorization: Bearer <API key>.")


async def require_api_key(
    access: AccessDep,
    key: Annotated[str | None, Security(API_KEY_HEADER)],
    credentials: Annotated[HTTPAuthorizationCredentials | None, Security(BEARER)],
) -> None:
    """401 unless the request carries the app's API key (when it has one)."""
    expected = access.api_key
    if expected is None:
        return
    given = key if key is not None else (credentials.credentials if credentials else None)
    if given is None or not secrets.compare_digest(given.encode(), expected.encode()):
        raise ApiError(
            401,
            "unauthorized",
            "missing or wrong API key; send 'Authorization: Bearer <key>' or 'X-API-Key: <key>'",
            headers={"WWW-Authenticate": "Bearer"},
        )


def websocket_allowed(websocket: WebSocket, access: AccessSettings) -> bool:
    """The API key (when the server has one) and, from a browser, an allowed origin: the
    server's own or one of cors_origins (a page elsewhere may not drive a session)."""
    expected = access.api_key
    if expected is not None:
        given = websocket.headers.get("x-api-key")
        authorization = websocket.headers.get("authorization", "")
        if given is None and authorization.lower().startswith("bearer "):
            given = authorization[7:]
        if given is None or not secrets.compare_digest(given.encode(), expected.encode()):
            return False
    origin = websocket.headers.get("origin")
    if origin is None:
        return True
    # The Origin's host must be one the server answers to (allowed_hosts): a rebinding
    # page's Origin and Host both name the attacker's host, so matching them is not enough.
    return origin_allowed(
        origin,
        websocket.headers.get("host", ""),
        websocket.scope.get(ALLOWED_HOSTS_KEY),
        tuple(access.cors_origins or ()),
    )
