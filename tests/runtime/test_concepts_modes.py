"""SAM 3 under the product's modes (:mod:`sam2serve.runtime.concepts`): which precision
each part computes in, per mode and per host; the conversion in place that every surface
uses; the encodings kept in the mode's dtype; furious's answers against fp32's on
identical weights; and the surfaces (run, serve, labelstudio) handing their --mode over."""

from __future__ import annotations

import argparse
import copy

import numpy as np
import pytest
import torch

from sam2serve.concepts.agreement import agreement
from sam2serve.concepts.runtime import Concepts
from sam2serve.runtime import concepts as runtime_concepts
from sam2serve.runtime.concepts import (
    CONCEPT_MODES,
    apply_concepts_mode,
    concepts_dtype,
    describe_concepts_mode,
    stage_precisions,
)
from sam2serve.runtime.modes import MODES

BF16 = torch.bfloat16


def _image(seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (48, 64, 3), dtype=np.uint8)


def _copy(concepts: Concepts) -> Concepts:
    model = copy.deepcopy(concepts.model)
    return Concepts(model, concepts.tokenize, concepts.size, concepts.spec, concepts.tracker)


def test_every_mode_says_what_it_does_to_sam3():
    assert set(CONCEPT_MODES) == set(MODES)
    assert all(CONCEPT_MODES.values())


@pytest.mark.parametrize("native", ["bfloat16", "float32"])
def test_dtype_rule_follows_the_host(monkeypatch, native):
    """furious and int8 compute in the device's native reduced precision: bf16 where the
    CPU has it, fp32 where bf16 is emulated (as SAM 2.1's furious); the lossless modes in
    fp32; ``reduced`` overrides the host (the bench's accuracy rows)."""
    monkeypatch.setattr(runtime_concepts, "native_reduced_dtype", lambda device: native)
    expected = {"bfloat16": BF16, "float32": torch.float32}[native]
    assert concepts_dtype("baseline", "cpu") == torch.float32
    assert concepts_dtype("fast", "cpu") == torch.float32
    assert concepts_dtype("furious", "cpu") == expected
    assert concepts_dtype("int8", "cpu") == expected
    assert concepts_dtype("furious", "cpu", reduced=BF16) == BF16
    assert concepts_dtype("baseline", "cpu", reduced=BF16) == torch.float32
    with pytest.raises(ValueError, match="'turbo'"):
        concepts_dtype("turbo", "cpu")


def test_lossless_modes_leave_the_model_as_loaded(concepts_tiny):
    for mode in ("baseline", "fast"):
        assert apply_concepts_mode(concepts_tiny, mode) is concepts_tiny
    assert stage_precisions(concepts_tiny, "baseline") == {
        "backbone": "fp32",
        "text": "fp32",
        "detector": "fp32",
    }


def test_furious_converts_in_place_and_keeps_encodings_in_bf16(concepts_tiny):
    """A surface's one model is converted in place (no second copy held); its encodings
    (what the service caches) are bf16: half the bytes of fp32's, but for the interactive
    side the tracker heads make, which stay float32 (as SAM 2.1's heads)."""
    own = _copy(concepts_tiny)
    furious = apply_concepts_mode(own, "furious", reduced=BF16)
    assert furious.model is own.model
    assert {p.dtype for p in own.model.parameters()} == {BF16}
    assert stage_precisions(furious, "furious") == {
        "backbone": "bf16",
        "text": "bf16",
        "detector": "bf16",
    }
    line = describe_concepts_mode("furious", furious)
    assert "furious" in line and "detector bf16" in line and "backend eager" in line
    image = _image()
    fp32_encoding = concepts_tiny.encode([image])[0]
    bf16_encoding = furious.encode([image])[0]
    assert {t.dtype for t in bf16_encoding.fpn_hidden_states} == {BF16}
    assert bf16_encoding.tracker.image_embed.dtype == torch.float32
    side = fp32_encoding.tracker.nbytes
    assert bf16_encoding.tracker.nbytes == side > 0
    assert (bf16_encoding.nbytes - side) * 2 == fp32_encoding.nbytes - side


@pytest.mark.parametrize("mode", ["furious", "int8"])
def test_reduced_modes_answer_near_fp32(concepts_tiny, mode):
    """The same instances (threshold 0: every query, matched by index) up to the
    precision: scores as fp32 floats, close to fp32's, masks overlapping. Random tiny
    weights are a harsh case (no trained margins), so the bounds are loose; the bench
    reports the full-size numbers."""
    moded = apply_concepts_mode(concepts_tiny, mode, reduced=BF16, copy=True)
    image, phrases = _image(1), ["cat", "red car"]
    reference = concepts_tiny.segment([image], phrases, score_thresh=0.0)[0]
    answer = moded.segment([image], phrases, score_thresh=0.0)[0]
    for phrase in phrases:
        assert len(answer[phrase]) == len(reference[phrase]) == concepts_tiny.size.queries
        assert all(isinstance(i.score, float) for i in answer[phrase])
        agree = agreement(reference[phrase], answer[phrase], top_k=5)
        assert agree.miou > 0.9 and agree.max_score_diff < 0.05, (phrase, agree)
        # bf16 really ran: the answers are not fp32's bit for bit
        assert any(
            a.score != r.score for a, r in zip(answer[phrase], reference[phrase], strict=True)
        )


def test_exemplar_boxes_run_in_bf16(concepts_tiny):
    from sam2serve.concepts.engine import ExemplarBox

    moded = apply_concepts_mode(concepts_tiny, "furious", reduced=BF16, copy=True)
    boxes = [ExemplarBox((4.0, 4.0, 30.0, 20.0)), ExemplarBox((35.0, 10.0, 60.0, 40.0), False)]
    found = moded.segment([_image(2)], ["cat"], boxes, score_thresh=0.0)[0]["cat"]
    assert len(found) == concepts_tiny.size.queries


def test_int8_needs_the_cpu(concepts_tiny):
    elsewhere = _copy(concepts_tiny)
    elsewhere.model.to("meta")
    with pytest.raises(ValueError, match="CPU only"):
        apply_concepts_mode(elsewhere, "int8")


# --------------------------------------------------------------------------- surfaces


def _sam3_args() -> argparse.Namespace:
    return argparse.Namespace(sam3_weights=None, sam3_size="tiny", random_weights=True, seed=0)


def test_serve_and_labelstudio_load_sam3_in_their_mode(monkeypatch, tmp_path):
    """serve --concepts and labelstudio --concepts hand their --mode to SAM 3."""
    from sam2serve.commands import labelstudio, serve
    from sam2serve.commands.concepts_flags import concepts_spec

    monkeypatch.setenv("SAM2SERVE_CACHE", str(tmp_path))
    monkeypatch.setattr(runtime_concepts, "native_reduced_dtype", lambda device: "bfloat16")
    settings = argparse.Namespace(concepts=argparse.Namespace(enabled=True))
    served = serve.load_concepts_flags(_sam3_args(), settings, "cpu", "furious")
    assert stage_precisions(served, "furious")["detector"] == "bf16"
    labelled = labelstudio._load_concepts(concepts_spec(_sam3_args(), "cpu"), "fast")
    assert stage_precisions(labelled, "fast")["detector"] == "fp32"
