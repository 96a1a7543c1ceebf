"""One object's prompt on one image as one value, and the arrays the decoder takes for many.

Every surface builds a :class:`Prompt`: the command line from its JSON form
(:meth:`Prompt.from_json`, :func:`prompts_from_json`), the HTTP API, its video sessions and
Label Studio from the request's objects (:meth:`Prompt.from_api`), the video predictor from
Meta's arrays (:meth:`Prompt.from_arrays`). A Prompt is checked when it is made: one label
per point, each 1 (foreground) or 0 (background), finite coordinates, a box
``[x0, y0, x1, y1]`` with ``x0 <= x1`` and ``y0 <= y1``, points or a box (or both).
:meth:`Prompt.check_inside` checks it against the image once its size is known.

:func:`prompt_arrays` turns prompts into the decoder's input with Meta's semantics: a box is
two corner points (labels 2 and 3) placed before the clicks, and shorter prompts are padded
to the longest with SAM's "not a point" label -1, which the prompt encoder embeds as such.

Every error is a :class:`PromptError` that names the part of the prompt (``points[1]``,
``labels[0]``, ``box``) apart from the problem, so that each surface says where the prompt
is in its own terms (``objects[2].points[1]``, ``--prompts file 'p.json': image 'a.jpg',
object 2, points[1]``). Torch-free: the command line checks a prompts file before torch is
imported.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import numpy as np

FOREGROUND, BACKGROUND = 1, 0
CLICK_LABELS = (FOREGROUND, BACKGROUND)
# A box's top-left and bottom-right corners, as SAM's prompt encoder embeds them.
BOX_CORNER_LABELS = (2, 3)
# SAM's label for a padding point, which the prompt encoder embeds as "not a point".
PADDING_LABEL = -1
# What the decoder takes in arrays (Meta's API: a caller may pad or place corners itself).
VALID_LABELS = (PADDING_LABEL, BACKGROUND, FOREGROUND, *BOX_CORNER_LABELS)
JSON_KEYS = ("points", "labels", "box")
BOX_ORDER = "[x0, y0, x1, y1], top-left then bottom-right"


class PromptError(ValueError):
    """A prompt the model cannot take. ``problem`` says what is wrong with which value;
    ``part`` (``points[1]``, ``labels[0]``, ``box``), when given, names where in the prompt.
    """

    def __init__(self, problem: str, part: str | None = None) -> None:
        super().__init__(problem if part is None else f"{part}: {problem}")
        self.problem = problem
        self.part = part

    def at(self, where: str, separator: str = ", ") -> str:
        """The message for the prompt named ``where``: ``{where}{separator}{part}: ...``, or
        ``{where}: ...`` without a part."""
        if self.part is None:
            return f"{where}: {self.problem}"
        return f"{where}{separator}{self.part}: {self.problem}"


class ApiPoint(Protocol):
    """A click as the HTTP API's schemas have it (``server.schemas.Point``)."""

    @property
    def x(self) -> float: ...

    @property
    def y(self) -> float: ...

    @property
    def label(self) -> int: ...


class ApiObject(Protocol):
    """An object's prompt as the HTTP API's schemas have it (``ObjectPrompt``, the video
    sessions' ``VideoPromptRequest``)."""

    @property
    def points(self) -> Sequence[ApiPoint]: ...

    @property
    def box(self) -> Sequence[float] | None: ...


def _finite_numbers(value: Any, count: int) -> tuple[float, ...] | None:
    """``value`` as ``count`` finite floats; None unless it is a sequence of exactly that
    (booleans and strings are not numbers)."""
    if isinstance(value, (str, bytes, Mapping)) or not hasattr(value, "__len__"):
        return None
    items = list(value)
    if len(items) != count:
        return None
    if not all(isinstance(v, numbers.Real) and not isinstance(v, (bool, np.bool_)) for v in items):
        return None
    floats = tuple(float(v) for v in items)
    return floats if all(math.isfinite(v) for v in floats) else None


def _numeric_array(value: Any, name: str) -> np.ndarray:
    try:
        array = np.asarray(value)
    except (TypeError, ValueError):  # ragged
        array = np.asarray(None)
    if array.dtype.kind not in "biuf":
        raise PromptError(f"{name} must be numbers, got {value!r:.80}")
    return array


def _label_count_error(points: int, labels: Any) -> PromptError:
    return PromptError(
        f"labels must be a list of one label per point ({points}), got {labels!r:.80}"
    )


def _shown(values: Sequence[float]) -> str:
    return "[" + ", ".join(f"{v:g}" for v in values) + "]"


@dataclass(frozen=True)
class Prompt:
    """The prompt for one object of one image: clicks ``points`` (x, y in the image's
    pixels) with their ``labels`` (1 foreground, 0 background), a ``box`` ``[x0, y0, x1,
    y1]`` in pixels, and optionally ``mask_input``: the low-res logits (1, 256, 256) of a
    previous prediction on the same image (a tensor; not part of the value).

    Any sequences of numbers will do; they are kept as tuples of floats and ints.
    ``bare_click`` marks a prompt written as a bare ``[x, y]`` (the command line's original
    form), whose records keep that form; it is not part of the value either.
    """

    points: Sequence[Sequence[float]] = ()
    labels: Sequence[int] = ()
    box: Sequence[float] | None = None
    mask_input: Any = field(default=None, compare=False, repr=False)
    bare_click: bool = field(default=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        points = []
        for j, point in enumerate(self.points):
            xy = _finite_numbers(point, 2)
            if xy is None:
                raise PromptError(
                    f"expected [x, y] with two finite numbers, got {point!r:.80}", f"points[{j}]"
                )
            points.append(xy)
        labels = list(self.labels)
        if len(labels) != len(points):
            raise _label_count_error(len(points), labels)
        for j, label in enumerate(labels):
            if isinstance(label, (bool, np.bool_)) or label not in CLICK_LABELS:
                raise PromptError(
                    f"a label is 1 (foreground) or 0 (background), got {label!r:.40}",
                    f"labels[{j}]",
                )
        box = None
        if self.box is not None:
            box = _finite_numbers(self.box, 4)
            if box is None:
                raise PromptError(
                    f"box must be [x0, y0, x1, y1] with four finite numbers, got {self.box!r:.80}"
                )
            if box[0] > box[2] or box[1] > box[3]:
                raise PromptError(
                    f"box {_shown(box)} must have x0 <= x1 and y0 <= y1 ({BOX_ORDER})"
                )
        if not points and box is None:
            raise PromptError("an object needs at least one point or a box (or both)")
        object.__setattr__(self, "points", tuple(points))
        object.__setattr__(self, "labels", tuple(int(label) for label in labels))
        object.__setattr__(self, "box", box)

    # ------------------------------------------------------------------ constructors
    @classmethod
    def click(cls, x: float, y: float) -> Prompt:
        """One foreground click, written as a bare ``[x, y]``."""
        return cls(((x, y),), (FOREGROUND,), bare_click=True)

    @classmethod
    def from_json(cls, value: Any) -> Prompt:
        """The command line's JSON form: a click ``[x, y]`` (foreground), or an object
        ``{"points": [[x, y], ...], "labels": [1, 0, ...], "box": [x0, y0, x1, y1]}``
        (labels default to 1; a box must not be empty)."""
        if isinstance(value, list):
            xy = _finite_numbers(value, 2)
            if xy is None:
                raise PromptError(f"expected [x, y] with two finite numbers, got {value!r:.80}")
            return cls.click(*xy)
        if not isinstance(value, Mapping):
            raise PromptError(
                f"expected [x, y] or an object with points, labels and a box, got {value!r:.80}"
            )
        unknown = sorted(set(value) - set(JSON_KEYS))
        if unknown:
            raise PromptError(f"unknown key {unknown[0]!r}; an object has {', '.join(JSON_KEYS)}")
        points = value.get("points", [])
        if not isinstance(points, list):
            raise PromptError(f"points must be a list of [x, y], got {points!r:.80}")
        labels = value.get("labels")
        if labels is None:
            labels = [FOREGROUND] * len(points)
        elif not isinstance(labels, list):
            raise _label_count_error(len(points), labels)
        box = value.get("box")
        # A box of the JSON form must not be empty either: in a file, it is a mistake.
        xyxy = _finite_numbers(box, 4) if box is not None else None
        if xyxy is not None and (xyxy[2] <= xyxy[0] or xyxy[3] <= xyxy[1]):
            raise PromptError(
                f"box {box!r:.80} is empty: it needs x1 > x0 and y1 > y0 ({BOX_ORDER})"
            )
        return cls(points, labels, box)

    @classmethod
    def from_api(cls, obj: ApiObject, mask_input: Any = None) -> Prompt:
        """An object of an HTTP request (its points with x, y and label, and its box)."""
        return cls(
            [(p.x, p.y) for p in obj.points],
            [p.label for p in obj.points],
            obj.box,
            mask_input=mask_input,
        )

    @classmethod
    def from_arrays(cls, points: Any = None, labels: Any = None, box: Any = None) -> Prompt:
        """Meta's arrays for one object: ``points`` (P, 2) with ``labels`` (P,), and/or a
        ``box`` (4,) (as Meta's video predictor's ``add_new_points_or_box`` takes them)."""
        if (points is None) != (labels is None):
            raise PromptError("points and labels must be given together")
        if points is None and box is None:
            raise PromptError("give points (with labels) or a box")
        coords = np.zeros((0, 2))
        label_list: list[Any] = []
        if points is not None:
            coords = _numeric_array(points, "points").astype(np.float64)
            if coords.ndim != 2 or coords.shape[1] != 2:
                raise PromptError(f"points must have shape (P, 2), got {coords.shape}")
            label_array = _numeric_array(labels, "labels")
            if label_array.shape != (coords.shape[0],):
                raise PromptError(
                    f"labels must have shape ({coords.shape[0]},) to match the points, "
                    f"got {label_array.shape}"
                )
            label_list = label_array.tolist()
        box_list: list[float] | None = None
        if box is not None:
            corners = _numeric_array(box, "box").astype(np.float64)
            if corners.size != 4:
                raise PromptError(f"box must be [x0, y0, x1, y1], got shape {corners.shape}")
            box_list = corners.reshape(4).tolist()
        return cls(coords.tolist(), label_list, box_list)

    def with_mask(self, mask_input: Any) -> Prompt:
        """This prompt with ``mask_input`` (a previous prediction's low-res logits)."""
        return replace(self, mask_input=mask_input)

    # ------------------------------------------------------------------ checks and forms
    def check_inside(self, width: int, height: int, what: str = "image") -> None:
        """PromptError unless every point and the box lie inside a ``width`` x ``height``
        ``what`` (``0 <= x <= width``, ``0 <= y <= height``); the error names the point or
        the box, its value and what is accepted."""
        size = f"{width}x{height} {what}"
        for j, (x, y) in enumerate(self.points):
            if not (0 <= x <= width and 0 <= y <= height):
                raise PromptError(
                    f"{_shown((x, y))} lies outside the {size}; accepted: "
                    f"0 <= x <= {width}, 0 <= y <= {height}",
                    f"points[{j}]",
                )
        if self.box is not None:
            x0, y0, x1, y1 = self.box
            if x0 < 0 or y0 < 0 or x1 > width or y1 > height:
                raise PromptError(
                    f"{_shown(self.box)} is not inside the {size}; accepted: "
                    f"0 <= x0 <= x1 <= {width}, 0 <= y0 <= y1 <= {height}",
                    "box",
                )

    def tokens(self) -> tuple[list[Sequence[float]], list[int]]:
        """The points the prompt encoder sees and their labels: the box's corners (labels 2
        and 3) first, then the clicks."""
        points = list(self.points)
        labels = list(self.labels)
        if self.box is not None:
            x0, y0, x1, y1 = self.box
            points = [(x0, y0), (x1, y1), *points]
            labels = [*BOX_CORNER_LABELS, *labels]
        return points, labels

    def as_json(self) -> dict[str, Any]:
        """The object form: ``{"points": [[x, y], ...], "labels": [...], "box": [...] or
        None}``."""
        return {
            "points": [list(point) for point in self.points],
            "labels": list(self.labels),
            "box": None if self.box is None else list(self.box),
        }


def prompts_from_json(values: Any) -> list[Prompt]:
    """A JSON list of prompts (:meth:`Prompt.from_json`); an error names the entry as
    ``point i`` (a bare click), ``object i`` or ``prompt i`` (neither) in ``part``."""
    if not isinstance(values, list):
        raise PromptError(
            'expected a list of [x, y] points or of objects {"points": [[x, y], ...], '
            f'"labels": [1, 0, ...], "box": [x0, y0, x1, y1]}}, got {values!r:.80}'
        )
    prompts = []
    for index, value in enumerate(values):
        kind = "point" if isinstance(value, list) else "object"
        if not isinstance(value, (list, Mapping)):
            kind = "prompt"
        try:
            prompts.append(Prompt.from_json(value))
        except PromptError as exc:
            where = f"{kind} {index}"
            raise PromptError(exc.problem, where if exc.part is None else f"{where}, {exc.part}")
    return prompts


def as_prompt(value: Prompt | Sequence[float] | Mapping[str, Any]) -> Prompt:
    """``value`` if it is a Prompt, else its JSON form read (:meth:`Prompt.from_json`; a
    click may be any pair of numbers: a list, a tuple, an array)."""
    if isinstance(value, Prompt):
        return value
    if isinstance(value, (Sequence, np.ndarray)) and not isinstance(value, (str, bytes)):
        value = list(value)
    return Prompt.from_json(value)


def prompt_arrays(prompts: Sequence[Prompt]) -> tuple[np.ndarray, np.ndarray]:
    """(B, N, 2) float32 coordinates in the image's pixels and (B, N) int32 labels: each
    prompt's box corners (labels 2, 3) then its clicks, padded to the longest prompt with
    label -1 (the padding points' coordinates are zeros)."""
    if not prompts:
        raise PromptError("give at least one prompt")
    sequences = [prompt.tokens() for prompt in prompts]
    longest = max(len(labels) for _, labels in sequences)
    coords = np.zeros((len(sequences), longest, 2), dtype=np.float32)
    labels = np.full((len(sequences), longest), PADDING_LABEL, dtype=np.int32)
    for row, (points, point_labels) in enumerate(sequences):
        coords[row, : len(points)] = points
        labels[row, : len(point_labels)] = point_labels
    return coords, labels


__all__ = [
    "BOX_CORNER_LABELS",
    "CLICK_LABELS",
    "PADDING_LABEL",
    "VALID_LABELS",
    "Prompt",
    "PromptError",
    "as_prompt",
    "prompt_arrays",
    "prompts_from_json",
]
