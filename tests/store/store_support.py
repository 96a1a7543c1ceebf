"""Helpers of the store tests: embeddings of the real shapes, small images, an identity."""

from __future__ import annotations

import io

import numpy as np
import torch
from PIL import Image

from sam2serve.engine.predictor import Embedding
from sam2serve.store.identity import StoreIdentity

IDENTITY = StoreIdentity("tiny", "fast", "float32", "random seed 0")


def random_embedding(seed: int = 0, size: tuple[int, int] = (170, 256)) -> Embedding:
    """An embedding of the real shapes with random values (no model needed)."""
    generator = torch.Generator().manual_seed(seed)
    return Embedding(
        torch.randn(1, 256, 64, 64, generator=generator),
        (
            torch.randn(1, 32, 256, 256, generator=generator),
            torch.randn(1, 64, 128, 128, generator=generator),
        ),
        (size,),
    )


def png_bytes(seed: int, size: tuple[int, int] = (96, 128)) -> bytes:
    """A small random-colour PNG (distinct bytes per seed)."""
    rng = np.random.default_rng(seed)
    pixels = rng.integers(0, 256, size=(*size, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()
