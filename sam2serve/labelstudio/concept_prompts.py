"""Concept prompts from Label Studio (``labelstudio --concepts``): what SAM 3 is asked.

- pre-annotation (no ``context``): the label names of the config's first BrushLabels or
  PolygonLabels tag on the Image are the phrases, each answered with its own label;
- an interaction whose ``context`` holds a TextArea result (``<TextArea name="concept"
  toName="image"/>``, the annotator types "red car"): its text is the phrase(s), split at
  commas and line breaks. A phrase that is one of the tag's labels (ignoring case) gets that
  label; any other gets the label chosen on another region of the context, else the tag's
  first label.

Everything is bounded before the model sees it: at most ``concept_max_labels`` phrases
(a config with more labels is refused, not cut), each at most ``MAX_PHRASE_CHARS``
characters. Every refusal is a 422 naming the place and the limit. Torch-free.
"""

from __future__ import annotations

from dataclasses import dataclass

from sam2serve.concepts.phrases import MAX_PHRASE_CHARS
from sam2serve.labelstudio.label_config import ControlTag, LabelConfig, LabelConfigError
from sam2serve.labelstudio.protocol import Context, ContextRegion
from sam2serve.server.errors import ApiError

TEXT_TYPES = ("textarea",)
_SEPARATORS = (",", "\n", "\r")
_LIMIT_FLAG = "--concept-max-labels"


@dataclass(frozen=True)
class ConceptPrompt:
    """The phrases asked on one Image, the tag their regions are written as, and each
    phrase's label."""

    output: ControlTag  # the BrushLabels or PolygonLabels tag
    image_name: str
    phrases: tuple[str, ...]
    labels: tuple[str, ...]  # the label of each phrase's regions


def is_text_context(context: Context | None) -> bool:
    """The interaction holds a TextArea result: a concept prompt, not clicks."""
    return context is not None and any(r.type.lower() in TEXT_TYPES for r in context.result)


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
    phrases = []
    for label in labels:
        phrase = label.strip()
        if not phrase or len(phrase) > MAX_PHRASE_CHARS:
            raise ApiError(
                422,
                "invalid_label_config",
                f"label_config: the label {_shown(label)} of {output.name!r} is "
                f"{len(phrase)} characters; a concept prompt is 1 to {MAX_PHRASE_CHARS}",
            )
        phrases.append(phrase)
    image_name = config.image_of(output)
    return ConceptPrompt(output, image_name, tuple(phrases), labels)


def text_prompts(context: Context, config: LabelConfig, max_phrases: int) -> ConceptPrompt:
    """The phrases typed in the context's TextArea results (empty: nothing to answer)."""
    image_name: str | None = None
    phrases: list[str] = []
    chosen: str | None = None
    for i, region in enumerate(context.result):
        where = f"context.result[{i}]"
        if region.type.lower() not in TEXT_TYPES:
            chosen = chosen or _label_of(region)
            continue
        if image_name is not None and region.to_name not in (None, image_name):
            raise _bad(
                f"{where}.to_name: {region.to_name!r}, but an earlier TextArea is on "
                f"{image_name!r}; one prediction is on one image"
            )
        image_name = region.to_name or image_name
        for k, entry in enumerate(_texts(region, where)):
            phrases.extend(_split(entry, f"{where}.value.text[{k}]", max_phrases))
            if len(dict.fromkeys(phrases)) > max_phrases:
                raise _too_many(where, max_phrases)
    unique = tuple(dict.fromkeys(phrases))
    output = _output(config, image_name if image_name in config.images else None)
    by_name = {label.casefold(): label for label in reversed(output.labels)}
    fallback = chosen if chosen in output.labels else output.labels[0]
    labels = tuple(by_name.get(phrase.casefold(), fallback) for phrase in unique)
    return ConceptPrompt(output, config.image_of(output, image_name), unique, labels)


def _output(config: LabelConfig, image_name: str | None) -> ControlTag:
    try:
        return config.concept_output_for(image_name)
    except LabelConfigError as exc:
        raise ApiError(422, "invalid_label_config", str(exc)) from None


def _texts(region: ContextRegion, where: str) -> list[str]:
    text = region.value.text
    if text is None:
        return []
    return [text] if isinstance(text, str) else list(text)


def _split(entry: str, where: str, max_phrases: int) -> list[str]:
    """The phrases of one text entry; its length is checked before it is split."""
    longest = max_phrases * (MAX_PHRASE_CHARS + 1)
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
    return [phrase for phrase in phrases if phrase]


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


__all__ = ["TEXT_TYPES", "ConceptPrompt", "is_text_context", "label_prompts", "text_prompts"]
