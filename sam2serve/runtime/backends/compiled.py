"""torch.compile: the mode's eager image path compiled by Inductor on first use (the
warm-up pays for it; ``sam2serve export`` artifacts avoid paying at every start)."""

from __future__ import annotations

import torch

from sam2serve.engine.predictor import Predictor
from sam2serve.modeling.sam2 import SAM2Image
from sam2serve.runtime.build import LoadsWeights, eager_image_path, predictor_for
from sam2serve.runtime.spec import RuntimeSpec


class Compiled(LoadsWeights):
    def build_from_model(self, spec: RuntimeSpec, model: SAM2Image) -> Predictor:
        image_path = eager_image_path(model, spec)
        # The input is always (B, 3, 1024, 1024): only the batch varies, so one graph.
        compiled = torch.compile(image_path, dynamic=False)
        return predictor_for(model, spec, compiled)

    def versions(self) -> dict[str, str]:
        return {"torch": torch.__version__}


BACKEND = Compiled()
