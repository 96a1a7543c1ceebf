"""``cluster up | status | down``: a local Ray for trying the config file, or an
existing cluster given by address.

``up`` starts a local Ray head with ``ray start`` (so it outlives the command) unless an
address is given, deploys every application of the config file with ``serve.run`` (the
file's deployment options applied) and waits until they run. ``status`` prints each
application, its deployment, the replicas by state and the replica actors. ``down``
deletes the applications and, when ``up`` started the local Ray, stops it.
"""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
import time
from dataclasses import dataclass
from typing import Any

from sam2serve.cache import cache_path
from sam2serve.cluster.config import ClusterConfig, check_local_sources

STATE_FILE = "cluster.json"  # in the cache root: the Ray that `cluster up` started
REPLICA_ACTOR_PREFIX = "SERVE_REPLICA::"


class ClusterError(RuntimeError):
    """A cluster operation that cannot be done; the message says why and what to do."""


@dataclass(frozen=True)
class LocalRay:
    num_cpus: int
    port: int = 6379
    metrics_port: int = 8080


def _ray_cli() -> str:
    ray = shutil.which("ray")
    if ray is None:
        raise ClusterError("the 'ray' command is not installed: pip install 'sam2serve[cluster]'")
    return ray


def start_local_ray(local: LocalRay) -> str:
    """``ray start --head`` on this machine; returns the address."""
    command = [
        _ray_cli(),
        "start",
        "--head",
        f"--port={local.port}",
        f"--num-cpus={local.num_cpus}",
        f"--metrics-export-port={local.metrics_port}",
        "--include-dashboard=false",
        "--disable-usage-stats",
    ]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise ClusterError(
            f"'ray start' failed (exit {done.returncode}): "
            + (done.stderr or done.stdout).strip()[-800:]
        )
    # The head's GCS listens on the node's IP, not loopback: 'auto' finds it (the
    # newest Ray started on this machine, which is this one).
    address = "auto"
    state = cache_path(STATE_FILE)
    state.parent.mkdir(parents=True, exist_ok=True)
    state.write_text(json.dumps({"address": address, "started_by": "sam2serve cluster up"}))
    return address


def connect(address: str) -> None:
    import ray

    if ray.is_initialized():
        return
    try:
        ray.init(address=address, logging_level=logging.WARNING, log_to_driver=False)
    except (ConnectionError, RuntimeError) as exc:
        raise ClusterError(
            f"no Ray cluster at {address!r} ({exc}); start one with 'sam2serve cluster up "
            "--config FILE' or give --address"
        ) from None


def _existing_local_address() -> str | None:
    state = cache_path(STATE_FILE)
    if state.is_file():
        try:
            return str(json.loads(state.read_text())["address"])
        except (ValueError, KeyError):
            return None
    return None


def up(config: ClusterConfig, address: str | None, local: LocalRay, timeout_s: float) -> list[str]:
    """Deploy every application of ``config``; returns their URLs."""
    from ray import serve

    from sam2serve.cluster.app import bind_app

    on_this_machine = address is None
    if address is None:
        check_local_sources(config)
        address = _existing_local_address()
        try:
            if address is None:
                raise ClusterError("no local Ray yet")
            connect(address)
        except ClusterError:  # none, or a stale state file: start one
            address = start_local_ray(local)
    connect(address)
    if on_this_machine:
        check_local_gpus(config)
    serve.start(http_options=config.http_options)
    urls = []
    for spec in config.apps:
        try:
            serve.run(bind_app(spec), name=spec.name, route_prefix=spec.route_prefix)
        except Exception as exc:  # noqa: BLE001 - a replica failed to start; Ray names why
            raise ClusterError(f"application {spec.name!r} failed to deploy: {exc}") from None
        urls.append(config.url(spec))
    wait_running([spec.name for spec in config.apps], timeout_s)
    return urls


def check_local_gpus(config: ClusterConfig) -> None:
    """On the local Ray: a replica that reserves more GPUs than Ray sees here would wait
    for them forever (Ray keeps it pending) and 'up' would only time out, so say it now.
    Other clusters may add GPU nodes on demand (KubeRay), so they are not checked."""
    import ray

    have = float(ray.cluster_resources().get("GPU", 0.0))
    for spec in config.apps:
        actor = spec.deployment.get("ray_actor_options") or {}
        wanted = float(actor.get("num_gpus", 0) or 0)
        if wanted > have:
            raise ClusterError(
                f"application {spec.name!r} reserves {wanted:g} GPU(s) per replica "
                f"(ray_actor_options.num_gpus) but the local Ray sees {have:g}; run it on a "
                "machine with a GPU (check CUDA_VISIBLE_DEVICES and 'ray status'), or deploy "
                "to a GPU cluster with --address"
            )


def wait_running(names: list[str], timeout_s: float) -> None:
    from ray import serve

    deadline = time.monotonic() + timeout_s
    while True:
        apps = serve.status().applications
        states = {name: apps[name].status if name in apps else "MISSING" for name in names}
        if all(state == "RUNNING" for state in states.values()):
            return
        if time.monotonic() > deadline:
            raise ClusterError(f"applications not running after {timeout_s:g} s: {states}")
        time.sleep(1.0)


def replica_counts(app: str | None = None) -> dict[str, dict[str, int]]:
    """Replicas by state, per deployment (``app/deployment``)."""
    from ray import serve

    counts: dict[str, dict[str, int]] = {}
    for name, status in serve.status().applications.items():
        if app is not None and name != app:
            continue
        for deployment, info in status.deployments.items():
            counts[f"{name}/{deployment}"] = {str(k): v for k, v in info.replica_states.items()}
    return counts


def status_lines(address: str | None) -> list[str]:
    """What ``cluster status`` prints."""
    import ray
    from ray import serve

    connect(address or _existing_local_address() or "auto")
    status = serve.status()
    if not status.applications:
        return ["no Serve applications are running"]
    lines = []
    for name, app in status.applications.items():
        lines.append(f"application {name}: {_enum(app.status)} {app.message}".rstrip())
        for deployment, info in app.deployments.items():
            states = ", ".join(f"{_enum(k)} {v}" for k, v in info.replica_states.items())
            lines.append(
                f"  deployment {deployment}: {_enum(info.status)}; replicas: {states or 'none'}"
                + (f"; {info.message}" if info.message else "")
            )
    actors = sorted(
        a["name"]
        for a in ray.util.list_named_actors(all_namespaces=True)
        if a["name"].startswith(REPLICA_ACTOR_PREFIX)
    )
    lines.append(f"replica actors ({len(actors)}):")
    lines += [f"  {name.removeprefix(REPLICA_ACTOR_PREFIX)}" for name in actors]
    return lines


def _enum(value: Any) -> str:
    return str(getattr(value, "value", value))


def down(address: str | None) -> list[str]:
    """Delete every Serve application; stop the local Ray if ``up`` started it."""
    import ray
    from ray import serve

    local = _existing_local_address()
    connect(address or local or "auto")
    serve.shutdown()
    ray.shutdown()
    said = ["Serve applications deleted"]
    if address is None and local is not None:
        subprocess.run([_ray_cli(), "stop"], capture_output=True, text=True, check=False)
        cache_path(STATE_FILE).unlink(missing_ok=True)
        said.append("the local Ray that 'cluster up' started is stopped")
    return said
