"""The cluster config file: the shipped files load, every bad value is named."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from sam2serve.cluster.config import (
    ConfigError,
    check_local_artifacts,
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
        ("applications.0.args.mode", "baseline", r"args\.mode: 'baseline' has no export"),
        ("applications.0.args.server", {"max_queue": 0}, r"args\.server\.max_queue must be"),
        ("applications.0.args.server", {"max_qeue": 3}, r"args\.server\.max_qeue: unknown"),
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
        check_local_artifacts(config)


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
