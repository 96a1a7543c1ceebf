"""/docs and /redoc work offline: the pages reference only this server, and every asset
they name is served by it."""

from __future__ import annotations

import re
from urllib.parse import urlsplit

import httpx
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from sam2serve.server.api_docs import ASSETS_URL, install_offline_docs

# Every URL a page loads or links: src/href attributes, Swagger UI's url, ReDoc's spec-url.
_URL = re.compile(r"""(?:src|href|spec-url)\s*=\s*["']([^"']+)|\burl:\s*'([^']+)'""")


def page_urls(html: str) -> list[str]:
    return [a or b for a, b in _URL.findall(html)]


def check_docs_offline(get) -> None:
    for page in ("/docs", "/redoc"):
        response = get(page)
        assert response.status_code == 200, page
        assert response.headers["content-type"].startswith("text/html")
        urls = page_urls(response.text)
        assert any(url.startswith(ASSETS_URL) for url in urls), urls
        for url in urls:
            parts = urlsplit(url)
            assert not parts.scheme and not parts.netloc, f"{page} loads {url} from elsewhere"
            assert get(url).status_code == 200, url
        assert "cdn" not in response.text.lower() and "fonts.googleapis" not in response.text
    bundle = get(f"{ASSETS_URL}/swagger-ui-bundle.js")
    assert "SwaggerUIBundle" in bundle.text[:2000]
    assert (
        get(f"{ASSETS_URL}/redoc.standalone.js")
        .headers["content-type"]
        .startswith("text/javascript")
    )


def test_pages_and_assets_are_served_locally():
    app = FastAPI(title="t", docs_url=None, redoc_url=None)
    install_offline_docs(app)
    with TestClient(app) as client:
        check_docs_offline(client.get)
        assert client.get("/docs/oauth2-redirect").status_code == 200
        assert "/docs" not in client.get("/openapi.json").json()["paths"]


def test_an_app_with_fastapis_own_pages_is_refused():
    with pytest.raises(ValueError, match="docs_url=None, redoc_url=None"):
        install_offline_docs(FastAPI())


def test_the_service_serves_its_docs_offline(main_server):
    with httpx.Client(base_url=main_server.url, timeout=30) as client:
        check_docs_offline(client.get)
