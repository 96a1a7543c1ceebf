"""What a concept phrase may be, for every surface (torch-free: the command line checks its
flags with it before any model loads)."""

from __future__ import annotations

# After stripping. SAM 3's text encoder reads 32 tokens anyway.
MAX_PHRASE_CHARS = 64
# Meta's text stand-in when only exemplar boxes are given.
VISUAL_PHRASE = "visual"
