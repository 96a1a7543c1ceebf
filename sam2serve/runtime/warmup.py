"""Warm-up: run every path a request will take once, so no request pays for lazy
initialisation (allocator growth, OpenVINO's first inference, compiled programs' first
call, oneDNN's kernels for each shape, torch.compile's compilation).

One encode (with the fast decoder, it builds the decoder's image side), one click, and,
with the fast decoder, a full chunk of clicks (its batched shapes, and its compiled
programs when they are loaded).
"""

from __future__ import annotations

import numpy as np

from sam2serve.engine.predictor import Predictor

WARMUP_SIDE = 64


def warm_up(predictor: Predictor) -> None:
    pixels = np.full((WARMUP_SIDE, WARMUP_SIDE, 3), 128, dtype=np.uint8)
    embedding = predictor.encode(pixels)
    centre = WARMUP_SIDE / 2
    predictor.predict(embedding, point_coords=[[centre, centre]], point_labels=[1])
    if predictor.fast_decoder is None:
        return
    clicks = max(predictor.fast_min_prompts, predictor.prompt_chunk)
    coords = np.array([[[centre + i % 8, centre - i % 8]] for i in range(clicks)])
    predictor.predict(embedding, point_coords=coords, point_labels=np.ones((clicks, 1)))
