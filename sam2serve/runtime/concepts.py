"""SAM 3 under a mode: which parts of the concept model compute in which precision.

The modes are SAM 2.1's (:mod:`sam2serve.runtime.modes`, their ``concepts_description``),
so ``--mode furious`` means the same thing to both models of a server: the device's native
reduced precision (:func:`sam2serve.runtime.build.native_reduced_dtype`: bf16 on CPUs with
AVX512-BF16 or AMX and on recent GPUs, float32 on other CPUs, where bf16 is emulated and
slower than fp32). SAM 3's time is in its matrix products everywhere — the ViT (~5.6 TFLOP
an image at full size), and per phrase the detector (~0.4 TFLOP: the DETR encoder attends
over the image's 5,184 tokens once per phrase) — so furious converts the whole model, not
the backbone alone; the engine (:mod:`sam2serve.concepts.engine`) casts what it feeds each
part to that part's dtype, keeps the image encodings in the detector's dtype (a bf16 cache
holds twice as many), and post-processes scores, boxes and masks in fp32.

``int8`` quantises the ViT's Linear layers dynamically (weights int8 per tensor,
activations per call; torch's x86 kernels, VNNI where present; CPU only); the rest follows
furious's rule.

SAM 3's video predictor (:mod:`sam2serve.concepts.video_load`) reads the same mode for its
tracker (:func:`apply_tracker_mode`): under furious and int8 the tracker neck, the memory
attention, the memory encoder and the mask decoder compute in the detector's reduced
dtype (as SAM 2.1's furious tracker runs its memory attention and memory encoder in bf16);
the tracker is not quantised under int8 (it stays bf16): most of a tracked frame is the
memory attention's scores and values over ~36k memory tokens, which dynamic quantisation
of Linear layers leaves in float32 (docs/concepts-video.md has the measurement).

Every mode runs on the eager backend: no other backend has been measured for SAM 3.
"""

from __future__ import annotations

import copy as copying
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import torch

from sam2serve.concepts.runtime import Concepts, ConceptsSpec, load_concepts
from sam2serve.runtime.build import native_reduced_dtype
from sam2serve.runtime.modes import MODES, get_mode

if TYPE_CHECKING:
    from sam2serve.concepts.video_association import VideoThresholds
    from sam2serve.concepts.video_predictor import Sam3VideoPredictor
    from sam2serve.concepts.video_tracker import Sam3Tracker

__all__ = [
    "BACKBONE",
    "CONCEPTS_BACKEND",
    "CONCEPT_MODES",
    "apply_concepts_mode",
    "apply_tracker_mode",
    "concepts_dtype",
    "describe_concepts_mode",
    "load_concepts_in_mode",
    "stage_precisions",
    "tracker_precisions",
    "video_predictor_in_mode",
]

BACKBONE = "vision_encoder.backbone"
CONCEPTS_BACKEND = "eager"
# Every mode of MODES, with what it does to SAM 3 (for --help and the bench's legend).
CONCEPT_MODES: dict[str, str] = {name: mode.concepts_description for name, mode in MODES.items()}

_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def concepts_dtype(
    mode: str, device: torch.device | str, reduced: torch.dtype | None = None
) -> torch.dtype:
    """The dtype SAM 3's text encoder and detector (and, but for int8, its ViT) compute in
    under ``mode`` on ``device``. ``reduced`` overrides the device's native reduced
    precision (the bench and the tests check bf16 on hosts that only emulate it)."""
    if not get_mode(mode).reduced_precision_concepts:
        return torch.float32
    return reduced or _DTYPES[native_reduced_dtype(device)]


def _cast_output(dtype: torch.dtype) -> Callable[[torch.nn.Module, tuple[Any, ...], Any], Any]:
    """A forward hook casting a module output's floating tensors to ``dtype``."""

    def hook(module: torch.nn.Module, args: tuple[Any, ...], output: Any) -> Any:
        fields = {
            key: value.to(dtype) if torch.is_tensor(value) and value.is_floating_point() else value
            for key, value in output.items()
        }
        return type(output)(**fields)

    return hook


def apply_concepts_mode(
    concepts: Concepts,
    mode: str,
    *,
    reduced: torch.dtype | None = None,
    copy: bool = False,
) -> Concepts:
    """``concepts`` running ``mode``. ``copy=False`` converts the model in place (a
    surface's one model: no second copy in memory); ``copy=True`` leaves ``concepts``
    answering as before (the bench compares modes on identical weights). A ValueError
    names an unknown mode, or int8 off the CPU."""
    spec = get_mode(mode)
    if spec.quantized_concepts_backbone and concepts.device.type != "cpu":
        raise ValueError(
            f"mode {mode} runs SAM 3 on the CPU only; the model is on {concepts.device}"
        )
    dtype = concepts_dtype(mode, concepts.device, reduced)
    if dtype == torch.float32 and not spec.quantized_concepts_backbone:
        return concepts  # float32 as loaded: its tracker too (Concepts.mode stays)
    model = copying.deepcopy(concepts.model) if copy else concepts.model
    if spec.quantized_concepts_backbone:
        from torch.ao.quantization import quantize_dynamic

        # Everything but the backbone in ``dtype``; the backbone stays fp32 around its
        # int8 products (its weights are quantised from fp32, not from a rounded copy).
        prefix = BACKBONE + "."
        with torch.no_grad():
            for name, tensor in (*model.named_parameters(), *model.named_buffers()):
                if not name.startswith(prefix) and tensor.is_floating_point():
                    tensor.data = tensor.data.to(dtype)
        backbone = model.get_submodule(BACKBONE)
        quantize_dynamic(backbone, {torch.nn.Linear}, dtype=torch.qint8, inplace=True)
        if dtype != torch.float32:
            backbone.register_forward_hook(_cast_output(dtype))
    else:
        model.to(dtype)  # type: ignore[arg-type]  # transformers' @wraps on PreTrainedModel.to hides its self
    return replace(concepts, model=model, mode=mode)


def apply_tracker_mode(
    neck: torch.nn.Module,
    tracker: Sam3Tracker,
    mode: str,
    device: torch.device | str,
    *,
    reduced: torch.dtype | None = None,
) -> torch.dtype:
    """SAM 3's video tracker (its neck and :class:`Sam3Tracker`) converted in place to
    ``mode``: the neck, memory attention, memory encoder and mask decoder in the dtype the
    mode gives the detector (:func:`concepts_dtype`: bf16 under furious and int8 where the
    device runs it natively, else float32); the tracker is never quantised. Returns that
    dtype. A ValueError names an unknown mode."""
    dtype = concepts_dtype(mode, device, reduced)
    if dtype != torch.float32:
        neck.to(dtype)
        tracker.to_precision(dtype)
    return dtype


def video_predictor_in_mode(
    concepts: Concepts,
    thresholds: VideoThresholds | None = None,
    bounded: bool = True,
    mode: str | None = None,
    reduced: torch.dtype | None = None,
) -> Sam3VideoPredictor:
    """SAM 3's video predictor over ``concepts``
    (:func:`~sam2serve.concepts.video_load.video_predictor`), its tracker and neck converted
    to ``mode`` by :func:`apply_tracker_mode` (None: the mode ``concepts`` was loaded in, so
    every surface's tracker follows its detector; ``reduced`` overrides the precision, as
    for the detector)."""
    from sam2serve.concepts.video_load import video_predictor  # the tracker's modules: on use

    predictor = video_predictor(concepts, thresholds, bounded)
    apply_tracker_mode(
        predictor.neck, predictor.tracker, mode or concepts.mode, concepts.device, reduced=reduced
    )
    return predictor


_SHORT = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}


def _short(dtype: torch.dtype) -> str:
    return _SHORT.get(dtype, str(dtype).removeprefix("torch."))


def tracker_precisions(neck: torch.nn.Module, tracker: Sam3Tracker) -> dict[str, str]:
    """What each part of SAM 3's video tracker computes in, read from its weights:
    ``neck``, ``memory_attention``, ``memory_encoder``, ``mask_decoder``."""
    return {
        "neck": _short(next(neck.parameters()).dtype),
        "memory_attention": _short(tracker.attention_dtype),
        "memory_encoder": _short(tracker.memory_encoder_dtype),
        "mask_decoder": _short(tracker.decoder_dtype),
    }


def stage_precisions(concepts: Concepts, mode: str) -> dict[str, str]:
    """What each model stage computes in, read from the model: ``backbone``, ``text``,
    ``detector`` -> ``int8``, ``bf16``, ``fp16`` or ``fp32``."""
    from sam2serve.concepts.engine import module_dtype

    model = concepts.model

    def short(module: torch.nn.Module) -> str:
        dtype = module_dtype(module)
        return _SHORT.get(dtype, str(dtype).removeprefix("torch."))

    quantized = get_mode(mode).quantized_concepts_backbone
    return {
        "backbone": "int8" if quantized else short(model.get_submodule(BACKBONE)),
        "text": short(model.get_submodule("text_encoder")),
        "detector": short(model.get_submodule("detr_encoder")),
    }


def describe_concepts_mode(mode: str, concepts: Concepts) -> str:
    """One line for a surface's start-up log: the mode and the precisions it ended with."""
    parts = ", ".join(f"{k} {v}" for k, v in stage_precisions(concepts, mode).items())
    return f"SAM 3 mode {mode}: {parts} (backend {CONCEPTS_BACKEND})"


def load_concepts_in_mode(spec: ConceptsSpec, mode: str) -> Concepts:
    """SAM 3 of ``spec`` (:func:`~sam2serve.concepts.runtime.load_concepts`), converted in
    place to ``mode``: what every surface (run, serve, labelstudio, track) loads."""
    get_mode(mode)  # an unknown mode fails before the weights load
    return apply_concepts_mode(load_concepts(spec), mode)
