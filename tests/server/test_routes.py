"""The endpoints as module-level routers with dependencies, checked on real servers.

The routers exist once per process and serve every app; what they need comes from the
app answering the request. These tests check that from the outside: the OpenAPI document
(FastAPI's own reading of the app) against the routers, the API key against what the
document promises, the metric labels against the requests actually sent, and two apps in
one process against each other.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import httpx
import pytest
from fastapi.routing import APIRoute
from server_support import LiveServer, scrape, start_server, wait_ready

from sam2serve.server.api_docs import DOCS_URL, REDOC_URL
from sam2serve.server.app import endpoint_paths
from sam2serve.server.metrics import OTHER_ENDPOINT
from sam2serve.server.routes import ROUTERS
from sam2serve.server.routes import page as page_routes
from sam2serve.server.settings import ServerSettings

API_KEY = "routes-test-key"
_ENDPOINT_LABEL = re.compile(r'endpoint="([^"]*)"')


@pytest.fixture(scope="module")
def keyed(predictor) -> Iterator[LiveServer]:
    live = start_server(ServerSettings.from_flat(warmup=False, api_key=API_KEY), predictor)
    wait_ready(live)
    yield live
    live.stop()


def documented_operations(live: LiveServer) -> set[tuple[str, str]]:
    """(path, METHOD) of every operation in the app's OpenAPI document."""
    with live.client() as client:
        paths = client.get("/openapi.json").json()["paths"]
    return {(path, method.upper()) for path, operations in paths.items() for method in operations}


def call(client: httpx.Client, path: str, method: str, **headers: str) -> httpx.Response:
    """One request that does no model work: POSTs get an empty object (a 4xx at worst)."""
    body = {"json": {}} if method == "POST" else {}
    return client.request(method, path, headers=headers, **body)


def test_every_documented_endpoint_is_a_route_of_a_router(keyed):
    """No endpoint is defined inside create_app, and every router route reaches the app."""
    from_routers = {
        (route.path, method)
        for router in ROUTERS
        for route in router.routes
        if isinstance(route, APIRoute) and route.include_in_schema
        for method in route.methods
    }
    assert documented_operations(keyed) == from_routers
    assert {path for path, _ in from_routers} == {
        "/v1/embeddings",
        "/v1/segment",
        "/v1/amg",
        "/v1/concepts",
        "/v1/coco",
        "/v1/images",
        "/v1/images/file",
        "/v1/videos",
        "/v1/videos/live",
        "/v1/videos/{session_id}",
        "/v1/videos/{session_id}/prompts",
        "/v1/videos/{session_id}/propagate",
        "/v1/videos/{session_id}/concepts",
        "/v1/videos/{session_id}/concepts/track",
        "/v1/videos/{session_id}/reset",
        "/v1/videos/{session_id}/objects/{obj_id}",
        "/v1/videos/{session_id}/frames/{frame_idx}",
        "/v1/video-export",
        "/healthz",
        "/readyz",
        "/metrics",
    }


def test_the_api_key_guards_exactly_the_operations_documented_with_401(keyed):
    operations = documented_operations(keyed)
    with keyed.client() as client:
        spec = client.get("/openapi.json").json()["paths"]
        guarded = {(p, m) for p, m in operations if "401" in spec[p][m.lower()]["responses"]}
        assert guarded == {(p, m) for p, m in operations if p.startswith("/v1/")} | {
            ("/metrics", "GET")
        }
        for path, method in sorted(operations):
            without = call(client, path, method)
            assert (without.status_code == 401) == ((path, method) in guarded), (path, method)
            if (path, method) in guarded:
                assert without.headers["www-authenticate"] == "Bearer"
                assert without.json()["error"]["code"] == "unauthorized"
            for header in ({"x-api-key": API_KEY}, {"authorization": f"Bearer {API_KEY}"}):
                assert call(client, path, method, **header).status_code != 401, (path, header)


def test_metric_labels_are_the_paths_the_app_routes(keyed):
    """Every endpoint is counted under its own path, every other path under "other", and
    the labels are exactly the app's route paths (endpoint_paths)."""
    docs_pages = {DOCS_URL, REDOC_URL, keyed.app.swagger_ui_oauth2_redirect_url}
    # The annotation page and its assets: routes of their own, left out of the schema.
    docs_pages |= {route.path for route in page_routes.router.routes if isinstance(route, APIRoute)}
    operations = documented_operations(keyed)
    key = {"x-api-key": API_KEY}
    with keyed.client() as client:
        for path, method in sorted(operations):
            call(client, path, method, **key)
        for page in docs_pages:
            assert client.get(page).status_code == 200, page
        for stray in ("/v1/nothing", "/v1/segment/extra"):
            assert client.get(stray).status_code == 404, stray
        assert client.get("/metrics").status_code == 401
    with keyed.client(headers=key) as client:
        samples = scrape(client)
    labels = {
        _ENDPOINT_LABEL.search(name).group(1)
        for name in samples
        if name.startswith("sam2serve_requests_total{")
    }
    routed = {path for path, _ in operations} | docs_pages
    assert labels == routed | {OTHER_ENDPOINT}
    assert endpoint_paths(keyed.app) == routed


def test_two_apps_share_the_routers_but_not_their_resources(keyed, server_factory, predictor):
    """The routers are module-level: each app must still answer with its own settings
    (the API key) and count into its own metrics."""
    open_app = server_factory(predictor)
    healthz = 'sam2serve_requests_total{endpoint="/healthz",status="200"}'
    with (
        open_app.client() as client,
        keyed.client() as keyless,
        keyed.client(headers={"x-api-key": API_KEY}) as keyed_client,
    ):
        assert client.get("/metrics").status_code == 200
        assert keyless.get("/metrics").status_code == 401
        keyed_before = scrape(keyed_client).get(healthz, 0)
        for _ in range(3):
            assert client.get("/healthz").status_code == 200
        assert scrape(client)[healthz] == 3
        assert scrape(keyed_client).get(healthz, 0) == keyed_before
    assert open_app.service is not keyed.service
