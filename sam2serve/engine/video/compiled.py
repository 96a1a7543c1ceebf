"""The compiled tracker: the frame step's heavy parts through torch.compile, on memory
banks of one shape (what Meta's ``vos_optimized`` SAM2VideoPredictorVOS does; our code).

A tracked frame's memory bank grows from one prompted frame's memory to ``num_maskmem``
slots and from one object pointer to ``max_obj_ptrs_in_encoder``: every new length would
be a new graph. Here the bank is padded to that full shape, its padding masked out of the
attention (``static_bank``: the padded keys get no weight, so the answer is the eager
one's up to float reassociation), and the memory attention, the memory encoder and the
mask decoder's two-way transformer are compiled with static shapes: after the first
frames (one graph per object count and bank shape, e.g. the first tracked frame has no
pointers yet) no frame compiles again. The mode follows the device: "max-autotune"
(Triton autotuning and CUDA graphs) on CUDA, Inductor's default on the CPU.

:func:`warm_up` compiles them before the first video (a synthetic clip, one object);
``sam2serve.runtime.video`` runs it through the compile cache
(:mod:`sam2serve.runtime.compile_cache`), so a later process loads that compilation
instead of compiling (other object counts compile on their first frames, in torch's own
cache).

Compiling changes the model in place (``Module.compile``: the parameter names, and so the
checkpoints, stay as they are).
"""

from __future__ import annotations

import torch
from torch import nn

from sam2serve.engine.video.model import CompilableParts
from sam2serve.engine.video.predictor import VideoPredictor

__all__ = ["compile_mode_for", "compile_tracker", "compiled_parts", "warm_up"]


def compile_mode_for(device: torch.device) -> str | None:
    """torch.compile's mode for the tracker on ``device``: CUDA graphs and autotuned
    kernels on CUDA (a tracked frame is many small launches), the default on the CPU."""
    return "max-autotune" if device.type == "cuda" else None


def compiled_parts(predictor: VideoPredictor) -> dict[str, nn.Module]:
    """The modules compiled: the memory attention the predictor runs (its reduced copy
    under furious), the memory encoder, the mask decoder's transformer."""
    model = predictor.model
    if not isinstance(model, CompilableParts):
        raise TypeError(
            f"the compiled tracker compiles SAM 2's own model; {type(model).__name__} has no "
            "memory_encoder, sam_mask_decoder or memory_attention_in"
        )
    dtype = predictor.memory_attention_dtype or torch.float32
    return {
        "memory_attention": model.memory_attention_in(dtype),
        "memory_encoder": model.memory_encoder,
        "mask_decoder_transformer": model.sam_mask_decoder.transformer,
    }


def compile_tracker(predictor: VideoPredictor, mode: str | None = "auto") -> VideoPredictor:
    """``predictor`` with a static memory bank and its frame step's parts compiled (in
    place; returned for chaining). ``mode``: torch.compile's, "auto" for
    :func:`compile_mode_for` the model's device."""
    config = predictor.config
    predictor.static_bank = (config.num_maskmem, config.max_obj_ptrs_in_encoder)
    if mode == "auto":
        mode = compile_mode_for(predictor.device)
    for part in compiled_parts(predictor).values():
        part.compile(dynamic=False, mode=mode)
    return predictor


def warm_up(predictor: VideoPredictor, objects: int = 1, frames: int | None = None) -> int:
    """Track ``objects`` objects over a synthetic clip of ``frames`` frames (default:
    ``num_maskmem + 2``, past the bank's filling) so that a compiled predictor compiles
    every graph a video with that many objects needs; returns the frames tracked. The
    frames are small (the encoder sees the model's size whatever the frame's)."""
    from sam2serve.samples import sample_clip

    frames = frames or predictor.config.num_maskmem + 2
    clip, _ = sample_clip(frames, (64, 80))
    state = predictor.init_state(list(clip))
    for obj in range(1, objects + 1):
        predictor.add_points(state, 0, obj, [[8.0 * obj % 80, 12.0 * obj % 64]], [1])
    return sum(1 for _ in predictor.propagate(state))
