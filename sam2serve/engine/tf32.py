"""TF32 per predictor: a predictor whose answers must be fp32-exact turns it off for its calls.

On CUDA, fp32 matmuls and convolutions may run in TF32 (inputs rounded to a 10-bit
mantissa), as ``torch.backends.cuda.matmul.allow_tf32`` and ``torch.backends.cudnn.allow_tf32``
say. Those switches belong to the process, not to a predictor: the entry point sets them
once (``sam2serve.runtime.process``: on only where its mode allows TF32). A predictor of a
mode with fp32 tolerances (every mode but furious, and a Predictor built by hand) runs each
call under :func:`exact_float32`, which turns them off for the call and puts them back
after. So it computes the same whatever the process allows and whatever other predictors
the process holds; the tolerances it is tested to on the CPU hold on a GPU only with fp32
matmuls. A predictor that allows TF32 leaves the switches as the process set them and never
turns them on: that would change the answers of an exact predictor running at the same
time in another thread.

The switches are shared by every thread, so exact calls are counted: the first to start
turns TF32 off, the last to end puts back what it found; no call restores the switches
under another that still runs. A TF32 call that overlaps an exact one in another thread
computes without TF32 meanwhile: more precise, never less. The switches are host-side
flags read when a kernel is launched (no device work, no synchronisation): a call pays a
lock and two assignments.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import torch

T = TypeVar("T")


class _ExactCalls:
    """The exact calls running now, and the switches they found when the first started."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running = 0
        self._found = (False, False)

    def start(self) -> None:
        with self._lock:
            if self._running == 0:
                self._found = (
                    torch.backends.cuda.matmul.allow_tf32,
                    torch.backends.cudnn.allow_tf32,
                )
                torch.backends.cuda.matmul.allow_tf32 = False
                torch.backends.cudnn.allow_tf32 = False
            self._running += 1

    def end(self) -> None:
        with self._lock:
            self._running -= 1
            if self._running == 0:
                matmul, cudnn = self._found
                torch.backends.cuda.matmul.allow_tf32 = matmul
                torch.backends.cudnn.allow_tf32 = cudnn


_EXACT_CALLS = _ExactCalls()


@contextmanager
def exact_float32() -> Iterator[None]:
    """TF32 off while the block runs (and while any other exact block runs)."""
    _EXACT_CALLS.start()
    try:
        yield
    finally:
        _EXACT_CALLS.end()


def tf32_policy(method: Callable[..., T]) -> Callable[..., T]:
    """A predictor method that runs under its predictor's ``allow_tf32``: as the process's
    switches are when it allows TF32, else under :func:`exact_float32`."""

    @functools.wraps(method)
    def call(predictor: Any, *args: Any, **kwargs: Any) -> T:
        if predictor.allow_tf32:
            return method(predictor, *args, **kwargs)
        with exact_float32():
            return method(predictor, *args, **kwargs)

    return call


__all__ = ["exact_float32", "tf32_policy"]
