"""Modes: what answers you get — a precision policy, from faithful to fastest.

A mode says *what* is computed (which decoder algebra, which dtypes, how prompts are
batched); a backend (:mod:`sam2serve.runtime.backends`) says *what executes it*; the two,
with the model, the device and the threads, make a
:class:`~sam2serve.runtime.spec.RuntimeSpec`. This module is torch-free, so the CLI can
offer the names without importing torch.

- ``baseline``: the reference behaviour — eager fp32, the decoder as Meta wrote it, AMG in
  batches of 64 points, MPS one prompt per decoder call, RLE one mask at a time.
- ``fast``: lossless — the same answers up to float reassociation: the fast decoder
  (~3x fewer FLOPs), all prompts of an image in one predict call, the image side of the
  decoder computed once per image or crop, masks filtered by predicted IoU before any
  upscaling, RLE batched with one host sync per batch.
- ``furious``: ``fast`` plus reduced precision in the image encoder and in the fast
  decoder's products (the per-image side, the attention scores and values, the Gram
  moments' products, the upscaling): bf16 weights and tensors on the CPU, bf16 on CUDA,
  only where the device runs bf16 natively (elsewhere the decoder stays fp32); the
  softmaxes, the per-position LayerNorm scales and the moments' sums are accumulated in
  fp32; TF32 matmuls allowed on CUDA.
- ``int8``: ``fast`` with the image encoder quantised to int8 after training (weights and
  activations, calibrated on photographs: :mod:`sam2serve.runtime.calibration`), run by a
  backend with int8 kernels (OpenVINO via NNCF, ONNX Runtime's quantiser); answers change
  within the accuracy the bench reports against the baseline.

Video tracking (``sam2serve track``, ``bench --task video``: :mod:`sam2serve.runtime.video`)
reads the same modes, each with its own ``video_description``: ``baseline`` is Meta's fp32
tracker; ``fast`` computes exactly what ``baseline`` computes, because no lossless change
was found that pays for a tracked frame on the CPU (most of its time is memory attention;
projecting the memory values after the attention instead of before, exact algebra with 4x
fewer value FLOPs, measured no faster in torch's CPU attention kernel, whose time is in
the scores); ``furious`` runs the image encoder and the memory attention in the reduced
precision the device runs natively (the dtype rule of
:func:`sam2serve.runtime.build.native_reduced_dtype`: float32 on CPUs without native bf16,
so there it answers as ``fast``). ``int8`` has no video path.

Prompt chunks are chosen per device: on a CPU a chunk's per-prompt tensors (coefficient
rows, attention scores: a few MB per prompt) must stay in the cache, so the fast modes
decode 8 prompts at a time (and the decoder upscales them two by two); on a GPU small
chunks would leave it launch-bound, so they decode 64.
"""

from __future__ import annotations

from dataclasses import dataclass

DEVICE_TYPES = ("cpu", "cuda")


@dataclass(frozen=True)
class Mode:
    name: str
    description: str
    decoder: str = "reference"  # Predictor decoder: "reference" or "fast"
    reduced_precision_encoder: bool = False
    # The fast decoder's products (transformer and upscaling) in reduced precision (bf16).
    reduced_precision_decoder: bool = False
    # The reference decodes MPS prompts one by one and converts masks to RLE one at a time.
    batch_prompts: bool = True
    batch_rle: bool = True
    # Prompts per decoder call inside the Predictor, per device type.
    prompt_chunk_cpu: int = 64
    prompt_chunk_cuda: int = 64
    # TF32 matmuls on CUDA (Ampere and later): off where answers must match fp32.
    allow_tf32: bool = False
    # Post-training quantisation of the image encoder: None, or the integer type ("int8").
    quantized_encoder: str | None = None
    # The backend a spec without one gets: None for the registry's default (eager); a mode
    # that eager cannot run names one that can, so `--mode int8` alone just works.
    default_backend: str | None = None
    # Video tracking: what the mode means there (None: the tracker does not run it), and
    # whether memory attention, most of a tracked frame, runs in the reduced precision
    # (the image encoder follows reduced_precision_encoder, as on images).
    video_description: str | None = None
    reduced_precision_memory_attention: bool = False
    # SAM 3 concept segmentation (:mod:`sam2serve.runtime.concepts`): what the mode means
    # there, whether the whole concept model (ViT backbone, text encoder, detector) runs in
    # the device's native reduced precision, and whether the ViT's Linear layers are int8.
    concepts_description: str = ""
    reduced_precision_concepts: bool = False
    quantized_concepts_backbone: bool = False

    def prompt_chunk(self, device_type: str) -> int:
        return self.prompt_chunk_cuda if device_type == "cuda" else self.prompt_chunk_cpu


MODES: dict[str, Mode] = {
    mode.name: mode
    for mode in (
        Mode(
            name="baseline",
            description="eager fp32, reference decoder, AMG points_per_batch 64, MPS one "
            "prompt per call, RLE one mask at a time",
            batch_prompts=False,
            batch_rle=False,
            video_description="Meta's tracker in eager fp32",
            concepts_description="SAM 3 as loaded, fp32 everywhere (Meta's)",
        ),
        Mode(
            name="fast",
            description="lossless: fast decoder, all prompts batched, IoU filter before "
            "upscaling, batched RLE",
            decoder="fast",
            prompt_chunk_cpu=8,
            video_description="the same computation as baseline (no lossless speed-up for "
            "tracking yet)",
            concepts_description="the same computation as baseline (no lossless speed-up "
            "for SAM 3 yet)",
        ),
        Mode(
            name="furious",
            description="fast + reduced-precision image encoder and fast decoder (bf16 where "
            "the device runs it natively), TF32 on CUDA",
            decoder="fast",
            prompt_chunk_cpu=8,
            reduced_precision_encoder=True,
            reduced_precision_decoder=True,
            allow_tf32=True,
            video_description="image encoder and memory attention in the device's native "
            "reduced precision (bf16, the memory encoder too; float32 on a CPU without "
            "native bf16, where it tracks as baseline), TF32 on CUDA",
            reduced_precision_memory_attention=True,
            concepts_description="the whole SAM 3 model (ViT backbone, text encoder, "
            "detector) in the device's native reduced precision (bf16; float32 on a CPU "
            "without native bf16, where it answers as baseline); scores, boxes and masks "
            "post-processed in fp32",
            reduced_precision_concepts=True,
        ),
        Mode(
            name="int8",
            description="fast + the image encoder quantised to int8 (post-training, "
            "calibrated on photographs; OpenVINO/NNCF or ONNX Runtime)",
            decoder="fast",
            prompt_chunk_cpu=8,
            quantized_encoder="int8",
            default_backend="openvino",
            concepts_description="SAM 3's ViT Linear layers dynamically quantised to int8 "
            "(torch's x86 kernels, CPU only); text encoder and detector as in furious",
            reduced_precision_concepts=True,
            quantized_concepts_backbone=True,
        ),
    )
}


# The modes the video tracker runs, in MODES' order.
VIDEO_MODES: tuple[str, ...] = tuple(
    name for name, mode in MODES.items() if mode.video_description is not None
)


def get_mode(name: str) -> Mode:
    try:
        return MODES[name]
    except KeyError:
        raise ValueError(f"unknown mode {name!r}; expected one of {', '.join(MODES)}") from None


def get_video_mode(name: str) -> Mode:
    """The mode ``name``, which the video tracker must run."""
    mode = get_mode(name)
    if mode.video_description is None:
        raise ValueError(f"video tracking runs the modes {', '.join(VIDEO_MODES)}, not {name!r}")
    return mode
