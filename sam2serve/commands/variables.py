"""The ``SAM2SERVE_*`` variables that set no flag, checked once when any command starts.

Every flag's own variable is read with the flag (sam2serve.options). These are read where
they are used, by whichever command needs them: the cache root (``SAM2SERVE_CACHE``,
sam2serve.cache), the checkpoint mirror (``SAM2SERVE_CHECKPOINT_URL_BASE``) and offline mode
(``SAM2SERVE_OFFLINE``, sam2serve.checkpoint) and the pinned checkpoint digest
(``SAM2SERVE_CHECKPOINT_SHA256``, sam2serve.checkpoint). So a bad one is found at start, as one
usage-error line naming it, rather than as a traceback deep in a download (torch-free).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

from sam2serve.cache import CACHE_ENV
from sam2serve.commands.common import UsageError
from sam2serve.config_text import parse_http_url, parse_path, parse_sha256, parse_switch

# Kept equal to sam2serve.checkpoint's (which imports torch; this module must not).
OFFLINE_ENV = "SAM2SERVE_OFFLINE"
URL_BASE_ENV = "SAM2SERVE_CHECKPOINT_URL_BASE"
SHA256_ENV = "SAM2SERVE_CHECKPOINT_SHA256"

# Each variable and what reads its text (a ValueError saying what is accepted).
READERS: dict[str, Callable[[str], Any]] = {
    CACHE_ENV: parse_path,
    URL_BASE_ENV: parse_http_url,
    OFFLINE_ENV: parse_switch,
    SHA256_ENV: parse_sha256,
}


def check_variables(environ: Mapping[str, str] | None = None) -> None:
    """Every variable of :data:`READERS` that is set (empty counts as unset) reads; else a
    :class:`UsageError` naming it, its value and what is accepted."""
    environ = os.environ if environ is None else environ
    for variable, read in READERS.items():
        text = environ.get(variable, "")
        if text:
            try:
                read(text)
            except ValueError as exc:
                raise UsageError(f"${variable}: {exc}") from None
