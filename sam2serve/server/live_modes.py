"""How a live connection takes frames that come faster than they are tracked.

- ``every`` (the default): each frame is tracked, in order; one sent while
  ``max_live_pending`` messages wait is refused (``too_fast``).
- ``latest`` (latest frame wins): while a frame is tracked, a newer frame replaces the one
  waiting, so at most one frame waits behind each prompt and none is ever refused. The
  replaced frame is answered at once as skipped; it never enters the session (it has no
  frame_idx): the session is the tracked frames, like a video sampled at a lower rate, so
  SAM 2's memory holds the newest tracked frames, each with its memory, and no holes.

A prompt is never skipped and is a barrier: a frame sent before it is tracked before it,
so a prompt may name (by ``seq``) the frame just sent. :class:`SeqLog` remembers, for the
newest seqs of a connection, what became of each: tracked as a frame_idx, or skipped.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Literal

LiveMode = Literal["every", "latest"]
LIVE_MODES: tuple[str, ...] = ("every", "latest")
# Seqs a connection remembers the outcome of (a prompt names a recent frame: the session
# holds its newest live_frames_kept frames anyway).
SEQS_REMEMBERED = 1024


class SeqLog:
    """The newest frames' outcomes on one connection: seq -> frame_idx, or the seq that
    replaced a skipped one. Bounded: the oldest outcome goes when a new one comes."""

    def __init__(self, size: int = SEQS_REMEMBERED) -> None:
        self.size = size
        self._outcomes: OrderedDict[int, tuple[str, int]] = OrderedDict()

    def tracked(self, seq: int, frame_idx: int) -> None:
        self._put(seq, ("tracked", frame_idx))

    def skipped(self, seq: int, replaced_by: int) -> None:
        self._put(seq, ("skipped", replaced_by))

    def _put(self, seq: int, outcome: tuple[str, int]) -> None:
        self._outcomes[seq] = outcome
        while len(self._outcomes) > self.size:
            self._outcomes.popitem(last=False)

    def frame_idx(self, seq: int, sent: int) -> int | tuple[str, str]:
        """The frame_idx frame ``seq`` became, or (code, message) saying why there is none
        (``sent``: the frames the connection has received)."""
        if seq >= sent:
            return "frame_not_sent", f"seq {seq}: this connection has received {sent} frames"
        outcome = self._outcomes.get(seq)
        if outcome is None:
            oldest = next(iter(self._outcomes), None)
            if oldest is not None and seq < oldest:
                why = f"seq {seq}: older than the newest {self.size} frames remembered"
                return "frame_not_held", why + "; prompt a recent frame"
            return "frame_not_tracked", f"seq {seq} was refused, not tracked"
        kind, value = outcome
        if kind == "skipped":
            why = f"seq {seq} was skipped (latest mode: frame seq {value} replaced it before "
            return "frame_skipped", why + "it was tracked): it has no frame_idx"
        return value


def skip_message(seq: int, replaced_by: int) -> dict[str, Any]:
    """The answer to a frame that a newer one replaced before it was tracked."""
    return {
        "type": "frame",
        "seq": seq,
        "skipped": True,
        "replaced_by": replaced_by,
        "frame_idx": None,
        "objects": [],
    }


__all__ = ["LIVE_MODES", "LiveMode", "SeqLog", "skip_message"]
