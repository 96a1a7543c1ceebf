"""Where a store lives: a directory or an fsspec URI, opened and checked before any model
loads (torch-free), so a location that cannot be used is one line, found in milliseconds.
"""

from __future__ import annotations

import os
import secrets
from typing import Any


class StoreError(OSError):
    """A store location that cannot be used; the message names it."""


def open_location(location: str) -> tuple[Any, str]:
    """The fsspec filesystem of ``location`` and the root path within it."""
    if not isinstance(location, str) or not location.strip():
        raise StoreError(f"store location must be a directory or an fsspec URI, got {location!r}")
    import fsspec

    try:
        fs, root = fsspec.core.url_to_fs(location)
    except (ValueError, ImportError) as exc:  # an unknown protocol; s3:// without s3fs
        raise StoreError(f"store {location!r}: {exc}") from None
    return fs, root.rstrip("/") or "/"


def check_location(location: str) -> None:
    """The location takes files: created if missing, a probe file written and removed."""
    fs, root = open_location(location)
    probe = f"{root}/.probe-{os.getpid()}-{secrets.token_hex(4)}"
    try:
        if fs.isfile(root):
            raise StoreError(f"store {location!r} is a file; give a directory (or an fsspec URI)")
        fs.makedirs(root, exist_ok=True)
        with fs.open(probe, "wb") as handle:
            handle.write(b"")
        fs.rm(probe)
    except StoreError:
        raise
    except OSError as exc:
        raise StoreError(
            f"store {location!r}: cannot write in it ({exc.strerror or exc})"
        ) from None
