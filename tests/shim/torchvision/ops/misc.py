"""torchvision.ops.misc stand-in: FrozenBatchNorm2d, which timm imports (unused by SAM 3)."""

import torch
from torch import nn


class FrozenBatchNorm2d(nn.Module):
    def __init__(self, num_features: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        for name, value in (("weight", 1.0), ("bias", 0.0), ("running_mean", 0.0)):
            self.register_buffer(name, torch.full((num_features,), value))
        self.register_buffer("running_var", torch.ones(num_features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale = self.weight * (self.running_var + self.eps).rsqrt()
        bias = self.bias - self.running_mean * scale
        return x * scale.view(1, -1, 1, 1) + bias.view(1, -1, 1, 1)
