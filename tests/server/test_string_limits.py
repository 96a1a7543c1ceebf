"""Every string a request body carries has a length limit, in both apps (``serve`` and
``labelstudio``): in the OpenAPI document (``maxLength``, a ``pattern`` of bounded length,
an ``enum``), or, for the few strings whose size the data decides, a check of their own
named here. A new string field without one fails this test."""

from __future__ import annotations

from typing import Any

import pytest

from sam2serve.labelstudio.app import create_labelstudio_app
from sam2serve.labelstudio.options import LabelStudioOptions
from sam2serve.server.app import create_app
from sam2serve.server.settings import ServerSettings

# Strings bounded by a check of their own rather than by the schema.
OWN_CHECKS = {
    # base64 of an image: at most max_upload_bytes once decoded, refused from its length
    # before it is decoded (uploads.decode_base64_image).
    "image": "max_upload_bytes",
    # RLE strings: read in pieces, refused at the first bad run; a mask prompt's is
    # refused past 7 characters a pixel of its frame before it is read (routes/videos.py),
    # a COCO export's is within the decode budget (routes/coco.py).
    "counts": "the mask's size and the decode budget",
}


def string_fields(schema: Any, components: dict[str, Any], path: str = "") -> list[tuple]:
    """(path, schema) of every string in ``schema``, references followed."""
    found: list[tuple] = []
    stack: list[tuple[str, Any, frozenset[str]]] = [(path, schema, frozenset())]
    while stack:
        where, node, seen = stack.pop()
        if not isinstance(node, dict):
            continue
        ref = node.get("$ref")
        if ref:
            name = ref.rsplit("/", 1)[-1]
            if name not in seen:
                stack.append((where, components[name], seen | {name}))
            continue
        if node.get("type") == "string" and node.get("format") != "binary":
            found.append((where, node))
        for key in ("anyOf", "oneOf", "allOf"):
            for option in node.get(key, []):
                stack.append((where, option, seen))
        for name, child in node.get("properties", {}).items():
            stack.append((f"{where}.{name}", child, seen))
        if isinstance(node.get("items"), dict):
            stack.append((f"{where}[]", node["items"], seen))
    return found


def unbounded(spec: dict[str, Any]) -> set[str]:
    components = spec.get("components", {}).get("schemas", {})
    missing = set()
    for path, methods in spec["paths"].items():
        for method, operation in methods.items():
            content = operation.get("requestBody", {}).get("content", {})
            for body in content.values():
                for where, node in string_fields(body.get("schema", {}), components):
                    bounded = "maxLength" in node or "enum" in node or "const" in node
                    if "pattern" in node and "maxLength" not in node:
                        bounded = "{" in node["pattern"] and node["pattern"].endswith("$")
                    field = where.rsplit(".", 1)[-1]
                    if not bounded and field not in OWN_CHECKS:
                        missing.add(f"{method.upper()} {path} {where}")
    return missing


@pytest.mark.parametrize("app_kind", ["serve", "labelstudio"])
def test_every_request_string_has_a_length_limit(app_kind, predictor, tmp_path):
    settings = ServerSettings.from_flat(warmup=False, video=False, images_dir=str(tmp_path))
    if app_kind == "serve":
        app = create_app(settings, predictor)
    else:
        app = create_labelstudio_app(settings, LabelStudioOptions(), predictor)
    assert unbounded(app.openapi()) == set()
