"""What ``run --task concepts`` is asked to find, checked before the model loads (torch-free):
the ``--text`` phrases and the concepts ``--prompts`` file of exemplar boxes and per-image
phrases.

The prompts file is a JSON object mapping an image's file name (or stem) to an object::

    {"photo.jpg": {"boxes": [{"box": [x1, y1, x2, y2], "positive": true}, ...],
                   "text": ["red car", ...]}}

``boxes`` (optional) are exemplar boxes in the image's pixels, top-left and bottom-right
corners, ``positive`` (default true) false for an example of what is *not* the concept;
every box refines every phrase of that image. ``text`` (optional) are phrases for that
image only, added after the ``--text`` phrases. An image with boxes and no phrase at all
gets Meta's stand-in phrase ``"visual"``. Keys are matched to images as the point tasks'
prompts file's are (:func:`~sam2serve.commands.inputs.match_images`); every box must lie
inside its image (its size read from the file's header).
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sam2serve.commands.common import UsageError
from sam2serve.commands.inputs import ImageInput, match_images, read_prompts_json
from sam2serve.concepts.phrases import MAX_PHRASE_CHARS, VISUAL_PHRASE, check_box
from sam2serve.concepts.phrases import check_phrase as concept_phrase
from sam2serve.engine.user_text import NAME_RULE

MAX_PHRASES = 64  # phrases per image: they run as one detector batch
MAX_BOXES = 64  # exemplar boxes per image
ENTRY_KEYS = ("boxes", "text")
_CSV_BREAKERS = "\x00\r\n"  # what Python's CSV reader cannot take in a row
_CSV_ERRORS = {  # its messages, by their first word, in the flag's terms
    "unexpected": "a double quote is not closed",
    "','": "a closing double quote must be followed by a comma or the end",
}
EXAMPLE = '{"photo.jpg": {"boxes": [{"box": [x1, y1, x2, y2], "positive": true}], "text": [...]}}'


@dataclass(frozen=True)
class BoxPrompt:
    """An exemplar box in image pixels (``concepts.engine.ExemplarBox`` without torch)."""

    xyxy: tuple[float, float, float, float]
    positive: bool = True

    def as_json(self) -> dict[str, Any]:
        return {"box": list(self.xyxy), "positive": self.positive}


@dataclass(frozen=True)
class ImageConcepts:
    """What to find in one image: its phrases (in category order) and exemplar boxes."""

    phrases: tuple[str, ...]
    boxes: tuple[BoxPrompt, ...] = ()


def check_phrase(value: Any, where: str) -> str:
    """One phrase, stripped: a string the service takes too
    (:func:`sam2serve.concepts.phrases.check_phrase`: 1..64 characters, no control,
    invisible or direction-changing character)."""
    if not isinstance(value, str):
        raise UsageError(f"{where}: a phrase must be a string, got {value!r:.80}")
    try:
        return concept_phrase(value, "a phrase")
    except ValueError as exc:
        raise UsageError(f"{where}: {exc}") from None


def check_phrases(values: list[Any], where: str) -> tuple[str, ...]:
    """A list of phrases, each checked; a phrase given twice is an error."""
    phrases: list[str] = []
    for index, value in enumerate(values):
        phrase = check_phrase(value, f"{where}, phrase {index + 1}")
        if phrase in phrases:
            raise UsageError(f"{where}: phrase {phrase!r} is given twice")
        phrases.append(phrase)
    if len(phrases) > MAX_PHRASES:
        raise UsageError(f"{where}: {len(phrases)} phrases; the limit is {MAX_PHRASES}")
    return tuple(phrases)


def parse_text(value: str | None) -> tuple[str, ...]:
    """--text "cat,dog": comma-separated phrases (none when the flag is not given), read as
    one CSV row, so a phrase holding a comma is given in double quotes
    (``'cat,"salt, pepper"'``; a quote inside one is doubled)."""
    if value is None:
        return ()
    where = f"--text {value!r:.100}"
    bad = next((i for i, char in enumerate(value) if char in _CSV_BREAKERS), None)
    if bad is not None:  # the phrase rule refuses them too, after CSV would have
        raise UsageError(
            f"{where}: has U+{ord(value[bad]):04X} (a control character) at {bad}; phrases "
            f"take {NAME_RULE}"
        )
    try:
        rows = list(csv.reader([value], skipinitialspace=True, strict=True))
    except csv.Error as exc:
        problem = _CSV_ERRORS.get(str(exc).split(" ")[0], str(exc))
        raise UsageError(
            f"{where}: {problem} (a phrase holding a comma goes in double quotes: "
            "'cat,\"salt, pepper\"')"
        ) from None
    return check_phrases(rows[0] if rows and rows[0] else [""], where)


def merged(*lists: tuple[str, ...]) -> tuple[str, ...]:
    """The phrases of several lists in order of first appearance (the COCO categories)."""
    return tuple(dict.fromkeys(phrase for phrases in lists for phrase in phrases))


# --------------------------------------------------------------------------- prompts file


def load_concept_prompts(
    path: Path, images: list[ImageInput], text: tuple[str, ...]
) -> dict[str, ImageConcepts]:
    """Every image's phrases and boxes: ``text`` (--text) plus its --prompts entry. An
    image with nothing to find (no phrase, no box) is a usage error naming it."""
    entries = read_prompts_json(path, f"a JSON object like {EXAMPLE}")
    matched = match_images(entries, images, path)
    found: dict[str, ImageConcepts] = {}
    for item in images:
        where = f"--prompts file {str(path)!r}, image {item.name!r}"
        entry = matched.get(item.name)
        found[item.name] = (
            ImageConcepts(text) if entry is None else _entry(entry, item, text, where)
        )
    return found


def _entry(entry: Any, item: ImageInput, text: tuple[str, ...], where: str) -> ImageConcepts:
    if not isinstance(entry, dict):
        raise UsageError(
            f'{where}: expected an object {{"boxes": [...], "text": [...]}}, got '
            f"{type(entry).__name__}"
        )
    unknown = sorted(set(entry) - set(ENTRY_KEYS))
    if unknown:
        raise UsageError(f"{where}: unknown key {unknown[0]!r} (accepted: boxes, text)")
    own = entry.get("text", [])
    if not isinstance(own, list):
        raise UsageError(f"{where}: text must be a list of phrases, got {own!r:.80}")
    phrases = merged(text, check_phrases(own, f"{where}, text"))
    if len(phrases) > MAX_PHRASES:
        raise UsageError(f"{where}: {len(phrases)} phrases with --text; the limit is {MAX_PHRASES}")
    boxes = _boxes(entry.get("boxes", []), item, where)
    if boxes and not phrases:  # Meta's rule: boxes alone answer the phrase "visual"
        phrases = (VISUAL_PHRASE,)
    return ImageConcepts(phrases, boxes)


def _boxes(values: Any, item: ImageInput, where: str) -> tuple[BoxPrompt, ...]:
    if not isinstance(values, list):
        raise UsageError(f"{where}: boxes must be a list, got {values!r:.80}")
    if len(values) > MAX_BOXES:
        raise UsageError(f"{where}: {len(values)} boxes; the limit is {MAX_BOXES}")
    size = item.size() if values else None
    return tuple(_box(value, size, f"{where}, box {index}") for index, value in enumerate(values))


def _box(value: Any, size: tuple[int, int] | None, where: str) -> BoxPrompt:
    if not isinstance(value, dict) or "box" not in value:
        raise UsageError(f'{where}: expected {{"box": [x1, y1, x2, y2], "positive": true}}')
    unknown = sorted(set(value) - {"box", "positive"})
    if unknown:
        raise UsageError(f"{where}: unknown key {unknown[0]!r} (accepted: box, positive)")
    positive = value.get("positive", True)
    if not isinstance(positive, bool):
        raise UsageError(f"{where}: positive must be true or false, got {positive!r:.40}")
    corners = value["box"]
    if (
        not isinstance(corners, list)
        or len(corners) != 4
        or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
            for v in corners
        )
    ):
        raise UsageError(
            f"{where}: box must be 4 finite numbers [x1, y1, x2, y2], got {corners!r:.80}"
        )
    x1, y1, x2, y2 = (float(v) for v in corners)
    try:
        check_box(corners, size)  # the service's rule
    except ValueError as exc:
        raise UsageError(f"{where}: {exc}") from None
    return BoxPrompt((x1, y1, x2, y2), positive)


def image_concepts(
    text: tuple[str, ...], prompts: dict[str, ImageConcepts] | None, images: list[ImageInput]
) -> dict[str, ImageConcepts]:
    """Each image's phrases and boxes; an image with neither is a usage error."""
    found = prompts or {item.name: ImageConcepts(text) for item in images}
    empty = [
        name for name, concepts in found.items() if not concepts.phrases and not concepts.boxes
    ]
    if empty:
        shown = ", ".join(repr(name) for name in empty[:5]) + (" ..." if len(empty) > 5 else "")
        raise UsageError(
            f"nothing to find in {len(empty)} image(s) ({shown}): give --text PHRASES, or "
            "phrases or exemplar boxes for them in the --prompts file"
        )
    return found


__all__ = [
    "EXAMPLE",
    "MAX_BOXES",
    "MAX_PHRASES",
    "MAX_PHRASE_CHARS",
    "VISUAL_PHRASE",
    "BoxPrompt",
    "ImageConcepts",
    "check_phrase",
    "check_phrases",
    "image_concepts",
    "load_concept_prompts",
    "merged",
    "parse_text",
]
