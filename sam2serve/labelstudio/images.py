"""A task's image: from the reference in its data to the file's bytes.

Label Studio tasks name their image in one of these ways, each read here:

- a path on Label Studio itself (``/data/upload/3/a1b2-cat.jpg``,
  ``/data/local-files/?d=photos/cat.jpg``, ``/tasks/7/presign/?fileuri=...``): fetched from
  Label Studio (``--label-studio-url``, else the hostname Label Studio sent in /setup when
  the operator allowed that host) with a token (``$LABEL_STUDIO_API_KEY``, sent only to
  ``--label-studio-url``; else the token /setup sent, only to its own allowed hostname);
- an ``http(s)://`` URL: fetched when the fetch policy allows it
  (:mod:`sam2serve.labelstudio.fetch_policy`); a token goes only to Label Studio's own
  address;
- a ``data:image/...;base64,`` URI: decoded;
- a local path (absolute, or ``file://``): read, but only inside a ``--local-root`` folder
  (a caller must not read any file of this machine).

Every fetch, redirects and the token exchange included, has one deadline
(``--fetch-timeout``, from the first byte asked to the last read), at most
``MAX_REDIRECTS`` redirects each checked by the policy, and ``max_bytes`` (the declared
length checked before reading, the bytes counted while reading). A token is either a
legacy API token (sent as ``Authorization: Token KEY``) or a personal access token (a
JWT: exchanged at ``/api/token/refresh`` for an access token, sent as ``Authorization:
Bearer ACCESS``, exchanged again when Label Studio answers 401). Every failure is an
:class:`~sam2serve.server.errors.ApiError` naming the reference and the reason (422), or
413 past ``max_bytes``.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import logging
import os
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urljoin, urlsplit

import httpx

from sam2serve.labelstudio.fetch_policy import FetchPolicy, FetchRefused
from sam2serve.server.errors import ApiError
from sam2serve.server.uploads import decode_base64_image

log = logging.getLogger("sam2serve.labelstudio")

_SHOWN = 120  # characters of a reference shown in a message
MAX_REDIRECTS = 5
_REDIRECTS = (301, 302, 303, 307, 308)


@dataclass(frozen=True)
class ByteLimit:
    """How large a fetched file may be, and what it is called in messages: an image (the
    default: max_upload_bytes, data: URIs decoded) or a video."""

    max_bytes: int
    kind: str = "image"
    setting: str = "max_upload_bytes"
    data_uri: bool = True  # a data: URI is decoded (images only)

    @property
    def what(self) -> str:
        return f"an {self.kind}" if self.kind[:1] in "aeiou" else f"a {self.kind}"


@dataclass(frozen=True)
class LabelStudioAccess:
    """Where Label Studio is and the token to read its files (either may be unknown)."""

    url: str | None = None
    token: str | None = None


class ImageFetcher:
    """Reads task images; one HTTP client (connection pool) for the app's life."""

    def __init__(
        self,
        *,
        max_bytes: int,
        timeout_s: float,
        policy: FetchPolicy | None = None,
        local_roots: tuple[str, ...] = (),
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.max_bytes = max_bytes
        self.local_roots = tuple(os.path.realpath(root) for root in local_roots)
        self.timeout_s = timeout_s
        self.policy = policy or FetchPolicy()
        self._transport = transport
        self._http: httpx.AsyncClient | None = None
        self._access_tokens: dict[tuple[str, str], str] = {}  # (url, personal token) -> JWT

    @property
    def _client(self) -> httpx.AsyncClient:
        """The client, made in the event loop that first fetches (the app's). It follows
        no redirect itself (each is checked here) and reads no proxy or .netrc from the
        environment (no credentials of this machine go anywhere)."""
        if self._http is None:
            self._http = httpx.AsyncClient(
                timeout=self.timeout_s,
                follow_redirects=False,
                trust_env=False,
                transport=self._transport,
            )
        return self._http

    async def aclose(self) -> None:
        if self._http is not None:
            await self._http.aclose()
            self._http = None

    async def fetch(
        self,
        reference: object,
        access: LabelStudioAccess,
        where: str,
        limit: ByteLimit | None = None,
    ) -> bytes:
        """The bytes of the image (or, with a video's ``limit``, the video) ``reference``
        names; ``where`` names it in errors."""
        limit = limit or ByteLimit(self.max_bytes)
        if not isinstance(reference, str) or not reference.strip():
            raise _unavailable(
                f"{where}: expected {limit.what} URL or path, got {_shown(reference)}"
            )
        reference = reference.strip()
        try:
            scheme = urlsplit(reference).scheme.lower()
        except ValueError:  # e.g. an unclosed '[' of an IPv6 address
            raise _unavailable(f"{where}: {_shown(reference)} is not a valid URL") from None
        if scheme == "data" and limit.data_uri:
            return decode_base64_image(reference, limit.max_bytes)
        if scheme in ("http", "https"):
            return await self._download(reference, access, where, limit)
        if scheme == "file" or (not scheme and reference.startswith("/")):
            if scheme == "file" or not _is_ls_path(reference) or self._inside_roots(reference):
                return await asyncio.to_thread(self._read_local, reference, where, limit)
            if access.url is None:
                raise _unavailable(
                    f"{where}: {_shown(reference)} is a path on Label Studio, but its address "
                    "is unknown: start the backend with --label-studio-url (or "
                    "$LABEL_STUDIO_URL); a hostname sent by /setup is used only when the "
                    "operator allowed it (--allow-fetch-host)"
                )
            return await self._download(access.url + reference, access, where, limit)
        data_uri = ", a data: URI," if limit.data_uri else ""
        raise _unavailable(
            f"{where}: {_shown(reference)} is not {limit.what} reference the backend reads; "
            f"accepted: a Label Studio path (/data/...), an http(s) URL{data_uri} or a "
            "local path inside --local-root"
        )

    # ------------------------------------------------------------------ HTTP
    async def _download(
        self, url: str, access: LabelStudioAccess, where: str, limit: ByteLimit
    ) -> bytes:
        """The body at ``url``, redirects followed, all within one deadline."""
        try:
            async with asyncio.timeout(self.timeout_s):
                return await self._follow(url, access, where, limit)
        except TimeoutError:
            raise _unavailable(
                f"{where}: GET {_shown(url)} did not finish within {self.timeout_s:g} s "
                "(--fetch-timeout)"
            ) from None
        except FetchRefused as refused:
            log.info("fetch refused by the policy: %s (for %s)", refused.url[:300], url[:300])
            via = "" if refused.url == url else f" (redirected to {_shown(refused.url)})"
            raise _unavailable(
                f"{where}: {_shown(url)}{via} is not fetched: the backend fetches from the "
                "hosts its operator allowed (--label-studio-url, --allow-fetch-host) and, "
                "unless --no-public-fetch, from public addresses on ports 80 and 443; this "
                "host is none of those, or does not resolve"
            ) from None

    async def _follow(
        self, url: str, access: LabelStudioAccess, where: str, limit: ByteLimit
    ) -> bytes:
        label_studio = _origin(access.url) if access.url is not None else None
        hop = url
        for _ in range(MAX_REDIRECTS + 1):
            to_label_studio = label_studio is not None and _origin(hop) == label_studio
            token = access.token if to_label_studio else None
            headers = await self._auth_headers(access, fresh=False) if token else {}
            data, status, location = await self._get(hop, headers, where, limit)
            if status == 401 and token and _is_jwt(token):  # the access token expired
                fresh = await self._auth_headers(access, True)
                data, status, location = await self._get(hop, fresh, where, limit)
            if status in _REDIRECTS and location:
                try:
                    hop = urljoin(hop, location)
                except ValueError:
                    raise FetchRefused(location) from None
                continue
            if status >= 400:
                hint = ""
                if status in (401, 403):
                    hint = (
                        " (Label Studio refused the token: set $LABEL_STUDIO_API_KEY to a "
                        "token of a user of this project)"
                        if to_label_studio
                        else " (the server wants credentials the backend does not have)"
                    )
                raise _unavailable(f"{where}: GET {_shown(url)} answered HTTP {status}{hint}")
            return data
        raise _unavailable(f"{where}: GET {_shown(url)} redirected more than {MAX_REDIRECTS} times")

    async def _get(
        self, url: str, headers: dict[str, str], where: str, limit: ByteLimit
    ) -> tuple[bytes, int, str | None]:
        """(body, status, Location) of one GET; the body only when the status is < 300."""
        try:
            async with self._request("GET", url, headers) as response:
                if response.status_code >= 300:
                    return b"", response.status_code, response.headers.get("location")
                declared = response.headers.get("content-length", "")
                if declared.isdigit() and int(declared) > limit.max_bytes:
                    raise _too_large(where, int(declared), limit)
                chunks, size = [], 0
                async for chunk in response.aiter_bytes():
                    size += len(chunk)
                    if size > limit.max_bytes:
                        raise _too_large(where, size, limit)
                    chunks.append(chunk)
                return b"".join(chunks), response.status_code, None
        except httpx.TimeoutException:
            raise _unavailable(f"{where}: GET {_shown(url)} timed out") from None
        except httpx.HTTPError as exc:
            raise _unavailable(
                f"{where}: GET {_shown(url)} failed: {exc or type(exc).__name__}"
            ) from None

    @asynccontextmanager
    async def _request(
        self, method: str, url: str, headers: dict[str, str], **kwargs: Any
    ) -> AsyncIterator[httpx.Response]:
        """One request where the policy allows it: a host the operator named goes as it
        is; any other is resolved here, every address checked, and the connection made to
        the first of them (the name stays in the Host header and TLS's server name), so a
        second resolution cannot lead elsewhere. FetchRefused otherwise."""
        scheme, host, port = self.policy.target(url)
        extensions: dict[str, Any] = {}
        if not self.policy.trusts_name(host, port):
            addresses = await _resolve(host, port)
            if not self.policy.allows_addresses(addresses, port):
                raise FetchRefused(url)
            target = httpx.URL(url)
            headers = {**headers, "Host": target.netloc.decode("ascii")}
            if scheme == "https":
                extensions["sni_hostname"] = host
            url = str(target.copy_with(host=str(addresses[0])))
        async with self._client.stream(
            method, url, headers=headers, extensions=extensions, **kwargs
        ) as response:
            yield response

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
            async with self._request(
                "POST", refresh_url, {}, json={"refresh": personal_token}
            ) as response:
                status = response.status_code
                body = await response.aread() if status == 200 else b""
        except httpx.HTTPError as exc:
            raise _unavailable(f"POST {refresh_url} failed: {exc or type(exc).__name__}") from None
        access = _json_field(body[: 64 * 1024], "access") if status == 200 else None
        if not isinstance(access, str):
            raise _unavailable(
                f"POST {refresh_url} answered HTTP {status}: Label Studio did not "
                "accept the personal access token ($LABEL_STUDIO_API_KEY)"
            )
        return access

    # ------------------------------------------------------------------ local files
    def _inside_roots(self, reference: str) -> bool:
        path = unquote(urlsplit(reference).path) if reference.startswith("file:") else reference
        real = os.path.realpath(path)
        return any(real == root or real.startswith(root + os.sep) for root in self.local_roots)

    def _read_local(self, reference: str, where: str, limit: ByteLimit) -> bytes:
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
            if size > limit.max_bytes:
                raise _too_large(where, size, limit)
            with open(real, "rb") as file:
                return file.read()
        except OSError as exc:
            raise _unavailable(
                f"{where}: cannot read {_shown(reference)}: {exc.strerror}"
            ) from None


async def _resolve(host: str, port: int) -> list[ipaddress.IPv4Address | ipaddress.IPv6Address]:
    """The addresses ``host`` resolves to (an address literal is itself); none when it
    does not resolve."""
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return []
    addresses = []
    for _, _, _, _, sockaddr in infos:
        try:
            address = ipaddress.ip_address(str(sockaddr[0]).split("%", 1)[0])
        except ValueError:
            continue
        if address not in addresses:
            addresses.append(address)
    return addresses


def _json_field(body: bytes, name: str) -> object:
    try:
        document = json.loads(body)
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        return None
    return document.get(name) if isinstance(document, dict) else None


def _is_ls_path(reference: str) -> bool:
    """A path Label Studio serves (its uploads, local files, presigned storage URLs)."""
    return reference.startswith(("/data/", "/tasks/", "/storage-data/", "/api/"))


def _is_jwt(token: str) -> bool:
    parts = token.split(".")
    return len(parts) == 3 and all(parts)


def _origin(url: str) -> tuple[str, str]:
    try:
        parts = urlsplit(url)
    except ValueError:  # not a URL: the origin of nothing
        return "", ""
    return parts.scheme.lower(), parts.netloc.lower()


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= _SHOWN else text[: _SHOWN - 3] + "..."


def _unavailable(message: str) -> ApiError:
    return ApiError(422, "image_unavailable", message)


def _too_large(where: str, size: int, limit: ByteLimit) -> ApiError:
    return ApiError(
        413,
        "upload_too_large",
        f"{where}: the {limit.kind} is over {limit.max_bytes} bytes ({size} read); the limit "
        f"is {limit.setting}",
    )


__all__ = ["ByteLimit", "ImageFetcher", "LabelStudioAccess"]
