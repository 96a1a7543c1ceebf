"""Video tracking sessions: one :class:`~sam2serve.engine.video.state.VideoState` per
session, held in this process's memory and bounded.

A session is created from a video's decoded frames and named by an unguessable id. Every
request on it takes the session for its duration (a second concurrent request on the same
session is 409 ``session_busy``: a state is not safe to change from two places at once),
and touches it. The limits:

- ``max_video_sessions`` sessions at once: one more is 429 ``too_many_sessions``, with a
  Retry-After of when the least recently used idle session will expire;
- ``max_video_sessions_per_client`` of them per client (its address): one more is 429
  ``too_many_sessions_per_client``, so one client cannot hold every session;
- ``max_video_frames`` frames and ``max_video_session_bytes`` bytes per session (decoded
  frames, plus what tracking every object through every frame would hold): 413;
- ``max_video_objects`` objects per session: 413; each may have a name (its class or
  label, :mod:`sam2serve.server.object_names`: at most 64 characters), so a session's
  names are bounded too;
- ``max_video_total_bytes`` for every session's bytes together (each counted as the
  per-session limit counts it): a session or an object that does not fit is 429
  ``video_memory_full``, so the memory of sessions is bounded whatever their number;
- objects SAM 3's video predictor reported (POST .../concepts/track) are the session's
  too (:class:`ConceptTrack`): their ids are never a SAM 2.1 object's, they count against
  ``max_video_objects``, and while a run streams, its estimated state (``concept_run_bytes``)
  counts against both byte limits;
- ``video_idle_s``: a session no work has used for that long (prompts, propagations,
  edits; reading it with GET does not count) is closed by the reaper, and its id is then
  404 ``session_not_found`` like an id that never existed.

Sessions survive nothing they should not: a restart, a redeploy or a replica that dies
loses its sessions (they are memory, not storage), and a client then creates a new one.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from sam2serve.engine.video.predictor import VideoPredictor
from sam2serve.engine.video.retention import memory_window
from sam2serve.engine.video.sources import LiveFrames
from sam2serve.engine.video.state import VideoState, object_frame_bytes
from sam2serve.engine.video_io import VideoFrames
from sam2serve.server.errors import ApiError
from sam2serve.server.session_ids import new_session_id
from sam2serve.server.settings_groups import LiveSettings, VideoSettings

# Frames decoded to uint8 RGB: what the session's frames cost in memory.
_BYTES_PER_PIXEL = 3


@dataclass(frozen=True)
class SessionLimits:
    max_sessions: int
    max_frames: int
    max_bytes: int
    max_objects: int
    idle_s: float
    max_per_client: int
    # Every session's counted bytes together (None: only the per-session limit).
    max_total_bytes: int | None = None
    # The upload (a video file or its frames) that creates a session (None: unbounded).
    max_upload_bytes: int | None = None

    @classmethod
    def of(cls, video: VideoSettings) -> SessionLimits:
        """The limits the server's video settings set."""
        return cls(
            max_sessions=video.max_video_sessions,
            max_frames=video.max_video_frames,
            max_bytes=video.max_video_session_bytes,
            max_objects=video.max_video_objects,
            idle_s=video.video_idle_s,
            max_per_client=video.max_video_sessions_per_client,
            max_total_bytes=video.max_video_total_bytes,
            max_upload_bytes=video.max_video_upload_bytes,
        )


@dataclass
class ConceptTrack:
    """An object SAM 3's video predictor reported on the session's frames (its masks were
    streamed, not stored): the phrase that found it and where it was seen."""

    obj_id: int
    phrase: str
    score: float  # SAM 3's detection score when it appeared
    first_frame: int
    last_frame: int
    # SAM 3's id of the object in its phrase's own run (Meta's id): clicks name it by it
    sam3_id: int | None = None


@dataclass(eq=False)
class VideoSession:
    """One client's video: its tracking state and what the limits need to know."""

    session_id: str
    state: VideoState
    source: str
    fps: float | None
    frames_bytes: int
    created: float  # time.time()
    last_used: float  # monotonic
    client: str = ""  # who created it (their address): the per-client limit counts by it
    busy_with: str | None = None  # the operation running on it, if any
    # Frames whose tracking state an object may hold at most: None, every frame of the
    # video (retention exact); a live session's bound (retention bounded).
    tracked_frames: int | None = None
    # A live session's default for frames faster than tracking: "every" or "latest"
    # (server/live_modes.py); a connection may choose its own.
    live_mode: str = "every"
    # The objects' names (obj_id -> name), set by prompts, renames and concept seeding: the
    # session's metadata, not its tracking state (a rename needs no model work).
    names: dict[int, str] = field(default_factory=dict)
    # Objects SAM 3's video predictor reported (obj_id -> track), beside the SAM 2.1 ones.
    concept_tracks: dict[int, ConceptTrack] = field(default_factory=dict)
    # While a SAM 3 run streams on the session: what its state may hold (estimated).
    concept_run_bytes: int = 0

    @property
    def live(self) -> bool:
        return isinstance(self.state.source, LiveFrames)

    @property
    def frames_counted(self) -> int:
        """Frames the byte limit counts each object's tracking state for."""
        return self.state.num_frames if self.tracked_frames is None else self.tracked_frames

    def has_object(self, obj_id: int) -> bool:
        """A SAM 2.1 object of the session or an object SAM 3 reported on it."""
        return obj_id in self.state.objects or obj_id in self.concept_tracks

    def used_ids(self) -> set[int]:
        """Every object id the session uses (SAM 2.1's and SAM 3's)."""
        return {int(i) for i in self.state.obj_ids} | set(self.concept_tracks)

    @property
    def object_count(self) -> int:
        """Objects the ``max_video_objects`` limit counts: SAM 2.1's and SAM 3's."""
        return len(self.state.obj_ids) + len(self.concept_tracks)

    def name_of(self, obj_id: int) -> str | None:
        """The object's name, or None (unnamed, or not an object of the session)."""
        return self.names.get(obj_id) if self.has_object(obj_id) else None

    def set_name(self, obj_id: int, name: str | None) -> None:
        """Name (None: unname) a tracked object (the caller checked that it is)."""
        if name is None:
            self.names.pop(obj_id, None)
        else:
            self.names[obj_id] = name

    def forget_names(self) -> None:
        """Drop the names of objects the session no longer has (removed, or reset)."""
        for obj_id in [i for i in self.names if not self.has_object(i)]:
            del self.names[obj_id]

    def add_concept_track(self, track: ConceptTrack) -> None:
        """Keep an object SAM 3 reported, named by its phrase."""
        self.concept_tracks[track.obj_id] = track
        self.names[track.obj_id] = track.phrase

    def forget_concept_tracks(self, phrase: str | None = None) -> list[int]:
        """Drop the objects SAM 3 reported (only ``phrase``'s, given one) and their names;
        their ids."""
        gone = [
            obj_id
            for obj_id, track in self.concept_tracks.items()
            if phrase is None or track.phrase == phrase
        ]
        for obj_id in gone:
            del self.concept_tracks[obj_id]
        self.forget_names()
        return gone

    def describe(self, limits: SessionLimits, now: float) -> dict[str, object]:
        return {
            "session_id": self.session_id,
            "num_frames": self.state.num_frames,
            "width": self.state.width,
            "height": self.state.height,
            "fps": self.fps,
            "source": self.source,
            "obj_ids": self.state.obj_ids,
            "objects": [
                {"obj_id": obj_id, "name": self.name_of(obj_id)} for obj_id in self.state.obj_ids
            ]
            + [
                {
                    "obj_id": obj_id,
                    "name": self.name_of(obj_id),
                    "tracker": "sam3",
                    "first_frame": track.first_frame,
                    "last_frame": track.last_frame,
                }
                for obj_id, track in sorted(self.concept_tracks.items())
            ],
            "frames_bytes": self.frames_bytes,
            "tracking_bytes": self.state.memory_bytes() + self.concept_run_bytes,
            "busy": self.busy_with is not None,
            "live": self.live,
            "expires_in_s": round(max(0.0, limits.idle_s - (now - self.last_used)), 3),
        }


class VideoSessions:
    """The sessions of one process (one replica), their limits and their expiry; ``live``:
    what a live session keeps (its newest frames, its prompted frames)."""

    def __init__(
        self,
        predictor: VideoPredictor,
        limits: SessionLimits,
        live: LiveSettings,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.predictor = predictor
        self.limits = limits
        self.live = live
        self.clock = clock
        self.object_frame_bytes = object_frame_bytes(predictor.model)
        self._sessions: dict[str, VideoSession] = {}
        self.expired = 0  # sessions closed by the reaper, since start

    def __len__(self) -> int:
        return len(self._sessions)

    # ------------------------------------------------------------------ admission
    def check_room(self, client: str) -> None:
        """429 if no session can be created now, or none for ``client`` (reaping expired
        ones first)."""
        self.reap()
        held = [s for s in self._sessions.values() if s.client == client]
        if len(held) >= self.limits.max_per_client:
            raise ApiError(
                429,
                "too_many_sessions_per_client",
                f"this client holds {len(held)} video sessions, the limit per client "
                f"(max_video_sessions_per_client {self.limits.max_per_client}); close one "
                f"(DELETE /v1/videos/{{session_id}}) or retry once an idle one expires "
                f"(video_idle_s {self.limits.idle_s:g})",
                headers={"Retry-After": str(self._seconds_until_room(held))},
            )
        if len(self._sessions) >= self.limits.max_sessions:
            raise ApiError(
                429,
                "too_many_sessions",
                f"this server holds {len(self._sessions)} video sessions, its limit "
                f"(max_video_sessions {self.limits.max_sessions}); close one (DELETE "
                f"/v1/videos/{{session_id}}) or retry once an idle one expires "
                f"(video_idle_s {self.limits.idle_s:g})",
                headers={"Retry-After": str(self._seconds_until_room())},
            )

    def check_frames(self, num_frames: int, height: int, width: int) -> int:
        """The bytes ``num_frames`` frames of this size hold, or 413 past a limit."""
        return self.check_frame_bytes(num_frames, num_frames * height * width * _BYTES_PER_PIXEL)

    def check_frame_bytes(self, num_frames: int, frames_bytes: int) -> int:
        """``frames_bytes`` (decoded frames, uint8 RGB) if a session may hold them with one
        object tracked through ``num_frames`` frames, or 413 past a limit."""
        if num_frames > self.limits.max_frames:
            raise ApiError(
                413,
                "too_many_frames",
                f"the video has {num_frames} frames; a session takes at most "
                f"{self.limits.max_frames} (max_video_frames): send a shorter clip",
            )
        self._check_bytes(frames_bytes, num_frames, objects=1, what="the video")
        self._check_total(frames_bytes + num_frames * self.object_frame_bytes, "the video")
        return frames_bytes

    def check_new_object(self, session: VideoSession, obj_id: int) -> None:
        """413 if adding ``obj_id`` to the session passes the object or byte limits."""
        objects = session.state.obj_ids
        if obj_id in objects:
            return
        track = session.concept_tracks.get(obj_id)
        if track is not None:
            raise ApiError(
                409,
                "concept_track_id",
                f"obj_id {obj_id} is an object SAM 3's video predictor reported on this "
                f"session ({track.phrase!r}): SAM 2.1 cannot prompt it; choose another id, "
                f"or remove it first (DELETE /v1/videos/{session.session_id}/objects/{obj_id})",
            )
        count = session.object_count
        if count >= self.limits.max_objects:
            used = sorted(session.used_ids())
            raise ApiError(
                413,
                "too_many_objects",
                f"obj_id {obj_id}: the session already has {count} objects "
                f"({used}), its limit (max_video_objects {self.limits.max_objects}); "
                "remove one first",
            )
        self._check_bytes(
            session.frames_bytes,
            session.frames_counted,
            objects=len(objects) + 1,
            what=f"obj_id {obj_id}",
        )
        tracking = (len(objects) + 1) * session.frames_counted * self.object_frame_bytes
        self._check_total(session.frames_bytes + tracking, f"obj_id {obj_id}", session)

    def check_new_objects(self, session: VideoSession, count: int, what: str) -> None:
        """413 if ``count`` more objects (``what`` names them) would pass the session's
        object or byte limits, 429 the servers' total bytes; the message names the numbers."""
        objects = session.state.obj_ids
        limit = self.limits.max_objects
        held = session.object_count
        if held + count > limit:
            raise ApiError(
                413,
                "too_many_objects",
                f"{what}: {count} new object(s) beside the {held} the session has "
                f"would pass its limit (max_video_objects {limit}); at most "
                f"{max(0, limit - held)} more: ask for fewer or remove objects first",
            )
        total = len(objects) + count
        self._check_bytes(session.frames_bytes, session.frames_counted, objects=total, what=what)
        tracking = total * session.frames_counted * self.object_frame_bytes
        self._check_total(session.frames_bytes + tracking, what, session)

    def counted_bytes(self, session: VideoSession) -> int:
        """What the limits count a session as holding: its frames, and its objects (at
        least one) each tracked through every frame it may hold."""
        objects = max(1, len(session.state.obj_ids))
        tracking = objects * session.frames_counted * self.object_frame_bytes
        return session.frames_bytes + tracking + session.concept_run_bytes

    def concept_run_room(
        self, session: VideoSession, wanted: int, base: int, per_object: int, what: str
    ) -> int:
        """The objects (at most ``wanted``) a SAM 3 run may track at once on ``session`` when
        its state holds ``base`` bytes plus ``per_object`` per object: what fits beside the
        session's counted bytes in max_video_session_bytes (none: 413 session_too_large)
        and beside every session's in max_video_total_bytes (none: 429 video_memory_full)."""
        mib = 1024 * 1024
        held = self.counted_bytes(session)
        fits = (self.limits.max_bytes - held - base) // per_object
        if fits < 1:
            raise ApiError(
                413,
                "session_too_large",
                f"{what}: the session holds {held / mib:.1f} MiB (frames and SAM 2.1's "
                f"tracking); SAM 3's video state needs {(base + per_object) / mib:.1f} MiB "
                f"for one object, which would pass the session limit of "
                f"{self.limits.max_bytes / mib:.1f} MiB (max_video_session_bytes); track "
                "fewer frames (max_frames), remove SAM 2.1 objects, or send a smaller video",
            )
        limit = self.limits.max_total_bytes
        if limit is not None:
            others = sum(self.counted_bytes(s) for s in self._sessions.values() if s is not session)
            room = (limit - others - held - base) // per_object
            if room < 1:
                raise ApiError(
                    429,
                    "video_memory_full",
                    f"{what}: SAM 3's video state needs {(base + per_object) / mib:.1f} MiB "
                    f"for one object beside the {(others + held) / mib:.1f} MiB the sessions "
                    f"hold, which would pass {limit / mib:.1f} MiB, what this server's "
                    "sessions may hold together (max_video_total_bytes); retry once a "
                    f"session closes or expires (video_idle_s {self.limits.idle_s:g})",
                    headers={"Retry-After": str(self._seconds_until_room())},
                )
            fits = min(fits, room)
        return int(min(wanted, fits))

    def _check_total(self, nbytes: int, what: str, session: VideoSession | None = None) -> None:
        """429 when ``nbytes`` (a new session's, or ``session``'s once grown) would take
        every session's bytes together past ``max_total_bytes``."""
        limit = self.limits.max_total_bytes
        if limit is None:
            return
        others = sum(self.counted_bytes(s) for s in self._sessions.values() if s is not session)
        if others + nbytes > limit:
            mib = 1024 * 1024
            raise ApiError(
                429,
                "video_memory_full",
                f"{what}: {nbytes / mib:.1f} MiB beside the {others / mib:.1f} MiB the "
                f"other sessions hold would pass {limit / mib:.1f} MiB, what this server's "
                "sessions may hold together (max_video_total_bytes); retry once a session "
                f"closes or expires (video_idle_s {self.limits.idle_s:g}), or send fewer or "
                "smaller frames",
                headers={"Retry-After": str(self._seconds_until_room())},
            )

    def _check_bytes(self, frames_bytes: int, num_frames: int, objects: int, what: str) -> None:
        tracking = objects * num_frames * self.object_frame_bytes
        if frames_bytes + tracking > self.limits.max_bytes:
            mib = 1024 * 1024
            raise ApiError(
                413,
                "session_too_large",
                f"{what}: {frames_bytes / mib:.1f} MiB of frames plus "
                f"{tracking / mib:.1f} MiB to track {objects} object(s) through "
                f"{num_frames} frames would pass the session limit of "
                f"{self.limits.max_bytes / mib:.1f} MiB (max_video_session_bytes); send "
                "fewer or smaller frames, or track fewer objects",
            )

    # ------------------------------------------------------------------ the sessions
    def create(self, frames: VideoFrames, client: str) -> VideoSession:
        """A new session of ``client`` for ``frames`` (call check_room and check_frames
        first)."""
        self.check_room(client)
        height, width = frames.size
        frames_bytes = self.check_frames(len(frames), height, width)
        now = self.clock()
        session = VideoSession(
            session_id=new_session_id(),
            state=self.predictor.init_state(frames.frames),
            source=frames.source,
            fps=frames.fps,
            frames_bytes=frames_bytes,
            created=time.time(),
            last_used=now,
            client=client,
        )
        self._sessions[session.session_id] = session
        return session

    def create_live(
        self, height: int, width: int, fps: float | None, client: str, mode: str = "every"
    ) -> VideoSession:
        """A new live session of ``client`` for frames of ``height`` x ``width`` that will
        come, of which it holds the newest ``live_frames_kept``, tracking with bounded
        retention: each object holds the frames SAM 2's memory reads next and its
        ``max_live_prompted_frames`` prompted ones, so the byte limit counts that many, not
        the video's length."""
        source = LiveFrames(height, width, keep=self.live.live_frames_kept)
        tracked_frames = memory_window(self.predictor.config) + self.live.max_live_prompted_frames
        self.check_room(client)
        frames_bytes = source.keep * source.height * source.width * _BYTES_PER_PIXEL
        self._check_bytes(frames_bytes, tracked_frames, objects=1, what="the live video")
        self._check_total(frames_bytes + tracked_frames * self.object_frame_bytes, "the live video")
        now = self.clock()
        session = VideoSession(
            session_id=new_session_id(),
            state=self.predictor.init_state(source, retention="bounded"),
            source="live",
            fps=fps,
            frames_bytes=frames_bytes,
            created=time.time(),
            last_used=now,
            client=client,
            tracked_frames=tracked_frames,
            live_mode=mode,
        )
        self._sessions[session.session_id] = session
        return session

    def get(self, session_id: str, touch: bool = True) -> VideoSession:
        """The session, or 404; ``touch``: this request works on it (its idle time starts
        again), not just reads it."""
        self.reap()
        session = self._sessions.get(session_id)
        if session is None:
            raise ApiError(
                404,
                "session_not_found",
                f"no video session {session_id[:80]!r} here: it was closed, expired after "
                f"{self.limits.idle_s:g} s idle (video_idle_s), lived on a server that has "
                "restarted, or never existed; create a new one with POST /v1/videos",
            )
        if touch:
            session.last_used = self.clock()
        return session

    def close(self, session_id: str) -> VideoSession:
        session = self.get(session_id, touch=False)
        if session.busy_with is not None:
            raise _busy(session)
        del self._sessions[session_id]
        return session

    @contextlib.contextmanager
    def using(self, session: VideoSession, operation: str) -> Iterator[VideoSession]:
        """Hold ``session`` for ``operation`` (409 if another request holds it); on leaving
        it is touched: its idle time starts then."""
        if session.busy_with is not None:
            raise _busy(session)
        session.busy_with = operation
        try:
            yield session
        finally:
            session.busy_with = None
            session.last_used = self.clock()

    def reap(self) -> list[str]:
        """Close the sessions idle past ``idle_s`` (never one in use); their ids."""
        now = self.clock()
        expired = [
            sid
            for sid, s in self._sessions.items()
            if s.busy_with is None and now - s.last_used >= self.limits.idle_s
        ]
        for sid in expired:
            del self._sessions[sid]
        self.expired += len(expired)
        return expired

    def held_bytes(self) -> int:
        """Frames and tracking memory of every session (the metric)."""
        return sum(
            s.frames_bytes + s.state.memory_bytes() + s.concept_run_bytes
            for s in self._sessions.values()
        )

    def check_live_prompt(self, session: VideoSession, obj_id: int, frame_idx: int) -> None:
        """On a live session, 422 unless ``frame_idx`` is still held and ``obj_id`` stays
        within ``max_live_prompted_frames`` prompted frames (each a memory kept for good)."""
        if not session.live:
            return
        max_prompted_frames = self.live.max_live_prompted_frames
        source = session.state.source
        assert isinstance(source, LiveFrames)
        if not source.oldest_held <= frame_idx < len(source):
            held = f"{source.oldest_held}..{len(source) - 1}" if len(source) else "none yet"
            raise ApiError(
                422,
                "frame_not_held",
                f"frame_idx {frame_idx}: a live session holds its newest {source.keep} frames "
                f"(live_frames_kept); held now: {held}",
            )
        track = session.state.objects.get(obj_id)
        prompted = set() if track is None else {*track.point_inputs, *track.mask_inputs}
        if frame_idx not in prompted and len(prompted) >= max_prompted_frames:
            raise ApiError(
                422,
                "too_many_prompted_frames",
                f"obj_id {obj_id} already has prompts on {len(prompted)} frames, the limit "
                f"for a live session (max_live_prompted_frames {max_prompted_frames}): "
                "each is a memory kept while the session lives; correct on one of them, or "
                "track a new object",
            )

    def clicks_on(self, session: VideoSession, obj_id: int, frame_idx: int) -> int:
        """The clicks ``obj_id`` already has on ``frame_idx`` (box corners not counted):
        what a prompt with clear_old_points false adds to."""
        track = session.state.objects.get(obj_id)
        prompt = None if track is None else track.point_inputs.get(frame_idx)
        if prompt is None:
            return 0
        return int((prompt.labels < 2).sum())

    def _seconds_until_room(self, among: list[VideoSession] | None = None) -> int:
        now = self.clock()
        idle = [
            self.limits.idle_s - (now - s.last_used)
            for s in (self._sessions.values() if among is None else among)
            if s.busy_with is None
        ]
        soonest = min(idle) if idle else self.limits.idle_s
        return max(1, math.ceil(soonest))


def _busy(session: VideoSession) -> ApiError:
    return ApiError(
        409,
        "session_busy",
        f"video session {session.session_id} is busy ({session.busy_with}); one request at "
        "a time per session: wait for it to finish (a propagation streams until its last "
        "frame, or until its client disconnects)",
        headers={"Retry-After": "1"},
    )


__all__ = ["ConceptTrack", "SessionLimits", "VideoSession", "VideoSessions"]
