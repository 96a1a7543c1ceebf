"""What every ONNX graph sam2serve writes shares: the exporter's call and the mask prompt's
dense embedding written as arithmetic.

The image export (:mod:`sam2serve.runtime.onnx_export`) and the video graphs
(:mod:`sam2serve.runtime.onnx_video`) both write their graphs through :func:`export_graph`
(the TorchScript-based exporter at :data:`OPSET`) and take a mask prompt as
``mask_input`` with ``has_mask_input`` (:func:`dense_embedding`): a graph cannot branch on
whether a mask was given.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import torch
from torch import nn

from sam2serve.modeling.prompt_encoder import PromptEncoder

# 17: what the SAM 2 ONNX files in circulation use; every ONNX Runtime since 1.14 runs it.
OPSET = 17


def dense_embedding(
    encoder: PromptEncoder, mask_input: torch.Tensor, has_mask_input: torch.Tensor
) -> torch.Tensor:
    """The prompt encoder's dense embedding (M, C, 64, 64): of ``mask_input`` where
    ``has_mask_input`` is 1, "no mask" where 0 (0 or 1, so the blend is exactly one of the
    two embeddings)."""
    has_mask = has_mask_input.reshape(-1, 1, 1, 1)
    return has_mask * encoder.embed_masks(mask_input) + (1 - has_mask) * (
        encoder.no_mask_embed.weight.reshape(1, -1, 1, 1)
    )


def export_graph(
    module: nn.Module,
    args: tuple[torch.Tensor, ...],
    path: Path,
    inputs: tuple[str, ...],
    outputs: tuple[str, ...],
    dynamic_axes: dict[str, dict[int, str]],
) -> None:
    """``module`` traced on ``args`` into the ONNX file ``path``, its inputs and outputs
    named, the ``dynamic_axes`` left dynamic (the rest of the shapes fixed by the trace)."""
    with warnings.catch_warnings():
        # The trace sees Hiera's padding checks, the decoder's shapes and the rotary
        # encoding's grid as constants: right for the fixed 1024 x 1024 input.
        warnings.simplefilter("ignore")
        torch.onnx.export(
            module.eval(),
            args,
            str(path),
            input_names=list(inputs),
            output_names=list(outputs),
            dynamic_axes=dynamic_axes,
            opset_version=OPSET,
            do_constant_folding=True,
            dynamo=False,
        )


__all__ = ["OPSET", "dense_embedding", "export_graph"]
