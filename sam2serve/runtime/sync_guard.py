"""Host syncs, caught without a GPU: a context manager that sees every request for a host
value that the code inside it makes of a tensor.

On a GPU, asking a tensor for a host value (``.item()``, ``.tolist()``, ``bool(t)`` as in
``if t.any():``, ``int(t)``, ``.cpu()`` / ``.numpy()``, ``nonzero``, one-argument
``torch.where``, ``masked_select``, ``unique``, boolean-mask indexing, ``repeat_interleave``
with tensor repeats) makes the host wait for the device: the queue of launched kernels
drains and the overlap of host and device work is lost. So does a blocking upload of host
data (``torch.tensor(values, device=cuda)``, ``t.to(cuda)`` of a host tensor without
``non_blocking=True``): torch copies it with a stream synchronisation. ``torch.cuda
.set_sync_debug_mode`` reports these, but only on a GPU; :class:`SyncGuard` reports the
same requests on any device, the CPU included, because it watches the requests
themselves (a function mode for the Python-level ones, a dispatch mode for the operators
whose output size depends on the data), not the device.

Each request is a :class:`HostSync` with its kind, the operation, the innermost engine
function that made it (``where``) and the stage it was made in (:meth:`SyncGuard.stage`).
``allow`` names the functions that may make them (glob patterns over the
``module.qualname`` of any caller on the stack): the points where outputs are handed out.
Any other request raises :class:`HostSyncError` (``raise_on_sync=True``) or is only
counted (``raise_on_sync=False``, for a profile: :meth:`SyncGuard.counts`).

    with SyncGuard(allow=["sam2serve.engine.video.outputs.object_masks"]):
        for frame in predictor.propagate(state):
            records = object_masks(frame)

What it cannot see: host work that never touches a tensor, and syncs made by a kernel
itself (a CUDA kernel that waits on the host); a blocking upload is seen when its host
data was made inside the guard (``torch.tensor``, ``torch.as_tensor``, ``torch.from_numpy``)
or given a device there. It slows every tensor operation inside it (a Python call per
operation): a test and profiling tool, not for production paths.
"""

from __future__ import annotations

import fnmatch
import sys
import threading
import weakref
from collections import Counter
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any, Self

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["HostSync", "HostSyncError", "SyncGuard"]

_TORCH_DIR = str(Path(torch.__file__).parent)
_THIS_FILE = __file__

# Python-level requests for a host value: every call is one sync on a device tensor.
_HOST_READS = {
    "item": "item",
    "tolist": "tolist",
    "__bool__": "bool",
    "__int__": "int",
    "__float__": "float",
    "__index__": "index",
    "numpy": "to host",
    "cpu": "to host",
}
# Operators whose output size (or value on the host) depends on the data.
_DATA_DEPENDENT = {
    "aten::_local_scalar_dense": "item",
    "aten::is_nonzero": "bool",
    "aten::equal": "bool",
    "aten::nonzero": "nonzero",
    "aten::nonzero_numpy": "nonzero",
    "aten::argwhere": "nonzero",
    "aten::masked_select": "masked_select",
    "aten::_unique": "unique",
    "aten::_unique2": "unique",
    "aten::unique_dim": "unique",
    "aten::unique_consecutive": "unique",
    "aten::unique_dim_consecutive": "unique",
    "aten::repeat_interleave": "repeat_interleave",
}
# The same requests at the Python level (under inference mode, some composite operators,
# one-argument torch.where's among them, never reach the dispatch mode).
_DATA_DEPENDENT_CALLS = {
    "nonzero": "nonzero",
    "argwhere": "nonzero",
    "masked_select": "masked_select",
    "unique": "unique",
    "unique_consecutive": "unique",
    "equal": "bool",
    "allclose": "bool",
}
# Python functions that make a host tensor out of host data.
_HOST_DATA = ("tensor", "as_tensor", "asarray", "from_numpy")


class HostSyncError(RuntimeError):
    """A request for a host value that the guard does not allow; the message names it."""


@dataclass(frozen=True)
class HostSync:
    """One request for a host value."""

    kind: str  # item, bool, tolist, to host, upload, nonzero, unique, ...
    op: str  # the torch function or operator
    where: str  # module.qualname:line of the innermost caller outside torch
    stage: str | None  # the guard's stage when it was made
    allowed: bool

    def __str__(self) -> str:
        stage = f" in stage {self.stage!r}" if self.stage else ""
        return f"{self.kind} ({self.op}) at {self.where}{stage}"


def _callers() -> list[tuple[str, int]]:
    """(module.qualname, line) of the Python frames on the stack outside torch and this
    module, innermost first."""
    out = []
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        filename = frame.f_code.co_filename
        if filename != _THIS_FILE and not filename.startswith(_TORCH_DIR):
            module = frame.f_globals.get("__name__", "?")
            out.append((f"{module}.{frame.f_code.co_qualname}", frame.f_lineno))
        frame = frame.f_back
    return out


def _is_device(value: Any) -> bool:
    return isinstance(value, (torch.device, str, int)) and not isinstance(value, bool)


def _target_device(args: tuple[Any, ...], kwargs: dict[str, Any]) -> torch.device | None:
    """The device of a ``Tensor.to`` call, if it names one."""
    candidates = [kwargs.get("device"), *args[1:2]]
    for candidate in candidates:
        if candidate is None or isinstance(candidate, torch.dtype):
            continue
        if isinstance(candidate, torch.Tensor):
            return candidate.device
        if _is_device(candidate):
            try:
                return torch.device(candidate)
            except (RuntimeError, TypeError):
                return None
    return None


def _bool_index(index: Any) -> bool:
    items = index if isinstance(index, (tuple, list)) else (index,)
    return any(
        isinstance(item, torch.Tensor) and item.dtype in (torch.bool, torch.uint8) for item in items
    )


class _FunctionSide(TorchFunctionMode):
    def __init__(self, guard: SyncGuard) -> None:
        super().__init__()
        self.guard = guard

    def __torch_function__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        module = getattr(func, "__module__", "") or ""
        kind = self._kind(func, name, args, kwargs)
        if kind is None:
            result = func(*args, **kwargs)
        else:
            method = bool(args) and isinstance(args[0], torch.Tensor) and module != "torch"
            self.guard._record(kind, f"Tensor.{name}" if method else f"torch.{name}")
            with self.guard._quiet():
                result = func(*args, **kwargs)
        made_here = name in _HOST_DATA and module == "torch" and kwargs.get("device") is None
        if made_here and isinstance(result, torch.Tensor):
            self.guard._mark_host_made(result)
        return result

    def _kind(
        self, func: Any, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> str | None:
        module = getattr(func, "__module__", "")
        if name in _HOST_DATA and module == "torch":
            device = kwargs.get("device")
            if device is not None and torch.device(device) == self.guard.device:
                return "upload"
            return None
        if name == "where" and len(args) == 1 and not kwargs:
            return "nonzero"
        if name in _DATA_DEPENDENT_CALLS:
            return _DATA_DEPENDENT_CALLS[name]
        if name == "repeat_interleave" and kwargs.get("output_size") is None:
            repeats = args[1] if len(args) > 1 else kwargs.get("repeats")
            if isinstance(repeats, torch.Tensor):
                return "repeat_interleave"
        if not args or not isinstance(args[0], torch.Tensor):
            return None
        if name in _HOST_READS:
            return _HOST_READS[name]
        if name == "to":
            target = _target_device(args, kwargs)
            if target is None or kwargs.get("non_blocking"):
                return None
            tensor = args[0]
            if tensor.device.type != target.type:
                return "to host" if target.type == "cpu" else "upload"
            if self.guard._is_host_made(tensor) and target == self.guard.device:
                return "upload"
        if name in ("__getitem__", "__setitem__") and len(args) > 1 and _bool_index(args[1]):
            return "boolean mask"
        return None


class _DispatchSide(TorchDispatchMode):
    def __init__(self, guard: SyncGuard) -> None:
        super().__init__()  # type: ignore[no-untyped-call]  # torch leaves TorchDispatchMode.__init__ unannotated
        self.guard = guard

    def __torch_dispatch__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        if not self.guard._is_quiet():
            name = func._schema.name
            kind = _DATA_DEPENDENT.get(name)
            if name == "aten::repeat_interleave" and (
                kwargs.get("output_size") is not None
                or func._schema.overload_name not in ("Tensor", "self_Tensor")
            ):
                kind = None
            if name in ("aten::index", "aten::index_put", "aten::index_put_") and len(args) > 1:
                kind = "boolean mask" if _bool_index(args[1]) else None
            if name in ("aten::_to_copy", "aten::copy_") and self._crosses(name, args, kwargs):
                kind = "device copy"
            if kind is not None:
                self.guard._record(kind, name)
        return func(*args, **kwargs)

    @staticmethod
    def _crosses(name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
        """A blocking copy between the host and a device (seen only on a real device)."""
        if kwargs.get("non_blocking") or (len(args) > 2 and args[2] is True):
            source: torch.Tensor = args[1] if name == "aten::copy_" else args[0]
            return source.device.type != "cpu"  # device -> host is waited for anyway
        if name == "aten::copy_":
            dst: torch.Tensor = args[0]
            src: torch.Tensor = args[1]
            return (dst.device.type == "cpu") != (src.device.type == "cpu")
        target = kwargs.get("device")
        return target is not None and (torch.device(target).type == "cpu") != (
            args[0].device.type == "cpu"
        )


class SyncGuard:
    """Within ``with SyncGuard(...)``: every request for a host value is recorded, and one
    no ``allow`` pattern covers raises :class:`HostSyncError` (``raise_on_sync``).

    ``allow``: glob patterns over ``module.qualname`` (e.g.
    ``"sam2serve.engine.video.outputs.*"``) of any caller on the stack. ``device``: the
    compute device a blocking upload goes to (default: CUDA where present, else the CPU):
    on the CPU, ``torch.tensor(values, device=cpu)`` and ``t.to(cpu)`` of host data made
    inside the guard count as the uploads they are on a GPU. One guard per thread; the
    modes are the thread's.
    """

    def __init__(
        self,
        *,
        allow: Iterable[str] = (),
        raise_on_sync: bool = True,
        device: str | torch.device | None = None,
    ) -> None:
        self.allow = tuple(allow)
        self.raise_on_sync = raise_on_sync
        if device is None:
            device = "cuda" if torch.cuda.is_available() else "cpu"
        device = torch.device(device)
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        self.device = device
        self.syncs: list[HostSync] = []
        self._stages: list[str] = []
        self._local = threading.local()
        # id -> weak reference of the host tensors made inside (not a WeakSet: its lookups
        # compare tensors with ==, itself a tensor operation).
        self._host_made: dict[int, weakref.ref[torch.Tensor]] = {}
        self._modes: list[Any] = []

    # -- use ----------------------------------------------------------------------------------

    def __enter__(self) -> Self:
        self._modes = [_FunctionSide(self), _DispatchSide(self)]
        for mode in self._modes:
            mode.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        for mode in reversed(self._modes):
            mode.__exit__(*exc)
        self._modes = []

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        """Requests made inside are recorded with stage ``name`` (the innermost wins)."""
        self._stages.append(name)
        try:
            yield
        finally:
            self._stages.pop()

    def counts(self, by: str = "stage", *, allowed: bool | None = None) -> Counter[str]:
        """How many requests per ``by`` (stage, kind, where or op); ``allowed`` True/False
        counts only the allowed / disallowed ones."""
        return Counter(
            getattr(sync, by) for sync in self.syncs if allowed is None or sync.allowed == allowed
        )

    @property
    def disallowed(self) -> list[HostSync]:
        return [sync for sync in self.syncs if not sync.allowed]

    def reset(self) -> None:
        self.syncs.clear()

    # -- recording ----------------------------------------------------------------------------

    def _record(self, kind: str, op: str) -> None:
        callers = _callers()
        where = f"{callers[0][0]}:{callers[0][1]}" if callers else "?"
        allowed = any(
            fnmatch.fnmatchcase(name, pattern) for name, _ in callers for pattern in self.allow
        )
        stage = self._stages[-1] if self._stages else None
        sync = HostSync(kind, op, where, stage, allowed)
        self.syncs.append(sync)
        if not allowed and self.raise_on_sync:
            raise HostSyncError(
                f"host sync: {sync}; call stack: {' <- '.join(name for name, _ in callers[:6])}"
            )

    def _mark_host_made(self, tensor: torch.Tensor) -> None:
        key = id(tensor)
        self._host_made[key] = weakref.ref(tensor, lambda _: self._host_made.pop(key, None))

    def _is_host_made(self, tensor: torch.Tensor) -> bool:
        ref = self._host_made.get(id(tensor))
        return ref is not None and ref() is tensor

    @contextmanager
    def _quiet(self) -> Iterator[None]:
        """The operators a recorded call runs are the same request: not counted again."""
        depth = getattr(self._local, "quiet", 0)
        self._local.quiet = depth + 1
        try:
            yield
        finally:
            self._local.quiet = depth

    def _is_quiet(self) -> bool:
        return getattr(self._local, "quiet", 0) > 0
