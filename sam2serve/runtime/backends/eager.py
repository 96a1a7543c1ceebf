"""PyTorch eager: the model as loaded, the mode's dtypes applied."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from sam2serve.engine.predictor import Predictor
from sam2serve.modeling.sam2 import SAM2Image
from sam2serve.runtime.build import LoadsWeights, eager_image_path, predictor_for
from sam2serve.runtime.spec import RuntimeSpec

if TYPE_CHECKING:
    from sam2serve.runtime.build import Backend


class Eager(LoadsWeights):
    def build_from_model(self, spec: RuntimeSpec, model: SAM2Image) -> Predictor:
        return predictor_for(model, spec, eager_image_path(model, spec))

    def versions(self) -> dict[str, str]:
        return {"torch": torch.__version__}


BACKEND: Backend = Eager()  # mypy checks it against the Backend protocol
