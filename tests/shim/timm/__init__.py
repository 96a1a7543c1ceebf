"""Stand-in for the three timm layers Meta's sam3 imports (DropPath, Mlp, trunc_normal_).

timm's package import pulls in torchvision's datasets, which cannot be installed next to
this torch build; SAM 3 uses only these layers, written here with timm's semantics and
parameter names (``fc1``, ``fc2``) so that Meta's code can serve as the concept tests' oracle.
"""

__version__ = "0.0.0+sam2serve.shim"
