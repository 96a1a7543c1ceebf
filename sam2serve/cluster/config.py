"""The cluster configuration file: a Ray Serve config file whose applications run
:func:`sam2serve.cluster.app.build_app`, one application (and one deployment) per
model/mode.

The same file works with ``sam2serve cluster up``, ``serve deploy`` / ``serve run`` and as
KubeRay's ``serveConfigV2``, so nothing here invents a format: :func:`load_config` reads
the YAML, checks what sam2serve needs with messages that name the key and its value
(``applications[0].deployments[0].autoscaling_config.max_replicas: ...``), then lets
Ray's own schema check the rest. An application's ``args`` (what its replicas load) are
checked by :class:`sam2serve.cluster.args.ReplicaArgs`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sam2serve.cluster.args import ConfigError, ReplicaArgs, is_int, is_number
from sam2serve.config import MODEL_CONFIGS

IMPORT_PATH = "sam2serve.cluster.app:build_app"


def deployment_name(model: str, mode: str) -> str:
    """The deployment of one model/mode, e.g. ``sam2_tiny_fast``."""
    return f"sam2_{model}_{mode}"


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


def _check_deployment(options: dict[str, Any], where: str) -> None:
    """The options this project documents, checked with messages naming key and value."""
    ongoing = options.get("max_ongoing_requests")
    if ongoing is not None and (not is_int(ongoing) or ongoing < 1):
        raise ConfigError(
            f"{where}.max_ongoing_requests: expected an integer >= 1, got {ongoing!r}"
        )
    queued = options.get("max_queued_requests")
    if queued is not None and (not is_int(queued) or not (queued == -1 or queued >= 1)):
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
        if value is not None and (not is_int(value) or value < 0):
            raise ConfigError(f"{key}.{name}: expected an integer >= 0, got {value!r}")
    low, high = scaling.get("min_replicas", 1), scaling.get("max_replicas", 1)
    if high < max(low, 1):
        raise ConfigError(
            f"{key}.max_replicas: {high!r} is below min_replicas {low!r} (or 1); "
            "expected max_replicas >= max(min_replicas, 1)"
        )
    target = scaling.get("target_ongoing_requests")
    if target is not None and (not is_number(target) or target <= 0):
        raise ConfigError(f"{key}.target_ongoing_requests: expected a number > 0, got {target!r}")
    for name in ("upscale_delay_s", "downscale_delay_s"):
        value = scaling.get(name)
        if value is not None and (not is_number(value) or value < 0):
            raise ConfigError(f"{key}.{name}: expected a number of seconds >= 0, got {value!r}")


def _check_gpus(device: str, options: dict[str, Any], where: str) -> None:
    """A CUDA replica needs Ray to reserve it a GPU, and a CPU replica must not hold one."""
    actor = options.get("ray_actor_options") or {}
    gpus = actor.get("num_gpus", 0) if isinstance(actor, dict) else 0
    if device == "cuda" and not (is_number(gpus) and gpus > 0):
        raise ConfigError(
            f"{where}: args.device is 'cuda', so each replica needs a GPU: expected a number "
            f"> 0 (e.g. 1, or 0.5 to share one), got {gpus!r}"
        )
    if device == "cpu" and is_number(gpus) and gpus > 0:
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


def check_local_sources(config: ClusterConfig) -> None:
    """For a cluster on this machine: every plain-path artifacts directory and checkpoint
    file exists (URIs are read by the replicas, with their own errors)."""
    from sam2serve.cluster.artifacts import is_uri

    for i, app in enumerate(config.apps):
        args, where = app.args, f"applications[{i}].args"
        location = args.source_location
        if is_uri(location):
            continue
        path = Path(location).expanduser()
        if args.checkpoint is not None:
            if not path.is_file():
                what = "is not a file" if path.exists() else "does not exist"
                name = MODEL_CONFIGS[args.model].checkpoint_names[0]
                raise ConfigError(
                    f"{where}.checkpoint: {location!r} {what}; give the path (or fsspec URI) "
                    f"of Meta's {name}, readable by every replica"
                )
        elif not (path / "manifest.json").is_file():
            what = "does not exist" if not path.exists() else "has no manifest.json"
            raise ConfigError(
                f"{where}.artifacts: directory {location!r} {what}; make it with "
                f"'sam2serve export --model {args.model} --mode {args.mode} --out {location}'"
            )


__all__ = [
    "AppSpec",
    "ClusterConfig",
    "ConfigError",
    "ReplicaArgs",
    "check_local_sources",
    "deployment_name",
    "load_config",
    "parse_config",
]
