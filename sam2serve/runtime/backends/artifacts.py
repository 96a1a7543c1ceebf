"""'sam2serve export' artifacts: the image path and the fast decoder's programs as
exported, checked against their manifest, nothing compiled at start-up."""

from __future__ import annotations

from typing import TYPE_CHECKING

from sam2serve.engine.predictor import Predictor
from sam2serve.modeling.sam2 import SAM2Image
from sam2serve.runtime.spec import RuntimeSpec, WeightsSource

if TYPE_CHECKING:
    from sam2serve.runtime.build import Backend


class Artifacts:
    def build(self, spec: RuntimeSpec, weights: WeightsSource) -> Predictor:
        from sam2serve.runtime.export import load_artifacts

        assert weights.artifacts is not None  # checked by build_predictor
        return load_artifacts(weights.artifacts, spec)

    def build_from_model(self, spec: RuntimeSpec, model: SAM2Image) -> Predictor:
        raise ValueError("artifacts carry their own model: build them without one")

    def versions(self) -> dict[str, str]:
        import torch

        versions = {"torch": str(torch.__version__)}
        try:  # CUDA artifacts are AOTInductor only: OpenVINO need not be installed
            import openvino
        except ImportError:
            return versions
        return {**versions, "openvino": openvino.__version__}


BACKEND: Backend = Artifacts()  # mypy checks it against the Backend protocol
