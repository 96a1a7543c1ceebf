"""Meta's SAM 3 video predictor on its real stack, as an oracle: run by the interpreter of
``meta_venv.py``'s environment, never by the tests' own.

    python meta_video_oracle.py REQUEST.json

The request names a reduced size (``Sam3Size`` fields), a seed, the clip's preprocessed
frames (``.npy`` float32 (T, 3, S, S)) and its size, a phrase, the video settings (Meta's
keyword names), and where to write the weights and the answers; optionally a prompt
frame, one normalised exemplar box (x, y, w, h) and a direction (``meta_video_prompts``),
or a prompt frame, a direction and clicks (frame, obj id, relative points, labels:
``meta_video_clicks``). Meta's builder makes the
video model (``meta_sam3_video``), its weights are set from the seed (the rule of
``meta_oracle.randomize``) and saved; Meta's ``add_prompt`` + ``propagate_in_video``
answer. This environment has no scikit-image, which Meta's hole filling calls on a CPU:
its connected components come from an 8-connected labelling written here (min-label
propagation), the same components.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from unittest import mock

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from meta_oracle import clip_bpe, randomize
from meta_sam3_video import build_meta_video_model, meta_track
from meta_video_clicks import meta_click_session
from meta_video_prompts import meta_session


def _label(mask: torch.Tensor) -> torch.Tensor:
    """(H, W) bool -> int64 component labels (0 background), 8-connected."""
    height, width = mask.shape
    big = height * width + 1
    labels = torch.where(mask, torch.arange(1, height * width + 1).view(height, width), big)
    labels = labels.view(1, 1, height, width).float()
    while True:
        smallest = -F.max_pool2d(-labels, 3, stride=1, padding=1)
        updated = torch.where(mask.view(1, 1, height, width), smallest, labels)
        if torch.equal(updated, labels):
            break
        labels = updated
    return torch.where(mask, labels[0, 0].long(), 0)


def connected_components(tensor: torch.Tensor):
    """Meta's ``connected_components`` contract: (labels, per-pixel component sizes)."""
    shape = tensor.shape
    flat = tensor.reshape(-1, *shape[-2:]).bool()
    labels, counts = [], []
    for mask in flat:
        label = _label(mask)
        sizes = torch.bincount(label.view(-1))
        count = torch.where(mask, sizes[label], 0)
        labels.append(label)
        counts.append(count)
    return torch.stack(labels).view(shape), torch.stack(counts).view(shape)


def main(request_path: str) -> None:
    request = json.loads(Path(request_path).read_text())
    model = build_meta_video_model(
        request["size"], clip_bpe(), thresholds=request["settings"], shim=False
    )
    randomize(model, request["seed"])
    torch.save(model.state_dict(), request["weights"])
    pixels = torch.from_numpy(np.load(request["pixels"]))
    with mock.patch("sam3.perflib.connected_components.connected_components", connected_components):
        if "clicks" in request:  # a phrase, its passes, clicks, the passes again
            frames = meta_click_session(
                model, pixels, request["height"], request["width"], request["frame"],
                request["phrase"], request["direction"],
                [(t, o, p, lab) for t, o, p, lab in request["clicks"]],
            )  # fmt: skip
        elif "direction" in request:  # a prompt frame, box and direction (meta_video_prompts)
            frames = meta_session(
                model, pixels, request["height"], request["width"], request["frame"],
                request["phrase"], request["box_xywh"], True, request["direction"],
            )  # fmt: skip
        else:
            frames = meta_track(
                model, pixels, request["height"], request["width"], request["phrase"]
            )
    torch.save(frames, request["out"])


if __name__ == "__main__":
    main(sys.argv[1])
