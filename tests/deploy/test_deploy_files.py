"""deploy/ and docs/deploy.md agree with the recipe: every image a deploy file names is one
docs/deploy.md builds from deploy/Containerfile; the recipe keeps its entrypoint, default
command, user and health check, takes its address from the environment, declares no
volume, pins and checks a CPU torch, takes extra CA certificates and leaves no sources;
compose.yaml starts `serve` and `labelstudio` on the ports they listen on; the Run section
starts with a line that needs no weights (first tier: reads files only; the image is built
and run by test_container_image.py, compose by test_compose.py, second tier)."""

from __future__ import annotations

import contextlib
import io
import re
import shlex
from pathlib import Path

import yaml

from sam2serve import cli

REPO = Path(__file__).resolve().parents[2]
RECIPE = REPO / "deploy" / "Containerfile"


def help_of(command: str) -> str:
    """``sam2serve COMMAND --help``, whitespace collapsed (argparse wraps its lines)."""
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.suppress(SystemExit):
        cli.main([command, "--help"])
    return " ".join(stdout.getvalue().split())


def recipe_lines() -> list[str]:
    """The recipe's instructions, continuation lines joined, comments dropped."""
    text = RECIPE.read_text()
    text = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
    return [line for line in text.replace("\\\n", " ").splitlines() if line.strip()]


def stage(name: str) -> list[str]:
    """The instructions of the stage ``FROM ... AS name``."""
    lines = recipe_lines()
    start = next(i for i, line in enumerate(lines) if re.match(rf"FROM \S+ AS {name}$", line))
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("FROM ")), None)
    return lines[start:end]


IMAGE_NAME = re.compile(r"\bsam2serve:(cpu|cuda)[a-z0-9-]*")


def built_tags() -> set[str]:
    """The ``-t sam2serve:TAG`` of every build command in docs/deploy.md."""
    text = (REPO / "docs" / "deploy.md").read_text()
    builds = re.findall(r"podman build[^`]*?-t (sam2serve:[a-z0-9-]+)", text.replace("\\\n", " "))
    return set(builds)


def test_every_image_a_deploy_file_names_is_built_by_the_docs():
    tags = built_tags()
    assert {"sam2serve:cpu", "sam2serve:cuda", "sam2serve:cpu-ray"} <= tags
    named = {
        path.name: {match.group(0) for match in IMAGE_NAME.finditer(path.read_text())}
        for path in sorted((REPO / "deploy").glob("*.yaml"))
    }
    assert named["rayservice_tiny.yaml"] == {"sam2serve:cpu-ray"}
    for name, images in named.items():
        # cuda-ray is the cpu-ray build with the CUDA index (the docs' table says so)
        unknown = {image for image in images if image.replace("cuda", "cpu") not in tags}
        assert not unknown, f"deploy/{name} names images docs/deploy.md does not build: {unknown}"


def test_the_recipe_keeps_its_contract():
    recipe = RECIPE.read_text()
    assert 'ENTRYPOINT ["sam2serve"]' in recipe
    assert "SAM2SERVE_CACHE=/var/cache/sam2serve" in recipe
    assert re.search(r"^USER 10001", recipe, re.MULTILINE)
    assert re.search(r"^HEALTHCHECK .*\n.*/readyz", recipe, re.MULTILINE)
    assert re.search(r"^FROM service AS baked$", recipe, re.MULTILINE)
    # the build context: the package and what installs it, never tests or caches
    ignore = (REPO / ".dockerignore").read_text().split()
    assert ignore[ignore.index("*") :][:4] == ["*", "!pyproject.toml", "!README.md", "!sam2serve"]


def test_the_address_comes_from_the_environment_so_sam2serve_variables_win():
    lines = recipe_lines()
    envs = " ".join(line for line in lines if line.startswith("ENV "))
    assert "SAM2SERVE_HOST=0.0.0.0" in envs
    commands = [line for line in lines if line.startswith("CMD ")]
    assert commands and all(line == 'CMD ["serve"]' for line in commands), commands
    # and the variable is the one `serve` and `labelstudio` read for --host
    for command in ("serve", "labelstudio"):
        help_text = help_of(command)
        assert "[env SAM2SERVE_HOST]" in help_text and "[env SAM2SERVE_PORT]" in help_text


def test_the_baked_target_sets_its_artifacts_through_the_environment():
    lines = stage("baked")
    assert not any(line.startswith("CMD ") for line in lines)
    envs = " ".join(line for line in lines if line.startswith("ENV "))
    assert "SAM2SERVE_ARTIFACTS=/opt/sam2serve/artifacts/model" in envs


def test_the_recipe_declares_no_volume():
    assert not [line for line in recipe_lines() if line.startswith("VOLUME")]


def test_torch_is_pinned_to_its_build_and_checked_after_install():
    lines = recipe_lines()
    assert "ARG TORCH_VARIANT=cpu" in lines
    [torch_step] = [
        line for line in lines if line.startswith('RUN pip install --index-url "$TORCH_INDEX"')
    ]
    assert '"torch==$TORCH_VERSION+$TORCH_VARIANT"' in torch_step
    # one line when the index gives no such torch, and the installed build checked
    assert '|| { echo "sam2serve build: no torch==$TORCH_VERSION+$TORCH_VARIANT' in torch_step
    assert "torch.version.cuda is None" in torch_step and "sys.exit(" in torch_step
    # the dependencies' install keeps that pin (it cannot swap torch for PyPI's)
    [deps_step] = [line for line in lines if "/tmp/sam2serve-deps[$EXTRAS]" in line]
    assert '"torch==$TORCH_VERSION+$TORCH_VARIANT"' in deps_step


def test_extra_ca_certificates_are_a_build_argument_used_before_any_download():
    lines = recipe_lines()
    assert "ARG EXTRA_CA_CERTS=" in lines
    runs = [line for line in lines if line.startswith("RUN ")]
    first = runs[0]
    assert "EXTRA_CA_CERTS" in first and "/usr/local/share/ca-certificates" in first
    assert "update-ca-certificates" in first and "/etc/pip.conf" in first
    # installed before apt-get and pip run
    assert first.index("/usr/local/share/ca-certificates") < first.index("apt-get")
    assert all("pip install" not in line for line in runs[:1])


def test_the_sources_are_installed_from_tmp_and_removed():
    lines = recipe_lines()
    assert not [line for line in lines if re.search(r"\s/src\b", line)], "a /src is back"
    assert not [line for line in lines if "pip install -e" in line or "--editable" in line]
    [install] = [line for line in lines if "/tmp/sam2serve-src" in line and line.startswith("RUN")]
    assert "rm -rf /tmp/sam2serve-src" in install


def compose() -> dict:
    return yaml.safe_load((REPO / "deploy" / "compose.yaml").read_text())


def environment(service: dict) -> dict[str, str | None]:
    entries = service.get("environment") or []
    if isinstance(entries, dict):
        return dict(entries)
    return {k: v for k, _, v in (e.partition("=") for e in entries)} | {
        e: None for e in entries if "=" not in e
    }


def test_compose_starts_serve_and_a_label_studio_pointed_at_the_ml_backend():
    services = compose()["services"]
    assert set(services) == {"serve", "ml-backend", "label-studio"}
    serve, backend, studio = services["serve"], services["ml-backend"], services["label-studio"]
    assert serve["command"] == ["serve"] and backend["command"] == ["labelstudio"]
    for service in (serve, backend):
        assert "sam2serve:cpu" in service["image"]
        assert service["volumes"] == ["sam2serve-cache:/var/cache/sam2serve"]
    assert "label-studio" in studio["image"]
    # the ports each command listens on, published on loopback only
    assert serve["ports"] == ["127.0.0.1:${SAM2SERVE_SERVE_PORT:-8000}:8000"]
    assert backend["ports"] == ["127.0.0.1:${SAM2SERVE_BACKEND_PORT:-9090}:9090"]
    assert studio["ports"] == ["127.0.0.1:${LABEL_STUDIO_PORT:-8080}:8080"]
    backend_env = environment(backend)
    # each listens on its command's own port (serve 8000, labelstudio 9090: their help)
    assert "SAM2SERVE_PORT" not in backend_env and "SAM2SERVE_PORT" not in environment(serve)
    assert "(default: 9090;" in help_of("labelstudio")
    # Label Studio reaches the backend by its service name: the Host check must allow it
    assert backend_env["SAM2SERVE_ALLOWED_HOSTS"] == "ml-backend"
    assert environment(serve)["SAM2SERVE_ALLOWED_HOSTS"] == "serve"
    # the backend reads Label Studio's uploads at Label Studio's service name and port
    assert backend_env["LABEL_STUDIO_URL"] == "http://label-studio:8080"
    assert "LABEL_STUDIO_API_KEY" in backend_env
    # only named volumes, all declared
    declared = set(compose()["volumes"])
    for service in services.values():
        for volume in service.get("volumes", []):
            assert volume.split(":")[0] in declared, volume
    # the variables compose.yaml sets are flags' variables the commands read
    for name, service in (("serve", serve), ("labelstudio", backend)):
        help_text = help_of(name)
        for variable in environment(service):
            if variable.startswith("SAM2SERVE_") and variable != "SAM2SERVE_API_KEY":
                assert f"[env {variable}]" in help_text, (name, variable)


def test_the_run_section_starts_with_a_try_it_without_weights_line():
    text = (REPO / "docs" / "deploy.md").read_text()
    run = text[text.index("\n## Run\n") :]
    first_block = re.search(r"```bash\n(.*?)```", run, re.DOTALL).group(1)
    first_command = next(line for line in first_block.splitlines() if line and line[0] != "#")
    words = shlex.split(first_command)
    assert words[:2] == ["podman", "run"] and words[-1] == "sam2serve:cpu"
    assert "SAM2SERVE_RANDOM_WEIGHTS=1" in words
    # the requirements are stated there, not only in the tests
    section = run[: run.index("\n### ")]
    for need in ("runc", "cgroupfs", "default_ulimits", "subuid"):
        assert need in section, need
