"""How many objects a SAM 3 video run may track at once, checked before any model work:
the one rule of a stored session's run (POST /v1/videos/{id}/concepts/track) and a live
connection's (``{"type": "concepts_track"}``).

- :func:`check_phrase_count`: the server's phrase limit (``max_concept_phrases``; the
  schema's bound is the API's own, this one may be lower): 422 ``too_many_prompts``.
- :func:`run_room`: the session's room (``max_video_objects`` minus its objects, those of
  the run's own phrases excepted, which the run replaces; 413 ``too_many_objects`` when
  none), at most ``max_concept_instances``, lowered to what the run's state may hold in
  bytes beside the session's and every session's (:meth:`VideoSessions.concept_run_room`:
  413 / 429), then shared out evenly among the phrases (413 when not one each).
"""

from __future__ import annotations

from dataclasses import dataclass

from sam2serve.server.errors import ApiError
from sam2serve.server.video_sessions import ConceptTrack, VideoSession, VideoSessions

__all__ = ["RunRoom", "check_phrase_count", "run_room"]


def check_phrase_count(count: int, limit: int) -> None:
    """The server's phrase limit: 422 ``too_many_prompts`` past it."""
    if count > limit:
        raise ApiError(
            422,
            "too_many_prompts",
            f"phrases: {count}; at most {limit} per request on this server (max_concept_phrases)",
        )


@dataclass(frozen=True)
class RunRoom:
    """What a run may track: ``per_phrase`` objects at once for each of ``phrases``; the
    session's objects of the same phrases (``replaced``) give their room to the run."""

    replaced: list[ConceptTrack]
    per_phrase: int
    phrases: int

    @property
    def max_objects(self) -> int:
        return self.per_phrase * self.phrases


def run_room(
    session: VideoSession,
    videos: VideoSessions,
    phrases: list[str],
    max_instances: int,
    per_object_bytes: int,
    what: str,
) -> RunRoom:
    """The room of a run of ``phrases`` on ``session`` whose state holds
    ``per_object_bytes`` per object (``what`` names the run in a byte limit's message);
    ApiError names the limit that leaves none."""
    replaced = [t for t in session.concept_tracks.values() if t.phrase in phrases]
    limit = videos.limits.max_objects
    room = limit - (session.object_count - len(replaced))
    if room < 1:
        raise ApiError(
            413,
            "too_many_objects",
            f"the session has {session.object_count} objects, its limit (max_video_objects "
            f"{limit}): no room for an object SAM 3 finds; remove objects first "
            f"(DELETE /v1/videos/{session.session_id}/objects/{{obj_id}})",
        )
    wanted = min(room, max_instances)
    fits = videos.concept_run_room(session, wanted, 0, per_object_bytes, what)
    count = len(phrases)
    if fits < count:
        raise ApiError(
            413,
            "too_many_objects",
            f"the session has room for {fits} object(s) SAM 3 tracks at once (its "
            f"max_video_objects, max_concept_instances and byte limits), fewer than the "
            f"{count} phrases (one each): track fewer phrases at once, or remove objects "
            f"(DELETE /v1/videos/{session.session_id}/objects/{{obj_id}})",
        )
    return RunRoom(replaced, fits // count, count)
