"""Post-training int8 quantisation of the image path (mode ``int8``) with NNCF.

The image path converted to OpenVINO (:func:`sam2serve.runtime.export.convert_image_path`)
is quantised by ``nncf.quantize``: weights and activations to int8, the activation ranges
observed on calibration photographs (:mod:`sam2serve.runtime.calibration`) preprocessed
exactly as requests are (:func:`sam2serve.engine.image.preprocess`). OpenVINO then runs the
quantised model with its int8 kernels; what is not quantised stays fp32.

The settings are in :data:`DEFAULT_CALIBRATION`: NNCF's recommendation for transformers
(preset ``mixed``, ``model_type=transformer``); the ``performance`` preset and no
transformer patterns were quantised too, their comparison is not finished (docs/
benchmarks.md, "int8"). The manifest of int8 artifacts records the settings. NNCF is an
optional dependency (``pip install "sam2serve[int8]"``): :func:`require_nncf` says so
before anything loads.
"""

from __future__ import annotations

import importlib.util
from dataclasses import asdict, dataclass
from typing import Any

from sam2serve.runtime.calibration import calibration_inputs

INSTALL_HINT = 'pip install "sam2serve[int8]"'


class QuantizerMissing(ValueError):
    """Mode int8 was asked for a backend that quantises, and NNCF is not installed."""


@dataclass(frozen=True)
class Calibration:
    """How the int8 image path is calibrated (written into int8 manifests)."""

    # Calibration photographs (calibration_images(images)); the bench's 4 samples come
    # after the first 14, so up to 14 the accuracy is measured on unseen photographs.
    images: int = 14
    # NNCF's preset: "mixed" (symmetric weights, asymmetric activations: GELU outputs and
    # attention probabilities are one-sided) or "performance" (all symmetric).
    preset: str = "mixed"
    # NNCF's transformer patterns: LayerNorm, softmax and the residual additions stay fp32,
    # SmoothQuant moves activation outliers of the linear layers into their weights.
    model_type: str | None = "transformer"
    source: str = (
        "skimage.data photographs (sam2serve.runtime.calibration), preprocessed as requests"
    )

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


DEFAULT_CALIBRATION = Calibration()


def require_nncf() -> None:
    """QuantizerMissing naming the install command when NNCF is not importable."""
    if importlib.util.find_spec("nncf") is None:
        raise QuantizerMissing(
            f"mode int8 quantises the image encoder with NNCF, which is not installed: "
            f"{INSTALL_HINT} (or run int8 artifacts exported elsewhere with --artifacts)"
        )


def quantize_image_path(
    converted: Any, image_size: int, calibration: Calibration = DEFAULT_CALIBRATION
) -> Any:
    """The OpenVINO image path ``converted`` with its weights and activations in int8."""
    require_nncf()
    import logging

    import nncf

    # NNCF logs progress bars and INFO lines per step; the CLI prints its own progress.
    logging.getLogger("nncf").setLevel(logging.WARNING)
    inputs = calibration_inputs(calibration.images, image_size)
    model_type = None if calibration.model_type is None else nncf.ModelType(calibration.model_type)
    return nncf.quantize(
        converted,
        nncf.Dataset(inputs),
        preset=nncf.QuantizationPreset(calibration.preset),
        model_type=model_type,
        subset_size=calibration.images,
    )
