"""Stand-in for the parts of torchvision that Meta's sam2 imports (see ``meta_compat``)."""

__version__ = "0.0.0+sam2serve.meta_compat"
