"""``sam2serve cluster``: help that explains, user errors as one line and exit 2."""

from __future__ import annotations

from itertools import pairwise
from pathlib import Path

import yaml

from sam2serve.cli import main

REPO = Path(__file__).resolve().parents[2]


def test_help_explains_the_commands(capsys):
    assert main(["cluster", "--help"]) == 0
    out = capsys.readouterr().out
    for word in ("up", "status", "down", "burst", "serve deploy", "RayService"):
        assert word in out
    assert main(["cluster", "burst", "--help"]) == 0
    assert "execution time" in capsys.readouterr().out


def test_up_help_exports_what_the_default_config_reads(capsys):
    """The export example in 'cluster up --help' writes the artifacts directory (and the
    model and mode) that deploy/serve_tiny.yaml, the default config, reads."""
    assert main(["cluster", "up", "--help"]) == 0
    help_text = capsys.readouterr().out.replace("\\\n", " ")
    [words] = [line.split() for line in help_text.splitlines() if " export " in line]
    flags = {word: value for word, value in pairwise(words) if word.startswith("--")}
    config = yaml.safe_load((REPO / "deploy" / "serve_tiny.yaml").read_text())
    args = config["applications"][0]["args"]
    assert (flags["--out"], flags["--model"], flags["--mode"]) == (
        args["artifacts"],
        args["model"],
        args["mode"],
    )


def test_up_names_a_bad_value_before_starting_anything(tmp_path, capsys):
    raw = yaml.safe_load((REPO / "deploy" / "serve_tiny.yaml").read_text())
    raw["applications"][0]["deployments"][0]["autoscaling_config"]["max_replicas"] = "two"
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(raw))
    assert main(["cluster", "up", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert "autoscaling_config.max_replicas" in err and "'two'" in err
    assert err.count("\n") == 1


def test_up_names_a_missing_artifacts_directory(tmp_path, capsys):
    raw = yaml.safe_load((REPO / "deploy" / "serve_tiny.yaml").read_text())
    missing = tmp_path / "no-such-artifacts"
    raw["applications"][0]["args"]["artifacts"] = str(missing)
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(raw))
    assert main(["cluster", "up", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"directory '{missing}' does not exist" in err and "sam2serve export" in err


def test_up_names_a_missing_checkpoint_file(tmp_path, capsys):
    raw = yaml.safe_load((REPO / "deploy" / "serve_tiny_cuda.yaml").read_text())
    missing = tmp_path / "sam2.1_hiera_tiny.pt"
    raw["applications"][0]["args"]["checkpoint"] = str(missing)
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(raw))
    assert main(["cluster", "up", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"args.checkpoint: '{missing}' does not exist" in err and err.count("\n") == 1


def test_burst_names_a_bad_task(capsys):
    assert main(["cluster", "burst", "--url", "http://127.0.0.1:9", "--tasks", "amg,xyz"]) == 2
    assert "unknown task 'xyz'" in capsys.readouterr().err
