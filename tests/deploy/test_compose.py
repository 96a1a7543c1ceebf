"""deploy/compose.yaml brought up with podman-compose, as docs/deploy.md's try-it line does
(SAM2SERVE_RANDOM_WEIGHTS=1): `serve` answers /healthz and the ML backend (`sam2serve
labelstudio`) /health over loopback, on the ports the file publishes; the whole stack is
torn down and its named volumes removed after.

Label Studio's image cannot be pulled here (no registry), so its service runs a stand-in
(label_studio_standin.py, in the sam2serve image) through an override file: it connects
the backend by its compose name as "Connect Model" does (/health, /setup), serves a task's
upload only with the token, and asks for a prediction for a click. That proves the wiring
compose.yaml sets up (names, the backend's Host check, LABEL_STUDIO_URL and its token,
the fetch of Label Studio's upload); it is not Label Studio itself.

Second tier: pytest -m extended tests/deploy/test_compose.py (podman and podman-compose;
skipped, with the reason, where either is missing)."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from podman_support import READY_WAIT_S, REPO, Podman, free_port

pytestmark = pytest.mark.extended

COMPOSE_FILE = REPO / "deploy" / "compose.yaml"
STANDIN = Path(__file__).resolve().parent / "label_studio_standin.py"
TOKEN = "compose-test-token"
UP_TIMEOUT_S = 600


def compose_override(image: str) -> str:
    """Label Studio's service replaced by the stand-in (JSON is YAML)."""
    standin = {
        "image": image,
        "entrypoint": ["python", "/standin/label_studio_standin.py"],
        "command": [],
        "environment": [
            f"LABEL_STUDIO_API_KEY={TOKEN}",
            "STANDIN_BACKEND_URL=http://ml-backend:9090",
        ],
        "volumes": [f"{STANDIN.parent}:/standin:ro"],
    }
    return json.dumps({"services": {"label-studio": standin}}, indent=2)


class Compose:
    """podman-compose on the test's podman storage (a wrapper script as its podman)."""

    def __init__(self, podman: Podman, folder: Path, image: str, ports: dict[str, int]):
        self.podman = podman
        self.volumes_before: set[str] = set()
        self.project = f"sam2serve-compose-test-{os.getpid()}"
        wrapper = folder / "podman"
        wrapper.write_text("#!/bin/sh\nexec " + shlex.join(podman.command()) + ' "$@"\n')
        wrapper.chmod(0o755)
        override = folder / "standin.yaml"
        override.write_text(compose_override(image))
        self.base = [
            "podman-compose",
            "--podman-path",
            str(wrapper),
            "-p",
            self.project,
            "-f",
            str(COMPOSE_FILE),
            "-f",
            str(override),
        ]
        self.env = {
            **os.environ,
            "CONTAINERS_CONF": str(podman.conf),
            # docs/deploy.md's try-it line
            "SAM2SERVE_RANDOM_WEIGHTS": "1",
            "SAM2SERVE_IMAGE": image,
            "SAM2SERVE_SERVE_PORT": str(ports["serve"]),
            "SAM2SERVE_BACKEND_PORT": str(ports["ml-backend"]),
            "LABEL_STUDIO_PORT": str(ports["label-studio"]),
            "LABEL_STUDIO_API_KEY": TOKEN,
        }

    def __call__(self, *args: str, timeout: float = UP_TIMEOUT_S) -> subprocess.CompletedProcess:
        return subprocess.run(
            [*self.base, *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def containers(self) -> list[str]:
        done = self.podman.run(
            "ps",
            "-a",
            "--filter",
            f"label=io.podman.compose.project={self.project}",
            "--format",
            "{{.Names}}",
        )
        return done.stdout.split()

    def volumes(self) -> set[str]:
        return {name for name in self.podman.volumes() if name.startswith(self.project)}

    def wait_healthy(self, name: str) -> None:
        started = time.monotonic()
        while time.monotonic() - started < READY_WAIT_S:
            if self.podman.run("healthcheck", "run", name, check=False).returncode == 0:
                return
            time.sleep(2)
        pytest.fail(f"{name}'s HEALTHCHECK did not pass within {READY_WAIT_S} s:\n{self.logs()}")

    def logs(self) -> str:
        return "\n".join(f"--- {name}\n{self.podman.logs(name)}" for name in self.containers())


def wait_ok(compose: Compose, url: str) -> dict:
    started = time.monotonic()
    while time.monotonic() - started < READY_WAIT_S:
        try:
            answer = httpx.get(url, timeout=5)
            if answer.status_code == 200:
                return answer.json()
        except httpx.HTTPError:
            pass
        time.sleep(1)
    pytest.fail(f"{url} did not answer 200 within {READY_WAIT_S} s:\n{compose.logs()}")


@pytest.fixture(scope="module")
def stack(podman: Podman, cpu_image: str, tmp_path_factory) -> Iterator[tuple[Compose, dict]]:
    if shutil.which("podman-compose") is None:
        pytest.skip("podman-compose is missing (apt-get install podman-compose)")
    ports = {name: free_port() for name in ("serve", "ml-backend", "label-studio")}
    compose = Compose(podman, tmp_path_factory.mktemp("compose"), cpu_image, ports)
    started = time.monotonic()
    compose.volumes_before = podman.volumes()
    try:
        up = compose("up", "-d")
        assert up.returncode == 0, (up.stdout + up.stderr)[-4000:]
        yield compose, ports
    finally:
        down = compose("down", timeout=300)
        # podman-compose 1.0.3's down keeps the named volumes (as docker compose's does)
        # and the project's network (docker compose removes it): both removed here
        for volume in compose.volumes():
            podman.run("volume", "rm", "-f", volume, check=False)
        podman.run("network", "rm", "-f", f"{compose.project}_default", check=False)
        print(f"\ncompose: up, checks, down in {time.monotonic() - started:.0f} s")
        assert down.returncode == 0, (down.stdout + down.stderr)[-4000:]
        assert podman.volumes() == compose.volumes_before
        assert not [name for name in podman.networks() if name.startswith(compose.project)]


def test_serve_and_the_ml_backend_answer_over_loopback(stack):
    compose, ports = stack
    assert wait_ok(compose, f"http://127.0.0.1:{ports['serve']}/healthz")
    health = wait_ok(compose, f"http://127.0.0.1:{ports['ml-backend']}/health")
    assert health["status"] == "UP" and health["model_class"] == "sam2serve", health
    # the image's HEALTHCHECK passes in both, on each command's own port (no SAM2SERVE_PORT)
    for service in ("serve", "ml-backend"):
        compose.wait_healthy(f"{compose.project}_{service}_1")
    # only the named volumes compose.yaml declares (podman-compose prefixes the project's
    # name): no anonymous one
    made = compose.podman.volumes() - compose.volumes_before
    declared = {f"{compose.project}_{name}" for name in ("sam2serve-cache", "label-studio-data")}
    assert f"{compose.project}_sam2serve-cache" in made and made <= declared, made


def test_label_studio_connects_the_backend_by_name_and_gets_a_mask(stack):
    compose, ports = stack
    url = f"http://127.0.0.1:{ports['label-studio']}/standin/result"
    started = time.monotonic()
    result = wait_ok(compose, url)
    while not result["done"] and time.monotonic() - started < READY_WAIT_S:
        time.sleep(2)
        result = wait_ok(compose, url)
    steps = result["steps"]
    assert result["done"] and steps.get("predict"), f"{result}\n{compose.logs()}"
    assert steps["health"][0] == 200 and steps["setup"][0] == 200, steps
    status, answer = steps["predict"]
    assert status == 200, f"{answer}\n{compose.logs()}"
    [prediction] = answer["results"]
    kinds = {region["type"] for region in prediction["result"]}
    assert "brushlabels" in kinds, prediction
    # the backend read the task's upload from Label Studio's address, with the token
    assert result["uploads_served"] >= 1 and result["uploads_refused"] == 0, result
    for name in compose.containers():
        logs = compose.podman.run("logs", name, check=False)
        assert "Traceback" not in logs.stdout + logs.stderr, compose.podman.logs(name)


def test_down_leaves_nothing_behind(podman, stack):
    compose, _ = stack
    down = compose("down", timeout=300)
    assert down.returncode == 0, (down.stdout + down.stderr)[-4000:]
    assert compose.containers() == []
