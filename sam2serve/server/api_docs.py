"""The API docs pages (/docs: Swagger UI, /redoc: ReDoc) served from installed files.

FastAPI's own pages load Swagger UI and ReDoc from a CDN, so on a machine without the
internet (or behind a strict proxy) /docs is a blank page. Here the pages reference only
this server: the JavaScript and CSS come from the ``fastapi-offline`` package (Swagger UI
5 and ReDoc 2, the versions FastAPI's pages ask the CDN for), mounted under
:data:`ASSETS_URL`. The app must be created with ``docs_url=None, redoc_url=None``.
"""

from __future__ import annotations

from importlib.resources import files

from fastapi import FastAPI, Request
from fastapi.openapi.docs import (
    get_redoc_html,
    get_swagger_ui_html,
    get_swagger_ui_oauth2_redirect_html,
)
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

__all__ = ["ASSETS_URL", "DOCS_URL", "REDOC_URL", "install_offline_docs"]

DOCS_URL = "/docs"
REDOC_URL = "/redoc"
ASSETS_URL = "/docs-assets"
ASSETS_PACKAGE = (
    "fastapi_offline"  # ships swagger-ui-bundle.js, swagger-ui.css, redoc.standalone.js
)
SWAGGER_JS = "swagger-ui-bundle.js"
SWAGGER_CSS = "swagger-ui.css"
REDOC_JS = "redoc.standalone.js"
FAVICON = "favicon.png"


def assets_directory() -> str:
    """The installed directory holding the Swagger UI and ReDoc files."""
    return str(files(ASSETS_PACKAGE) / "static")


def install_offline_docs(app: FastAPI) -> None:
    """Serve /docs and /redoc (and Swagger UI's OAuth2 redirect page) from local assets."""
    if app.docs_url is not None or app.redoc_url is not None:
        raise ValueError(
            "create the app with docs_url=None, redoc_url=None: its own /docs and /redoc "
            "load their scripts from a CDN"
        )
    openapi_url = app.openapi_url or "/openapi.json"
    oauth2_redirect_url = app.swagger_ui_oauth2_redirect_url
    app.mount(ASSETS_URL, StaticFiles(directory=assets_directory()), name="docs-assets")

    def asset(request: Request, name: str) -> str:
        return f"{request.scope.get('root_path', '')}{ASSETS_URL}/{name}"

    @app.get(DOCS_URL, include_in_schema=False)
    async def swagger_ui(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "")
        return get_swagger_ui_html(
            openapi_url=f"{root}{openapi_url}",
            title=f"{app.title} - API docs",
            oauth2_redirect_url=f"{root}{oauth2_redirect_url}" if oauth2_redirect_url else None,
            swagger_js_url=asset(request, SWAGGER_JS),
            swagger_css_url=asset(request, SWAGGER_CSS),
            swagger_favicon_url=asset(request, FAVICON),
            swagger_ui_parameters=app.swagger_ui_parameters,
        )

    if oauth2_redirect_url:

        @app.get(oauth2_redirect_url, include_in_schema=False)
        async def swagger_ui_redirect() -> HTMLResponse:
            return get_swagger_ui_oauth2_redirect_html()

    @app.get(REDOC_URL, include_in_schema=False)
    async def redoc(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "")
        return get_redoc_html(
            openapi_url=f"{root}{openapi_url}",
            title=f"{app.title} - API reference",
            redoc_js_url=asset(request, REDOC_JS),
            redoc_favicon_url=asset(request, FAVICON),
            with_google_fonts=False,
        )
