"""``track --text PHRASE --click FRAME:OBJ:X,Y,LABEL[;X,Y,LABEL...]`` (``--tracker sam3``):
clicks on SAM 3's video objects after its full pass, then Meta's next propagation (only the
clicked objects run: docs/concepts-video.md, "Clicks"). Torch-free: the spec's syntax here,
its place in the video checked by :func:`check_clicks` once the video is read."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sam2serve.commands.common import UsageError

if TYPE_CHECKING:
    from sam2serve.concepts.video_phrases import PhrasesFrame, PhrasesState
    from sam2serve.concepts.video_predictor import FrameResult, Sam3VideoPredictor

CLICK_HELP = (
    "--tracker sam3: after the pass, click on object OBJ on frame FRAME at X,Y (the "
    "video's pixels) with LABEL 1 (object) or 0 (background), several points separated by "
    "';' (e.g. 12:0:40,30,1;80,60,0); an OBJ SAM 3 has not found adds an object. Meta's "
    "clicks (add_prompt points): the clicked objects are then tracked again over the same "
    "frames and the files hold the final answers. Repeatable (one object per --click); "
    "the session then keeps every frame's memory and answers (Meta's, not bounded)"
)


@dataclass(frozen=True)
class ClickSpec:
    """One --click: the frame, the object id, points (video pixels) and their labels."""

    text: str
    frame: int
    obj_id: int
    points: tuple[tuple[float, float], ...]
    labels: tuple[int, ...]

    def as_json(self) -> dict[str, Any]:
        return {
            "frame": self.frame,
            "obj_id": self.obj_id,
            "points": [list(p) for p in self.points],
            "labels": list(self.labels),
        }


def add_click_argument(group: Any) -> None:
    """--click on ``group`` (an argparse group)."""
    group.add_argument(
        "--click", action="append", metavar="FRAME:OBJ:X,Y,LABEL[;...]", help=CLICK_HELP
    )


def parse_click(text: str) -> ClickSpec:
    """One --click value, or UsageError naming it."""

    def bad(why: str) -> UsageError:
        return UsageError(f"--click {text!r}: {why}")

    parts = text.split(":")
    if len(parts) != 3:
        raise bad("expected FRAME:OBJ:X,Y,LABEL[;X,Y,LABEL...]")
    frame_text, obj_text, points_text = parts
    try:
        frame, obj_id = int(frame_text), int(obj_text)
    except ValueError:
        raise bad("FRAME and OBJ are whole numbers") from None
    if frame < 0 or obj_id < 0:
        raise bad("FRAME and OBJ are >= 0")
    points: list[tuple[float, float]] = []
    labels: list[int] = []
    for point in points_text.split(";"):
        fields = point.split(",")
        if len(fields) != 3:
            raise bad(f"each point is X,Y,LABEL; got {point!r}")
        try:
            x, y = float(fields[0]), float(fields[1])
        except ValueError:
            raise bad(f"X and Y are numbers; got {point!r}") from None
        if not (math.isfinite(x) and math.isfinite(y)):
            raise bad(f"X and Y are finite numbers; got {point!r}")
        if fields[2].strip() not in ("0", "1"):
            raise bad(f"LABEL is 1 (object) or 0 (background); got {fields[2]!r}")
        points.append((x, y))
        labels.append(int(fields[2]))
    return ClickSpec(text, frame, obj_id, tuple(points), tuple(labels))


def parse_clicks(values: Sequence[str] | None) -> list[ClickSpec]:
    return [parse_click(value) for value in values or ()]


def check_clicks(
    clicks: Sequence[ClickSpec],
    num_frames: int,
    height: int,
    width: int,
    processed: Iterable[int],
) -> None:
    """Each click's frame processed by the pass before it, its points inside the video
    (the predictor's own rules, :func:`~sam2serve.concepts.video_clicks.check_click`):
    UsageError naming the --click value."""
    from sam2serve.concepts.video_clicks import check_click
    from sam2serve.concepts.video_predictor import VideoState

    state = VideoState(num_frames, height, width, interactive=True)
    state.cached = {frame: {} for frame in processed}
    for click in clicks:
        try:
            check_click(state, click.frame, click.obj_id, click.points, click.labels)
        except ValueError as exc:
            hint = ""
            if click.frame not in state.cached and 0 <= click.frame < num_frames:
                hint = " (--direction and --concept-frame choose the frames the pass visits)"
            raise UsageError(f"--click {click.text!r}: {exc}{hint}") from None


def clicked_run(
    predictor: Sam3VideoPredictor,
    phrases: Sequence[str],
    boxes: Sequence[Any],
    clicks: Sequence[ClickSpec],
    frame_at: Callable[[int], Any],
    num_frames: int,
    height: int,
    width: int,
    start: int,
    direction: str,
) -> tuple[PhrasesState, Iterator[PhrasesFrame]]:
    """The phrase's pass (an interactive state), then the clicks' answers in order, then
    Meta's next propagation (partial): every answer in that order, a frame answered again
    coming again. One phrase only (Meta's clicks are on one session's objects)."""
    from sam2serve.concepts.video_clicks import add_points, propagate
    from sam2serve.concepts.video_phrases import PhrasesState, merge
    from sam2serve.concepts.video_prompts import check_direction

    if len(phrases) != 1:
        raise UsageError(
            f"--click goes with one phrase (Meta's clicks are on one session's objects); "
            f"got {len(phrases)}: {', '.join(map(repr, phrases))}"
        )
    phrase, way = phrases[0], check_direction(direction)
    state = predictor.start(num_frames, height, width, phrase, boxes, interactive=True)

    def answers() -> Iterator[FrameResult]:
        yield from propagate(predictor, state, frame_at, start, way)
        for click in clicks:
            frame = frame_at(click.frame)
            try:
                yield add_points(
                    predictor, state, click.frame, frame, click.obj_id, click.points, click.labels
                )
            except ValueError as exc:  # what only the pass tells: no room for a new object
                raise UsageError(f"--click {click.text!r}: {exc}") from None
        yield from propagate(predictor, state, frame_at, start, way)

    run = PhrasesState([phrase], [state])  # one phrase: its own ids, as a several-phrase run's
    return run, (merge(run, [result]) for result in answers())


def no_clicks_with(args: argparse.Namespace) -> None:
    """--click is SAM 3's video predictor's: UsageError with another tracker."""
    if args.click and args.tracker != "sam3":
        raise UsageError("--click is a --tracker sam3 option (SAM 3's video predictor)")


__all__ = [
    "ClickSpec",
    "add_click_argument",
    "check_clicks",
    "clicked_run",
    "no_clicks_with",
    "parse_click",
    "parse_clicks",
]
