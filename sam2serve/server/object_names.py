"""What a tracked object's name may be (its class or label: the category it is exported
under), for every video route: prompts, renames, concept seeding and live prompts.

A name obeys the one rule for names and phrases (:mod:`sam2serve.engine.user_text`), so a
phrase that seeded an object is always a valid name: at most :data:`MAX_OBJECT_NAME_CHARS`
characters after stripping, not empty, and none of the characters that would let a name
forge lines, reorder the text it is shown in or look like another name (control, format
and invisible characters, line and paragraph separators, surrogates, private-use and
unassigned code points; emoji and their joiners pass). A session holds at most
max_video_objects names, so its names hold at most that many times 4 x 64 bytes of text.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, Field

from sam2serve.engine.user_text import MAX_NAME_CHARS, NAME_RULE, check_name

MAX_OBJECT_NAME_CHARS = MAX_NAME_CHARS

NAME_DOC = (
    f"The object's name (its class or label: its category in exports): 1..{MAX_OBJECT_NAME_CHARS} "
    f"characters after stripping spaces: {NAME_RULE}."
)


def check_object_name(name: str) -> str:
    """``name`` stripped; a ValueError naming the problem (and the code point) when it is
    empty, longer than :data:`MAX_OBJECT_NAME_CHARS` or holds a refused character."""
    if not name.strip():
        raise ValueError("the name is empty; give null to leave the object unnamed")
    return check_name(name, "the name")


# The schema's bound is the raw string's (before stripping): what the OpenAPI document and
# the parser enforce before the rule above reads it.
ObjectName = Annotated[
    str,
    Field(min_length=1, max_length=MAX_OBJECT_NAME_CHARS, description=NAME_DOC),
    AfterValidator(check_object_name),
]

__all__ = ["MAX_OBJECT_NAME_CHARS", "NAME_DOC", "ObjectName", "check_object_name"]
