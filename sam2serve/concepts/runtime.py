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

from sam2serve.concepts import weights as weights_folder
from sam2serve.concepts.checkpoint import load_strict, meta_to_transformers
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
from sam2serve.concepts.interactive import InteractivePredictor
from sam2serve.concepts.model import Sam3Size, build_model
from sam2serve.concepts.tokenizer import ClipTokenizer, load_tokenizer
from sam2serve.concepts.tracker_heads import (
    TrackerHeads,
    build_tracker_heads,
    load_tracker_heads,
)

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


def randomize_(model: torch.nn.Module, seed: int) -> None:
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
    """A loaded concept model and its tokenizer: the engine's calls, bound. ``tracker``:
    SAM 3's tracker heads (the interactive path, :attr:`interactive`), which every
    encoding then carries the image side of; they stay in float32 whatever the mode (as
    SAM 2.1's heads do)."""

    model: Sam3Model
    tokenize: Tokenize
    size: Sam3Size
    spec: ConceptsSpec = field(default_factory=ConceptsSpec)
    tracker: TrackerHeads | None = None
    # The mode the detector was converted to (runtime/concepts.apply_concepts_mode; baseline
    # while it runs float32 as loaded): SAM 3's video tracker follows it
    # (concepts/video_load.video_predictor), so every surface's tracker runs its detector's mode.
    mode: str = "baseline"
    _interactive: InteractivePredictor | None = field(default=None, init=False, repr=False)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def interactive(self) -> InteractivePredictor:
        """SAM 3's interactive predictor (points, boxes, mask inputs on an encoding's
        ``tracker`` side) with SAM 2.1's fast decoder (the same answers within float32
        rounding, ~3.6x fewer seconds per click at 1008 px; its per-image side, ~48 MiB,
        is made on an image's first click and kept in the encoding's ``tracker``); a
        ValueError when the tracker heads are not loaded."""
        if self.tracker is None:
            raise ValueError("SAM 3's tracker heads are not loaded")
        if self._interactive is None or self._interactive.tracker_heads is not self.tracker:
            self._interactive = InteractivePredictor(self.tracker, decoder="fast")
        return self._interactive

    def encode(self, images: Sequence[np.ndarray]) -> list[ConceptEncoding]:
        return encode_images(self.model, images, self.tracker)

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
    (:func:`load_weights`; a one-line ``WeightsError`` when missing).
    Random: CLIP's public BPE vocabulary (a one-line ``WeightsError`` saying how to install
    it when missing), loaded before the model is built."""
    size = SIZES[spec.size]()
    if spec.random_weights:
        tokenize = load_tokenizer()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(spec.seed)
            model = build_model(size)
            tracker = build_tracker_heads(size)
        randomize_(model, spec.seed)
        randomize_(tracker, spec.seed + 1)
    else:
        model, tracker, tokenize = load_weights(spec.weights, size)
    moved = model.to(spec.device)  # type: ignore[arg-type]  # transformers' @wraps on PreTrainedModel.to hides its self
    return Concepts(moved, tokenize, size, spec, tracker.to(spec.device))


def load_weights(
    directory: Path | None = None, size: Sam3Size | None = None
) -> tuple[Sam3Model, TrackerHeads, ClipTokenizer]:
    """(detector model, tracker heads, tokenizer) from the weights folder (None: the
    download cache); every key of the checkpoint checked strictly (the video tracker's
    keys are left for it)."""
    directory = weights_folder.require(directory)
    checkpoint = directory / weights_folder.CHECKPOINT
    loaded = torch.load(checkpoint, map_location="cpu", weights_only=True, mmap=True)
    state = loaded.get("model", loaded)
    # Read when called: the size a downloaded file must match (tests set a reduced one).
    size = size or weights_folder.EXPECTED_SIZE
    model = build_model(size)
    load_strict(model, meta_to_transformers(state))
    tracker = build_tracker_heads(size)
    load_tracker_heads(tracker, state)
    return model, tracker, load_tokenizer(directory)
