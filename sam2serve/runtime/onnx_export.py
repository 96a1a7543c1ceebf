"""ONNX export in the shape annotation tools already consume, and its manifest.

``export_onnx`` writes into a directory:

- ``image_encoder.onnx``: input ``image`` float32 (1, 3, 1024, 1024), resized and
  normalised as :func:`sam2serve.engine.image.preprocess` does; outputs ``image_embed``
  (1, 256, 64, 64, ``no_mem_embed`` added), ``high_res_feats_0`` (1, 32, 256, 256) and
  ``high_res_feats_1`` (1, 64, 128, 128): exactly what an :class:`Embedding` holds. With
  mode ``int8`` this graph is quantised by ONNX Runtime's quantiser (:func:`quantize_encoder`).
- ``prompt_decoder.onnx``: the prompt encoder and mask decoder in the interface of the
  SAM 2 ONNX decoders used by annotation tools (samexporter / AnyLabeling, the
  ONNX-SAM2 ports): inputs ``image_embed``, ``high_res_feats_0``, ``high_res_feats_1``,
  ``point_coords`` (P, N, 2) in the 1024 x 1024 input frame, ``point_labels`` (P, N),
  ``mask_input`` (1 or P, 1, 256, 256), ``has_mask_input`` (1 or P), ``orig_im_size``
  int64 (2,) = (H, W); outputs ``masks`` (P, 3, H, W) logits, ``iou_predictions`` (P, 3),
  ``low_res_masks`` (P, 3, 256, 256) clamped to +-32. Always the three multimask outputs
  (the tools pick the best by IoU); docs/onnx.md has the whole contract.
- ``decoder_low_res.onnx``: the same decoder with the four mask tokens at low resolution
  and no upsampling, for the ``onnxruntime`` backend (the Predictor makes the single-mask
  choice, filters by IoU and upsamples, as with every other backend);
- ``heads.pt``: the prompt encoder's and mask decoder's weights (the Predictor's prompt
  checks and mask-only prompts run them eagerly);
- ``manifest.json``: format ``onnx``, model, mode, precision, runtime versions, the input
  and output names and shapes of each graph, sha256 of every file, weights, command;
- with ``video=True``, the video path's four graphs too (:mod:`sam2serve.runtime.onnx_video`),
  described in the manifest's ``video`` (null without them).

The graphs are made by the TorchScript-based exporter (``torch.onnx.export(...,
dynamo=False)``): the decoder's output size comes from the *values* of ``orig_im_size``,
which it records as an ONNX ``Resize`` with computed sizes, while torch.export would need
them as data-dependent symbols; and it needs no ``onnxscript``.
"""

from __future__ import annotations

import json
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from sam2serve.checkpoint import load_model, load_video_model
from sam2serve.config import IMAGE_SIZE
from sam2serve.modeling.sam2 import SAM2Image
from sam2serve.modeling.sam2_video import SAM2Video
from sam2serve.runtime.artifacts_kind import ONNX_FORMAT
from sam2serve.runtime.backends import ONNX_MODES
from sam2serve.runtime.cache_entry import file_problems, sha256_file
from sam2serve.runtime.calibration import calibration_inputs
from sam2serve.runtime.export import ArtifactError
from sam2serve.runtime.modes import get_mode
from sam2serve.runtime.onnx_graph import OPSET, dense_embedding, export_graph
from sam2serve.runtime.onnx_video import VIDEO_GRAPHS, export_video_graphs

FORMAT = ONNX_FORMAT
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
ENCODER_ONNX = "image_encoder.onnx"
DECODER_ONNX = "prompt_decoder.onnx"
LOW_RES_DECODER_ONNX = "decoder_low_res.onnx"
HEADS = "heads.pt"
LOW_RES_CLAMP = 32.0
ENCODER_OUTPUTS = ("image_embed", "high_res_feats_0", "high_res_feats_1")
DECODER_INPUTS = (
    "image_embed",
    "high_res_feats_0",
    "high_res_feats_1",
    "point_coords",
    "point_labels",
    "mask_input",
    "has_mask_input",
    "orig_im_size",
)
DECODER_OUTPUTS = ("masks", "iou_predictions", "low_res_masks")
LOW_RES_INPUTS = DECODER_INPUTS[:-1]
LOW_RES_OUTPUTS = ("low_res_masks", "iou_predictions")
INSTALL_HINT = 'pip install "sam2serve[onnx]"'


class OnnxArtifactError(ArtifactError):
    """ONNX exports that are missing, corrupt or do not match what was asked for."""


def require_onnx() -> None:
    """Raise with the install command when onnx / onnxruntime are missing."""
    missing = []
    for name in ("onnx", "onnxruntime"):
        try:
            __import__(name)
        except ImportError:
            missing.append(name)
    if missing:
        raise OnnxArtifactError(
            f"{' and '.join(missing)} not installed: the ONNX export and the onnxruntime "
            f"backend need them ({INSTALL_HINT})"
        )


class OnnxImageEncoder(nn.Module):
    """The image path (trunk, neck, high-res projections, ``no_mem_embed``) with the
    three feature maps as outputs, in the order the names say."""

    def __init__(self, model: SAM2Image) -> None:
        super().__init__()
        self.model = model

    def forward(self, image: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        features = self.model.encode_image(image)
        return features.image_embed, *features.high_res_feats


class OnnxPromptDecoder(nn.Module):
    """Prompt encoder + mask decoder over one image's features, for P prompts of N points.

    ``full_size=True``: the tools' interface (three multimask outputs, masks upsampled to
    ``orig_im_size``); ``False``: all four mask tokens at 256 x 256, unclamped, for the
    backend. Points are in the 1024 input frame; the padding point SAM appends is added
    here (as Meta's predictor does), so label -1 rows only pad ragged prompts."""

    def __init__(self, model: SAM2Image, full_size: bool) -> None:
        super().__init__()
        self.prompt_encoder = model.sam_prompt_encoder
        self.mask_decoder = model.sam_mask_decoder
        self.full_size = full_size

    def forward(
        self,
        image_embed: torch.Tensor,
        high_res_feats_0: torch.Tensor,
        high_res_feats_1: torch.Tensor,
        point_coords: torch.Tensor,
        point_labels: torch.Tensor,
        mask_input: torch.Tensor,
        has_mask_input: torch.Tensor,
        orig_im_size: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, ...]:
        encoder = self.prompt_encoder
        sparse = encoder.embed_points(point_coords, point_labels)
        dense = dense_embedding(encoder, mask_input, has_mask_input)
        logits, iou, _ = self.mask_decoder.predict_all_masks(
            image_embed,
            encoder.dense_positional_encoding(),
            sparse,
            dense,
            (high_res_feats_0, high_res_feats_1),
        )
        if not self.full_size:
            return logits, iou
        logits, iou = logits[:, 1:], iou[:, 1:]
        assert orig_im_size is not None
        size = (orig_im_size[0], orig_im_size[1])
        # Tensors, not ints: traced for ONNX, the output size is a dynamic input's values.
        masks = F.interpolate(logits, size=size, mode="bilinear", align_corners=False)  # type: ignore[arg-type]  # ONNX-traced size
        return masks, iou, logits.clamp(-LOW_RES_CLAMP, LOW_RES_CLAMP)


def _decoder_examples(features: tuple[torch.Tensor, ...], side: int) -> tuple[torch.Tensor, ...]:
    prompts, points = 2, 3
    coords = torch.rand(prompts, points, 2) * side
    labels = torch.tensor([[1.0, 0.0, 1.0], [2.0, 3.0, 1.0]])
    mask_input = torch.zeros(prompts, 1, side // 4, side // 4)
    has_mask = torch.zeros(prompts)
    return (*features, coords, labels, mask_input, has_mask)


_PROMPT_AXES = {
    "point_coords": {0: "num_prompts", 1: "num_points"},
    "point_labels": {0: "num_prompts", 1: "num_points"},
    # 1 (shared by every prompt) or num_prompts, as the tools pass them.
    "mask_input": {0: "num_mask_inputs"},
    "has_mask_input": {0: "num_mask_inputs"},
}


def export_onnx(
    size: str,
    mode: str,
    out: str | Path,
    *,
    checkpoint: str | None = None,
    random_weights: bool = False,
    seed: int = 0,
    quantization_method: str = "dynamic",
    calibration: int = 8,
    video: bool = False,
    command: str | None = None,
    progress: Callable[[str], None] = lambda step: None,
) -> dict[str, Any]:
    """Export the model of ``size`` for ``mode`` (fast or int8) as ONNX into ``out``;
    returns the manifest. Mode int8 quantises the encoder (:func:`quantize_encoder`).
    ``video`` (mode fast): also the video path's graphs (:mod:`sam2serve.runtime.onnx_video`),
    from the video model with the same weights; the manifest's ``video`` describes them."""
    require_onnx()
    if mode not in ONNX_MODES:
        raise OnnxArtifactError(
            f"the ONNX export is for the {' and '.join(ONNX_MODES)} modes, got {mode!r}"
        )
    if video and mode != "fast":
        raise OnnxArtifactError(
            f"the video graphs are exported in mode fast (tracking has no {mode} path), "
            f"not {mode!r}"
        )
    get_mode(mode)
    load = load_video_model if video else load_model
    model = load(size, checkpoint, random_weights=random_weights, seed=seed, device="cpu")
    model.eval()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    side = model.image_size
    image = torch.zeros(1, 3, side, side)
    with torch.inference_mode():
        features = OnnxImageEncoder(model)(image)
    progress("image encoder: torch.onnx.export")
    export_graph(
        OnnxImageEncoder(model), (image,), out / ENCODER_ONNX, ("image",), ENCODER_OUTPUTS, {}
    )
    quantization = None
    if mode == "int8":
        progress(f"image encoder: int8 quantisation ({quantization_method})")
        quantization = quantize_encoder(out / ENCODER_ONNX, quantization_method, calibration)
    progress("prompt decoders: torch.onnx.export")
    examples = _decoder_examples(features, side)
    orig_im_size = torch.tensor([side, side], dtype=torch.int64)
    export_graph(
        OnnxPromptDecoder(model, full_size=True),
        (*examples, orig_im_size),
        out / DECODER_ONNX,
        DECODER_INPUTS,
        DECODER_OUTPUTS,
        {**_PROMPT_AXES, "masks": {0: "num_prompts", 2: "height", 3: "width"}},
    )
    export_graph(
        OnnxPromptDecoder(model, full_size=False),
        examples,
        out / LOW_RES_DECODER_ONNX,
        LOW_RES_INPUTS,
        LOW_RES_OUTPUTS,
        _PROMPT_AXES,
    )
    image_heads = SAM2Image(model.config, with_image_encoder=False).state_dict()
    heads = {k: v for k, v in model.state_dict().items() if k in image_heads}
    torch.save(heads, out / HEADS)
    files = [ENCODER_ONNX, DECODER_ONNX, LOW_RES_DECODER_ONNX, HEADS]
    video_section = None
    if video:
        assert isinstance(model, SAM2Video)
        video_section = export_video_graphs(model, out, progress)
        files += VIDEO_GRAPHS
    embed, s0, s1 = (tuple(t.shape[1:]) for t in features)
    decoder_inputs = {
        "image_embed": [1, *embed],
        "high_res_feats_0": [1, *s0],
        "high_res_feats_1": [1, *s1],
        "point_coords": ["num_prompts", "num_points", 2],
        "point_labels": ["num_prompts", "num_points"],
        "mask_input": ["num_mask_inputs", 1, side // 4, side // 4],
        "has_mask_input": ["num_mask_inputs"],
    }
    manifest = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "model": size,
        "mode": mode,
        "spec": {"model": size, "mode": mode, "backend": "onnxruntime", "dtype": "float32"},
        "device": "cpu",
        "precision": "int8" if mode == "int8" else "f32",
        "opset": OPSET,
        "exporter": "torch.onnx.export(dynamo=False)",
        "runtime": runtime_versions(),
        "graphs": {
            ENCODER_ONNX: {
                "inputs": {"image": [1, 3, side, side]},
                "outputs": {
                    "image_embed": [1, *embed],
                    "high_res_feats_0": [1, *s0],
                    "high_res_feats_1": [1, *s1],
                },
            },
            DECODER_ONNX: {
                "inputs": {**decoder_inputs, "orig_im_size": [2]},
                "outputs": {
                    "masks": ["num_prompts", 3, "height", "width"],
                    "iou_predictions": ["num_prompts", 3],
                    "low_res_masks": ["num_prompts", 3, side // 4, side // 4],
                },
            },
            LOW_RES_DECODER_ONNX: {
                "inputs": decoder_inputs,
                "outputs": {
                    "low_res_masks": ["num_prompts", 4, side // 4, side // 4],
                    "iou_predictions": ["num_prompts", 4],
                },
            },
        },
        "quantization": quantization,
        "video": video_section,
        "weights": model.weights_info.as_dict(),
        "files": {name: sha256_file(out / name) for name in files},
        "export_seconds": round(time.perf_counter() - started, 1),
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {"python": platform.python_version(), "platform": platform.platform()},
        "command": command or " ".join(sys.argv),
    }
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def runtime_versions() -> dict[str, str]:
    import onnx
    import onnxruntime

    return {
        "torch": torch.__version__,
        "onnx": onnx.__version__,
        "onnxruntime": onnxruntime.__version__,
    }


QUANTIZATION_METHODS = ("dynamic", "static")


def quantize_encoder(path: Path, method: str = "dynamic", calibration: int = 8) -> dict[str, Any]:
    """Quantise the encoder graph at ``path`` to int8, in place; returns what was done.

    ``dynamic`` (the default): int8 weights, activations quantised per call from their
    observed range. ``static``: QDQ with per-channel weights and activation ranges
    calibrated (min-max) on ``calibration`` photographs preprocessed as requests are.
    Exports use dynamic: static was measured no faster and an order of magnitude less
    accurate (docs/onnx.md)."""
    from onnxruntime.quantization import (
        CalibrationDataReader,
        QuantFormat,
        QuantType,
        quantize_dynamic,
        quantize_static,
    )

    if method not in QUANTIZATION_METHODS:
        raise OnnxArtifactError(
            f"quantization method must be one of {', '.join(QUANTIZATION_METHODS)}, got {method!r}"
        )
    staged = path.with_suffix(".int8.onnx")
    if method == "dynamic":
        quantize_dynamic(path, staged, weight_type=QuantType.QInt8)
        done: dict[str, Any] = {
            "method": "dynamic",
            "weights": "int8",
            "activations": "uint8, per call",
        }
    else:

        class Photographs(CalibrationDataReader):  # type: ignore[misc]  # onnxruntime is untyped (Any)
            def __init__(self) -> None:
                self.batches = iter(calibration_inputs(calibration, IMAGE_SIZE))

            def get_next(self) -> dict[str, Any] | None:
                batch = next(self.batches, None)
                return None if batch is None else {"image": batch}

        quantize_static(
            path,
            staged,
            Photographs(),
            quant_format=QuantFormat.QDQ,
            activation_type=QuantType.QUInt8,
            weight_type=QuantType.QInt8,
            per_channel=True,
        )
        done = {
            "method": "static",
            "format": "QDQ",
            "weights": "int8, per channel",
            "activations": "uint8, min-max calibrated",
            "calibration_images": calibration,
        }
    staged.replace(path)
    return {**done, "tool": "onnxruntime.quantization"}


def open_onnx_export(directory: str | Path, size: str | None, mode: str | None) -> dict[str, Any]:
    """The manifest of the ONNX export in ``directory``, once onnxruntime is importable and
    every mismatch with the request is ruled out (:func:`check_onnx_manifest`)."""
    from sam2serve.runtime.export import read_manifest

    require_onnx()
    manifest = read_manifest(Path(directory), expected_format="onnx")
    check_onnx_manifest(manifest, Path(directory), size, mode)
    return manifest


def check_onnx_manifest(
    manifest: dict[str, Any], directory: Path, size: str | None, mode: str | None
) -> None:
    """Every mismatch between the ONNX export and the request or the installed runtime."""
    problems = []
    if manifest.get("format_version") != FORMAT_VERSION:
        problems.append(
            f"format version is {manifest.get('format_version')!r}, this sam2serve reads "
            f"{FORMAT_VERSION} (export again)"
        )
    if size is not None and manifest.get("model") != size:
        problems.append(f"model is {manifest.get('model')!r}, asked for {size!r}")
    if mode is not None and manifest.get("mode") != mode:
        problems.append(f"mode is {manifest.get('mode')!r}, asked for {mode!r}")
    files = manifest.get("files")
    if not isinstance(files, dict) or not files:
        problems.append("the manifest lists no files")
        files = {}
    problems += file_problems(directory, files)
    if problems:
        raise OnnxArtifactError(
            f"ONNX export in {str(directory)!r} cannot be used: " + "; ".join(problems)
        )
