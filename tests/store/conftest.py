"""Fixtures of the store tests: a tiny model with random weights."""

from __future__ import annotations

import pytest

from sam2serve.engine.predictor import Predictor


@pytest.fixture(scope="session")
def tiny_predictor() -> Predictor:
    from sam2serve.checkpoint import load_model

    return Predictor(load_model("tiny", random_weights=True, seed=0))
