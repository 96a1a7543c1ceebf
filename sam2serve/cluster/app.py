"""The service as a Ray Serve application: one deployment per model/mode.

Each replica of :class:`SAM2Replica` loads its model
(:func:`sam2serve.cluster.model_source.load_replica_model`: ``sam2serve export`` artifacts
on the CPU, or an official checkpoint on the CPU or the GPU Ray assigned it, each from a
shared path or an fsspec URI copied to a local cache), runs one encode and one decode, and
only then finishes its constructor, so Ray Serve routes to it only once it is warm. It then serves the very app ``sam2serve serve`` serves
(:func:`sam2serve.server.app.create_app`), wrapped by :class:`ReplicaIngress`.

Within a replica, concurrent encodes are batched across requests by the app's model
worker (``server.max_batch_size`` / ``server.max_wait_ms`` in the config file).

``build_app(args)`` is the application builder that ``import_path`` names in the config
file (``serve deploy``, ``serve run``, KubeRay); ``bind_app(spec)`` builds the same
application with the file's deployment options applied, for ``sam2serve cluster up``.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from typing import Any

from ray import serve
from ray.serve import Application

from sam2serve.cluster.config import AppSpec, ReplicaArgs, deployment_name
from sam2serve.cluster.ingress import ReplicaIngress
from sam2serve.cluster.readiness import (
    ReadinessMetrics,
    ReplicaReport,
    compile_frames,
    process_start_time,
    record_ray_metrics,
)
from sam2serve.runtime.warmup import warm_up

log = logging.getLogger("sam2serve.cluster")


def _reserved_cpus() -> int:
    """The CPUs Ray reserved for this replica (its ray_actor_options num_cpus), at least 1."""
    import ray

    reserved = ray.get_runtime_context().get_assigned_resources().get("CPU", 1.0)
    return max(1, int(reserved))


@dataclasses.dataclass(frozen=True)
class HeldImage:
    """What the multiplexing cache holds for an image id or a video session id: only the
    fact that this replica has it; the embedding or the session lives in the app."""

    image_id: str


@serve.deployment
@serve.ingress()
class SAM2Replica:
    """One replica: a warm model (artifacts or a checkpoint), the service app, its report."""

    def __init__(self, args: dict[str, Any]) -> None:
        constructor_started = time.time()
        from sam2serve.cluster.model_source import load_replica_model
        from sam2serve.server.app import create_app

        self.args = ReplicaArgs.from_dict(args)
        stages = {"process_to_constructor": max(0.0, constructor_started - process_start_time())}
        loaded = load_replica_model(self.args, threads=_reserved_cpus())
        stages.update(loaded.stages_s)
        predictor, source = loaded.predictor, loaded.source
        clock = time.perf_counter()
        warm_up(predictor)  # with backend compile, this is where it compiles
        stages["warmup"] = time.perf_counter() - clock

        context = serve.get_replica_context()
        weights = predictor.model.weights_info
        assert predictor.runtime is not None  # set by build_predictor
        self.report = ReplicaReport(
            replica=context.replica_id.unique_id,
            deployment=context.deployment,
            app=context.app_name,
            model=self.args.model,
            mode=self.args.mode,
            backend=predictor.runtime.backend or "custom",
            device=predictor.runtime.device,
            source_kind=source.kind,
            source_location=source.location,
            source_local=source.local_path,
            source_copied=source.copied,
            source_sha256=source.sha256,
            weights=weights.as_dict(),
            compile_frames=compile_frames(),
            stages_s={k: round(v, 3) for k, v in stages.items()},
        )
        if weights.is_random:
            log.warning("replica %s serves %s", self.report.replica, weights.describe())
        api_key = os.environ.get(self.args.api_key_env) if self.args.api_key_env else None
        settings = self.args.settings(api_key or None)
        self.service_app = create_app(settings, predictor)
        self.metrics = ReadinessMetrics(self.report)
        self.ray_metrics = record_ray_metrics(self.report)  # kept: exported while alive

        async def hold(image_id: str) -> HeldImage:
            return HeldImage(image_id)

        # Built here, not as a decorated method, because its size comes from the config.
        # Image ids and video session ids share it: room for every session the app may hold.
        held = self.args.images_per_replica + (
            settings.video.max_video_sessions if settings.video.enabled else 0
        )
        self.hold = serve.multiplexed(max_num_models_per_replica=held)(hold)
        log.info("replica ready: %s", self.report.as_dict())

    def __serve_build_asgi_app__(self) -> ReplicaIngress:
        return ReplicaIngress(
            self.service_app,
            self.report,
            self.metrics,
            hold=self.hold,
            multiplexed_id=serve.get_multiplexed_model_id,
        )

    async def check_health(self) -> None:
        """Ray Serve's health check: the app's own /readyz must answer 200."""
        import httpx

        transport = httpx.ASGITransport(app=self.service_app)
        async with httpx.AsyncClient(transport=transport, base_url="http://replica") as client:
            answer = await client.get("/readyz")
        if answer.status_code != 200:
            raise RuntimeError(f"/readyz answered {answer.status_code}: {answer.text[:200]}")

    def describe(self) -> dict[str, Any]:
        """The readiness report (also served at GET /cluster/replica)."""
        return self.report.as_dict()


def build_app(args: dict[str, Any]) -> Application:
    """The application builder named by ``import_path`` in the config file."""
    checked = ReplicaArgs.from_dict(args)
    name = deployment_name(checked.model, checked.mode)
    return SAM2Replica.options(name=name).bind(dataclasses.asdict(checked))  # type: ignore[attr-defined]  # @serve.deployment made the class a Deployment


def bind_app(spec: AppSpec) -> Application:
    """The application of one config entry, with its deployment options applied."""
    name = deployment_name(spec.args.model, spec.args.mode)
    deployment = SAM2Replica.options(name=name, **spec.deployment)  # type: ignore[attr-defined]  # @serve.deployment made the class a Deployment
    return deployment.bind(dataclasses.asdict(spec.args))


__all__ = ["SAM2Replica", "bind_app", "build_app"]
