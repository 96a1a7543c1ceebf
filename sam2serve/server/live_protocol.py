"""The live-frames protocol: one WebSocket connection to a live session, as a state
machine that reads messages and answers them in order, within the limits.

The client sends each frame as a binary message (raw RGB, W*H*3 bytes, row-major; or an
image file: JPEG, PNG, ...) and prompts as text messages (``{"type": "prompt",
"frame_idx", "obj_id", "points", "labels", "box", "clear_old_points", "name"}``, as POST
.../prompts without masks: :class:`~sam2serve.server.video_schemas.LivePromptMessage`;
each answered object carries its ``name``, null when unnamed). The server answers, in the
order they came, every frame (``{"type": "frame", "seq", "frame_idx", "objects",
"received_ms", "latency_ms", "track_ms"}``) and prompt (``{"type": "prompt", ...}``), and
refuses one it cannot take with ``{"type": "error", "seq"?, "code", "message", "error":
{"code", "message"}}`` (the connection stays): a frame of the wrong size, bytes that are no
image, one sent while ``max_live_pending`` are waiting (``too_fast``), a text message that
is not JSON within the body limits (``max_json_items``, ``max_json_depth``: the HTTP API's
own parser). A message over ``max_live_frame_bytes`` closes the connection (1009), as does
``{"type": "end"}`` (1000) once everything sent before it is answered, and video_idle_s
without a message. Nothing a client sends ends the connection without an answer: a
failure the client caused is an error message then a close 1008, one of the server's (a
bug, logged) a close 1011.

A phrase for SAM 3's own video predictor (``{"type": "concepts_track", "text",
"score_thresh"?, "hotstart_delay"?}``, or several: ``"phrases": [..]`` instead of ``text``,
one ViT pass a frame for all; :mod:`sam2serve.server.live_concepts`) starts a SAM 3
run from the next frame, bounded before any model work as POST .../concepts/track is
(answered ``{"type": "concepts_track", "from_frame", ...}``): every later frame is tracked by
SAM 2.1 (its objects, in the ``frame`` answer) and then pushed to SAM 3, whose answers
(``{"type": "concepts_frame", "frame_idx", "seq", "objects"}``, each object with its
``score`` and ``phrase``, named by its phrase) come as hot start lets them out, ``hotstart_delay`` frames
later (Meta's 15). ``{"type": "concepts_stop"}`` or the connection's end lets out the rest,
then ``{"type": "concepts_done", ...}``; a client that leaves gets none, and the run's bytes
are freed either way. One run at a time (``concepts_running``).

Two tasks share a connection: :meth:`LiveConnection.read` takes messages (frames wait in
a queue, bounded by ``max_live_pending``; in ``latest`` mode a newer frame replaces the
waiting one, :mod:`sam2serve.server.live_modes`) and :meth:`LiveConnection.answer` runs
each on the app's model worker as an interactive job, one at a time.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
from fastapi import WebSocket
from pydantic import ValidationError
from starlette.websockets import WebSocketDisconnect, WebSocketState

from sam2serve.engine.prompts import Prompt
from sam2serve.engine.video.outputs import ObjectMask, object_masks
from sam2serve.engine.video.predictor import VideoPromptError
from sam2serve.engine.video.sources import FrameGone, LiveFrames
from sam2serve.server.batching import JobContext
from sam2serve.server.decode_budget import Reservation
from sam2serve.server.errors import ApiError
from sam2serve.server.live_concepts import (
    CONCEPTS_STOP,
    CONCEPTS_TRACK,
    LiveConceptRun,
    LiveConceptsStop,
    LiveConceptsTrack,
    ReportedFrame,
    start_run,
)
from sam2serve.server.live_modes import SeqLog, skip_message
from sam2serve.server.prompts import check_inside
from sam2serve.server.request_body import load_json
from sam2serve.server.service import RequestClock, Service
from sam2serve.server.settings_groups import LimitSettings
from sam2serve.server.video_answers import frame_gone, objects_out
from sam2serve.server.video_schemas import LivePromptMessage
from sam2serve.server.video_sessions import VideoSession, VideoSessions

log = logging.getLogger("sam2serve.server")

# WebSocket close codes (RFC 6455 7.4.1).
CLOSE_NORMAL = 1000
CLOSE_POLICY = 1008
CLOSE_SERVER_ERROR = 1011
CLOSE_TRY_LATER = 1013
# A text message (a prompt: a few hundred bytes; its clicks are max_points_per_object at
# most) longer than this is refused unread.
MAX_TEXT_CHARS = 64 * 1024


@dataclass
class _Frame:
    seq: int
    data: bytes
    received: float  # perf_counter
    skipped: int = 0  # frames this one replaced while waiting (latest mode)


@dataclass
class _PromptItem:
    body: LivePromptMessage
    received: float
    frames_before: int  # frames the connection had received when it came


@dataclass
class _ConceptsItem:
    body: LiveConceptsTrack | LiveConceptsStop
    received: float


class _End:
    """The end marker of a connection's queue: everything before it is answered."""


_END = _End()

# SAM 3's answers a frame lets out; None: its step failed (the run ends).
_Sam3Out = list[ReportedFrame] | None


class LiveConnection:
    """One live connection: reads messages, answers them in order, within the limits."""

    def __init__(
        self,
        websocket: WebSocket,
        service: Service,
        videos: VideoSessions,
        session: VideoSession,
        mode: str,
        *,
        limits: LimitSettings,
    ) -> None:
        self.ws = websocket
        self.mode = mode
        self.live = videos.live  # what the session keeps, and how much may wait
        self.limits = limits  # the HTTP bodies' bounds, for prompts (JSON, clicks)
        self.idle_s = videos.limits.idle_s
        # latest mode: the queued frame no one has taken yet, when it is the queue's last
        # item (a newer frame replaces it; a prompt behind it keeps it).
        self.waiting: _Frame | None = None
        self.seqs = SeqLog()
        self.received = 0  # frames received (the next seq)
        self.service = service
        self.videos = videos
        self.session: VideoSession = session
        source = session.state.source
        assert isinstance(source, LiveFrames)  # a live session's frames arrive on it
        self.source = source
        self.queue: asyncio.Queue[_Frame | _PromptItem | _ConceptsItem | _End] = asyncio.Queue()
        self.pending = 0
        self.prompts = 0  # prompts of those (latest mode bounds them, not frames)
        self.send_lock = asyncio.Lock()
        self.open = True
        # SAM 3's run on the connection's frames (concepts_track .. concepts_stop or the end)
        self.concepts: LiveConceptRun | None = None
        self.concepts_started = 0.0  # perf_counter

    async def send(self, message: dict[str, Any]) -> None:
        if not self.open:
            return
        async with self.send_lock:
            try:
                await self.ws.send_text(json.dumps(message))
            except (WebSocketDisconnect, RuntimeError, OSError):
                self.open = False

    async def error(self, code: str, message: str, seq: int | None = None) -> None:
        await self.send(error_message(code, message, seq))

    # -- the connection's life ----------------------------------------------------------

    async def run(self) -> tuple[str, int]:
        """Read and answer until the client leaves, ends, idles or is refused; every message
        taken is answered first. Why it stopped, and the close code to send."""
        answering = asyncio.create_task(self.answer())
        reason, close_code = "disconnect", CLOSE_NORMAL
        try:
            reason = await self.read()
        except ApiError as exc:  # refused while reading (the session gone): said, then closed
            log.info("live connection to %s refused: %s", self.session.session_id[:80], exc.code)
            await self.error(exc.code, exc.message)
            reason, close_code = "refused", CLOSE_POLICY
        except Exception:  # a bug: logged with its traceback, said, then closed
            log.exception("a live video connection failed")
            await self.error("internal_error", "the connection failed; it has been logged")
            reason, close_code = "failed", CLOSE_SERVER_ERROR
        finally:
            if reason == "disconnect":
                self.open = False
            # Messages already taken are answered (a client that left gets none).
            self.queue.put_nowait(_END)
            with contextlib.suppress(Exception):
                await answering
        return reason, close_code

    async def close(self, reason: str, close_code: int) -> None:
        """Say why (an idle connection), then close, unless the client already left."""
        if reason == "idle":
            await self.error("idle", f"no message for {self.idle_s:g} s (video_idle_s): closing")
        if self.ws.client_state is WebSocketState.CONNECTED and reason != "disconnect":
            with contextlib.suppress(Exception):
                await self.ws.close(code=close_code)

    # -- reading ------------------------------------------------------------------------

    async def read(self) -> str:
        """Read until the client leaves, ends or idles; why it stopped."""
        seq = 0
        while True:
            try:
                message = await asyncio.wait_for(self.ws.receive(), timeout=self.idle_s)
            except TimeoutError:
                return "idle"
            if message["type"] == "websocket.disconnect":
                return "disconnect"
            self.videos.get(self.session.session_id)  # touched: in use
            data, text = message.get("bytes"), message.get("text")
            if data is not None:
                this, seq = seq, seq + 1
                self.received = seq
                if len(data) > self.live.max_live_frame_bytes:
                    await self.error(
                        "frame_too_large",
                        f"message of {len(data):,} bytes; at most "
                        f"{self.live.max_live_frame_bytes:,} (max_live_frame_bytes)",
                        this,
                    )
                elif self.mode == "latest":
                    await self._latest(_Frame(this, data, time.perf_counter()))
                elif self._room(this):
                    self.pending += 1
                    self.queue.put_nowait(_Frame(this, data, time.perf_counter()))
                else:
                    await self._too_fast(this)
            elif text is not None and await self._text(text) == "end":
                return "end"

    async def _latest(self, frame: _Frame) -> None:
        """Latest frame wins: the waiting frame (if any) is replaced and answered as
        skipped; else the frame waits. Never refused: frames in the queue are at most one
        behind each prompt, and prompts are bounded by max_live_pending."""
        waiting = self.waiting
        if waiting is None:
            self.pending += 1
            self.waiting = frame
            self.queue.put_nowait(frame)
            return
        old = waiting.seq
        waiting.seq, waiting.data, waiting.received = frame.seq, frame.data, frame.received
        waiting.skipped += 1
        self.seqs.skipped(old, frame.seq)
        await self.send(skip_message(old, frame.seq))

    def _room(self, seq: int | None) -> bool:
        return self.pending < self.live.max_live_pending

    async def _too_fast(self, seq: int | None) -> None:
        waiting = "prompts" if self.mode == "latest" else "messages"
        count = self.prompts if self.mode == "latest" else self.pending
        await self.error(
            "too_fast",
            f"{count} {waiting} are waiting to be answered, the limit "
            f"(max_live_pending {self.live.max_live_pending}): this one is not taken; "
            f"send {'prompts' if self.mode == 'latest' else 'frames'} no faster than they "
            "are answered",
            seq,
        )

    async def _text(self, text: str) -> str | None:
        if len(text) > MAX_TEXT_CHARS:
            await self.error(
                "message_too_large",
                f"a text message of {len(text):,} characters; at most {MAX_TEXT_CHARS:,} "
                "(a prompt is a few hundred)",
            )
            return None
        try:  # the HTTP bodies' parser: items and depth bounded, RecursionError caught
            payload = load_json(text.encode(), self.limits, "the text message")
        except ApiError as exc:
            await self.error(exc.code, exc.message)
            return None
        kind = payload.get("type") if isinstance(payload, dict) else None
        if kind == "end":
            return "end"
        if kind in (CONCEPTS_TRACK, CONCEPTS_STOP):
            await self._concepts_message(kind, payload)
            return None
        if kind != "prompt":
            await self.error(
                "invalid_message",
                'a text message is {"type": "prompt", ...}, {"type": "concepts_track", ...}, '
                '{"type": "concepts_stop"} or {"type": "end"}',
            )
            return None
        try:
            body = LivePromptMessage.model_validate(payload)
        except ValidationError as exc:
            await self._invalid(exc)
            return None
        if body.mask is not None:
            await self.error("invalid_request", "mask: a live prompt is clicks and/or a box")
            return None
        room = self.prompts if self.mode == "latest" else self.pending
        if room >= self.live.max_live_pending:
            await self._too_fast(None)
            return None
        self.pending += 1
        self.prompts += 1
        self.waiting = None  # a frame before a prompt is tracked before it
        self.queue.put_nowait(_PromptItem(body, time.perf_counter(), self.received))
        return None

    async def _invalid(self, exc: ValidationError) -> None:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "message"
        await self.error("invalid_request", f"{where}: {first['msg']}")

    async def _concepts_message(self, kind: str, payload: Any) -> None:
        """A concepts_track or concepts_stop message: checked, then queued (in order with
        the frames: a run starts on the frame after it), bounded as prompts are."""
        schema = LiveConceptsTrack if kind == CONCEPTS_TRACK else LiveConceptsStop
        try:
            body = schema.model_validate(payload)
        except ValidationError as exc:
            await self._invalid(exc)
            return
        room = self.prompts if self.mode == "latest" else self.pending
        if room >= self.live.max_live_pending:
            await self._too_fast(None)
            return
        self.pending += 1
        self.prompts += 1
        self.waiting = None  # a frame before it is tracked before it
        self.queue.put_nowait(_ConceptsItem(body, time.perf_counter()))

    # -- answering ----------------------------------------------------------------------

    async def answer(self) -> None:
        """Answer every queued message in order, until the end marker (which stops a SAM 3
        run: its held answers, unless the client left)."""
        try:
            await self._answer_all()
        finally:
            if self.concepts is not None:  # cancelled, or a bug: its bytes are freed
                self.concepts.release()

    async def _answer_all(self) -> None:
        while True:
            item = await self.queue.get()
            if isinstance(item, _End):
                if self.concepts is not None:
                    try:
                        await self._stop_concepts()
                    except Exception:  # a bug: logged; the run's bytes are freed
                        log.exception("ending a live SAM 3 run failed")
                return
            if item is self.waiting:
                self.waiting = None  # taken: a newer frame waits behind it
            try:
                if isinstance(item, _Frame):
                    await self._frame(item)
                elif isinstance(item, _ConceptsItem):
                    await self._concepts(item)
                else:
                    await self._prompt(item)
            except ApiError as exc:
                await self.error(exc.code, exc.message, getattr(item, "seq", None))
            except FrameGone as exc:  # a prompt's frame dropped while it waited
                gone = frame_gone(exc)
                await self.error(gone.code, gone.message, getattr(item, "seq", None))
            except Exception:  # a bug: logged, answered, and the stream goes on
                log.exception("a live video step failed")
                await self.error(
                    "internal_error", "this message failed", getattr(item, "seq", None)
                )
            finally:
                self.pending -= 1
                self.prompts -= isinstance(item, _PromptItem | _ConceptsItem)

    async def _frame(self, item: _Frame) -> None:
        pixels, reservation = await self._pixels(item)
        state = self.session.state
        predictor = self.videos.predictor
        concepts = self.concepts

        def run(context: JobContext) -> tuple[int, list[ObjectMask], float, _Sam3Out]:
            started = time.perf_counter()
            index = self.source.append(pixels)
            frame = predictor.track_next(state, index)
            records = object_masks(frame)
            seconds = time.perf_counter() - started
            sam3: _Sam3Out = []
            if concepts is not None:  # SAM 3 after SAM 2.1: its answer is not delayed by it
                try:
                    sam3 = concepts.push(context, index, pixels)
                except Exception:  # a bug: logged; the run ends, SAM 2.1's answer stands
                    log.exception("a live SAM 3 step failed")
                    sam3 = None
            return index, records, seconds, sam3

        with reservation:
            index, records, seconds, sam3 = await self.service.run_job(
                "video_live", run, RequestClock(), long=concepts is not None
            )
        self.seqs.tracked(item.seq, index)
        if concepts is not None:
            concepts.seqs[index] = item.seq
        objects = await objects_out(records, "coco_rle", self.service, self.session.names)
        answer: dict[str, Any] = {
            "type": "frame",
            "seq": item.seq,
            "frame_idx": index,
            "objects": [obj.model_dump() for obj in objects],
            "track_ms": round(seconds * 1000, 3),
            "latency_ms": round((time.perf_counter() - item.received) * 1000, 3),
        }
        if self.mode == "latest":
            answer["skipped"] = False
            answer["skipped_count"] = item.skipped  # the frames it replaced
        await self.send(answer)
        if concepts is not None and sam3 is None:
            self.concepts = None
            concepts.release()
            await self.error(
                "internal_error", "SAM 3's step failed; its run has ended (logged)", item.seq
            )
        elif concepts is not None:
            await self._send_concepts(concepts, sam3 or [])

    async def _concepts(self, item: _ConceptsItem) -> None:
        body = item.body
        run = self.concepts
        if isinstance(body, LiveConceptsStop):
            if run is None:
                raise ApiError(
                    409,
                    "concepts_not_running",
                    'no phrase is tracked on this connection: send {"type": '
                    '"concepts_track", "text": ...} first',
                )
            await self._stop_concepts()
            return
        if run is not None:
            raise ApiError(
                409,
                "concepts_running",
                f"SAM 3 already tracks {run.label} on this connection (one run at a "
                'time): send {"type": "concepts_stop"} first',
            )
        run = await start_run(body, self.session, self.videos, self.service)
        self.concepts, self.concepts_started = run, time.perf_counter()
        await self.send(
            {
                "type": "concepts_track",
                **run.named(),
                "from_frame": len(self.source),
                "hotstart_delay": run.thresholds.hotstart_delay,
                "score_thresh": run.thresholds.score,
                "new_object_thresh": run.thresholds.new_det,
                "max_objects": run.max_objects,
            }
        )

    async def _stop_concepts(self) -> None:
        """The run's held answers (unless the client left), ``concepts_done``; its bytes
        are freed whatever happens."""
        run = self.concepts
        assert run is not None
        self.concepts = None
        try:
            if not self.open:
                return
            held = await self.service.run_job(
                "video_live", lambda _context: run.flush(), RequestClock(), long=True
            )
            await self._send_concepts(run, held)
            await self.send(run.done(time.perf_counter() - self.concepts_started))
        finally:
            run.release()

    async def _send_concepts(self, run: LiveConceptRun, frames: list[ReportedFrame]) -> None:
        for frame in frames:
            run.keep(frame)
            await self.send(await run.message(frame, self.service))

    async def _pixels(
        self, item: _Frame
    ) -> tuple[np.ndarray, Reservation | contextlib.nullcontext[None]]:
        """The frame's pixels: raw RGB of the session's size, or an image file of it."""
        height, width = self.source.height, self.source.width
        if len(item.data) == height * width * 3:
            pixels = np.frombuffer(item.data, np.uint8).reshape(height, width, 3)
            return pixels, contextlib.nullcontext()
        pixels, reservation = await self.service.decode(item.data)
        if pixels.shape[:2] != (height, width):
            reservation.release()
            raise ApiError(
                422,
                "wrong_size",
                f"frame {item.seq}: {pixels.shape[1]}x{pixels.shape[0]}; this live video's "
                f"frames are {width}x{height} (raw RGB: {width * height * 3:,} bytes)",
            )
        return pixels, reservation

    async def _prompt(self, item: _PromptItem) -> None:
        body, session = item.body, self.session
        state, predictor = session.state, self.videos.predictor
        frame_idx = body.frame_idx
        if body.seq is not None:
            found = self.seqs.frame_idx(body.seq, item.frames_before)
            if isinstance(found, tuple):
                raise ApiError(422, *found)
            frame_idx = found
        assert frame_idx is not None
        prompt = Prompt.from_api(body)
        check_inside(prompt, (state.height, state.width), what="frame")
        limit = self.limits.max_points_per_object
        if len(body.points) > limit:
            raise ApiError(
                422,
                "too_many_prompts",
                f"points: {len(body.points)} clicks; at most {limit} (max_points_per_object)",
            )
        self.videos.check_new_object(session, body.obj_id)
        self._check_sam3_room(body.obj_id)
        self.videos.check_live_prompt(session, body.obj_id, frame_idx)
        if not body.clear_old_points:
            total = self.videos.clicks_on(session, body.obj_id, frame_idx) + len(body.points)
            if total > limit:
                raise ApiError(
                    422, "too_many_prompts", f"points: {total} clicks on the frame; at most {limit}"
                )

        def run(_context: JobContext) -> list[ObjectMask]:
            frame = predictor.add_prompt(
                state, frame_idx, body.obj_id, prompt, clear_old_points=body.clear_old_points
            )
            predictor.commit_prompts(state)  # its memory, while the frame is held
            return object_masks(frame)

        try:
            records = await self.service.run_job("video_live", run, RequestClock())
        except VideoPromptError as exc:
            raise ApiError(422, "invalid_request", str(exc)) from None
        if body.name is not None:  # the object exists now: its name is kept
            session.set_name(body.obj_id, body.name)
        if self.concepts is not None:  # SAM 3 gives it to no object it finds
            self.concepts.ids.used.add(body.obj_id)
        objects = await objects_out(records, body.mask_format, self.service, session.names)
        await self.send(
            {
                "type": "prompt",
                "frame_idx": frame_idx,
                **({} if body.seq is None else {"seq": body.seq}),
                "objects": [obj.model_dump() for obj in objects],
                "latency_ms": round((time.perf_counter() - item.received) * 1000, 3),
            }
        )

    def _check_sam3_room(self, obj_id: int) -> None:
        """A new SAM 2.1 object during a SAM 3 run: the session keeps room for the objects
        SAM 3 may still report (413 when it has none left)."""
        run, session = self.concepts, self.session
        if run is None or obj_id in session.state.obj_ids:
            return
        limit = self.videos.limits.max_objects
        if session.object_count + run.unreported >= limit:
            raise ApiError(
                413,
                "too_many_objects",
                f"obj_id {obj_id}: the session has {session.object_count} objects and SAM 3's "
                f"run on {run.label} keeps room for {run.unreported} more it may report, "
                f"the limit (max_video_objects {limit}); stop the run "
                '({"type": "concepts_stop"}) or remove objects first',
            )


def error_message(code: str, message: str, seq: int | None = None) -> dict[str, Any]:
    """A refusal on a live connection: its type, seq (of the refused message, when it has
    one), code and message, and the HTTP API's error shape ``{"error": {code, message}}``."""
    body: dict[str, Any] = {"type": "error", "code": code, "message": message}
    if seq is not None:
        body["seq"] = seq
    body["error"] = {"code": code, "message": message}
    return body


__all__ = [
    "CLOSE_NORMAL",
    "CLOSE_POLICY",
    "CLOSE_SERVER_ERROR",
    "CLOSE_TRY_LATER",
    "LiveConnection",
    "error_message",
]
