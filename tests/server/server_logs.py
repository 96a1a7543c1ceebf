"""What a spawned server wrote to its log while one test ran: a mark before, the text
after it, and the check every hostile test ends with (no traceback, nothing asyncio
complains about when a task or future is dropped)."""

from __future__ import annotations

from hostile import SpawnedServer

# Lines that mean an exception escaped a handler or a task, whatever the route.
ESCAPED = ("Traceback", "Future exception was never retrieved", "Task was destroyed")


def log_mark(live: SpawnedServer) -> int:
    """Where the server's log ends now."""
    return len(live.log())


def log_since(live: SpawnedServer, mark: int) -> str:
    """What the server logged after ``mark`` (a full garbage collection first, so what
    collected tasks and futures log is in it)."""
    live.collect_garbage(0.2)
    return live.log()[mark:]


def assert_no_traceback(live: SpawnedServer, mark: int) -> None:
    """Nothing escaped since ``mark``: the log names the first escape, with its context."""
    text = log_since(live, mark)
    for marker in ESCAPED:
        at = text.find(marker)
        assert at < 0, f"{marker!r} in the server's log:\n{text[max(0, at - 300) : at + 2500]}"
