"""Decoder programs exported for another version of the fast decoder's interfaces (what
the side's blocks and statistics and the final keys' rows mean) are never run: the
decoder runs eagerly from the same weights, and says why."""

from __future__ import annotations

import json
import shutil

import pytest

from sam2serve.runtime.decoder_programs import INTERFACE
from sam2serve.runtime.export import load_artifacts


@pytest.mark.extended  # the decoder programs: compiled minutes (tests/conftest.py)
@pytest.mark.parametrize("interface", [None, 1, INTERFACE + 1])
def test_programs_of_another_interface_run_eagerly(exported_programs, tmp_path, interface):
    copy = tmp_path / "copy"
    shutil.copytree(exported_programs, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    assert manifest["decoder"]["interface"] == INTERFACE  # what an export writes now
    if interface is None:  # written before interfaces were recorded
        del manifest["decoder"]["interface"]
    else:
        manifest["decoder"]["interface"] = interface
    (copy / "manifest.json").write_text(json.dumps(manifest))
    loaded = load_artifacts(copy)
    assert type(loaded.fast_decoder).__name__ == "FastMaskDecoder"
    version = 1 if interface is None else interface
    expected = f"programs of decoder interface {version}, not {INTERFACE}: export again"
    assert loaded.fast_decoder.source == f"eager ({expected})"
