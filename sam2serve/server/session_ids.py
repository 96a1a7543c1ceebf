"""Video session ids and the header that carries a new one: torch-free, so the cluster's
routing and its clients can recognise a session id without importing the engine."""

from __future__ import annotations

import re
import secrets

SESSION_PREFIX = "vs-"
# Set on the answer that creates a session (POST /v1/videos), beside its body's session_id.
SESSION_HEADER = "x-sam2serve-session"
_SESSION_ID = re.compile(r"vs-[0-9a-f]{32}")


def new_session_id() -> str:
    """An unguessable session id (128 random bits), told apart from image ids by its prefix."""
    return SESSION_PREFIX + secrets.token_hex(16)


def is_session_id(value: str) -> bool:
    return bool(_SESSION_ID.fullmatch(value))


__all__ = ["SESSION_HEADER", "SESSION_PREFIX", "is_session_id", "new_session_id"]
