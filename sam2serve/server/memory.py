"""The process's memory: giving freed memory back to the system, and the limit it runs under.

glibc keeps memory that Python and torch have freed in its arenas for reuse, so after a
burst of large images the resident size stays near its peak although nothing uses it.
``malloc_trim(0)`` returns the free pages of every arena to the system; the model worker
calls it when it falls idle after its resident size has grown (:class:`IdleRelease`).
Without glibc (musl, macOS) it does nothing.

Not after every job: the pages a trim gives back are the ones the next job of the same
kind touches again, and each comes back as a page fault of a zeroed page. A click on a
cached embedding frees and reuses tens of MB of the decoder's temporaries; trimmed after
each, a click cost 20 ms more CPU (56 instead of 36 ms on a 2-core host), more than
half of it faulting the decoder's pages back in.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
from collections.abc import Callable
from pathlib import Path

_CGROUP_LIMITS = (
    Path("/sys/fs/cgroup/memory.max"),  # cgroup v2
    Path("/sys/fs/cgroup/memory/memory.limit_in_bytes"),  # cgroup v1
)


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        trim = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


def release_free_memory() -> bool:
    """Return the allocator's free memory to the system; False where that is unsupported."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True


# Resident growth since the last release after which an idle moment releases again: less
# is one job's working memory (a click's, an AMG batch's), which the next job reuses.
IDLE_RELEASE_GROWTH = 256 * 1024 * 1024


class IdleRelease:
    """The model worker's idle hook: :func:`release_free_memory` when the resident size
    has grown by ``growth`` bytes or more since the last release (or never released), so
    a burst of large images is given back once it is over, while a run of clicks keeps
    the working memory it reuses. At most ``growth`` bytes of freed memory stay with the
    process."""

    def __init__(self, growth: int = IDLE_RELEASE_GROWTH) -> None:
        self.growth = growth
        self._after_release: int | None = None

    def __call__(self) -> bool:
        """Whether it released (False: not grown enough, or unsupported)."""
        resident = resident_bytes()
        if self._after_release is not None and resident - self._after_release < self.growth:
            return False
        released = release_free_memory()
        self._after_release = resident_bytes()
        return released


def memory_limit_bytes() -> int:
    """The memory this process may use: its cgroup's limit if one is set, else the
    machine's physical memory."""
    physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    for path in _CGROUP_LIMITS:
        try:
            text = path.read_text().strip()
        except OSError:
            continue
        if text.isdigit() and 0 < int(text) < physical:
            return int(text)
    return physical


def resident_bytes() -> int:
    """The process's resident memory now (0 where /proc is missing)."""
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return 0
