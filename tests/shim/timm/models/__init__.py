"""timm.models stand-in."""
