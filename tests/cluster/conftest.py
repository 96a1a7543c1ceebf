"""The cluster tests need Ray Serve; their artifacts are tests/conftest.py's
``exported_artifacts`` (random tiny weights, fast mode) or, for the real cluster of the
second tier, ``exported_programs`` (the same with the decoder programs)."""

from __future__ import annotations

import pytest

pytest.importorskip("ray.serve")
