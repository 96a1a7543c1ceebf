"""Meta's SAM 3 on its real stack, as an oracle: run by the interpreter of ``meta_venv.py``'s
environment (PyPI's torch, torchvision, timm; Meta's sam3), never by the tests' own.

    python meta_oracle.py REQUEST.json

The request names a size (``Sam3Size`` fields), a seed, an image (``.npy``, uint8 HWC),
cases (phrase, exemplar boxes ``[x1, y1, x2, y2, positive]`` in pixels, threshold), phrases
to tokenise, interactive cases (``predict_inst``'s keyword arguments: the model is then built
with Meta's instance interactivity), and where to write the weights and the answers. Meta's own builder makes the
model (reduced through ``meta_sam3``), its weights are set from the seed (the rule of
``sam2serve.concepts.runtime.randomize_``, restated here: this environment has no sam2serve)
and saved; Meta's ``Sam3Processor`` answers each case; Meta's ``SimpleTokenizer`` tokenises
the phrases, on the CLIP BPE file open-clip-torch ships in this environment.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import sys
import time
from pathlib import Path
from unittest import mock

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from meta_sam3 import build_meta_image_model

CONTEXT_LENGTH = 32
PACKAGES = ("torch", "torchvision", "timm", "sam3", "ftfy", "regex", "open_clip_torch")


def randomize(model: torch.nn.Module, seed: int) -> None:
    """Every floating tensor from ``seed``: norm scales 1 + noise, the rest noise (0.02)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, tensor in model.state_dict().items():
            if not tensor.is_floating_point():
                continue
            noise = torch.randn(tensor.shape, generator=generator) * 0.02
            base = 1.0 if name.endswith("weight") and tensor.ndim == 1 else 0.0
            tensor.copy_((noise + base).to(tensor.dtype))


def clip_bpe() -> Path:
    spec = importlib.util.find_spec("open_clip")
    return Path(next(iter(spec.submodule_search_locations))) / "bpe_simple_vocab_16e6.txt.gz"


def answer_all(model, image: np.ndarray, cases: list[dict], resolution: int) -> list[dict]:
    """Meta's processor: the image set once, then each case's prompts on it (Meta resets
    the prompts between cases and keeps the image's backbone features)."""
    from PIL import Image
    from sam3.model.sam3_image_processor import Sam3Processor

    processor = Sam3Processor(model, resolution, "cpu")
    h, w = image.shape[:2]
    answers = []
    # Meta pins a 4-float scale tensor; this CUDA build has no GPU to pin for
    with mock.patch.object(torch.Tensor, "pin_memory", lambda self, *a, **k: self):
        state = processor.set_image(Image.fromarray(image))
        for case in cases:
            processor.reset_all_prompts(state)
            processor.set_confidence_threshold(case["thresh"])
            state = processor.set_text_prompt(case["phrase"], state)
            for x1, y1, x2, y2, positive in case["boxes"]:
                cxcywh = [(x1 + x2) / 2 / w, (y1 + y2) / 2 / h, (x2 - x1) / w, (y2 - y1) / h]
                state = processor.add_geometric_prompt(cxcywh, bool(positive), state)
            answers.append(
                {
                    "scores": state["scores"].float().clone(),
                    "boxes": state["boxes"].float().clone(),
                    "masks": state["masks"][:, 0].bool().clone(),
                }
            )
    return answers


def answer_interactive(model, image: np.ndarray, cases: list[dict], resolution: int) -> list:
    """Meta's interactive path (``Sam3Image.predict_inst``) on the image set once: each
    case's keyword arguments (arrays as lists) -> (masks, IoU, low-res logits)."""
    from PIL import Image
    from sam3.model.sam3_image_processor import Sam3Processor

    processor = Sam3Processor(model, resolution, "cpu")
    answers = []
    with mock.patch.object(torch.Tensor, "pin_memory", lambda self, *a, **k: self):
        state = processor.set_image(Image.fromarray(image))
        for case in cases:
            kwargs = {k: v if isinstance(v, bool) else np.asarray(v) for k, v in case.items()}
            masks, iou, low = model.predict_inst(state, **kwargs)
            answers.append({"masks": masks.astype(bool), "iou": iou, "low_res": low})
    return answers


def main(request_path: str) -> None:
    from sam3.model.tokenizer_ve import SimpleTokenizer

    request = json.loads(Path(request_path).read_text())
    interactive = request.get("interactive_cases", [])
    start = time.monotonic()
    model = build_meta_image_model(
        request["size"], clip_bpe(), shim=False, interactive=bool(interactive)
    )
    randomize(model, request["seed"])
    torch.save(model.state_dict(), request["weights"])
    built = time.monotonic()
    image = np.load(request["image"])
    resolution = request["size"]["image_size"]
    with torch.inference_mode():
        answers = answer_all(model, image, request["cases"], resolution)
        inst = answer_interactive(model, image, interactive, resolution) if interactive else []
    tokens = SimpleTokenizer(bpe_path=str(clip_bpe()))(request["phrases"], CONTEXT_LENGTH)
    versions = {name: importlib.metadata.version(name) for name in PACKAGES}
    versions["torchvision.ops.roi_align"] = _roi_align_origin()
    out = {
        "answers": answers,
        "interactive": inst,
        # Meta fills holes on the CPU with scikit-image, which sam3 does not depend on: where
        # it is missing, Meta skips the step (with a warning)
        "hole_filling": importlib.util.find_spec("skimage") is not None,
        "tokens": tokens,
        "versions": versions,
        "seconds": {"build": built - start, "answer": time.monotonic() - built},
    }
    torch.save(out, request["out"])


def _roi_align_origin() -> str:
    import torchvision.ops

    return torchvision.ops.roi_align.__module__


if __name__ == "__main__":
    main(sys.argv[1])
