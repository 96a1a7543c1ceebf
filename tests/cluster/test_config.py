"""The cluster config file: the shipped files load, every bad value is named, a replica's
model comes from exactly one of artifacts (CPU) and a checkpoint (CPU or GPU)."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from sam2serve.cluster.config import (
    ConfigError,
    check_local_sources,
    load_config,
    parse_config,
)

REPO = Path(__file__).resolve().parents[2]
SHIPPED = sorted((REPO / "deploy").glob("serve_*.yaml"))


def good() -> dict:
    return {
        "http_options": {"host": "127.0.0.1", "port": 8000},
        "applications": [
            {
                "name": "tiny-fast",
                "route_prefix": "/",
                "import_path": "sam2serve.cluster.app:build_app",
                "args": {"model": "tiny", "mode": "fast", "artifacts": "/nonexistent/art"},
                "deployments": [
                    {
                        "name": "sam2_tiny_fast",
                        "max_queued_requests": 8,
                        "autoscaling_config": {
                            "min_replicas": 1,
                            "max_replicas": 2,
                            "target_ongoing_requests": 2,
                            "upscale_delay_s": 5,
                            "downscale_delay_s": 60,
                        },
                    }
                ],
            }
        ],
    }


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_shipped_config_files_load(path):
    config = load_config(path)
    app = config.apps[0]
    scaling = app.deployment["autoscaling_config"]
    assert scaling["min_replicas"] <= scaling["max_replicas"]
    assert app.deployment["backpressure_config"]["retry_after_s"] > 0
    assert config.url(app) == "http://127.0.0.1:8000"


def edit(path: str, value) -> dict:
    raw = copy.deepcopy(good())
    target = raw
    keys = path.split(".")
    for key in keys[:-1]:
        target = target[int(key)] if key.isdigit() else target[key]
    target[keys[-1]] = value
    return raw


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        (
            "applications.0.deployments.0.autoscaling_config.max_replicas",
            0,
            r"applications\[0\]\.deployments\[0\]\.autoscaling_config\.max_replicas: 0 is below",
        ),
        (
            "applications.0.deployments.0.autoscaling_config.min_replicas",
            -1,
            r"autoscaling_config\.min_replicas: expected an integer >= 0, got -1",
        ),
        (
            "applications.0.deployments.0.autoscaling_config.target_ongoing_requests",
            0,
            r"target_ongoing_requests: expected a number > 0, got 0",
        ),
        (
            "applications.0.deployments.0.autoscaling_config.upscale_delay_s",
            "soon",
            r"upscale_delay_s: expected a number of seconds >= 0, got 'soon'",
        ),
        (
            "applications.0.deployments.0.max_queued_requests",
            0,
            r"max_queued_requests: expected an integer >= 1 \(or -1: no limit\), got 0",
        ),
        ("applications.0.args.model", "huge", r"args\.model: 'huge' is not a model size"),
        (
            "applications.0.args.mode",
            "baseline",
            r"args\.mode: 'baseline' is not run by backend 'artifacts'; accepted: fast, furious",
        ),
        ("applications.0.args.server", {"max_queue": 0}, r"args\.server\.max_queue must be"),
        ("applications.0.args.server", {"max_qeue": 3}, r"args\.server\.max_qeue: unknown"),
        (
            "applications.0.args.server",
            {"limits": {"max_queue": 3}},
            r"args\.server\.limits\.max_queue: not a setting of the limits section \(value 3\)",
        ),
        (
            "applications.0.args.server",
            {"batching": {"max_queue": 0}},
            r"args\.server\.max_queue must be an integer >= 1, got 0",
        ),
        (
            "applications.0.args.server",
            {"max_queue": 3, "batching": {"max_queue": 4}},
            r"args\.server\.batching\.max_queue: max_queue is given twice",
        ),
        ("applications.0.args.colour", "red", r"args\.colour: unknown key \(value 'red'\)"),
        (
            "applications.0.deployments.0.name",
            "sam2",
            r"deployments\[0\]\.name: expected 'sam2_tiny_fast'.*got 'sam2'",
        ),
        ("applications.0.import_path", "x:y", r"import_path: expected 'sam2serve"),
        (
            "applications.0.deployments.0.health_check_period_s",
            "often",
            r"applications\[0\]\.deployments\[0\]\.health_check_period_s: .*'often'",
        ),
    ],
)
def test_bad_values_are_named(path, value, message):
    with pytest.raises(ConfigError, match=message):
        parse_config(edit(path, value))


def test_missing_artifacts_directory_is_named():
    config = parse_config(good())
    with pytest.raises(ConfigError, match=r"args\.artifacts: directory '/nonexistent/art' does"):
        check_local_sources(config)


def with_args(device: str = "cpu", num_gpus: float | None = None, **args) -> dict:
    """good() with these args (None removes a key) and, if given, num_gpus per replica."""
    raw = copy.deepcopy(good())
    app = raw["applications"][0]
    app["args"]["device"] = device
    for key, value in args.items():
        if value is None:
            app["args"].pop(key, None)
        else:
            app["args"][key] = value
    if num_gpus is not None:
        app["deployments"][0]["ray_actor_options"] = {"num_gpus": num_gpus, "num_cpus": 1}
    return raw


CHECKPOINT = "/nonexistent/sam2.1_hiera_tiny.pt"


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (
            with_args(artifacts=None),
            (
                r"applications\[0\]\.args\.artifacts or applications\[0\]\.args\.checkpoint: "
                r"required \(neither is given\); a replica loads either"
            ),
        ),
        (
            with_args(checkpoint=CHECKPOINT),
            (
                r"args\.checkpoint: '/nonexistent/sam2\.1_hiera_tiny\.pt' given with artifacts "
                r"'/nonexistent/art'; a replica loads one of them"
            ),
        ),
        (
            with_args(artifacts=None, checkpoint=""),
            r"args\.checkpoint: expected a path or fsspec URI, got ''",
        ),
        (
            with_args(artifacts=None, checkpoint=CHECKPOINT, backend="tensorrt-llm"),
            (
                r"args\.backend: unknown backend 'tensorrt-llm'; expected one of auto, eager, "
                r"compile, openvino, artifacts, onnxruntime"
            ),
        ),
        (
            with_args(backend="eager"),
            (
                r"args\.backend: backend 'eager' starts from weights, but '/nonexistent/art' is "
                r"'sam2serve export' output: run it with backend 'artifacts' \(or auto\)"
            ),
        ),
        (
            with_args(artifacts=None, checkpoint=CHECKPOINT, backend="artifacts"),
            (
                r"args\.backend: backend 'artifacts' runs 'sam2serve export' output: give the "
                r"export directory \(artifacts\), or a backend that starts from weights: eager, "
                r"compile, openvino"
            ),
        ),
        (
            with_args(device="cuda", num_gpus=1),
            (
                r"args\.device: 'cuda' with artifacts '/nonexistent/art': 'sam2serve export' "
                r"artifacts are CPU-only .*give checkpoint .* with backend: eager"
            ),
        ),
        (
            with_args(
                device="cuda", num_gpus=1, artifacts=None, checkpoint=CHECKPOINT, backend="openvino"
            ),
            r"args\.device: backend 'openvino' runs on cpu, not 'cuda'",
        ),
        (
            with_args(artifacts=None, checkpoint=CHECKPOINT, backend="openvino", mode="baseline"),
            r"args\.mode: 'baseline' is not run by backend 'openvino'; accepted: fast, furious",
        ),
        (
            with_args(artifacts=None, checkpoint=CHECKPOINT, artifacts_cache="/var/cache/a"),
            (
                r"args\.artifacts_cache: '/var/cache/a' is where artifacts URIs are copied, but this "
                r"replica loads checkpoint .*use checkpoint_cache"
            ),
        ),
        (
            with_args(checkpoint_cache="/var/cache/c"),
            r"args\.checkpoint_cache: '/var/cache/c' is where checkpoint URIs are copied",
        ),
        (
            with_args(device="cuda", artifacts=None, checkpoint=CHECKPOINT),
            (
                r"deployments\[0\]\.ray_actor_options\.num_gpus: args\.device is 'cuda', so each "
                r"replica needs a GPU: expected a number > 0 .*got 0"
            ),
        ),
        (
            with_args(num_gpus=1),
            r"ray_actor_options\.num_gpus: 1 GPUs reserved for replicas that run on the CPU",
        ),
    ],
    ids=[
        "no-source",
        "both-sources",
        "empty-checkpoint",
        "unknown-backend",
        "weights-backend-with-artifacts",
        "artifacts-backend-with-checkpoint",
        "cuda-artifacts",
        "cuda-openvino",
        "mode-not-run-by-backend",
        "artifacts-cache-with-checkpoint",
        "checkpoint-cache-with-artifacts",
        "cuda-without-gpus",
        "cpu-with-gpus",
    ],
)
def test_model_source_rules_are_named(raw, message):
    with pytest.raises(ConfigError, match=message):
        parse_config(raw)


@pytest.mark.parametrize(
    ("backend", "mode", "device", "expected"),
    [
        (None, "fast", "cuda", "eager"),  # a checkpoint defaults to eager
        ("compile", "furious", "cuda", "compile"),
        ("eager", "baseline", "cpu", "eager"),  # any mode: nothing was exported
        ("openvino", "fast", "cpu", "openvino"),
    ],
)
def test_a_checkpoint_runs_with_a_backend_that_starts_from_weights(backend, mode, device, expected):
    raw = with_args(
        device=device,
        num_gpus=1 if device == "cuda" else None,
        artifacts=None,
        checkpoint="s3://bucket/sam2.1_hiera_tiny.pt",
        backend=backend,
        mode=mode,
    )
    raw["applications"][0]["deployments"][0]["name"] = f"sam2_tiny_{mode}"
    args = parse_config(raw).apps[0].args
    spec = args.runtime_spec(threads=4)
    assert (spec.backend, spec.device, spec.mode, spec.threads) == (expected, device, mode, 4)
    assert args.source_kind == "checkpoint"
    assert args.settings(api_key=None).runtime.checkpoint == "s3://bucket/sam2.1_hiera_tiny.pt"


def test_server_settings_may_be_flat_or_in_their_groups_sections():
    """A flat name and its group's section set the same setting; ``video`` and ``store``
    are settings when given a value and sections when given a mapping."""
    flat = {"max_queue": 5, "video": True, "store": "file:///emb", "max_pixels": 1000}
    sections = {
        "batching": {"max_queue": 5},
        "video": {"enabled": True},
        "store": {"location": "file:///emb"},
        "limits": {"max_pixels": 1000},
    }
    for server in (flat, sections):
        settings = parse_config(with_args(server=server)).apps[0].args.settings(api_key=None)
        assert settings.batching.max_queue == 5 and settings.video.enabled is True
        assert settings.store.location == "file:///emb" and settings.limits.max_pixels == 1000
        assert settings.runtime.warmup is False  # a replica warms up before it is ready


def test_artifacts_default_to_their_backend_and_threads_to_the_reserved_cpus():
    args = parse_config(good()).apps[0].args
    spec = args.runtime_spec(threads=2)
    assert (args.source_kind, spec.backend, spec.device, spec.threads) == (
        "artifacts",
        "artifacts",
        "cpu",
        2,
    )
    pinned = parse_config(with_args(threads=3)).apps[0].args
    assert pinned.runtime_spec(threads=2).threads == 3  # the file's threads win


def test_local_checkpoint_files_are_checked(tmp_path):
    missing = tmp_path / "sam2.1_hiera_tiny.pt"
    config = parse_config(with_args(artifacts=None, checkpoint=str(missing)))
    with pytest.raises(
        ConfigError,
        match=rf"applications\[0\]\.args\.checkpoint: '{missing}' does not exist; give the "
        r"path \(or fsspec URI\) of Meta's sam2\.1_hiera_tiny\.pt",
    ):
        check_local_sources(config)
    missing.write_bytes(b"weights")
    check_local_sources(config)  # exists: the replica's load checks what it holds
    uri = parse_config(with_args(artifacts=None, checkpoint="s3://bucket/sam2.1_hiera_tiny.pt"))
    check_local_sources(uri)  # URIs are the replicas' to read


def test_a_bad_file_names_itself(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("applications: [\n")
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_config(path)
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "missing.yaml")


def test_the_kuberay_example_embeds_a_valid_config():
    import yaml

    service = yaml.safe_load((REPO / "deploy" / "rayservice_tiny.yaml").read_text())
    assert service["kind"] == "RayService"
    config = parse_config(yaml.safe_load(service["spec"]["serveConfigV2"]))
    assert config.host == "0.0.0.0" and config.apps[0].args.artifacts == "/artifacts/tiny-fast"
