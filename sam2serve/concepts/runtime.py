"""The concept model a surface runs: SAM 3 from the weights folder, or a seeded random one.

Every surface (``run --task concepts``, the service, Label Studio, bench) loads it through
:func:`load_concepts` from a :class:`ConceptsSpec`, and calls :class:`Concepts` methods,
which are the engine's functions bound to the model and its tokenizer.

Random weights (smoke tests, benches: Meta's weights are gated) tokenise with CLIP's public
BPE vocabulary (:mod:`sam2serve.concepts.tokenizer`): the same ids as Meta's weights' files.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from sam2serve.concepts.engine import (
    DEFAULT_SCORE_THRESH,
    ConceptEncoding,
    ExemplarBox,
    Instance,
    TextEncoding,
    Tokenize,
    detect,
    encode_images,
    encode_text,
    segment_concepts,
)
from sam2serve.concepts.model import Sam3Size, build_model
from sam2serve.concepts.tokenizer import load_tokenizer

if TYPE_CHECKING:
    from transformers import Sam3Model

SIZES = {"full": Sam3Size.full, "tiny": Sam3Size.tiny}


@dataclass(frozen=True)
class ConceptsSpec:
    """Where the concept model comes from. ``weights``: a folder holding ``sam3.pt``,
    ``vocab.json`` and ``merges.txt`` (None: the download cache). ``random_weights``: a
    seeded random model of ``size`` (``full`` is SAM 3's; ``tiny`` is for tests)."""

    weights: Path | None = None
    random_weights: bool = False
    seed: int = 0
    size: str = "full"
    device: str = "cpu"

    def __post_init__(self) -> None:
        if self.size not in SIZES:
            raise ValueError(f"SAM 3 size must be one of {', '.join(SIZES)}; got {self.size!r}")
        if self.size != "full" and not self.random_weights:
            raise ValueError(f"SAM 3 size {self.size!r} exists for --random-weights only")


def randomize_(model: Sam3Model, seed: int) -> None:
    """Every floating tensor from ``seed``: norm scales 1 + noise, the rest noise (0.02)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, tensor in model.state_dict().items():
            if not tensor.is_floating_point():
                continue
            noise = torch.randn(tensor.shape, generator=generator) * 0.02
            base = 1.0 if name.endswith("weight") and tensor.ndim == 1 else 0.0
            tensor.copy_((noise + base).to(tensor.dtype))


@dataclass
class Concepts:
    """A loaded concept model and its tokenizer: the engine's calls, bound."""

    model: Sam3Model
    tokenize: Tokenize
    size: Sam3Size
    spec: ConceptsSpec = field(default_factory=ConceptsSpec)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def encode(self, images: Sequence[np.ndarray]) -> list[ConceptEncoding]:
        return encode_images(self.model, images)

    def encode_text(self, phrases: Sequence[str]) -> TextEncoding:
        return encode_text(self.model, self.tokenize, phrases)

    def detect(
        self,
        encoding: ConceptEncoding,
        phrases: Sequence[str],
        boxes: Sequence[ExemplarBox] = (),
        score_thresh: float = DEFAULT_SCORE_THRESH,
        text: TextEncoding | None = None,
        max_instances: int | None = None,
    ) -> dict[str, list[Instance]]:
        return detect(
            self.model, self.tokenize, encoding, phrases, boxes, score_thresh, text, max_instances
        )

    def segment(
        self,
        images: Sequence[np.ndarray],
        phrases: Sequence[str],
        boxes: Sequence[ExemplarBox] = (),
        score_thresh: float = DEFAULT_SCORE_THRESH,
    ) -> list[dict[str, list[Instance]]]:
        return segment_concepts(self.model, self.tokenize, images, phrases, boxes, score_thresh)


def load_concepts(spec: ConceptsSpec) -> Concepts:
    """The concept model of ``spec`` on its device. Real weights: strictly checked
    (:func:`sam2serve.concepts.weights.load`; a one-line ``WeightsError`` when missing).
    Random: CLIP's public BPE vocabulary (a one-line ``WeightsError`` saying how to install
    it when missing), loaded before the model is built."""
    size = SIZES[spec.size]()
    if spec.random_weights:
        tokenize = load_tokenizer()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(spec.seed)
            model = build_model(size)
        randomize_(model, spec.seed)
    else:
        from sam2serve.concepts.weights import load

        model, tokenize = load(spec.weights, size)
    moved = model.to(spec.device)  # type: ignore[arg-type]  # transformers' @wraps on PreTrainedModel.to hides its self
    return Concepts(moved, tokenize, size, spec)
