"""ONNX Runtime: 'sam2serve export --format onnx' files run by ONNX Runtime sessions.

The image encoder (fp32, or int8 for mode ``int8``) and the prompt decoder
(``decoder_low_res.onnx``: all four mask tokens at 256 x 256) run in ORT; the Predictor
around them makes the multimask choice, filters AMG prompts by IoU before upsampling,
and upsamples, exactly as with the other backends. A mask input without points (no ONNX
graph takes zero points the way SAM does: it would still append its padding point) runs
the model's own decoder from ``heads.pt``.

Execution providers: ``CPUExecutionProvider`` on the CPU (verified here); on CUDA devices
``TensorrtExecutionProvider`` then ``CUDAExecutionProvider`` where the installed
onnxruntime has them (``onnxruntime-gpu``), CPU as the fallback; the GPU providers are not
verified by the tests (no GPU build here).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from sam2serve.engine.predictor import Predictor
from sam2serve.modeling.sam2 import ImageFeatures, SAM2Image
from sam2serve.runtime.spec import RuntimeSpec, WeightsSource

CPU_PROVIDERS = ("CPUExecutionProvider",)
CUDA_PROVIDERS = ("TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider")


if TYPE_CHECKING:
    from sam2serve.runtime.build import Backend


def providers_for(device: str) -> list[str]:
    """The execution providers for ``device`` that this onnxruntime has, best first."""
    import onnxruntime

    wanted = CUDA_PROVIDERS if device.startswith("cuda") else CPU_PROVIDERS
    available = set(onnxruntime.get_available_providers())
    chosen = [name for name in wanted if name in available]
    if device.startswith("cuda") and not set(chosen) - {"CPUExecutionProvider"}:
        from sam2serve.runtime.onnx_export import OnnxArtifactError

        raise OnnxArtifactError(
            f"device {device!r}: this onnxruntime has no GPU execution provider "
            f"(available: {', '.join(sorted(available))}); install onnxruntime-gpu"
        )
    return chosen


def open_session(path: Path, device: str, threads: int | None) -> Any:
    import onnxruntime

    from sam2serve.runtime.threads import check_threads

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = check_threads(threads)
    options.log_severity_level = 3  # shape-merge warnings on load are noise
    return onnxruntime.InferenceSession(str(path), options, providers=providers_for(device))


def _numpy(tensor: torch.Tensor) -> np.ndarray:
    return tensor.detach().to("cpu", torch.float32).contiguous().numpy()


@dataclass
class OrtImageEncoder:
    """Runs ``image_encoder.onnx`` (batch 1) image by image; the same ImageFeatures as
    encode_image, on ``device``."""

    session: Any  # onnxruntime.InferenceSession
    device: torch.device
    source: str = "ONNX Runtime"

    def __call__(self, images: torch.Tensor) -> ImageFeatures:
        outputs = [self.session.run(None, {"image": _numpy(image[None])}) for image in images]
        embed, s0, s1 = (
            torch.from_numpy(np.concatenate(parts)).to(self.device) for parts in zip(*outputs)
        )
        return ImageFeatures(embed, (s0, s1))


@dataclass
class OrtPromptDecoder:
    """Runs ``decoder_low_res.onnx``: a :class:`~sam2serve.engine.predictor.PromptDecoder`."""

    session: Any  # onnxruntime.InferenceSession
    device: torch.device

    def __call__(
        self,
        image_embed: torch.Tensor,
        high_res_feats: tuple[torch.Tensor, torch.Tensor],
        coords: torch.Tensor,
        labels: torch.Tensor,
        mask_input: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if mask_input is None:
            side = 4 * image_embed.shape[-1]
            masks = np.zeros((1, 1, side, side), np.float32)
            has_mask = np.zeros(1, np.float32)
        else:
            masks = _numpy(mask_input)
            has_mask = np.ones(masks.shape[0], np.float32)
        low, iou = self.session.run(
            None,
            {
                "image_embed": _numpy(image_embed),
                "high_res_feats_0": _numpy(high_res_feats[0]),
                "high_res_feats_1": _numpy(high_res_feats[1]),
                "point_coords": _numpy(coords),
                "point_labels": _numpy(labels),
                "mask_input": masks,
                "has_mask_input": has_mask,
            },
        )
        return torch.from_numpy(low).to(self.device), torch.from_numpy(iou).to(self.device)


def load_onnx_predictor(directory: str | Path, spec: RuntimeSpec) -> Predictor:
    """A Predictor running the ONNX export in ``directory`` as ``spec`` asks, after the
    manifest is checked (every mismatch named)."""
    from sam2serve.checkpoint import WeightsInfo
    from sam2serve.config import get_config
    from sam2serve.runtime.build import predictor_for
    from sam2serve.runtime.onnx_export import (
        ENCODER_ONNX,
        HEADS,
        LOW_RES_DECODER_ONNX,
        open_onnx_export,
    )

    directory = Path(directory)
    manifest = open_onnx_export(directory, spec.model, spec.mode)
    device = torch.device(spec.device)
    model = SAM2Image(get_config(manifest["model"]), with_image_encoder=False)
    heads = torch.load(directory / HEADS, weights_only=True, map_location=device)
    model.load_state_dict(heads, strict=True)
    info = manifest["weights"]
    model.weights_info = WeightsInfo(info["source"], path=info.get("path"), seed=info.get("seed"))
    model.to(device).eval()
    encoder = OrtImageEncoder(
        open_session(directory / ENCODER_ONNX, spec.device, spec.threads), device
    )
    decoder = OrtPromptDecoder(
        open_session(directory / LOW_RES_DECODER_ONNX, spec.device, spec.threads), device
    )
    return predictor_for(model, spec.replace(dtype="float32"), encoder, prompt_decoder=decoder)


class OnnxRuntime:
    def build(self, spec: RuntimeSpec, weights: WeightsSource) -> Predictor:
        assert weights.artifacts is not None  # checked by build_predictor
        return load_onnx_predictor(weights.artifacts, spec)

    def build_from_model(self, spec: RuntimeSpec, model: SAM2Image) -> Predictor:
        raise ValueError(
            "the onnxruntime backend runs 'sam2serve export --format onnx' files: build it "
            "from them, without a model"
        )

    def versions(self) -> dict[str, str]:
        import onnxruntime

        return {"onnxruntime": onnxruntime.__version__, "torch": torch.__version__}


BACKEND: Backend = OnnxRuntime()  # mypy checks it against the Backend protocol
