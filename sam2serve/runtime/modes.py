"""Execution modes: how the same model is run, from faithful to fastest.

A mode is a frozen description; every surface (library, CLI, bench, server) selects modes
by name from :data:`MODES`, so a new mode appears everywhere at once.

- ``baseline``: the reference behaviour — eager fp32, the decoder as Meta wrote it, AMG in
  batches of 64 points, MPS one prompt per decoder call, RLE one mask at a time.
- ``fast``: lossless — the same answers up to float reassociation: the fast decoder
  (~3x fewer FLOPs), all prompts of an image in one predict call (decoded in cache-sized
  chunks of 4), the image side of the decoder computed once per image or crop, masks
  filtered by predicted IoU before any upscaling, RLE batched with one host sync per
  batch. AMG keeps Meta's 64 points per batch: that bounds memory, and the decoder's
  per-image work is already shared across batches.
- ``furious``: ``fast`` plus reduced precision (bf16 on CPU, fp16 on CUDA) in the image
  encoder and in the second half of the mask upscaling (the largest per-prompt tensors;
  3.7x faster there on this CPU); the transformer stays fp32 because its LayerNorm
  statistics are computed from Gram matrices, which reduced precision would not survive.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from sam2serve.accel.fast_decoder import FastMaskDecoder
from sam2serve.checkpoint import load_model
from sam2serve.engine.predictor import Predictor


@dataclass(frozen=True)
class Mode:
    name: str
    description: str
    decoder: str = "reference"  # Predictor decoder: "reference" or "fast"
    reduced_precision_encoder: bool = False
    # The fast decoder's second upscaling half and mask products in bf16 (fp16 on CUDA).
    reduced_precision_upscaling: bool = False
    # AMG points per decoder call (None: the caller's value, Meta's default 64).
    amg_points_per_batch: int | None = None
    # The reference decodes MPS prompts one by one and converts masks to RLE one at a time.
    batch_prompts: bool = True
    batch_rle: bool = True
    # Prompts per decoder call inside the Predictor. On this CPU (2 cores, measured)
    # per-prompt cost rises with the batch once activations leave the cache: the fast
    # decoder costs 39 ms/prompt in chunks of 2-4, 53 ms at 8 and 72 ms at 32.
    prompt_chunk: int = 64

    def encoder_dtype(self, device: torch.device) -> torch.dtype:
        return _reduced(device) if self.reduced_precision_encoder else torch.float32

    def upscaling_dtype(self, device: torch.device) -> torch.dtype:
        return _reduced(device) if self.reduced_precision_upscaling else torch.float32

    def predictor(
        self,
        model: torch.nn.Module,
        image_encoder: Callable[[torch.Tensor], Any] | None = None,
        fast_decoder: FastMaskDecoder | None = None,
    ) -> Predictor:
        """A Predictor running ``model``'s heads this mode's way; the image path and the
        fast decoder may be given (ahead-of-time compiled), else they run eagerly."""
        return Predictor(
            model,
            decoder=self.decoder,
            prompt_chunk=self.prompt_chunk,
            image_encoder=image_encoder,
            upscaling_dtype=self.upscaling_dtype(model.device),
            fast_decoder=fast_decoder,
        )


def _reduced(device: torch.device) -> torch.dtype:
    return torch.float16 if device.type == "cuda" else torch.bfloat16


MODES: dict[str, Mode] = {
    mode.name: mode
    for mode in (
        Mode(
            name="baseline",
            description="eager fp32, reference decoder, AMG points_per_batch 64, MPS one "
            "prompt per call, RLE one mask at a time",
            batch_prompts=False,
            batch_rle=False,
        ),
        Mode(
            name="fast",
            description="lossless: fast decoder, all prompts batched, IoU filter before "
            "upscaling, batched RLE",
            decoder="fast",
            prompt_chunk=4,
        ),
        Mode(
            name="furious",
            description="fast + bf16 image encoder and mask upscaling (fp16 on CUDA)",
            decoder="fast",
            prompt_chunk=4,
            reduced_precision_encoder=True,
            reduced_precision_upscaling=True,
        ),
    )
}


# How the image path of a fast/furious mode starts; ``sam2serve bench --modes`` takes them as
# suffixes (``furious+aot``). Plain names run the image path in eager PyTorch.
VARIANTS: dict[str, str] = {
    "aot": "image path (OpenVINO) and mask decoder (AOTInductor) from 'sam2serve export' "
    "artifacts, no compilation at start-up",
    "jit": "image path converted and compiled with OpenVINO at start-up (the alternative "
    "to artifacts)",
}
ENCODER_BACKENDS = ("torch", "openvino")


def split_variant(label: str) -> tuple[str, str | None]:
    """``"furious+aot"`` -> ``("furious", "aot")``; ``"fast"`` -> ``("fast", None)``.
    Both parts are checked: an unknown one is a ValueError that names it."""
    name, _, variant = label.partition("+")
    mode = get_mode(name)
    if not variant:
        return name, None
    if variant not in VARIANTS:
        raise ValueError(
            f"unknown mode variant {variant!r} in {label!r}; expected one of "
            f"{', '.join('+' + v for v in VARIANTS)}"
        )
    if mode.decoder != "fast":
        raise ValueError(f"+{variant} is for the fast and furious modes, got {label!r}")
    return name, variant


def get_mode(name: str) -> Mode:
    try:
        return MODES[name]
    except KeyError:
        raise ValueError(f"unknown mode {name!r}; expected one of {', '.join(MODES)}") from None


def build_predictor(
    size: str,
    mode: str = "baseline",
    *,
    checkpoint: str | None = None,
    random_weights: bool = False,
    seed: int = 0,
    device: str | torch.device = "cpu",
    artifacts: str | None = None,
    encoder_backend: str = "torch",
) -> Predictor:
    """Load the model of ``size`` and wrap it in a Predictor configured for ``mode``;
    with ``artifacts`` (a ``sam2serve export`` directory) start from those instead,
    checked against their manifest, with no compilation. ``encoder_backend="openvino"``
    converts and compiles the image path with OpenVINO at start-up (CPU only)."""
    if encoder_backend not in ENCODER_BACKENDS:
        raise ValueError(
            f"encoder_backend must be one of {', '.join(ENCODER_BACKENDS)}, got {encoder_backend!r}"
        )
    if artifacts is not None:
        from sam2serve.accel.export import load_artifacts

        if checkpoint is not None or random_weights:
            raise ValueError(
                "artifacts carry their weights: give no checkpoint or random_weights with them"
            )
        return load_artifacts(artifacts, size, mode)
    spec = get_mode(mode)
    model = load_model(
        size, checkpoint=checkpoint, random_weights=random_weights, seed=seed, device=device
    )
    return configure_predictor(model, spec, encoder_backend)


def configure_predictor(
    model: torch.nn.Module, spec: Mode, encoder_backend: str = "torch"
) -> Predictor:
    """A Predictor running ``model`` (which it may convert in place) the way ``spec`` says."""
    if encoder_backend == "openvino":
        from sam2serve.accel.export import openvino_image_encoder

        if model.device.type != "cpu":
            raise ValueError(f"the OpenVINO image path runs on the CPU, not on {model.device}")
        if spec.decoder != "fast":
            raise ValueError(f"the OpenVINO image path is for fast and furious, not {spec.name}")
        return spec.predictor(model, openvino_image_encoder(model, spec))
    dtype = spec.encoder_dtype(model.device)
    if dtype != torch.float32:
        model.image_encoder.to(dtype)
    return spec.predictor(model)
