"""The process's memory: giving freed memory back to the system, and the limit it runs under.

glibc keeps memory that Python and torch have freed in its arenas for reuse, so after a
burst of large images the resident size stays near its peak although nothing uses it.
``malloc_trim(0)`` returns the free pages of every arena to the system; the model worker
calls it whenever it falls idle (it costs a few milliseconds, then nothing while idle).
Without glibc (musl, macOS) it does nothing.
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
