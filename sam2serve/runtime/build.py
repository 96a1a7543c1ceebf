"""The one constructor: :func:`build_predictor` turns a RuntimeSpec and a WeightsSource
into a Predictor, through the spec's backend.

What every backend shares lives here too: :func:`predictor_for` (a Predictor running a
loaded model the spec's way, given an image path and fast decoder from elsewhere or not, its
spec and its TF32 policy, all at construction) and the mode's dtypes per device. Building
changes nothing process-wide: threads and TF32 are the entry point's
(:func:`sam2serve.runtime.process.configure_process`).
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from typing import Any, Protocol

import torch

from sam2serve.checkpoint import load_model
from sam2serve.engine.predictor import Predictor, PromptDecoder
from sam2serve.modeling.fast_mask_decoder import FastMaskDecoder
from sam2serve.modeling.sam2 import SAM2Image
from sam2serve.runtime.backends import BackendInfo, get_backend_info
from sam2serve.runtime.modes import get_mode
from sam2serve.runtime.spec import RuntimeSpec, WeightsSource


class Backend(Protocol):
    """How a backend (a module of :mod:`sam2serve.runtime.backends`, its ``BACKEND``)
    builds the predictor a spec describes."""

    def build(self, spec: RuntimeSpec, weights: WeightsSource) -> Predictor:
        """The predictor for ``spec`` with ``weights`` (checkpoint, random, or artifacts)."""
        ...

    def build_from_model(self, spec: RuntimeSpec, model: SAM2Image) -> Predictor:
        """The predictor for ``spec`` around an already loaded ``model``."""
        ...

    def versions(self) -> dict[str, str]:
        """Versions of the runtimes it uses (written into outputs and manifests)."""
        ...


def load_backend(info: BackendInfo) -> Backend:
    """The registered backend's ``BACKEND``, its module imported now (the registry names
    it without importing it)."""
    backend: Backend = importlib.import_module(info.module).BACKEND
    return backend


def build_predictor(
    spec: RuntimeSpec, weights: WeightsSource | None = None, *, model: SAM2Image | None = None
) -> Predictor:
    """The Predictor ``spec`` describes, with ``weights`` (default: the official checkpoint
    from the cache). ``model``: an already loaded model to run instead of loading one (it
    may be converted in place, e.g. its encoder cast to bf16)."""
    weights = weights or WeightsSource()
    assert spec.backend is not None  # RuntimeSpec sets it
    backend = get_backend_info(spec.backend)
    if backend.needs_artifacts != (weights.artifacts is not None):
        raise ValueError(
            f"backend {backend.name!r} starts from 'sam2serve export' artifacts: give them"
            if backend.needs_artifacts
            else f"artifacts are run by backend 'artifacts', not {backend.name!r} (an ONNX "
            "export: by 'onnxruntime')"
        )
    if not backend.needs_artifacts:  # artifacts carry the dtype they were exported in
        spec = resolve_dtype(spec)
    implementation = load_backend(backend)
    if model is None:
        predictor = implementation.build(spec, weights)
    else:
        predictor = implementation.build_from_model(spec, model)
    if predictor.runtime is None:
        raise TypeError(
            f"backend {backend.name!r} built a Predictor without its RuntimeSpec: build it "
            "with sam2serve.runtime.build.predictor_for"
        )
    return predictor


class LoadsWeights:
    """Base of the backends that run a model loaded from weights: ``build`` loads it and
    hands it to the backend's ``build_from_model``."""

    def build(self, spec: RuntimeSpec, weights: WeightsSource) -> Predictor:
        return self.build_from_model(spec, load_spec_model(spec, weights))

    def build_from_model(self, spec: RuntimeSpec, model: SAM2Image) -> Predictor:
        raise NotImplementedError


def load_spec_model(
    spec: RuntimeSpec, weights: WeightsSource, loader: Callable[..., SAM2Image] = load_model
) -> SAM2Image:
    """``spec``'s model with ``weights``, by ``loader`` (load_model; load_video_model for
    the tracker)."""
    return loader(
        spec.model,
        checkpoint=weights.checkpoint,
        random_weights=weights.random_weights,
        seed=weights.seed,
        device=spec.device,
    )


def native_reduced_dtype(device: torch.device | str) -> str:
    """The reduced precision ``device`` runs natively: bf16 on GPUs that have it (Ampere
    and later) and on CPUs with AVX512-BF16 or AMX; fp16 on older GPUs; on other CPUs
    float32, because bf16 is emulated there (tiny's encoder took 32.3 s in bf16 against
    3.9 s in fp32 on an AVX2-only CPU, measured)."""
    device = torch.device(device)
    if device.type == "cuda":
        return "bfloat16" if torch.cuda.is_bf16_supported() else "float16"
    native = torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()
    return "bfloat16" if native else "float32"


def resolve_dtype(spec: RuntimeSpec) -> RuntimeSpec:
    """``spec`` with its dtype decided: float32 for the lossless modes, the device's
    native reduced precision for the others unless the spec names one."""
    if spec.dtype is not None:
        return spec
    if not get_mode(spec.mode).reduced_precision_encoder:
        return spec.replace(dtype="float32")
    return spec.replace(dtype=native_reduced_dtype(spec.device))


def encoder_dtype(spec: RuntimeSpec) -> torch.dtype:
    """What the image encoder computes in under ``spec`` (its dtype resolved)."""
    mode = get_mode(spec.mode)
    return _reduced(spec) if mode.reduced_precision_encoder else torch.float32


def decoder_dtype(spec: RuntimeSpec) -> torch.dtype:
    """What the fast decoder's products (and its per-image side) are in under ``spec``:
    bf16 where the mode asks for reduced precision and the device runs bf16; fp32 else,
    fp16 included (its range does not hold the decoder's attention logits and Gram
    moments)."""
    mode = get_mode(spec.mode)
    reduced = _reduced(spec)
    if mode.reduced_precision_decoder and reduced == torch.bfloat16:
        return reduced
    return torch.float32


def _reduced(spec: RuntimeSpec) -> torch.dtype:
    dtype: torch.dtype = getattr(torch, resolve_dtype(spec).dtype or "float32")
    return dtype


def eager_image_path(model: SAM2Image, spec: RuntimeSpec) -> Callable[[torch.Tensor], Any]:
    """The mode's eager image path (see :func:`encoder_precision`)."""
    autocast_dtype = encoder_precision(model, spec)
    if autocast_dtype is None:
        return model.encode_image
    return functools.partial(model.encode_image, autocast_dtype=autocast_dtype)


def encoder_precision(model: SAM2Image, spec: RuntimeSpec) -> torch.dtype | None:
    """Puts ``model``'s image encoder in the mode's precision and returns the autocast
    dtype to run it under: fp32 (None); or reduced precision as bf16 weights on the CPU
    (measured faster than autocast there; None, the weights are cast here) and as autocast
    on CUDA (Meta's way: the weights stay fp32)."""
    dtype = encoder_dtype(spec)
    if dtype == torch.float32:
        return None
    if model.device.type == "cuda":
        return dtype
    assert model.image_encoder is not None  # a model that runs its own image path
    model.image_encoder.to(dtype)
    return None


def predictor_for(
    model: SAM2Image,
    spec: RuntimeSpec,
    image_encoder: Callable[[torch.Tensor], Any] | None = None,
    fast_decoder: FastMaskDecoder | None = None,
    prompt_decoder: PromptDecoder | None = None,
) -> Predictor:
    """A Predictor running ``model``'s heads the way ``spec``'s mode says; the image path
    and the fast decoder may come from a backend, else they run eagerly. A backend's
    ``prompt_decoder`` (ONNX Runtime) replaces the model's decoder for prompts with points."""
    mode = get_mode(spec.mode)
    spec = resolve_dtype(spec)
    assert spec.prompt_chunk is not None  # resolved by RuntimeSpec
    return Predictor(
        model,
        decoder=mode.decoder if prompt_decoder is None else "reference",
        prompt_chunk=spec.prompt_chunk,
        image_encoder=image_encoder,
        decoder_dtype=decoder_dtype(spec),
        fast_decoder=fast_decoder,
        prompt_decoder=prompt_decoder,
        runtime=spec,
        allow_tf32=mode.allow_tf32,
    )
