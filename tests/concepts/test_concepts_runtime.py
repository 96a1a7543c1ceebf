"""The concept runtime: the random path's real tokenizer, seeded random models, the spec's
checks, and the engine's encode/detect split equal to one segment call."""

from __future__ import annotations

import argparse

import numpy as np
import pytest

from sam2serve.commands.common import UsageError
from sam2serve.commands.concepts_flags import add_concepts_flags, concepts_spec
from sam2serve.concepts import tokenizer
from sam2serve.concepts.engine import ExemplarBox, token_batch
from sam2serve.concepts.runtime import ConceptsSpec, load_concepts
from sam2serve.concepts.weights import WeightsError


def test_random_weights_tokenise_with_clips_vocabulary(concepts_tiny):
    ids = concepts_tiny.tokenize("Red cat")
    assert ids[0] == 49406 and ids[-1] == 49407  # CLIP's start and end
    assert len(ids) == 4  # "red", "cat": one BPE token each, not one per character
    long_ids, mask = token_batch(concepts_tiny.tokenize, ["red cat " * 20])
    assert long_ids.shape == (1, 32) and long_ids[0, -1] == 49407 and mask.all()


def test_random_weights_without_the_vocabulary_say_how_to_get_it(monkeypatch):
    monkeypatch.setattr(tokenizer, "CLIP_BPE_PACKAGE", "no_such_package_sam2serve")
    with pytest.raises(WeightsError, match="pip install --no-deps open-clip-torch"):
        load_concepts(ConceptsSpec(random_weights=True, size="tiny"))


def test_spec_checks():
    with pytest.raises(ValueError, match="'huge'"):
        ConceptsSpec(random_weights=True, size="huge")
    with pytest.raises(ValueError, match="random-weights only"):
        ConceptsSpec(size="tiny")
    parser = argparse.ArgumentParser()
    parser.add_argument("--random-weights", action="store_true")
    parser.add_argument("--seed", type=int, default=0)
    add_concepts_flags(parser)
    spec = concepts_spec(parser.parse_args(["--random-weights", "--sam3-size", "tiny"]))
    assert spec.random_weights and spec.size == "tiny"
    with pytest.raises(UsageError, match="exclude"):
        concepts_spec(parser.parse_args(["--random-weights", "--sam3-weights", "w"]))
    with pytest.raises(UsageError, match="random-weights only"):
        concepts_spec(parser.parse_args(["--sam3-size", "tiny"]))


def test_encode_detect_equal_segment(concepts_tiny):
    rng = np.random.default_rng(3)
    images = [rng.integers(0, 256, (120, 160, 3), dtype=np.uint8) for _ in range(2)]
    box = [ExemplarBox((10, 10, 80, 60))]
    whole = concepts_tiny.segment(images, ["cat", "dog"], box, score_thresh=0.0)
    encodings = concepts_tiny.encode(images)
    assert encodings[1].height == 120 and encodings[1].width == 160
    assert encodings[0].nbytes > 0
    for encoding, expected in zip(encodings, whole, strict=True):
        got = concepts_tiny.detect(encoding, ["dog"], box, score_thresh=0.0)["dog"]
        want = expected["dog"]
        assert len(got) == len(want) == concepts_tiny.size.queries
        np.testing.assert_allclose([i.score for i in got], [i.score for i in want], atol=1e-5)
    # random weights score near 0.25: Meta's default 0.5 keeps nothing
    assert concepts_tiny.segment(images[:1], ["cat"])[0]["cat"] == []
