"""An application's ``args``: what each of its replicas loads and the limits it keeps.

A replica's model comes from exactly one of two places:

- ``artifacts``: a ``sam2serve export`` directory (or fsspec URI), run by the backend
  its manifest calls for (``artifacts``; ``onnxruntime`` for an ONNX export), decided by
  :func:`sam2serve.runtime.backend_choice.choose_backend` like every surface's: nothing
  compiled at start-up, CPU only for ``artifacts`` (see ``ARTIFACT_IMAGE_PATH_DEVICES`` in
  sam2serve.runtime.backends);
- ``checkpoint``: an official SAM 2.1 checkpoint file (or fsspec URI), run by a backend
  that starts from weights (``eager``, ``compile``, ...) on the CPU or on the GPU Ray
  assigns the replica. This is how a replica runs on a GPU.

Backends, their devices and modes come from the runtime's registry
(:data:`sam2serve.runtime.backends.BACKENDS`), so a new backend needs no change here.
Every bad value is a :class:`ConfigError` naming the key and the value. Torch-free: the
CLI checks a file before anything heavy is imported.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from sam2serve.config import ACCEPTED_MODELS, MODEL_SIZES, model_size
from sam2serve.runtime.backend_choice import BackendChoiceError, choose_backend
from sam2serve.runtime.backends import BACKENDS, BackendInfo
from sam2serve.runtime.modes import MODES
from sam2serve.runtime.spec import RuntimeSpec
from sam2serve.server.settings import ServerSettings, flat_keys

DEFAULT_IMAGES_PER_REPLICA = 32
# A replica runs on the CPU or on the one GPU Ray assigns it (always its cuda:0).
REPLICA_DEVICES = ("cpu", "cuda")
# ServerSettings' settings (by flat name) a replica takes from the file. The model comes
# from the artifacts or checkpoint, the API key from an environment variable, and a
# replica always warms up.
NOT_SERVER_KEYS = frozenset(
    {
        "model",
        "mode",
        "backend",
        "checkpoint",
        "random_weights",
        "artifacts",
        "seed",
        "device",
        "threads",
        "api_key",
    }
)
SERVER_KEYS = tuple(name for name in flat_keys() if name not in NOT_SERVER_KEYS)
# ServerSettings' groups: ``server`` may name settings flat (max_pixels: ...) or in their
# group's section (limits: {max_pixels: ...}); a section is a mapping, so ``video: true``
# (the setting) and ``video: {max_video_sessions: 2}`` (the section) do not collide.
SERVER_GROUPS = tuple(f.name for f in dataclasses.fields(ServerSettings))


class ConfigError(ValueError):
    """A configuration file that cannot be used; the message names the key and value."""


def server_values(server: dict[str, Any], where: str) -> dict[str, Any]:
    """A ``server`` mapping's settings by flat name: its flat keys as they are, and the
    keys of each group section (``limits: {max_pixels: 1000}``; a key may be the flat name
    or the group's field name: ``store: {location: emb/}``). ConfigError naming a section
    key that is no setting of the section, or a setting given twice."""
    routes = flat_keys()
    flat: dict[str, Any] = {}
    for key, value in server.items():
        if key not in SERVER_GROUPS or not isinstance(value, dict):
            pairs = [(key, key, value)]
        else:
            members: dict[str, str] = {}
            for name, (group, attribute) in routes.items():
                if group == key:
                    members[name] = members[attribute] = name
            pairs = []
            for inner, inner_value in value.items():
                if inner not in members:
                    raise ConfigError(
                        f"{where}.{key}.{inner}: not a setting of the {key} section (value "
                        f"{inner_value!r}); accepted: " + ", ".join(sorted(set(members)))
                    )
                pairs.append((f"{key}.{inner}", members[inner], inner_value))
        for written, name, item in pairs:
            if name in flat:
                raise ConfigError(f"{where}.{written}: {name} is given twice")
            flat[name] = item
    return flat


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


@dataclass(frozen=True)
class ReplicaArgs:
    """An application's ``args``: what each of its replicas loads and the limits it keeps."""

    model: str
    mode: str
    # Exactly one of the two: 'sam2serve export' artifacts (a directory every replica can
    # read, or an fsspec URI), or an official SAM 2.1 checkpoint file (path or URI).
    artifacts: str | None = None
    checkpoint: str | None = None
    # What runs the model (sam2serve.runtime.backends); None or 'auto': the backend the
    # artifacts' manifest calls for, or the mode's for a checkpoint (choose_backend).
    backend: str | None = None
    artifacts_cache: str | None = None  # where artifacts URIs are copied (default: ~/.cache)
    checkpoint_cache: str | None = None  # where checkpoint URIs are copied (default: ~/.cache)
    images_per_replica: int = DEFAULT_IMAGES_PER_REPLICA  # image ids a replica advertises
    api_key_env: str | None = None  # environment variable with the API key, if any
    # Torch threads per replica; None: the CPUs Ray reserved for it (ray_actor_options
    # num_cpus, 1 by default), so replicas sharing a machine do not oversubscribe it.
    threads: int | None = None
    # Where a replica runs the model: "cpu", or "cuda" (the GPU Ray assigns it: give the
    # deployment ray_actor_options.num_gpus, and a checkpoint: artifacts are CPU-only).
    device: str = "cpu"
    server: dict[str, Any] = field(default_factory=dict)  # settings: flat or in sections

    @classmethod
    def from_dict(cls, raw: Any, where: str = "args") -> ReplicaArgs:
        if not isinstance(raw, dict):
            raise ConfigError(f"{where}: expected a mapping, got {raw!r}")
        known = {f.name for f in dataclasses.fields(cls)}
        for key in raw:
            if key not in known:
                raise ConfigError(
                    f"{where}.{key}: unknown key (value {raw[key]!r}); accepted: "
                    + ", ".join(sorted(known))
                )
        for key in ("model", "mode"):
            if key not in raw:
                raise ConfigError(f"{where}.{key}: required")
        if isinstance(raw["model"], str) and raw["model"] not in MODEL_SIZES:
            with contextlib.suppress(ValueError):  # a Hugging Face id: its size
                raw = {**raw, "model": model_size(raw["model"])}
        args = cls(**raw)
        args.check(where)
        return args

    @property
    def source_kind(self) -> str:
        """Where the model comes from: "artifacts" or "checkpoint"."""
        return "artifacts" if self.artifacts is not None else "checkpoint"

    @property
    def source_location(self) -> str:
        """The configured path or URI of the model."""
        location = self.artifacts if self.artifacts is not None else self.checkpoint
        assert location is not None  # checked: exactly one is given
        return location

    def runtime_backend(self, artifacts_dir: str | None = None) -> str:
        """The backend that runs the model (BackendChoiceError if none can).
        ``artifacts_dir``: the artifacts fetched to this node, whose manifest says which
        backend runs them (a URI cannot be read before it is fetched)."""
        return choose_backend(self.backend, self.mode, self.device, artifacts_dir or self.artifacts)

    def runtime_spec(self, threads: int | None, artifacts_dir: str | None = None) -> RuntimeSpec:
        """How a replica runs the model. Ray sets CUDA_VISIBLE_DEVICES to the GPU it
        assigned, so "cuda" is always that GPU (the replica's cuda:0)."""
        return RuntimeSpec(
            model=self.model,
            mode=self.mode,
            backend=self.runtime_backend(artifacts_dir),
            device=self.device,
            threads=self.threads or threads,
        )

    def check(self, where: str = "args") -> None:
        if self.model not in MODEL_SIZES:
            raise ConfigError(
                f"{where}.model: {self.model!r} is not a model size; accepted: {ACCEPTED_MODELS}"
            )
        backend = self._check_source(where)
        self._check_mode_and_device(backend, where)
        if not is_int(self.images_per_replica) or self.images_per_replica < 1:
            raise ConfigError(
                f"{where}.images_per_replica: expected an integer >= 1, "
                f"got {self.images_per_replica!r}"
            )
        if self.threads is not None and (not is_int(self.threads) or self.threads < 1):
            raise ConfigError(
                f"{where}.threads: expected an integer >= 1 (or leave it out: the CPUs Ray "
                f"reserves for the replica), got {self.threads!r}"
            )
        if not isinstance(self.server, dict):
            raise ConfigError(f"{where}.server: expected a mapping, got {self.server!r}")
        for key, value in server_values(self.server, f"{where}.server").items():
            if key not in SERVER_KEYS:
                raise ConfigError(
                    f"{where}.server.{key}: unknown setting (value {value!r}); accepted: "
                    + ", ".join(SERVER_KEYS)
                )
        try:
            self.settings(api_key=None)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"{where}.server.{exc}") from None

    def _check_source(self, where: str) -> BackendInfo:
        """Exactly one of artifacts and checkpoint, a backend that runs it, its cache."""
        for key in ("artifacts", "checkpoint", "artifacts_cache", "checkpoint_cache"):
            value = getattr(self, key)
            if value is not None and (not isinstance(value, str) or not value.strip()):
                raise ConfigError(f"{where}.{key}: expected a path or fsspec URI, got {value!r}")
        if self.artifacts is None and self.checkpoint is None:
            raise ConfigError(
                f"{where}.artifacts or {where}.checkpoint: required (neither is given); a "
                "replica loads either 'sam2serve export' artifacts (CPU) or an official SAM 2.1 "
                "checkpoint file (CPU or GPU, with a backend such as eager)"
            )
        if self.artifacts is not None and self.checkpoint is not None:
            raise ConfigError(
                f"{where}.checkpoint: {self.checkpoint!r} given with artifacts "
                f"{self.artifacts!r}; a replica loads one of them: remove the other"
            )
        for cache, source in (("artifacts_cache", "artifacts"), ("checkpoint_cache", "checkpoint")):
            if getattr(self, cache) is not None and getattr(self, source) is None:
                raise ConfigError(
                    f"{where}.{cache}: {getattr(self, cache)!r} is where {source} URIs are "
                    f"copied, but this replica loads {self.source_kind} {self.source_location!r}"
                    f"; remove it (or use {self.source_kind}_cache)"
                )
        if self.backend is not None and not isinstance(self.backend, str):
            raise ConfigError(f"{where}.backend: expected a backend name, got {self.backend!r}")
        try:
            return BACKENDS[self.runtime_backend()]
        except BackendChoiceError as exc:
            raise ConfigError(f"{where}.backend: {exc}") from None

    def _check_mode_and_device(self, backend: BackendInfo, where: str) -> None:
        """The mode and the device the backend runs, as the runtime's registry lists them."""
        modes = backend.modes or tuple(MODES)
        if self.mode not in modes:
            raise ConfigError(
                f"{where}.mode: {self.mode!r} is not run by backend {backend.name!r}; "
                f"accepted: {', '.join(modes)}"
            )
        if self.device not in REPLICA_DEVICES:
            raise ConfigError(
                f"{where}.device: expected one of {', '.join(REPLICA_DEVICES)} (a replica "
                f"uses the GPU Ray assigns it), got {self.device!r}"
            )
        if self.device in backend.devices:
            return
        if self.artifacts is not None:
            raise ConfigError(
                f"{where}.device: {self.device!r} with artifacts {self.artifacts!r}: "
                "'sam2serve export' artifacts are CPU-only (AOTInductor packages compiled "
                "for CUDA crashed when loaded); for a GPU replica give checkpoint "
                "(an official SAM 2.1 checkpoint file or URI) with backend: eager instead"
            )
        raise ConfigError(
            f"{where}.device: backend {backend.name!r} runs on {', '.join(backend.devices)}, "
            f"not {self.device!r}"
        )

    def settings(self, api_key: str | None) -> ServerSettings:
        """The replica's ServerSettings (the app is handed the replica's predictor, so the
        model fields only describe it)."""
        values = server_values(self.server, "server")
        if "cors_origins" in values:
            values["cors_origins"] = tuple(values["cors_origins"])
        return ServerSettings.from_flat(
            model=self.model,
            mode=self.mode,
            backend=self.runtime_backend(),
            artifacts=self.artifacts,
            checkpoint=self.checkpoint,
            device=self.device,
            api_key=api_key,
            warmup=False,  # the replica warms the model up before it reports ready
            **values,
        )
