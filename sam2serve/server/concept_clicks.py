"""Clicks on SAM 3's video objects in POST /v1/videos/{id}/concepts/track (``clicks``):
checked before any model work, then run on the model worker, stateless per request.

Nothing of SAM 3 is kept between requests (as ``track --click``): the request runs the
phrase's full pass again on an interactive state (Meta's memory: every record kept), then
the clicks in order (Meta's ``add_prompt(frame, points, point_labels, obj_id)``), then
Meta's next propagation, partial: only the clicked objects are tracked again
(docs/concepts-video.md, "Clicks"). Every answer is streamed in that order, so a frame
answered again comes again; its last event is its final answer.

A click's ``obj_id`` is a session id: an object this phrase's earlier run reported (the
session keeps its SAM 3 id, and the run gives that SAM 3 id the same session id again:
the same phrase, frames and threshold give the same pass), or an id the session does not
use (SAM 3 adds an object; it gets the next SAM 3 id). Another phrase's object or a SAM
2.1 object is refused (409 ``click_object``), as are bad clicks (422 ``invalid_request``:
:func:`~sam2serve.concepts.video_clicks.check_click`'s rules, frames the pass answers),
clicks with several phrases, and a pass that stops before the video's end (Meta's partial
pass runs to it).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from sam2serve.concepts.video_clicks import add_points, check_click, repropagate
from sam2serve.concepts.video_phrases import PhrasesFrame, PhrasesState, merge
from sam2serve.concepts.video_predictor import FrameResult, Sam3VideoPredictor, VideoState
from sam2serve.engine.video.predictor import VideoPromptError
from sam2serve.server.concept_tracks import TrackIds
from sam2serve.server.errors import ApiError
from sam2serve.server.video_schemas import ConceptClick
from sam2serve.server.video_sessions import VideoSession

PASS, CLICK, REPASS = 0, 1, 2  # the phase of a run's answer


@dataclass(frozen=True)
class ClickPlan:
    """A request's clicks, checked: the phrase, the clicks in order, the SAM 3 id of each
    earlier object clicked (by session id) and the session ids of new objects."""

    phrase: str
    clicks: list[ConceptClick]
    sam3_of: dict[int, int]
    new_ids: set[int]

    def seed(self, ids: TrackIds) -> None:
        """The run's ids: each earlier object clicked keeps its session id; the new
        objects' ids are kept for them."""
        for obj, sam3 in self.sam3_of.items():
            ids.given[sam3] = obj
            ids.used.add(obj)
        ids.used |= self.new_ids


def plan_clicks(
    clicks: Sequence[ConceptClick],
    phrases: Sequence[str],
    session: VideoSession,
    start: int,
    stop: int,
) -> ClickPlan:
    """The clicks checked against the request and the session (4xx naming the bad one)."""
    state = session.state
    if len(phrases) != 1:
        raise ApiError(
            422,
            "invalid_request",
            f"clicks go with one phrase (Meta's clicks are on one run's objects); got "
            f"{len(phrases)}: {', '.join(map(repr, phrases))}",
        )
    if stop != state.num_frames:
        raise ApiError(
            422,
            "invalid_request",
            f"clicks: the pass must run to the video's last frame ({state.num_frames - 1}), "
            f"where Meta's partial pass after the clicks goes; max_frames stops it at "
            f"{stop - 1}: leave max_frames out",
        )
    phrase = phrases[0]
    answered = VideoState(state.num_frames, state.height, state.width, interactive=True)
    answered.cached = {frame: {} for frame in range(start, stop)}
    sam3_of: dict[int, int] = {}
    new_ids: set[int] = set()
    used = session.used_ids()
    for index, click in enumerate(clicks):
        where = f"clicks[{index}]"
        points = [(x, y) for x, y in click.points]
        try:
            check_click(answered, click.frame_idx, click.obj_id, points, click.labels)
        except ValueError as exc:
            hint = ""
            if click.frame_idx not in answered.cached and click.frame_idx < state.num_frames:
                hint = f" (the pass answers frames {start}..{stop - 1}: frame_idx)"
            raise ApiError(422, "invalid_request", f"{where}: {exc}{hint}") from None
        obj = click.obj_id
        track = session.concept_tracks.get(obj)
        if track is not None and track.phrase == phrase and track.sam3_id is not None:
            sam3_of[obj] = track.sam3_id
        elif track is not None:
            raise ApiError(
                409,
                "click_object",
                f"{where}.obj_id {obj} is an object of phrase {track.phrase!r}, not of "
                f"{phrase!r}: click an object this phrase's run reported, or an unused id "
                "for a new one",
            )
        elif obj in used:
            raise ApiError(
                409,
                "click_object",
                f"{where}.obj_id {obj} is a SAM 2.1 object of this session (POST .../prompts"
                "), not SAM 3's: click an object this phrase's run reported, or an unused id "
                "for a new one",
            )
        else:
            new_ids.add(obj)
    return ClickPlan(phrase, list(clicks), sam3_of, new_ids)


def clicked_answers(
    predictor: Sam3VideoPredictor,
    plan: ClickPlan,
    state: VideoState,
    frame_at: Callable[[int], np.ndarray],
    start: int,
    ids: TrackIds,
) -> Iterator[tuple[int, PhrasesFrame]]:
    """(On the model worker.) The phrase's full pass on ``state`` (interactive), the
    clicks' answers, then Meta's partial pass: every answer in that order with its phase.
    A new object's SAM 3 id is the next after every id SAM 3 and the plan know of; a
    click SAM 3 refuses (no room for a new object) ends the run with an error event."""
    run = PhrasesState([plan.phrase], [state])  # one phrase: its own ids

    def named(result: FrameResult) -> PhrasesFrame:
        return merge(run, [result])

    for result in predictor.propagate_clip(state, frame_at, start, "forward"):
        yield PASS, named(result)
    sam3_of = dict(plan.sam3_of)
    for click in plan.clicks:
        sam3 = sam3_of.get(click.obj_id)
        if sam3 is None:
            sam3 = max([state.max_obj_id, *ids.given]) + 1
            sam3_of[click.obj_id] = sam3
            ids.given[sam3] = click.obj_id
        frame = frame_at(click.frame_idx)
        points = [(float(x), float(y)) for x, y in click.points]
        try:
            result = add_points(
                predictor, state, click.frame_idx, frame, sam3, points, list(click.labels)
            )
        except ValueError as exc:
            raise VideoPromptError(f"clicks on obj_id {click.obj_id}: {exc}") from None
        yield CLICK, named(result)
    for result in repropagate(predictor, state, frame_at, start, "forward"):
        yield REPASS, named(result)


__all__ = ["CLICK", "PASS", "REPASS", "ClickPlan", "clicked_answers", "plan_clicks"]
