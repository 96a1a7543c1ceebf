"""The concept runtime: the stand-in tokenizer, seeded random models, the spec's checks,
and the engine's encode/detect split equal to one segment call."""

from __future__ import annotations

import argparse

import numpy as np
import pytest

from sam2serve.commands.common import UsageError
from sam2serve.commands.concepts_flags import add_concepts_flags, concepts_spec
from sam2serve.concepts.engine import ExemplarBox, load_tokenizer, token_batch
from sam2serve.concepts.runtime import ConceptsSpec, write_stand_in_tokenizer


def test_stand_in_tokenizer_is_clip_bytes(tmp_path):
    tokenize = load_tokenizer(write_stand_in_tokenizer(tmp_path))
    ids = tokenize("Red cat")
    assert ids[0] == 512 and ids[-1] == 513  # start, end after 256 bytes + 256 word ends
    assert len(ids) == 2 + len("redcat")  # lower-cased, one token per character
    assert all(0 <= i < 49408 for i in ids)
    long_ids, mask = token_batch(tokenize, ["x" * 100])
    assert long_ids.shape == (1, 32) and long_ids[0, -1] == 513 and mask.all()


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
