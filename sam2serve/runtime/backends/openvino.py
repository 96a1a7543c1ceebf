"""OpenVINO at start-up: the image path converted from our modules and compiled for this
CPU when the predictor is built (tens of seconds; artifacts skip that). In mode int8 it is
quantised by NNCF first, on calibration photographs (:mod:`sam2serve.runtime.quantize`):
that calibration runs at every start-up; ``sam2serve export --mode int8`` does it once."""

from __future__ import annotations

from typing import TYPE_CHECKING

from sam2serve.engine.predictor import Predictor
from sam2serve.modeling.sam2 import SAM2Image
from sam2serve.runtime.build import LoadsWeights, predictor_for
from sam2serve.runtime.spec import RuntimeSpec

if TYPE_CHECKING:
    from sam2serve.runtime.build import Backend


class OpenVINO(LoadsWeights):
    def build_from_model(self, spec: RuntimeSpec, model: SAM2Image) -> Predictor:
        from sam2serve.runtime.export import openvino_image_encoder

        return predictor_for(model, spec, openvino_image_encoder(model, spec))

    def versions(self) -> dict[str, str]:
        import openvino

        versions = {"openvino": openvino.__version__}
        try:  # the int8 mode's quantiser (optional)
            import nncf
        except ImportError:
            return versions
        return {**versions, "nncf": nncf.__version__}


BACKEND: Backend = OpenVINO()  # mypy checks it against the Backend protocol
