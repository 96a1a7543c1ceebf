"""The /v1/concepts contract: pydantic models of its request and response bodies.

A concept request names noun phrases and/or exemplar boxes; the answer is every instance
of each phrase SAM 3 finds on the image (:mod:`sam2serve.concepts.engine`). Strict like
:mod:`sam2serve.server.schemas`: unknown fields and coerced types are errors, and every
list and string is bounded here; the server's ``max_concept_*`` settings may only lower the
bounds.
"""

from __future__ import annotations

from typing import Annotated, Self

from pydantic import BaseModel, Field, field_validator, model_validator

from sam2serve.concepts.phrases import (
    MAX_PHRASE_CHARS,
    MAX_RAW_PHRASE_CHARS,
    META_SCORE_THRESH,
    RANDOM_WEIGHTS_SCORE_THRESH,
    VISUAL_PHRASE,
    check_box,
    check_phrase,
    default_score_thresh,
)
from sam2serve.engine.user_text import NAME_RULE
from sam2serve.server.errors import IMAGE_ID_PATTERN
from sam2serve.server.schemas import (
    IMAGE_BASE64_DOC,
    MASK_FORMAT_DOC,
    SEGMENTATION_DOC,
    FiniteFloat,
    ImageInfo,
    MaskFormat,
    Segmentation,
    _Strict,
)
from sam2serve.server.settings_groups import (
    MAX_CONCEPT_BOXES,
    MAX_CONCEPT_INSTANCES,
    MAX_CONCEPT_PHRASES,
)

Phrase = Annotated[str, Field(max_length=MAX_RAW_PHRASE_CHARS)]


class ExemplarBoxIn(_Strict):
    """An example of the concept (positive) or of what it is not (negative)."""

    box: list[FiniteFloat] = Field(
        min_length=4,
        max_length=4,
        description="[x0, y0, x1, y1] in pixels of the image (x0 < x1, y0 < y1), inside it.",
    )
    positive: bool = Field(
        True, description="true: an instance of the concept; false: something that is not."
    )

    @field_validator("box")
    @classmethod
    def _a_box(cls, box: list[float]) -> list[float]:
        check_box(box)  # the command line's rule too; inside the image: the route's
        return box


def clean_phrases(phrases: list[str]) -> list[str]:
    """Request phrases stripped; one that is no phrase (:func:`check_phrase`) or is
    repeated is a ValueError naming its index (the image and the video concept requests
    share the rule, and the command line's is the same)."""
    stripped = [check_phrase(phrase, f"phrases[{i}]") for i, phrase in enumerate(phrases)]
    for i, phrase in enumerate(stripped):
        if phrase in stripped[:i]:
            raise ValueError(f"phrases[{i}] {phrase!r} is given twice")
    return stripped


class ConceptPrompts(_Strict):
    """The prompt fields the image and the video concept requests share, with their rules:
    phrases stripped, 1..64 characters, none twice; at least a phrase or a box."""

    phrases: list[Phrase] = Field(
        default_factory=list,
        max_length=MAX_CONCEPT_PHRASES,
        description=f"Noun phrases, e.g. 'cat', 'yellow school bus' (1..{MAX_PHRASE_CHARS} "
        f"characters after stripping: {NAME_RULE}; no two the same; at most "
        f"max_concept_phrases). With boxes and no phrase the phrase is {VISUAL_PHRASE!r} "
        "(Meta's rule).",
    )
    boxes: list[ExemplarBoxIn] = Field(
        default_factory=list,
        max_length=MAX_CONCEPT_BOXES,
        description="Exemplar boxes on the image, applied to every phrase (at most "
        "max_concept_boxes).",
    )
    score_thresh: FiniteFloat = Field(
        META_SCORE_THRESH,
        ge=0,
        le=1,
        description="Keep instances whose score (class x presence probability) is above this "
        f"(default: Meta's {META_SCORE_THRESH}; {RANDOM_WEIGHTS_SCORE_THRESH:g} on a server "
        "whose SAM 3 has random weights, which score every instance about 0.25).",
    )

    @field_validator("phrases")
    @classmethod
    def _phrases_are_names(cls, phrases: list[str]) -> list[str]:
        return clean_phrases(phrases)

    @model_validator(mode="after")
    def _has_a_prompt(self) -> ConceptPrompts:
        if not self.phrases and not self.boxes:
            raise ValueError("give at least one phrase or one exemplar box")
        return self

    def with_server_default(self, random_weights: bool) -> Self:
        """This request, its threshold the server's default when it gave none: 0 under
        random weights (:func:`sam2serve.concepts.phrases.default_score_thresh`)."""
        if "score_thresh" in self.model_fields_set:
            return self
        return self.model_copy(update={"score_thresh": default_score_thresh(random_weights)})

    def prompt_phrases(self) -> list[str]:
        """The phrases the detector answers (boxes alone: Meta's stand-in phrase)."""
        return list(self.phrases) or [VISUAL_PHRASE]


class ConceptsRequest(ConceptPrompts):
    """Every instance of one or more concepts on one image."""

    image: str | None = Field(
        None, description=IMAGE_BASE64_DOC + " Give either image or image_id."
    )
    image_id: str | None = Field(
        None,
        pattern=IMAGE_ID_PATTERN,
        description="The image_id a previous /v1/concepts response returned: reuse its "
        "cached SAM 3 encoding (404 'unknown_image_id' once evicted, or if only SAM 2.1 has "
        "seen it: send the image again). The same id /v1/embeddings and /v1/segment use.",
    )
    max_instances: int | None = Field(
        None,
        ge=1,
        le=MAX_CONCEPT_INSTANCES,
        description="Instances per phrase, highest scores first (at most "
        "max_concept_instances; null or omitted: max_concept_instances, 100 by default).",
    )
    mask_format: MaskFormat = Field("coco_rle", description=MASK_FORMAT_DOC)


class InstanceOut(BaseModel):
    score: float = Field(description="Class x presence probability of this instance.")
    bbox: list[float] = Field(description="Box around the mask, [x, y, width, height].")
    area: int = Field(description="Pixels in the mask.")
    segmentation: Segmentation = Field(description=SEGMENTATION_DOC)


class ConceptOut(BaseModel):
    phrase: str = Field(description="The phrase (stripped), or 'visual' for boxes alone.")
    instances: list[InstanceOut] = Field(
        description="Instances above score_thresh, highest score first, at most max_instances."
    )


class ConceptsResponse(ImageInfo):
    """Every instance of each phrase, in the order of the request's phrases. ``model``,
    ``cached`` and ``inference_ms`` are those of SAM 3 (the concept model)."""

    concepts: list[ConceptOut] = Field(description="One entry per phrase, in order.")
