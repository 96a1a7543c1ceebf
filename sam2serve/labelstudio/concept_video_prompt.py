"""A text prompt on a video task (``labelstudio --concepts --video``): the phrase (or
phrases) SAM 3's video predictor follows through the clip.

The labelling config puts a TextArea on the Video (``<TextArea name="concept"
toName="video" smart="true" editable="true" maxSubmissions="1"/>``); the phrase the
annotator submits reaches /predict as the interaction's ``context``: its ``textarea``
results. Label Studio sends one kind of region per interaction (the regions of the type
just finished, on the same object tag), so a text prompt comes without VideoRectangle
keyframes; those are a SAM 2.1 interaction of their own
(:mod:`sam2serve.labelstudio.video_context`), and a context mixing them is refused.

Bounded as an image's TextArea is (:mod:`sam2serve.labelstudio.concept_prompts`, the same
rule for a phrase): the interaction's text at most what ``concept_max_labels`` phrases and
their separators take, counted before it is split, each phrase 1 to ``MAX_PHRASE_CHARS``
characters, at most ``concept_max_labels`` different phrases over the whole interaction (a
phrase typed twice counts once; more are refused, not cut). Meta's video predictor follows
one text prompt; several phrases are one run of it each over a shared encoding per frame
(:mod:`sam2serve.concepts.video_phrases`). Every refusal is a 422 naming the place.
Torch-free.
"""

from __future__ import annotations

from dataclasses import dataclass

from sam2serve.concepts.phrases import MAX_PHRASE_CHARS
from sam2serve.labelstudio.concept_prompts import (
    TEXT_TYPES,
    longest_text,
    region_texts,
    split_phrases,
)
from sam2serve.labelstudio.label_config import LabelConfig
from sam2serve.labelstudio.protocol import Context
from sam2serve.server.errors import ApiError

_LIMIT_FLAG = "--concept-max-labels"


@dataclass(frozen=True)
class VideoTextPrompt:
    """The phrases typed on a Video, each once in the order typed (none: its TextArea held
    none, nothing to answer), and the Video tag they were typed on (None: the TextArea
    named none)."""

    phrases: tuple[str, ...]
    video_name: str | None


def is_video_text(context: Context | None, config: LabelConfig) -> bool:
    """Whether ``context`` holds a TextArea result on a Video: one naming a Video tag of
    the config, or naming no tag in a config of videos only."""
    if context is None:
        return False
    for region in context.result:
        if region.type.lower() not in TEXT_TYPES:
            continue
        if region.to_name in config.videos:
            return True
        if region.to_name is None and config.videos and not config.images:
            return True
    return False


def video_text_prompt(context: Context, max_phrases: int) -> VideoTextPrompt:
    """The phrases of the interaction's TextArea results on one Video; a 422 naming the
    region for anything else in the context, two Videos, a text past the bound (before it
    is split), a phrase the rule refuses, or more than ``max_phrases`` different phrases."""
    video_name: str | None = None
    phrases: dict[str, None] = {}  # each phrase once, in order
    typed = 0  # characters of every entry, bounded before splitting
    longest = longest_text(max_phrases)
    for i, region in enumerate(context.result):
        where = f"context.result[{i}]"
        if region.type.lower() not in TEXT_TYPES:
            raise _bad(
                f"{where}.type: {region.type!r} next to a text prompt on a video; a video's "
                "text prompt is its TextArea results only (keyframe boxes are asked on "
                "their own)"
            )
        if video_name is not None and region.to_name not in (None, video_name):
            raise _bad(
                f"{where}.to_name: {region.to_name!r}, but an earlier text prompt is on "
                f"{video_name!r}; one prediction is on one video"
            )
        video_name = region.to_name or video_name
        for k, entry in enumerate(region_texts(region, where)):
            at = f"{where}.value.text[{k}]"
            split = split_phrases(entry, at, max_phrases)  # the entry's own length first
            typed += len(entry)
            if typed > longest:
                raise _bad(
                    f"{at}: the interaction's TextArea text passes {longest} characters; it "
                    f"is at most {max_phrases} phrases ({_LIMIT_FLAG}) of at most "
                    f"{MAX_PHRASE_CHARS} characters each"
                )
            phrases.update(dict.fromkeys(split))
            if len(phrases) > max_phrases:
                raise _bad(
                    f"{at}: {len(phrases)} different phrases in the interaction; at most "
                    f"{max_phrases} per request ({_LIMIT_FLAG})"
                )
    return VideoTextPrompt(tuple(phrases), video_name)


def _bad(message: str) -> ApiError:
    return ApiError(422, "invalid_request", message)


__all__ = ["VideoTextPrompt", "is_video_text", "video_text_prompt"]
