"""A task's image: from the reference in its data to the file's bytes.

Label Studio tasks name their image in one of these ways, each read here:

- a path on Label Studio itself (``/data/upload/3/a1b2-cat.jpg``,
  ``/data/local-files/?d=photos/cat.jpg``, ``/tasks/7/presign/?fileuri=...``): fetched from
  Label Studio (``--label-studio-url``, else the hostname Label Studio sent in /setup) with
  a token (``$LABEL_STUDIO_API_KEY``, else the project owner's token from /setup);
- an ``http(s)://`` URL: fetched; the token is sent only to Label Studio's own address;
- a ``data:image/...;base64,`` URI: decoded;
- a local path (absolute, or ``file://``): read, but only inside a ``--local-root`` folder
  (a caller must not read any file of this machine).

A token is either a legacy API token (sent as ``Authorization: Token KEY``) or a personal
access token (a JWT: exchanged at ``/api/token/refresh`` for an access token, sent as
``Authorization: Bearer ACCESS``, exchanged again when Label Studio answers 401).
Every failure is an :class:`~sam2serve.server.errors.ApiError` naming the reference and
the reason (422), or 413 past ``max_bytes``.
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

import httpx

from sam2serve.server.errors import ApiError
from sam2serve.server.uploads import decode_base64_image

_SHOWN = 120  # characters of a reference shown in a message


@dataclass(frozen=True)
class LabelStudioAccess:
    """Where Label Studio is and the token to read its files (either may be unknown)."""

    url: str | None = None
    token: str | None = None

    def over(self, fallback: LabelStudioAccess) -> LabelStudioAccess:
        """These values, each missing one taken from ``fallback``."""
        return LabelStudioAccess(self.url or fallback.url, self.token or fallback.token)


class ImageFetcher:
    """Reads task images; one HTTP client (connection pool) for the app's life."""

    def __init__(
        self,
        *,
        max_bytes: int,
        timeout_s: float,
        local_roots: tuple[str, ...] = (),
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.max_bytes = max_bytes
        self.local_roots = tuple(os.path.realpath(root) for root in local_roots)
        self.timeout_s = timeout_s
        self._transport = transport
        self._http: httpx.AsyncClient | None = None
        self._access_tokens: dict[tuple[str, str], str] = {}  # (url, personal token) -> JWT

    @property
    def _client(self) -> httpx.AsyncClient:
        """The client, made in the event loop that first fetches (the app's)."""
        if self._http is None:
            self._http = httpx.AsyncClient(
                timeout=self.timeout_s, follow_redirects=True, transport=self._transport
            )
        return self._http

    async def aclose(self) -> None:
        if self._http is not None:
            await self._http.aclose()
            self._http = None

    async def fetch(self, reference: object, access: LabelStudioAccess, where: str) -> bytes:
        """The bytes of the image ``reference`` names; ``where`` names it in errors."""
        if not isinstance(reference, str) or not reference.strip():
            raise _unavailable(f"{where}: expected an image URL or path, got {_shown(reference)}")
        reference = reference.strip()
        scheme = urlsplit(reference).scheme.lower()
        if scheme == "data":
            return decode_base64_image(reference, self.max_bytes)
        if scheme in ("http", "https"):
            return await self._download(reference, access, where)
        if scheme == "file" or (not scheme and reference.startswith("/")):
            if scheme == "file" or not _is_ls_path(reference) or self._inside_roots(reference):
                return await asyncio.to_thread(self._read_local, reference, where)
            if access.url is None:
                raise _unavailable(
                    f"{where}: {_shown(reference)} is a path on Label Studio, but its address "
                    "is unknown: start the backend with --label-studio-url (or "
                    "$LABEL_STUDIO_URL), or connect it from a Label Studio that sends one in "
                    "/setup"
                )
            return await self._download(access.url + reference, access, where)
        raise _unavailable(
            f"{where}: {_shown(reference)} is not an image reference the backend reads; "
            "accepted: a Label Studio path (/data/...), an http(s) URL, a data: URI, or a "
            "local path inside --local-root"
        )

    # ------------------------------------------------------------------ HTTP
    async def _download(self, url: str, access: LabelStudioAccess, where: str) -> bytes:
        to_label_studio = access.url is not None and _origin(url) == _origin(access.url)
        token = access.token if to_label_studio else None
        headers = await self._auth_headers(access, fresh=False) if token else {}
        data, status = await self._get(url, headers, where)
        if status == 401 and token and _is_jwt(token):  # the access token expired
            data, status = await self._get(url, await self._auth_headers(access, True), where)
        if status >= 400:
            hint = ""
            if status in (401, 403):
                hint = (
                    " (Label Studio refused the token: set $LABEL_STUDIO_API_KEY to a token of "
                    "a user of this project)"
                    if to_label_studio
                    else " (the server wants credentials the backend does not have)"
                )
            raise _unavailable(f"{where}: GET {_shown(url)} answered HTTP {status}{hint}")
        return data

    async def _get(self, url: str, headers: dict[str, str], where: str) -> tuple[bytes, int]:
        try:
            async with self._client.stream("GET", url, headers=headers) as response:
                if response.status_code >= 400:
                    return b"", response.status_code
                declared = response.headers.get("content-length", "")
                if declared.isdigit() and int(declared) > self.max_bytes:
                    raise _too_large(where, int(declared), self.max_bytes)
                chunks, size = [], 0
                async for chunk in response.aiter_bytes():
                    size += len(chunk)
                    if size > self.max_bytes:
                        raise _too_large(where, size, self.max_bytes)
                    chunks.append(chunk)
                return b"".join(chunks), response.status_code
        except httpx.TimeoutException:
            raise _unavailable(f"{where}: GET {_shown(url)} timed out") from None
        except httpx.HTTPError as exc:
            raise _unavailable(
                f"{where}: GET {_shown(url)} failed: {exc or type(exc).__name__}"
            ) from None

    async def _auth_headers(self, access: LabelStudioAccess, fresh: bool) -> dict[str, str]:
        token = access.token
        assert token is not None and access.url is not None
        if not _is_jwt(token):
            return {"Authorization": f"Token {token}"}
        key = (access.url, token)
        if fresh or key not in self._access_tokens:
            self._access_tokens[key] = await self._exchange(access.url, token)
        return {"Authorization": f"Bearer {self._access_tokens[key]}"}

    async def _exchange(self, url: str, personal_token: str) -> str:
        """A personal access token's short-lived access token (Label Studio >= 1.17)."""
        refresh_url = f"{url}/api/token/refresh"
        try:
            response = await self._client.post(refresh_url, json={"refresh": personal_token})
        except httpx.HTTPError as exc:
            raise _unavailable(f"POST {refresh_url} failed: {exc or type(exc).__name__}") from None
        access = response.json().get("access") if response.status_code == 200 else None
        if not isinstance(access, str):
            raise _unavailable(
                f"POST {refresh_url} answered HTTP {response.status_code}: Label Studio did not "
                "accept the personal access token ($LABEL_STUDIO_API_KEY)"
            )
        return access

    # ------------------------------------------------------------------ local files
    def _inside_roots(self, reference: str) -> bool:
        path = unquote(urlsplit(reference).path) if reference.startswith("file:") else reference
        real = os.path.realpath(path)
        return any(real == root or real.startswith(root + os.sep) for root in self.local_roots)

    def _read_local(self, reference: str, where: str) -> bytes:
        path = unquote(urlsplit(reference).path) if reference.startswith("file:") else reference
        real = os.path.realpath(path)
        if not self._inside_roots(reference):
            allowed = ", ".join(self.local_roots) or "none are given"
            raise _unavailable(
                f"{where}: {_shown(reference)} is a local path outside the folders the backend "
                f"may read (--local-root: {allowed})"
            )
        try:
            size = os.path.getsize(real)
            if size > self.max_bytes:
                raise _too_large(where, size, self.max_bytes)
            with open(real, "rb") as file:
                return file.read()
        except OSError as exc:
            raise _unavailable(
                f"{where}: cannot read {_shown(reference)}: {exc.strerror}"
            ) from None


def _is_ls_path(reference: str) -> bool:
    """A path Label Studio serves (its uploads, local files, presigned storage URLs)."""
    return reference.startswith(("/data/", "/tasks/", "/storage-data/", "/api/"))


def _is_jwt(token: str) -> bool:
    parts = token.split(".")
    return len(parts) == 3 and all(parts)


def _origin(url: str) -> tuple[str, str]:
    parts = urlsplit(url)
    return parts.scheme.lower(), parts.netloc.lower()


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= _SHOWN else text[: _SHOWN - 3] + "..."


def _unavailable(message: str) -> ApiError:
    return ApiError(422, "image_unavailable", message)


def _too_large(where: str, size: int, limit: int) -> ApiError:
    return ApiError(
        413,
        "upload_too_large",
        f"{where}: the image is over {limit} bytes ({size} read); the limit is max_upload_bytes",
    )


__all__ = ["ImageFetcher", "LabelStudioAccess"]
