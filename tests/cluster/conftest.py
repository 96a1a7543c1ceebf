"""The cluster tests need Ray Serve; their artifacts are tests/conftest.py's
``exported_artifacts`` (random tiny weights, fast mode, decoder programs included)."""

from __future__ import annotations

import pytest

pytest.importorskip("ray.serve")
