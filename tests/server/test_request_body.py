"""Reading bodies without letting a body's size or shape cost the server: JSON structure
limits (counted before parsing), nesting depth, base64 in slices, short error values."""

from __future__ import annotations

import base64
import json
import os
import platform

import pytest

from sam2serve.server.errors import ApiError, short_repr
from sam2serve.server.memory import memory_limit_bytes, release_free_memory, resident_bytes
from sam2serve.server.request_body import json_depth, load_json
from sam2serve.server.settings import ServerSettings
from sam2serve.server.uploads import decode_base64_image

LIMITS = ServerSettings.from_flat(max_json_items=1000, max_json_depth=8).limits


def refused(raw: bytes) -> ApiError:
    with pytest.raises(ApiError) as caught:
        load_json(raw, LIMITS, "the body")
    return caught.value


def test_items_are_counted_before_parsing():
    # 1001 separators: refused without parsing, whatever follows (even invalid JSON).
    error = refused(b"[" + b"0," * 1001 + b"this is not JSON")
    assert (error.status, error.code) == (413, "json_too_large")
    assert "1002 JSON items" in error.message and "max_json_items" in error.message
    # Strings count nothing, so a large image in base64 is never refused for its size.
    assert load_json(json.dumps({"image": "A" * 100_000}).encode(), LIMITS, "x")


@pytest.mark.parametrize("depth", [9, 500, 100_000])
def test_nesting_deeper_than_the_limit_is_a_400(depth):
    raw = b"[" * depth + b"]" * depth
    error = refused(raw) if depth <= 1000 else None
    if error is None:  # past max_json_items too: refused for its size first
        error = refused(raw)
        assert error.code == "json_too_large"
        deep = ServerSettings.from_flat(max_json_items=200_000, max_json_depth=8).limits
        with pytest.raises(ApiError) as caught:  # json's own RecursionError, caught
            load_json(raw, deep, "the body")
        error = caught.value
    assert (error.status, error.code) == (400, "json_too_deep")
    assert "8 levels" in error.message


def test_depth_is_measured_without_recursion():
    assert json_depth(1, 8) == 0
    assert json_depth({"a": [{"b": [1]}]}, 8) == 4
    nested: list = []
    for _ in range(50_000):  # deeper than Python's recursion limit
        nested = [nested]
    assert json_depth(nested, 8) == 9  # stops counting past the limit


def test_invalid_json_names_the_problem():
    error = refused(b'{"a": ')
    assert (error.status, error.code) == (400, "invalid_json")
    assert error.message.startswith("the body is not valid JSON")
    # A key given twice: json would keep the last silently.
    error = refused(b'{"objects": [], "image_id": "a", "objects": [1]}')
    assert (error.status, error.code) == (400, "invalid_json")
    assert "the key 'objects' appears more than once" in error.message
    error = refused(b'{"x": ' + b"9" * 5000 + b"}")
    assert "a number has more than 4300 digits" in error.message


def test_base64_in_slices_equals_one_call():
    data = os.urandom(10 * 1024 * 1024 + 7)  # past the 4 Mi-character slice, odd length
    text = base64.b64encode(data).decode()
    assert decode_base64_image(text, len(data)) == data
    url_safe = base64.urlsafe_b64encode(data).decode()
    assert decode_base64_image(url_safe, len(data)) == data
    with pytest.raises(ApiError, match="not valid base64"):
        decode_base64_image(text[:-1], len(data))


def test_error_values_are_short_and_never_raise():
    assert short_repr(10**5000) == "an integer of about 5000 digits"
    assert short_repr([10**5000]) == "a list"  # its repr cannot even be made
    assert len(short_repr("x" * 10_000)) == 60
    assert len(short_repr(list(range(1_000_000)))) == 60


def test_memory_helpers_read_this_process():
    if platform.libc_ver()[0] == "glibc":
        assert release_free_memory()
    physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    assert 0 < memory_limit_bytes() <= physical
    assert 0 < resident_bytes() < physical
