"""GET /: the annotation page, and GET /page/<asset>: its scripts and styles.

The page is plain HTML, a few ES modules and one style sheet shipped in
``sam2serve/server/page/``: no build step, no framework, nothing from a CDN, so it works
offline. It talks to the server only through the public API (/v1/embeddings, /v1/segment,
/v1/amg, /v1/coco, /v1/images) with the API key the person types in, so it needs no
access of its own: like /docs, the page and its assets are open, the API behind it is not.

Every asset gets a route of its own, made from the files present when this module is
imported: the paths are literal (each is its own metric label) and no part of a URL ever
becomes a file path. Files are read once; answers carry an ETag (the content's hash) and
a Content-Security-Policy that allows this origin only.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from importlib.resources import files

from fastapi import APIRouter, Request
from fastapi.responses import Response

from sam2serve.server.errors import ApiError

log = logging.getLogger("sam2serve.server")

PAGE_URL = "/"
ASSETS_URL = "/page"
INDEX = "index.html"
MEDIA_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
}
# Only this origin: scripts and styles from /page, images drawn from blobs, API calls here.
CONTENT_SECURITY_POLICY = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' blob: data:; "
    "connect-src 'self'; object-src 'none'; base-uri 'none'; frame-ancestors 'none'"
)


@dataclass(frozen=True)
class Asset:
    content: bytes
    media_type: str
    etag: str


def load_assets() -> dict[str, Asset]:
    """The page's files by name (index.html included), read from the installed package;
    empty (and logged) when an installation left them out: the API still serves."""
    folder = files("sam2serve.server") / "page"
    assets = {}
    if folder.is_dir():
        for entry in folder.iterdir():
            suffix = "." + entry.name.rsplit(".", 1)[-1] if "." in entry.name else ""
            if entry.is_file() and suffix in MEDIA_TYPES:
                content = entry.read_bytes()
                etag = '"' + hashlib.sha256(content).hexdigest()[:32] + '"'
                assets[entry.name] = Asset(content, MEDIA_TYPES[suffix], etag)
    if INDEX not in assets:
        log.warning("the annotation page is not installed: no %s in %s", INDEX, folder)
        return {}
    return assets


ASSETS = load_assets()
router = APIRouter()


def serve(asset: Asset) -> Callable[[Request], Awaitable[Response]]:
    """The endpoint of one asset: its bytes, or 304 when the browser has them."""

    async def endpoint(request: Request) -> Response:
        headers = {
            "ETag": asset.etag,
            "Cache-Control": "no-cache",  # revalidate: a new version shows at once
            "X-Content-Type-Options": "nosniff",
            "Content-Security-Policy": CONTENT_SECURITY_POLICY,
        }
        if request.headers.get("if-none-match") == asset.etag:
            return Response(status_code=304, headers=headers)
        return Response(asset.content, media_type=asset.media_type, headers=headers)

    return endpoint


async def missing_page() -> Response:
    raise ApiError(
        404,
        "page_not_installed",
        f"the annotation page's files are missing from this installation (sam2serve/server/"
        f"page/{INDEX}); the API works: see /docs",
    )


router.add_api_route(
    PAGE_URL,
    serve(ASSETS[INDEX]) if INDEX in ASSETS else missing_page,
    methods=["GET"],
    include_in_schema=False,
    response_class=Response,
    name="annotation_page",
)
for _name, _asset in sorted(ASSETS.items()):
    if _name != INDEX:
        router.add_api_route(
            f"{ASSETS_URL}/{_name}",
            serve(_asset),
            methods=["GET"],
            include_in_schema=False,
            response_class=Response,
            name=f"page_asset_{_name}",
        )

__all__ = ["ASSETS", "ASSETS_URL", "PAGE_URL", "router"]
