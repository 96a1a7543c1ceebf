"""What a replica loads: its model source fetched to this node, then built into a
Predictor by the runtime, with the time each step took.

Ray-free, so it is tested without a cluster; :class:`sam2serve.cluster.app.SAM2Replica`
calls :func:`load_replica_model` in its constructor, then warms the predictor up.

- ``artifacts``: the directory, or a copy of the URI keyed by its manifest
  (:mod:`sam2serve.cluster.artifacts`), run by the backend the manifest calls for
  (``artifacts``, CPU; ``onnxruntime`` for an ONNX export), which checks every file
  against the manifest and compiles nothing.
- ``checkpoint`` (CPU or the GPU Ray assigned): the file, or a copy of the URI
  (:mod:`sam2serve.cluster.checkpoints`), run by a backend that starts from weights
  (``eager``; ``compile`` pays its compilation in the warm-up).

Either way the predictor comes from :func:`sam2serve.runtime.build.build_predictor`, the
constructor every surface uses.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sam2serve.cluster.args import ReplicaArgs

if TYPE_CHECKING:
    from sam2serve.engine.predictor import Predictor


@dataclass(frozen=True)
class ModelSource:
    """Where a replica's model came from, as its report and metrics state it."""

    kind: str  # "artifacts" or "checkpoint"
    location: str  # the path or URI the configuration named
    local_path: str  # the directory (artifacts) or file (checkpoint) loaded
    copied: bool  # fetched through fsspec on this start (else used in place or cached)
    sha256: str  # of the artifacts' manifest, or of the checkpoint file


@dataclass(frozen=True)
class LoadedModel:
    predictor: Predictor
    source: ModelSource
    # Seconds per cold-start stage: "fetch_model" (to a local path), "load_model" (to a
    # Predictor); readiness.STAGES lists them with the others.
    stages_s: dict[str, float]


def fetch_model(args: ReplicaArgs) -> ModelSource:
    """The replica's artifacts or checkpoint on this node (copied once per node)."""
    if args.artifacts is not None:
        from sam2serve.cluster.artifacts import resolve_artifacts

        local = resolve_artifacts(args.artifacts, args.artifacts_cache)
        return ModelSource(
            "artifacts", local.source, str(local.directory), local.copied, local.manifest_sha256
        )
    from sam2serve.cluster.checkpoints import resolve_checkpoint_file

    assert args.checkpoint is not None  # checked by ReplicaArgs: exactly one is given
    checkpoint = resolve_checkpoint_file(args.checkpoint, args.checkpoint_cache)
    return ModelSource(
        "checkpoint", checkpoint.source, str(checkpoint.path), checkpoint.copied, checkpoint.sha256
    )


def load_replica_model(args: ReplicaArgs, threads: int | None = None) -> LoadedModel:
    """The replica's Predictor, not yet warm, its process set up for it (threads, TF32:
    a replica's process runs this one model, and loads it once). ``threads``: torch threads
    when ``args`` names none (a replica passes the CPUs Ray reserved for it)."""
    from sam2serve.runtime.build import build_predictor
    from sam2serve.runtime.process import configure_process
    from sam2serve.runtime.spec import WeightsSource

    clock = time.perf_counter()
    source = fetch_model(args)
    fetched = time.perf_counter()
    if source.kind == "artifacts":
        weights = WeightsSource(artifacts=source.local_path)
        spec = args.runtime_spec(threads, artifacts_dir=source.local_path)
    else:
        weights = WeightsSource(checkpoint=source.local_path)
        spec = args.runtime_spec(threads)
    configure_process(spec)
    predictor = build_predictor(spec, weights)
    stages = {"fetch_model": fetched - clock, "load_model": time.perf_counter() - fetched}
    return LoadedModel(predictor, source, stages)
