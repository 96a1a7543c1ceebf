"""A stored embedding answers exactly as the encoder's own: the same masks, bit for bit,
from the real (tiny, random weights) model."""

from __future__ import annotations

import numpy as np
import torch
from store_support import png_bytes

from sam2serve.engine.image import load_image
from sam2serve.store.embedding_store import EmbeddingStore
from sam2serve.store.identity import StoreIdentity, image_id_of


def test_masks_from_a_stored_float32_embedding_equal_a_fresh_encode(tiny_predictor, tmp_path):
    data = png_bytes(seed=11, size=(120, 160))
    fresh = tiny_predictor.encode(load_image(data))
    identity = StoreIdentity("tiny", "fast", "float32", "random seed 0")
    EmbeddingStore(str(tmp_path), identity).put(image_id_of(data), fresh)
    stored = EmbeddingStore(f"file://{tmp_path}", identity).get(image_id_of(data))
    assert stored is not None and stored.original_size == (120, 160)
    clicks = np.array([[[40.0, 30.0]], [[100.0, 80.0]], [[150.0, 10.0]]])
    labels = np.ones((3, 1))
    expected = tiny_predictor.predict(fresh, clicks, labels)
    answered = tiny_predictor.predict(stored, clicks, labels)
    assert torch.equal(answered.masks, expected.masks)
    assert torch.equal(answered.low_res_logits, expected.low_res_logits)
    assert torch.equal(answered.iou_scores, expected.iou_scores)
