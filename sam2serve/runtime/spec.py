"""RuntimeSpec: everything that decides how a model runs, in one frozen, validated value.

*Model* (its size), *mode* (what answers: :mod:`sam2serve.runtime.modes`), *backend* (what
executes them: :mod:`sam2serve.runtime.backends`), *device*, the *dtype* of the mode's
reduced-precision parts, *threads* and the prompt chunk. It is checked once, on
construction, with messages that name the bad value; the
Predictor carries it (``predictor.runtime``), and the service's /readyz and metrics, the
CLI's outputs, artifact manifests and bench rows write it. Torch-free.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from sam2serve.config import model_size
from sam2serve.runtime.backends import BACKENDS, DEFAULT_BACKEND, get_backend_info
from sam2serve.runtime.modes import DEVICE_TYPES, get_mode

DTYPES = ("float32", "bfloat16", "float16")
from sam2serve.runtime.threads import check_threads


@dataclass(frozen=True)
class WeightsSource:
    """Where the weights come from: a checkpoint (or the cache), seeded random weights,
    or a 'sam2serve export' directory (which carries its own)."""

    checkpoint: str | None = None
    random_weights: bool = False
    seed: int = 0
    artifacts: str | None = None

    def __post_init__(self) -> None:
        if self.artifacts is not None and (self.checkpoint is not None or self.random_weights):
            raise ValueError(
                "artifacts carry their weights: give no checkpoint or random weights with them"
            )


@dataclass(frozen=True)
class RuntimeSpec:
    model: str = "tiny"
    mode: str = "fast"
    # None: the mode's default backend (default_backend; eager for the float modes).
    backend: str | None = None
    device: str = "cpu"
    # Intra-op CPU threads; None: the CPUs this process may use (affinity and cgroup quota).
    threads: int | None = None
    # Prompts per decoder call; None: the mode's choice for the device.
    prompt_chunk: int | None = None
    # What the mode's reduced-precision parts (furious: the image encoder and the second
    # half of the upscaling) compute in; always float32 for the lossless modes. None: the
    # best the device runs natively, resolved when the predictor is built
    # (runtime.build.native_reduced_dtype): bfloat16 on CUDA GPUs with bf16 and on CPUs
    # with AVX512-BF16 or AMX, float16 on older GPUs, float32 on CPUs without native
    # bf16 (emulated bf16 is several times slower than fp32: docs/benchmarks.md).
    dtype: str | None = None

    def __post_init__(self) -> None:
        # A Hugging Face id (facebook/sam2.1-hiera-tiny) becomes its size.
        object.__setattr__(self, "model", model_size(self.model))
        mode = get_mode(self.mode)
        if self.backend is None:
            object.__setattr__(self, "backend", default_backend(mode.name))
        assert self.backend is not None  # set just above
        backend = get_backend_info(self.backend)
        device_type = self.device.split(":", 1)[0]
        if device_type not in DEVICE_TYPES:
            raise ValueError(
                f"unknown device {self.device!r}; expected one of {', '.join(DEVICE_TYPES)} "
                "(or cuda:N)"
            )
        if device_type not in backend.devices:
            raise ValueError(
                f"backend {backend.name!r} runs on {', '.join(backend.devices)}, not on "
                f"{self.device!r}"
            )
        if backend.modes is not None and mode.name not in backend.modes:
            if mode.quantized_encoder is not None:
                runners = [n for n, i in BACKENDS.items() if i.modes and mode.name in i.modes]
                raise ValueError(
                    f"mode {mode.name!r} needs {mode.quantized_encoder} kernels, which backend "
                    f"{backend.name!r} does not have: run it with backend "
                    f"{' or '.join(runners)} (or leave the backend out: {mode.default_backend})"
                )
            raise ValueError(
                f"backend {backend.name!r} runs the {_and(backend.modes)} modes, not {mode.name!r}"
            )
        if self.threads is not None:
            check_threads(self.threads)
        if self.dtype is not None:
            if self.dtype not in DTYPES:
                raise ValueError(
                    f"unknown dtype {self.dtype!r}; expected one of {', '.join(DTYPES)}"
                )
            if not mode.reduced_precision_encoder and self.dtype != "float32":
                raise ValueError(
                    f"mode {mode.name!r} computes in float32 (it is lossless), not {self.dtype!r}"
                )
        if self.prompt_chunk is None:
            object.__setattr__(self, "prompt_chunk", mode.prompt_chunk(device_type))
        elif isinstance(self.prompt_chunk, bool) or not (
            isinstance(self.prompt_chunk, int) and self.prompt_chunk >= 1
        ):
            raise ValueError(f"prompt_chunk must be an integer >= 1, got {self.prompt_chunk!r}")

    @property
    def device_type(self) -> str:
        return self.device.split(":", 1)[0]

    @property
    def label(self) -> str:
        """``mode`` for eager, else ``mode+backend`` (the bench's row names)."""
        return (
            self.mode
            if self.backend == default_backend(self.mode)
            else f"{self.mode}+{self.backend}"
        )

    @classmethod
    def from_label(cls, label: str, **fields: Any) -> RuntimeSpec:
        """``"furious+openvino"`` -> mode furious, backend openvino (names checked);
        ``"int8"`` -> mode int8, its default backend (openvino)."""
        mode, _, backend = label.partition("+")
        return cls(mode=mode, backend=backend or None, **fields)

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def replace(self, **changes: Any) -> RuntimeSpec:
        return dataclasses.replace(self, **changes)


def default_backend(mode: str) -> str:
    """The backend a spec of ``mode`` gets when it names none: the mode's own choice (int8:
    openvino, since eager has no int8 kernels), else the registry's default."""
    return get_mode(mode).default_backend or DEFAULT_BACKEND


def _and(names: tuple[str, ...]) -> str:
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"
