"""torchvision.datasets stand-in: import-only (Meta sam3 training data classes)."""
