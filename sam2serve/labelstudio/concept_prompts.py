"""Concept prompts from Label Studio (``labelstudio --concepts``): what SAM 3 is asked.

- pre-annotation (no ``context``): the label names of the config's first BrushLabels or
  PolygonLabels tag on the Image are the phrases, each answered with its own label;
- an interaction whose ``context`` holds a TextArea result (``<TextArea name="concept"
  toName="image"/>``, the annotator types "red car"): its text is the phrase(s), split at
  commas and line breaks. A phrase that is one of the tag's labels (ignoring case) gets that
  label; any other gets the label chosen on another region of the context, else the tag's
  first label;
- an interaction whose ``context`` holds rectangles (RectangleLabels / Rectangle) labelled
  with one of the tag's labels (ignoring case): each is an **exemplar box** of that label's
  concept, positive; labelled ``not <label>`` (or sent with ``is_positive: false``) it is a
  negative one (an example of what the concept is not). Every phrase answered with that
  label is refined by its boxes; a label with boxes and no typed phrase is asked by its
  name. Such a rectangle is no SAM 2 box prompt any more; a rectangle whose label is no
  concept label still is (the context then goes to SAM 2 when nothing else makes it a
  concept prompt).

Everything is bounded before the model sees it: at most ``concept_max_labels`` phrases
(a config with more labels is refused, not cut), each at most ``MAX_PHRASE_CHARS``
characters, the TextArea text of one interaction (all its entries together) at most what
that many phrases and their separators take, counted before it is split (so a text of many
repeated phrases is refused, not deduplicated at length), and at most the service's
``max_concept_boxes`` exemplar boxes in one
interaction (counted as they are read: more is refused, not cut). Every refusal is a 422
naming the place and the limit. Coordinates stay in percent (checked and clamped as SAM 2's
boxes are, :func:`sam2serve.labelstudio.context.percent_box`) until the image's size is
known. Torch-free.
"""

from __future__ import annotations

from dataclasses import dataclass

from sam2serve.concepts.phrases import MAX_PHRASE_CHARS, check_phrase
from sam2serve.labelstudio.context import (
    BOX_TYPES,
    PercentBox,
    check_unrotated,
    percent_box,
)
from sam2serve.labelstudio.label_config import ControlTag, LabelConfig, LabelConfigError
from sam2serve.labelstudio.protocol import Context, ContextRegion
from sam2serve.server.errors import ApiError

TEXT_TYPES = ("textarea",)
_SEPARATORS = (",", "\n", "\r")
_LIMIT_FLAG = "--concept-max-labels"
_BOX_LIMIT = "max_concept_boxes, the service's --max-concept-boxes"
# A rectangle labelled "not <label>" is a negative exemplar of <label>'s concept.
NEGATIVE_PREFIX = "not "


@dataclass(frozen=True)
class PercentExemplar:
    """An exemplar box in percent of the image: an example of the concept (positive) or of
    what it is not."""

    box: PercentBox
    positive: bool


@dataclass(frozen=True)
class ConceptPrompt:
    """The phrases asked on one Image, the tag their regions are written as, each phrase's
    label, and each phrase's exemplar boxes (empty: none for any phrase)."""

    output: ControlTag  # the BrushLabels or PolygonLabels tag
    image_name: str
    phrases: tuple[str, ...]
    labels: tuple[str, ...]  # the label of each phrase's regions
    exemplars: tuple[tuple[PercentExemplar, ...], ...] = ()  # per phrase, when any

    def exemplars_of(self, index: int) -> tuple[PercentExemplar, ...]:
        """The exemplar boxes that refine phrase ``index``."""
        return self.exemplars[index] if self.exemplars else ()


def label_prompts(config: LabelConfig, max_labels: int) -> ConceptPrompt:
    """Every label name of the output tag as a phrase (pre-annotation)."""
    output = _output(config, None)
    labels = tuple(dict.fromkeys(output.labels))  # a label listed twice is asked once
    if len(labels) > max_labels:
        raise ApiError(
            422,
            "too_many_prompts",
            f"label_config: the {output.kind} tag {output.name!r} has {len(labels)} labels; "
            f"with concepts each label is a prompt, at most {max_labels} ({_LIMIT_FLAG})",
        )
    phrases = [_label_phrase(label, output) for label in labels]
    image_name = config.image_of(output)
    return ConceptPrompt(output, image_name, tuple(phrases), labels)


def context_prompts(
    context: Context, config: LabelConfig, max_phrases: int, max_boxes: int
) -> ConceptPrompt | None:
    """The concept prompt of an interaction: the phrases typed in its TextArea results and
    the exemplar boxes of its rectangles labelled with a concept label. None when it has
    neither (its clicks and boxes are SAM 2's); a TextArea with no phrase in it is a prompt
    with nothing to answer."""
    output = _context_output(context, config)
    if output is None:
        return None
    by_name = {label.casefold(): label for label in reversed(output.labels)}
    image_name: str | None = None
    phrases: dict[str, None] = {}  # the typed phrases, each once, in order
    typed_chars = 0  # of every TextArea entry of the interaction, bounded before splitting
    exemplars: dict[str, list[PercentExemplar]] = {}
    boxes = 0
    typed = False
    chosen: str | None = None
    for i, region in enumerate(context.result):
        where = f"context.result[{i}]"
        kind = region.type.lower()
        concept = _concept_of(region, output, by_name) if kind in BOX_TYPES else None
        if kind not in TEXT_TYPES and concept is None:
            chosen = chosen or _label_of(region)
            continue
        if image_name is not None and region.to_name not in (None, image_name):
            raise _bad(
                f"{where}.to_name: {region.to_name!r}, but an earlier concept prompt is on "
                f"{image_name!r}; one prediction is on one image"
            )
        image_name = region.to_name or image_name
        if concept is not None:
            label, positive = concept
            chosen = chosen or label
            boxes += 1
            if boxes > max_boxes:
                raise ApiError(
                    422,
                    "too_many_prompts",
                    f"{where}: more than {max_boxes} exemplar boxes (rectangles labelled "
                    f"with a concept label) in one interaction; at most {max_boxes} "
                    f"({_BOX_LIMIT})",
                )
            check_unrotated(region, where)
            box = percent_box(region, where)
            exemplars.setdefault(label, []).append(PercentExemplar(box, positive))
            continue
        typed = True
        for k, entry in enumerate(region_texts(region, where)):
            at = f"{where}.value.text[{k}]"
            split = split_phrases(entry, at, max_phrases)  # the entry's own length checked first
            typed_chars += len(entry)
            if typed_chars > longest_text(max_phrases):
                raise _bad(
                    f"{at}: the interaction's TextArea text passes {longest_text(max_phrases)} "
                    f"characters; it is at most {max_phrases} phrases ({_LIMIT_FLAG}) of at "
                    f"most {MAX_PHRASE_CHARS} characters each"
                )
            phrases.update(dict.fromkeys(split))
            if len(phrases) > max_phrases:
                raise _too_many(where, max_phrases)
    if not typed and not exemplars:
        return None
    unique = list(phrases)
    fallback = chosen if chosen in output.labels else output.labels[0]
    labels = [by_name.get(phrase.casefold(), fallback) for phrase in unique]
    for label in exemplars:  # a concept shown by example only is asked by its name
        if label not in labels:
            unique.append(_label_phrase(label, output))
            labels.append(label)
    if len(unique) > max_phrases:
        raise _too_many("context.result", max_phrases)
    per_phrase = tuple(tuple(exemplars.get(label, ())) for label in labels)
    return ConceptPrompt(
        output,
        config.image_of(output, image_name),
        tuple(unique),
        tuple(labels),
        per_phrase if exemplars else (),
    )


def _context_output(context: Context, config: LabelConfig) -> ControlTag | None:
    """The tag whose labels are the concepts of this interaction: the one on the image of
    its first TextArea or rectangle (any image when they name none). None for a context of
    rectangles only on an image without such a tag (SAM 2's, which says what is missing)."""
    prompts = [r for r in context.result if r.type.lower() in (*TEXT_TYPES, *BOX_TYPES)]
    if not prompts:
        return None
    named = next((r.to_name for r in prompts if r.to_name in config.images), None)
    try:
        return config.concept_output_for(named)
    except LabelConfigError as exc:
        if any(r.type.lower() in TEXT_TYPES for r in prompts):
            raise ApiError(422, "invalid_label_config", str(exc)) from None
        return None


def _concept_of(
    region: ContextRegion, output: ControlTag, by_name: dict[str, str]
) -> tuple[str, bool] | None:
    """A rectangle's concept label and whether it is a positive example of it: its label
    is a concept label (exactly, else ignoring case), or ``not <label>`` for a negative
    one; None for any other label (a SAM 2 box)."""
    label = _label_of(region)
    if label is None:
        return None
    positive = region.is_positive is not False
    if label in output.labels:
        return label, positive
    folded = label.strip().casefold()
    if folded in by_name:
        return by_name[folded], positive
    if folded.startswith(NEGATIVE_PREFIX):
        named = by_name.get(folded[len(NEGATIVE_PREFIX) :].strip())
        if named is not None:
            return named, False
    return None


def _label_phrase(label: str, output: ControlTag) -> str:
    """A label name as a phrase: stripped, 1..MAX_PHRASE_CHARS characters, by the one rule
    for phrases (:func:`sam2serve.concepts.phrases.check_phrase`)."""
    phrase = label.strip()
    if not phrase or len(phrase) > MAX_PHRASE_CHARS:
        raise ApiError(
            422,
            "invalid_label_config",
            f"label_config: the label {_shown(label)} of {output.name!r} is "
            f"{len(phrase)} characters; a concept prompt is 1 to {MAX_PHRASE_CHARS}",
        )
    try:
        return check_phrase(phrase, "the label")
    except ValueError as exc:
        raise ApiError(
            422, "invalid_label_config", f"label_config: {exc} (of {output.name!r})"
        ) from None


def _output(config: LabelConfig, image_name: str | None) -> ControlTag:
    try:
        return config.concept_output_for(image_name)
    except LabelConfigError as exc:
        raise ApiError(422, "invalid_label_config", str(exc)) from None


def region_texts(region: ContextRegion, where: str) -> list[str]:
    """The text entries of a TextArea result (one string, or a list of them)."""
    text = region.value.text
    if text is None:
        return []
    return [text] if isinstance(text, str) else list(text)


def split_phrases(entry: str, where: str, max_phrases: int) -> list[str]:
    """The phrases of one text entry (split at commas and line breaks, stripped, empty ones
    dropped), each by the one rule for phrases; its length is checked before it is split
    (at most :func:`longest_text` of ``max_phrases``), each phrase's after. A 422 naming
    ``where`` otherwise."""
    longest = longest_text(max_phrases)
    if len(entry) > longest:
        raise _bad(
            f"{where}: {len(entry)} characters; a TextArea prompt is at most {max_phrases} "
            f"phrases ({_LIMIT_FLAG}) of at most {MAX_PHRASE_CHARS} characters each"
        )
    for separator in _SEPARATORS[1:]:
        entry = entry.replace(separator, _SEPARATORS[0])
    phrases = [part.strip() for part in entry.split(_SEPARATORS[0])]
    for phrase in phrases:
        if len(phrase) > MAX_PHRASE_CHARS:
            raise _bad(
                f"{where}: the phrase {_shown(phrase)} is {len(phrase)} characters; a concept "
                f"prompt is at most {MAX_PHRASE_CHARS}"
            )
    try:  # the service's and the command line's rule for a phrase
        return [check_phrase(phrase, "the phrase") for phrase in phrases if phrase]
    except ValueError as exc:
        raise _bad(f"{where}: {exc}") from None


def longest_text(max_phrases: int) -> int:
    """The most characters ``max_phrases`` phrases and their separators can take."""
    return max_phrases * (MAX_PHRASE_CHARS + 1)


def _label_of(region: ContextRegion) -> str | None:
    value = region.value
    labels = value.labels or value.keypointlabels or value.rectanglelabels or []
    return labels[0] if labels else None


def _too_many(where: str, max_phrases: int) -> ApiError:
    return _bad(f"{where}: more than {max_phrases} phrases in one interaction ({_LIMIT_FLAG})")


def _shown(text: str) -> str:
    return repr(text) if len(text) <= 40 else repr(text[:37]) + "..."


def _bad(message: str) -> ApiError:
    return ApiError(422, "invalid_request", message)


__all__ = [
    "NEGATIVE_PREFIX",
    "TEXT_TYPES",
    "ConceptPrompt",
    "PercentExemplar",
    "context_prompts",
    "label_prompts",
    "longest_text",
    "region_texts",
    "split_phrases",
]
