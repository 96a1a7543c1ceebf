"""The cluster configuration file: a Ray Serve config file whose applications run
:func:`sam2serve.cluster.app.build_app`, one application (and one deployment) per
model/mode.

The same file works with ``sam2serve cluster up``, ``serve deploy`` / ``serve run`` and as
KubeRay's ``serveConfigV2``, so nothing here invents a format: :func:`load_config` reads
the YAML, checks what sam2serve needs with messages that name the key and its value
(``applications[0].deployments[0].autoscaling_config.max_replicas: ...``), then lets
Ray's own schema check the rest.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sam2serve.config import MODEL_SIZES
from sam2serve.server.settings import ServerSettings

IMPORT_PATH = "sam2serve.cluster.app:build_app"
EXPORT_MODES = ("fast", "furious")  # the modes 'sam2serve export' writes
DEFAULT_IMAGES_PER_REPLICA = 32
# A replica runs on the CPU or on the one GPU Ray assigns it (always its cuda:0).
REPLICA_DEVICES = ("cpu", "cuda")
# ServerSettings fields a replica takes from the file. The model comes from the
# artifacts, the API key from an environment variable, and a replica always warms up.
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
SERVER_KEYS = tuple(
    f.name for f in dataclasses.fields(ServerSettings) if f.name not in NOT_SERVER_KEYS
)
AUTOSCALING_KEYS = (
    "min_replicas",
    "max_replicas",
    "target_ongoing_requests",
    "upscale_delay_s",
    "downscale_delay_s",
)


class ConfigError(ValueError):
    """A configuration file that cannot be used; the message names the key and value."""


def deployment_name(model: str, mode: str) -> str:
    """The deployment of one model/mode, e.g. ``sam2_tiny_fast``."""
    return f"sam2_{model}_{mode}"


@dataclass(frozen=True)
class ReplicaArgs:
    """An application's ``args``: what each of its replicas loads and the limits it keeps."""

    model: str
    mode: str
    artifacts: str  # a directory every replica can read, or an fsspec URI
    artifacts_cache: str | None = None  # where fsspec URIs are copied (default: ~/.cache)
    images_per_replica: int = DEFAULT_IMAGES_PER_REPLICA  # image ids a replica advertises
    api_key_env: str | None = None  # environment variable with the API key, if any
    # Torch threads per replica; None: the CPUs Ray reserved for it (ray_actor_options
    # num_cpus, 1 by default), so replicas sharing a machine do not oversubscribe it.
    threads: int | None = None
    # Where a replica runs the model: "cpu", or "cuda" (the GPU Ray assigns it: give the
    # deployment ray_actor_options.num_gpus, and artifacts exported with --device cuda).
    device: str = "cpu"
    server: dict[str, Any] = field(default_factory=dict)  # ServerSettings fields

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
        for key in ("model", "mode", "artifacts"):
            if key not in raw:
                raise ConfigError(f"{where}.{key}: required")
        args = cls(**raw)
        args.check(where)
        return args

    def check(self, where: str = "args") -> None:
        if self.model not in MODEL_SIZES:
            raise ConfigError(
                f"{where}.model: {self.model!r} is not a model size; "
                f"accepted: {', '.join(MODEL_SIZES)}"
            )
        if self.mode not in EXPORT_MODES:
            raise ConfigError(
                f"{where}.mode: {self.mode!r} has no export artifacts; "
                f"accepted: {', '.join(EXPORT_MODES)}"
            )
        if not isinstance(self.artifacts, str) or not self.artifacts.strip():
            raise ConfigError(
                f"{where}.artifacts: expected a directory or fsspec URI of "
                f"'sam2serve export' artifacts, got {self.artifacts!r}"
            )
        if not _is_int(self.images_per_replica) or self.images_per_replica < 1:
            raise ConfigError(
                f"{where}.images_per_replica: expected an integer >= 1, "
                f"got {self.images_per_replica!r}"
            )
        if self.device not in REPLICA_DEVICES:
            raise ConfigError(
                f"{where}.device: expected one of {', '.join(REPLICA_DEVICES)} (a replica "
                f"uses the GPU Ray assigns it), got {self.device!r}"
            )
        if self.threads is not None and (not _is_int(self.threads) or self.threads < 1):
            raise ConfigError(
                f"{where}.threads: expected an integer >= 1 (or leave it out: the CPUs Ray "
                f"reserves for the replica), got {self.threads!r}"
            )
        if not isinstance(self.server, dict):
            raise ConfigError(f"{where}.server: expected a mapping, got {self.server!r}")
        for key, value in self.server.items():
            if key not in SERVER_KEYS:
                raise ConfigError(
                    f"{where}.server.{key}: unknown setting (value {value!r}); accepted: "
                    + ", ".join(SERVER_KEYS)
                )
        try:
            self.settings(api_key=None)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"{where}.server.{exc}") from None

    def settings(self, api_key: str | None) -> ServerSettings:
        """The replica's ServerSettings (model and weights come from the artifacts)."""
        values = dict(self.server)
        if "cors_origins" in values:
            values["cors_origins"] = tuple(values["cors_origins"])
        return ServerSettings(
            model=self.model,
            mode=self.mode,
            artifacts=self.artifacts,
            device=self.device,
            api_key=api_key,
            warmup=False,  # the replica warms the model up before it reports ready
            **values,
        )


@dataclass(frozen=True)
class AppSpec:
    """One application of the file: one model/mode, one deployment."""

    name: str
    route_prefix: str
    args: ReplicaArgs
    deployment: dict[str, Any]  # Ray Serve deployment options, the name left out


@dataclass(frozen=True)
class ClusterConfig:
    raw: dict[str, Any]  # the file as Ray Serve reads it
    apps: tuple[AppSpec, ...]
    source: str = "<dict>"

    @property
    def http_options(self) -> dict[str, Any]:
        return dict(self.raw.get("http_options") or {})

    @property
    def host(self) -> str:
        return str(self.http_options.get("host", "127.0.0.1"))

    @property
    def port(self) -> int:
        return int(self.http_options.get("port", 8000))

    def url(self, app: AppSpec) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "::") else self.host
        return f"http://{host}:{self.port}{app.route_prefix.rstrip('/')}"


def load_config(path: str | Path) -> ClusterConfig:
    """Read and check a cluster configuration file (YAML)."""
    import yaml

    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {str(path)!r} does not exist")
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise ConfigError(f"cannot read config file {str(path)!r}: {exc}") from None
    try:
        return parse_config(raw, source=str(path))
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None


def parse_config(raw: Any, source: str = "<dict>") -> ClusterConfig:
    """Check a configuration already parsed from YAML or built in code."""
    if not isinstance(raw, dict):
        raise ConfigError(f"expected a mapping with 'applications', got {raw!r}")
    apps_raw = raw.get("applications")
    if not isinstance(apps_raw, list) or not apps_raw:
        raise ConfigError(
            f"applications: expected a non-empty list of applications, got {apps_raw!r}"
        )
    apps = tuple(_app(app, f"applications[{i}]") for i, app in enumerate(apps_raw))
    for key in ("name", "route_prefix"):
        seen: set[str] = set()
        for i, app in enumerate(apps):
            value = getattr(app, key)
            if value in seen:
                raise ConfigError(f"applications[{i}].{key}: {value!r} is used twice")
            seen.add(value)
    _check_with_ray(raw)
    return ClusterConfig(raw, apps, source)


def _app(raw: Any, where: str) -> AppSpec:
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: expected a mapping, got {raw!r}")
    name = raw.get("name")
    if not isinstance(name, str) or not name:
        raise ConfigError(f"{where}.name: expected a non-empty string, got {name!r}")
    if raw.get("import_path") != IMPORT_PATH:
        raise ConfigError(
            f"{where}.import_path: expected {IMPORT_PATH!r}, got {raw.get('import_path')!r}"
        )
    prefix = raw.get("route_prefix", "/")
    if not isinstance(prefix, str) or not prefix.startswith("/"):
        raise ConfigError(f"{where}.route_prefix: expected a path like '/', got {prefix!r}")
    args = ReplicaArgs.from_dict(raw.get("args"), f"{where}.args")
    expected = deployment_name(args.model, args.mode)
    deployments = raw.get("deployments")
    if not isinstance(deployments, list) or len(deployments) != 1:
        raise ConfigError(
            f"{where}.deployments: expected a list with one deployment named {expected!r}, "
            f"got {deployments!r}"
        )
    options = deployments[0]
    if not isinstance(options, dict):
        raise ConfigError(f"{where}.deployments[0]: expected a mapping, got {options!r}")
    if options.get("name") != expected:
        raise ConfigError(
            f"{where}.deployments[0].name: expected {expected!r} (the deployment of model "
            f"{args.model!r}, mode {args.mode!r}), got {options.get('name')!r}"
        )
    options = {k: v for k, v in options.items() if k != "name"}
    _check_deployment(options, f"{where}.deployments[0]")
    _check_gpus(args.device, options, f"{where}.deployments[0].ray_actor_options.num_gpus")
    return AppSpec(name, prefix, args, options)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _check_deployment(options: dict[str, Any], where: str) -> None:
    """The options this project documents, checked with messages naming key and value."""
    ongoing = options.get("max_ongoing_requests")
    if ongoing is not None and (not _is_int(ongoing) or ongoing < 1):
        raise ConfigError(
            f"{where}.max_ongoing_requests: expected an integer >= 1, got {ongoing!r}"
        )
    queued = options.get("max_queued_requests")
    if queued is not None and (not _is_int(queued) or not (queued == -1 or queued >= 1)):
        raise ConfigError(
            f"{where}.max_queued_requests: expected an integer >= 1 (or -1: no limit), "
            f"got {queued!r}"
        )
    scaling = options.get("autoscaling_config")
    if scaling is None:
        return
    if "num_replicas" in options and options["num_replicas"] != "auto":
        raise ConfigError(
            f"{where}.num_replicas: {options['num_replicas']!r} cannot be combined with "
            "autoscaling_config; remove one of them"
        )
    key = f"{where}.autoscaling_config"
    if not isinstance(scaling, dict):
        raise ConfigError(f"{key}: expected a mapping, got {scaling!r}")
    for name in ("min_replicas", "max_replicas"):
        value = scaling.get(name)
        if value is not None and (not _is_int(value) or value < 0):
            raise ConfigError(f"{key}.{name}: expected an integer >= 0, got {value!r}")
    low, high = scaling.get("min_replicas", 1), scaling.get("max_replicas", 1)
    if high < max(low, 1):
        raise ConfigError(
            f"{key}.max_replicas: {high!r} is below min_replicas {low!r} (or 1); "
            "expected max_replicas >= max(min_replicas, 1)"
        )
    target = scaling.get("target_ongoing_requests")
    if target is not None and (not _is_number(target) or target <= 0):
        raise ConfigError(f"{key}.target_ongoing_requests: expected a number > 0, got {target!r}")
    for name in ("upscale_delay_s", "downscale_delay_s"):
        value = scaling.get(name)
        if value is not None and (not _is_number(value) or value < 0):
            raise ConfigError(f"{key}.{name}: expected a number of seconds >= 0, got {value!r}")


def _check_gpus(device: str, options: dict[str, Any], where: str) -> None:
    """A CUDA replica needs Ray to reserve it a GPU, and a CPU replica must not hold one."""
    actor = options.get("ray_actor_options") or {}
    gpus = actor.get("num_gpus", 0) if isinstance(actor, dict) else 0
    if device == "cuda" and not (_is_number(gpus) and gpus > 0):
        raise ConfigError(
            f"{where}: args.device is 'cuda', so each replica needs a GPU: expected a number "
            f"> 0 (e.g. 1, or 0.5 to share one), got {gpus!r}"
        )
    if device == "cpu" and _is_number(gpus) and gpus > 0:
        raise ConfigError(
            f"{where}: {gpus!r} GPUs reserved for replicas that run on the CPU; set "
            "args.device: cuda, or remove num_gpus"
        )


def _check_with_ray(raw: dict[str, Any]) -> None:
    """Ray Serve's own schema, for every key this module does not check itself."""
    try:
        from ray.serve.config import AutoscalingConfig
        from ray.serve.schema import ServeDeploySchema
    except ImportError:  # deploying needs Ray anyway; checking a file does not
        return
    from pydantic import ValidationError

    try:
        ServeDeploySchema.model_validate(raw)
        for i, app in enumerate(raw["applications"]):
            scaling = app["deployments"][0].get("autoscaling_config")
            if scaling is not None:
                try:
                    AutoscalingConfig.model_validate(scaling)
                except ValidationError as exc:
                    raise _named(exc, f"applications[{i}].deployments[0].autoscaling_config")
    except ValidationError as exc:
        raise _named(exc, "") from None


def _named(exc: Any, prefix: str) -> ConfigError:
    first = exc.errors()[0]
    where = prefix
    for part in first["loc"]:
        where += f"[{part}]" if isinstance(part, int) else (f".{part}" if where else str(part))
    value = first.get("input")
    return ConfigError(f"{where}: {first['msg']} (got {value!r})")


def check_local_artifacts(config: ClusterConfig) -> None:
    """For a cluster on this machine: every plain-path artifacts directory exists."""
    from sam2serve.cluster.artifacts import is_uri

    for i, app in enumerate(config.apps):
        location = app.args.artifacts
        if is_uri(location):
            continue
        directory = Path(location).expanduser()
        if not (directory / "manifest.json").is_file():
            what = "does not exist" if not directory.exists() else "has no manifest.json"
            raise ConfigError(
                f"applications[{i}].args.artifacts: directory {location!r} {what}; make it "
                f"with 'sam2serve export --model {app.args.model} --mode {app.args.mode} "
                f"{'--device cuda ' if app.args.device == 'cuda' else ''}--out {location}'"
            )
