"""The SAM2 image network in plain PyTorch (no Hydra, no torchvision)."""
