"""What a concept prompt may be, for every surface (torch-free: the command line checks its
flags with it before any model loads): the phrase and exemplar-box rules ``run --task
concepts``, ``track --text``, ``/v1/concepts``, video concept seeding and Label Studio all
apply, so they take and refuse the same prompts, and the score threshold a request gets
when it names none."""

from __future__ import annotations

import math
from collections.abc import Sequence

from sam2serve.engine.user_text import MAX_NAME_CHARS, check_name

# After stripping: a phrase seeds objects named by it, so it is a name.
MAX_PHRASE_CHARS = MAX_NAME_CHARS
# Before stripping: a phrase padded with spaces is still a bounded string.
MAX_RAW_PHRASE_CHARS = 256
# Meta's text stand-in when only exemplar boxes are given.
VISUAL_PHRASE = "visual"
META_SCORE_THRESH = 0.5  # Meta's Sam3Processor confidence_threshold
# Random weights score every query about 0.25: Meta's threshold would keep nothing.
RANDOM_WEIGHTS_SCORE_THRESH = 0.0


def check_phrase(text: str, what: str = "the phrase") -> str:
    """``text`` stripped; a ValueError naming ``what`` and the problem when it is longer
    than :data:`MAX_RAW_PHRASE_CHARS` before stripping or no name once stripped
    (:func:`sam2serve.engine.user_text.check_name`: 1..64 characters, no control,
    invisible or direction-changing character)."""
    if len(text) > MAX_RAW_PHRASE_CHARS:
        raise ValueError(
            f"{what} has {len(text)} characters with its spaces; the limit is "
            f"{MAX_RAW_PHRASE_CHARS} (and {MAX_PHRASE_CHARS} without them)"
        )
    return check_name(text, what)


def check_box(box: Sequence[float], size: tuple[int, int] | None = None) -> None:
    """An exemplar box ``[x0, y0, x1, y1]`` in image pixels: four finite numbers, a
    positive area (x0 < x1, y0 < y1) and, given the image's ``size`` (height, width), inside
    it; else a ValueError saying which rule the box breaks."""
    if len(box) != 4 or not all(math.isfinite(v) for v in box):
        raise ValueError(f"a box is 4 finite numbers [x0, y0, x1, y1], got {list(box)}")
    x0, y0, x1, y1 = box
    if not (x0 < x1 and y0 < y1):
        raise ValueError(f"box {list(box)} is empty (needs x0 < x1 and y0 < y1)")
    if min(box) < 0:
        raise ValueError(f"box {list(box)} has a coordinate below 0")
    if size is not None:
        height, width = size
        if x1 > width or y1 > height:
            raise ValueError(
                f"box {list(box)} is outside the {width}x{height} image "
                f"(x in 0..{width}, y in 0..{height})"
            )


def default_score_thresh(random_weights: bool) -> float:
    """The threshold of a request that names none: Meta's, or 0 under random weights."""
    return RANDOM_WEIGHTS_SCORE_THRESH if random_weights else META_SCORE_THRESH
