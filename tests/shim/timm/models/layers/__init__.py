from timm.layers import DropPath, Mlp, trunc_normal_  # noqa: F401
