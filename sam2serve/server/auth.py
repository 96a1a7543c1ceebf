"""The API key: a FastAPI dependency that accepts it as a bearer token or in X-API-Key.

The routers that need it declare it (``dependencies=[Depends(require_api_key)]``); the key
itself comes from the app's settings (:func:`~sam2serve.server.dependencies.get_settings`),
so the check follows whichever app answers the request.
"""

from __future__ import annotations

import secrets
from typing import Annotated

from fastapi import Security
from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer

from sam2serve.server.dependencies import SettingsDep
from sam2serve.server.errors import ApiError

API_KEY_HEADER = APIKeyHeader(
    name="X-API-Key", auto_error=False, description="The server's API key (when it has one)."
)
BEARER = HTTPBearer(auto_error=False, description="Authorization: Bearer <API key>.")


async def require_api_key(
    settings: SettingsDep,
    key: Annotated[str | None, Security(API_KEY_HEADER)],
    credentials: Annotated[HTTPAuthorizationCredentials | None, Security(BEARER)],
) -> None:
    """401 unless the request carries the app's API key (when it has one)."""
    expected = settings.access.api_key
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
