"""Helpers of the Label Studio backend tests: a brush RLE decoder written from the format's
description (independent of the encoder), images, requests, and the engine's own masks."""

from __future__ import annotations

import base64
import io

import numpy as np
from PIL import Image

from sam2serve.labelstudio.label_config import EXAMPLE_CONFIG

CONFIG = EXAMPLE_CONFIG.replace(
    '<Label value="Object" background="#ff0000"/>',
    '<Label value="Object" background="#ff0000"/><Label value="Cat" background="#ffaa00"/>',
)


def decode_brush(rle: list[int], height: int, width: int) -> np.ndarray:
    """Label Studio's brush RLE -> (H, W) bool from the alpha channel, by the rle-pack
    description: 32-bit count, 5-bit word size - 1, four 4-bit widths - 1, then chunks of
    (repeat flag, 2-bit width index, length - 1, one word or that many words)."""
    bits = "".join(f"{byte:08b}" for byte in rle)
    position = 0

    def read(n: int) -> int:
        nonlocal position
        value = int(bits[position : position + n], 2)
        position += n
        return value

    count = read(32)
    word = read(5) + 1
    widths = [read(4) + 1 for _ in range(4)]
    out = np.zeros(count, dtype=np.uint8)
    i = 0
    while i < count:
        repeat = read(1)
        length = read(widths[read(2)]) + 1
        if repeat:
            out[i : i + length] = read(word)
        else:
            for k in range(length):
                out[i + k] = read(word)
        i += length
    assert count == height * width * 4, (count, height, width)
    return out.reshape(height, width, 4)[:, :, 3] > 127


def picture(width: int = 96, height: int = 64, seed: int = 0) -> np.ndarray:
    """A small RGB image with a few flat shapes (something for a mask to follow)."""
    rng = np.random.default_rng(seed)
    pixels = np.full((height, width, 3), 40, dtype=np.uint8)
    pixels[height // 4 : height * 3 // 4, width // 5 : width // 2] = (220, 40, 40)
    pixels[height // 3 :, width * 3 // 5 : width - 4] = (40, 200, 90)
    pixels += rng.integers(0, 12, size=pixels.shape, dtype=np.uint8)
    return pixels


def png(pixels: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


def data_uri(data: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(data).decode("ascii")


def keypoint(x: float, y: float, positive: bool = True, label: str = "Object") -> dict:
    return {
        "type": "keypointlabels",
        "from_name": "click",
        "to_name": "image",
        "original_width": 96,
        "original_height": 64,
        "image_rotation": 0,
        "is_positive": positive,
        "value": {"x": x, "y": y, "width": 0.5, "keypointlabels": [label]},
    }


def rectangle(x: float, y: float, width: float, height: float, label: str = "Object") -> dict:
    return {
        "type": "rectanglelabels",
        "from_name": "box",
        "to_name": "image",
        "image_rotation": 0,
        "value": {
            "x": x,
            "y": y,
            "width": width,
            "height": height,
            "rotation": 0,
            "rectanglelabels": [label],
        },
    }


def predict_body(
    images: list[str], context: list[dict] | None = None, config: str = CONFIG
) -> dict:
    body: dict = {
        "tasks": [{"id": i + 1, "data": {"image": image}} for i, image in enumerate(images)],
        "project": "1.1700000000",
        "label_config": config,
        "params": {"login": None, "password": None},
    }
    if context is not None:
        body["params"]["context"] = {"result": context}
    return body


def engine_mask(predictor, pixels, coords, labels, box=None, multimask=False):
    """The engine's mask for a prompt in pixels: the best-scored candidate, and its score."""
    embedding = predictor.encode([pixels])[0]
    kwargs = {}
    if coords:
        kwargs["point_coords"] = np.asarray([coords], dtype=np.float32)
        kwargs["point_labels"] = np.asarray([labels], dtype=np.int32)
    if box is not None:
        kwargs["boxes"] = np.asarray([box], dtype=np.float32)
    out = predictor.predict(embedding, multimask_output=multimask, **kwargs)
    scores = out.iou_scores[0].float().cpu().numpy()
    best = int(scores.argmax())
    return out.masks[0, best].cpu().numpy(), float(scores[best])
