"""A GPU's placement rules, checked without a GPU: a dispatch mode that sees every operator
the code inside it runs and fails on the ones that only work when the model is on the CPU.

With the model's weights and inputs on another device (the ``meta`` device on a CPU host:
shapes and dtypes only, no values), :class:`DeviceGuard` raises :class:`DeviceError`, naming
the operator and the innermost ``sam2serve`` caller, for

- **mixed devices**: an operator whose tensor arguments live on the model's device and on
  the CPU (a CUDA kernel refuses them: "Expected all tensors to be on the same device"; an
  index tensor on the CPU is accepted there but copied and waited for, and counts too).
  A 0-dim CPU tensor is a scalar to every device (torch's rule) and passes. The copies
  that move data between the host and the device (``.to``, ``.cpu()``, ``copy_``) are the
  point of those operators and pass.
- **a tensor made on the host**: a factory (``arange``, ``zeros``, ``empty``, ``full``,
  ``linspace``, ...) called without ``device=`` (so on the CPU) while the model is
  elsewhere. Host *data* turned into a tensor (``torch.tensor(values)``,
  ``torch.from_numpy``) is not a factory: it is the upload's source and passes; its use on
  the device without an upload is the mixed-devices case.
- **a CPU-only kernel**: interpolation other than nearest (bilinear, bicubic, their
  antialiased forms, linear, trilinear, lanczos) of an integer tensor on any device but the
  CPU: CUDA implements them for floating dtypes only (tests/cuda/test_concepts_cuda.py
  checks each on a GPU); on ``meta`` they still compute a shape, so this is a rule of the
  guard, not of the device.

On ``meta`` a host read has no value to give; ``stand_in_reads=True`` answers them with
stand-ins so the code after them (the hand-out of masks, boxes and scores) runs too: a copy
to the host is zeros of its shape, a scalar read is 1 (True, 1.0), and ``nonzero`` (boolean
masks) assumes every element is set (torch's own meta rule, switched on here).

    with DeviceGuard("meta"):
        instances = detect(model_on_meta, tokenize, encoding, ["cat"])
"""

from __future__ import annotations

import fnmatch
import sys
import weakref
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
import torch.fx.experimental._config as fx_config
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

_TORCH_DIR = str(Path(torch.__file__).parent)

# The operators that copy between devices: crossing is what they are for.
_COPIES = {"aten::_to_copy", "aten::to", "aten::copy_", "aten::_copy_from"}
# Factories: a new tensor from sizes or values alone; without device= it is on the CPU.
_FACTORIES = {
    "aten::arange",
    "aten::empty",
    "aten::empty_strided",
    "aten::zeros",
    "aten::ones",
    "aten::full",
    "aten::linspace",
    "aten::logspace",
    "aten::eye",
    "aten::scalar_tensor",
    "aten::rand",
    "aten::randn",
    "aten::randint",
    "aten::randperm",
    "aten::tril_indices",
    "aten::triu_indices",
}
# Interpolations a CUDA build implements for floating dtypes only (nearest takes uint8).
_FLOAT_ONLY_OFF_CPU = {
    "aten::upsample_bilinear2d",
    "aten::_upsample_bilinear2d_aa",
    "aten::upsample_bicubic2d",
    "aten::_upsample_bicubic2d_aa",
    "aten::_upsample_lanczos2d_aa",
    "aten::upsample_linear1d",
    "aten::upsample_trilinear3d",
}
_FOLLOWED = 64  # the largest meta tensor whose host value is followed (elements)
_SCALAR_READS = {"aten::_local_scalar_dense", "aten::item", "aten::is_nonzero", "aten::equal"}


class DeviceError(RuntimeError):
    """An operator that works only with the model on the CPU; the message names it."""


def _called_from(patterns: tuple[str, ...]) -> bool:
    """Whether a function matching one of ``patterns`` (module.qualname) is on the stack."""
    frame = sys._getframe(1)
    while frame is not None and patterns:
        name = f"{frame.f_globals.get('__name__', '?')}.{frame.f_code.co_qualname}"
        if any(fnmatch.fnmatchcase(name, pattern) for pattern in patterns):
            return True
        frame = frame.f_back
    return False


def _caller() -> str:
    """module.qualname:line of the innermost Python frame outside torch and this file, and
    the innermost sam2serve one when that is another (``... via sam2serve...``)."""
    frame = sys._getframe(1)
    innermost = None
    while frame is not None:
        filename = frame.f_code.co_filename
        if filename != __file__ and not filename.startswith(_TORCH_DIR):
            name = f"{frame.f_globals.get('__name__', '?')}.{frame.f_code.co_qualname}"
            where = f"{name}:{frame.f_lineno}"
            if innermost is None:
                innermost = where
                if name.startswith("sam2serve."):
                    return where
            elif name.startswith("sam2serve."):
                return f"{innermost} via {where}"
        frame = frame.f_back
    return innermost or "?"


class _HostData(TorchFunctionMode):
    """``torch.tensor(values, device=meta)`` keeps no values: remember them beside it."""

    def __init__(self, guard: DeviceGuard) -> None:
        super().__init__()
        self.guard = guard

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        result = func(*args, **kwargs)
        device = kwargs.get("device")
        if (
            getattr(func, "__name__", "") in ("tensor", "as_tensor")
            and getattr(func, "__module__", "") == "torch"
            and device is not None
            and torch.device(device).type == "meta"
            and isinstance(result, torch.Tensor)
            and result.numel() <= _FOLLOWED
        ):
            value = func(*args, **{**kwargs, "device": "cpu"})
            self.guard._remember(result, value)
        return result


class DeviceGuard(TorchDispatchMode):
    """Within ``with DeviceGuard(device)``: an operator that works only on the CPU raises
    :class:`DeviceError` (``raise_on_error``; else it is only recorded in ``errors``).
    ``device``: the model's device (not the CPU). ``host``: glob patterns over the
    ``module.qualname`` of functions that build host data by design (token ids from Python
    lists) and may make host tensors; their use on the device still counts.
    ``stand_in_reads``: answer host reads of ``meta`` tensors with stand-ins (see the
    module's doc)."""

    def __init__(
        self,
        device: str | torch.device = "meta",
        *,
        host: Iterable[str] = (),
        raise_on_error: bool = True,
        stand_in_reads: bool = True,
    ) -> None:
        super().__init__()
        self.host = tuple(host)
        self.device = torch.device(device)
        if self.device.type == "cpu":
            raise ValueError("DeviceGuard checks a model on another device than the CPU")
        self.raise_on_error = raise_on_error
        self.stand_in_reads = stand_in_reads and self.device.type == "meta"
        self.errors: list[str] = []
        self.ops: set[str] = set()
        self._nonzero = None
        self._host_data: _HostData | None = None
        # id -> (weak reference of a small meta tensor, its value on the host)
        self._values: dict[int, tuple[weakref.ref, torch.Tensor]] = {}

    def __enter__(self):
        if self.stand_in_reads:
            self._nonzero = fx_config.patch(meta_nonzero_assume_all_nonzero=True)
            self._nonzero.__enter__()
            self._host_data = _HostData(self)
            self._host_data.__enter__()
        return super().__enter__()

    def __exit__(self, *exc: object) -> None:
        super().__exit__(*exc)
        if self._host_data is not None:
            self._host_data.__exit__(*exc)
            self._host_data = None
        if self._nonzero is not None:
            self._nonzero.__exit__(*exc)
            self._nonzero = None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func._schema.name
        self.ops.add(name)
        tensors = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        if self.stand_in_reads:
            answer = self._stand_in(name, tensors, args, kwargs, func)
            if answer is not None:
                return answer
        self._check(name, tensors, args, kwargs)
        out = func(*args, **kwargs)
        if self.stand_in_reads:
            self._follow(tensors, args, kwargs, func, out)
        return out

    # -- the rules ------------------------------------------------------------------------------

    def _check(self, name: str, tensors: list[torch.Tensor], args, kwargs) -> None:
        if name in _COPIES:
            return
        on_host = [t for t in tensors if t.device.type == "cpu" and t.dim() > 0]
        on_device = [t for t in tensors if t.device.type == self.device.type]
        if on_host and on_device:
            shapes = ", ".join(str(tuple(t.shape)) for t in on_host)
            self._fail(f"{name} mixes devices: CPU tensor(s) {shapes} with {self.device.type} ones")
        if name in _FACTORIES and not tensors:
            device = kwargs.get("device")
            on_cpu = device is None or torch.device(device).type == "cpu"
            if on_cpu and not _called_from(self.host):
                self._fail(
                    f"{name} makes a tensor on the host (no device=) while the model is on {self.device.type}"
                )
        if name in _FLOAT_ONLY_OFF_CPU and tensors:
            image = tensors[0]
            if image.device.type != "cpu" and not image.is_floating_point():
                self._fail(
                    f"{name} of a {image.dtype} tensor on {image.device.type}: "
                    "no kernel for that dtype off the CPU"
                )

    def _fail(self, message: str) -> None:
        message = f"{message} (at {_caller()})"
        self.errors.append(message)
        if self.raise_on_error:
            raise DeviceError(message)

    # -- stand-in values for host reads on meta -------------------------------------------------

    def _stand_in(self, name, tensors, args, kwargs, func) -> Any:
        if not tensors or tensors[0].device.type != "meta":
            return None
        source = tensors[0]
        known = self._value(source)
        if name in _SCALAR_READS:
            if known is not None and name in ("aten::_local_scalar_dense", "aten::item"):
                return known.item()
            if source.dtype == torch.bool or name not in (
                "aten::_local_scalar_dense",
                "aten::item",
            ):
                return True
            return 1.0 if source.is_floating_point() else 1
        if name in ("aten::_to_copy", "aten::to"):
            device = kwargs.get("device")
            if device is not None and torch.device(device).type == "cpu":
                dtype = kwargs.get("dtype") or source.dtype
                if known is not None:
                    return known.to(dtype)
                return torch.zeros(source.shape, dtype=dtype)
        return None

    def _follow(self, tensors, args, kwargs, func, out) -> None:
        """Small tensors on meta made from host values (shapes, sizes: ``torch.tensor(
        [[h, w]], device=...)``) keep those values beside them, and the operators on them
        are run on the values too, so that a later read of one gets its real value."""
        if not isinstance(out, torch.Tensor) or out.device.type != "meta":
            return
        if out.numel() > _FOLLOWED or not tensors:
            return
        if any(t.device.type == "meta" and self._value(t) is None for t in tensors):
            return

        def host(value):
            if isinstance(value, torch.Tensor) and value.device.type == "meta":
                return self._value(value)
            if isinstance(value, torch.device) and value.type == "meta":
                return torch.device("cpu")
            return value

        host_args = tree_map(host, args)
        host_kwargs = tree_map(host, kwargs)
        if host_kwargs.get("device") == "meta":
            host_kwargs["device"] = torch.device("cpu")
        try:
            value = func(*host_args, **host_kwargs)
        except (RuntimeError, TypeError, ValueError, NotImplementedError):
            return
        if isinstance(value, torch.Tensor) and value.device.type == "cpu":
            self._remember(out, value)

    def _remember(self, tensor: torch.Tensor, value: torch.Tensor) -> None:
        key = id(tensor)
        self._values[key] = (weakref.ref(tensor, lambda _: self._values.pop(key, None)), value)

    def _value(self, tensor: torch.Tensor) -> torch.Tensor | None:
        entry = self._values.get(id(tensor))
        if entry is None or entry[0]() is not tensor:
            return None
        return entry[1]
