"""What a tracked object's name may be (its class or label: the category it is exported
under), for every video route: prompts, renames, concept seeding and live prompts.

A name is a concept phrase's size, so a phrase that seeded an object is always a valid
name: at most :data:`MAX_OBJECT_NAME_CHARS` characters after stripping, not empty, and
none of the characters that would let a name forge lines or reorder the text it is shown
in (control characters, line and paragraph separators, bidirectional overrides,
surrogates, private-use and unassigned code points). A session holds at most
max_video_objects names, so its names hold at most that many times 4 x 64 bytes of text.
"""

from __future__ import annotations

import unicodedata
from typing import Annotated

from pydantic import AfterValidator, Field

from sam2serve.concepts.phrases import MAX_PHRASE_CHARS

MAX_OBJECT_NAME_CHARS = MAX_PHRASE_CHARS

# Control (Cc), surrogate (Cs), private use (Co), unassigned (Cn), line (Zl) and
# paragraph (Zp) separators. Other format characters (Cf) stay: emoji sequences join with
# U+200D; the bidirectional ones are refused by code point below.
_REFUSED_CATEGORIES = frozenset({"Cc", "Cs", "Co", "Cn", "Zl", "Zp"})
# Embeddings, overrides and isolates: they reorder what follows them on screen.
_BIDI_CONTROLS = frozenset(
    {*(chr(c) for c in range(0x202A, 0x202F)), *(chr(c) for c in range(0x2066, 0x206A))}
)

NAME_DOC = (
    f"The object's name (its class or label: its category in exports): 1..{MAX_OBJECT_NAME_CHARS} "
    "characters after stripping spaces, no control characters."
)


def check_object_name(name: str) -> str:
    """``name`` stripped; a ValueError naming the problem when it is empty, longer than
    :data:`MAX_OBJECT_NAME_CHARS` or holds a refused character."""
    stripped = name.strip()
    if not stripped:
        raise ValueError("the name is empty; give null to leave the object unnamed")
    if len(stripped) > MAX_OBJECT_NAME_CHARS:
        raise ValueError(
            f"the name has {len(stripped)} characters; at most {MAX_OBJECT_NAME_CHARS}"
        )
    for i, char in enumerate(stripped):
        if char in _BIDI_CONTROLS or unicodedata.category(char) in _REFUSED_CATEGORIES:
            raise ValueError(
                f"the name holds U+{ord(char):04X} at index {i}: control characters, "
                "line separators, bidirectional controls, private-use and unassigned code "
                "points are not taken"
            )
    return stripped


# The schema's bound is the raw string's (before stripping): what the OpenAPI document and
# the parser enforce before the rule above reads it.
ObjectName = Annotated[
    str,
    Field(min_length=1, max_length=MAX_OBJECT_NAME_CHARS, description=NAME_DOC),
    AfterValidator(check_object_name),
]

__all__ = ["MAX_OBJECT_NAME_CHARS", "NAME_DOC", "ObjectName", "check_object_name"]
