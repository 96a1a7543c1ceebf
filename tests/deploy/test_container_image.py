"""The CPU container image from deploy/Containerfile, built with podman from a Debian 12
base and run: `serve` becomes ready, encodes, segments and serves the annotation page;
`labelstudio` answers /health; the image runs as a non-root user, keeps SAM2SERVE_CACHE
on a volume and its HEALTHCHECK passes. Build and start times are printed (pytest -s),
never asserted.

Second tier (downloads and a build of several minutes the first time): pytest -m extended
tests/deploy. Skipped, with the reason, where podman cannot run."""

from __future__ import annotations

import base64
import io
import json
import os
import socket
import time
from collections.abc import Iterator

import httpx
import numpy as np
import pytest
from PIL import Image
from podman_support import BAKED_IMAGE, CPU_IMAGE, STATE, Podman, why_podman_cannot_run

pytestmark = pytest.mark.extended

READY_WAIT_S = 900  # a bound on waiting for a container, never asserted as a duration
CACHE_DIR = "/var/cache/sam2serve"
USER_ID = "10001"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def png_b64() -> str:
    pixels = np.zeros((96, 128, 3), dtype=np.uint8)
    pixels[20:70, 30:90] = (200, 60, 40)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return base64.b64encode(buffer.getvalue()).decode()


def wait_for(podman: Podman, name: str, url: str) -> float:
    """Seconds until ``url`` answers 200 (the container must keep running meanwhile)."""
    started = time.monotonic()
    while time.monotonic() - started < READY_WAIT_S:
        if not podman.running(name):
            pytest.fail(f"container {name} stopped before {url} answered:\n{podman.logs(name)}")
        try:
            if httpx.get(url, timeout=5).status_code == 200:
                return time.monotonic() - started
        except httpx.HTTPError:
            pass
        time.sleep(1)
    pytest.fail(f"{url} did not answer 200 within {READY_WAIT_S} s:\n{podman.logs(name)}")


@pytest.fixture(scope="module")
def podman() -> Podman:
    reason = why_podman_cannot_run()
    if reason is not None:
        pytest.skip(reason)
    podman = Podman(STATE)
    probe = podman.run("info", check=False, timeout=120)
    if probe.returncode != 0:
        pytest.skip(f"podman cannot run here: {(probe.stdout + probe.stderr).strip()[-300:]}")
    return podman


@pytest.fixture(scope="module")
def cpu_image(podman: Podman) -> str:
    podman.ensure_base()
    seconds = podman.build(CPU_IMAGE)
    size = podman.run("image", "inspect", "--format", "{{.Size}}", CPU_IMAGE).stdout.strip()
    print(f"\n{CPU_IMAGE}: built in {seconds:.0f} s, {int(size) / 1e6:.0f} MB")
    return CPU_IMAGE


@pytest.fixture(scope="module")
def served(podman: Podman, cpu_image: str) -> Iterator[tuple[str, str]]:
    """`serve --random-weights --model tiny` in the image, on a loopback port: its URL."""
    name = f"sam2serve-test-serve-{os.getpid()}"
    port = free_port()
    args = ["serve", "--random-weights", "--model", "tiny"]
    args += ["--host", "127.0.0.1", "--port", str(port)]
    podman.start(name, cpu_image, *args, env={"SAM2SERVE_PORT": str(port)})
    try:
        url = f"http://127.0.0.1:{port}"
        seconds = wait_for(podman, name, f"{url}/readyz")
        print(f"\n{cpu_image}: start -> /readyz in {seconds:.0f} s")
        ready = httpx.get(f"{url}/readyz", timeout=30).json()
        assert (ready["model"], ready["device"]) == ("tiny", "cpu"), ready
        yield name, url
    finally:
        podman.run("rm", "-f", name, check=False)


def segment_once(url: str) -> None:
    """One encode and one segment request, answered with a mask."""
    with httpx.Client(base_url=url, timeout=120) as client:
        encoded = client.post("/v1/embeddings", json={"image": png_b64()})
        assert encoded.status_code == 200, encoded.text
        body = encoded.json()
        assert (body["width"], body["height"], body["model"]) == (128, 96, "tiny")
        objects = [{"points": [{"x": 60, "y": 45}], "box": [30, 20, 90, 70]}]
        request = {"image_id": body["image_id"], "objects": objects}
        segmented = client.post("/v1/segment", json=request)
        assert segmented.status_code == 200, segmented.text
        [answer] = segmented.json()["objects"]
        assert answer["masks"] and {"mask_id", "score", "bbox", "area"} <= answer["masks"][0].keys()


def test_image_config_runs_sam2serve_as_a_non_root_user(podman, cpu_image):
    inspected = json.loads(podman.run("image", "inspect", cpu_image).stdout)[0]
    config = inspected["Config"]
    assert config["Entrypoint"] == ["sam2serve"]
    assert config["Cmd"] == ["serve", "--host", "0.0.0.0"]
    assert config["User"].split(":")[0] == USER_ID
    assert CACHE_DIR in config["Volumes"]
    assert f"SAM2SERVE_CACHE={CACHE_DIR}" in config["Env"]
    # podman's inspect holds the health check beside Config, docker's inside it
    healthcheck = inspected.get("Healthcheck") or config["Healthcheck"]
    assert "/readyz" in " ".join(healthcheck["Test"])


def test_serve_encodes_segments_and_serves_the_page(served):
    _, url = served
    segment_once(url)
    with httpx.Client(base_url=url, timeout=120) as client:
        page = client.get("/")
        assert page.status_code == 200
        assert "text/html" in page.headers["content-type"]
        assert "<html" in page.text.lower()


def test_container_user_cache_volume_and_healthcheck(podman, served):
    name, _ = served
    assert podman.run("exec", name, "id", "-u").stdout.strip() == USER_ID
    # the cache volume is writable by that user
    podman.run("exec", name, "sh", "-c", f"touch {CACHE_DIR}/probe && rm {CACHE_DIR}/probe")
    assert podman.run("healthcheck", "run", name, check=False).returncode == 0, podman.logs(name)


def test_labelstudio_in_the_image_answers_health(podman, cpu_image):
    name = f"sam2serve-test-labelstudio-{os.getpid()}"
    port = free_port()
    args = ["labelstudio", "--random-weights", "--model", "tiny", "--no-warmup"]
    args += ["--host", "127.0.0.1", "--port", str(port)]
    podman.start(name, cpu_image, *args, env={"SAM2SERVE_PORT": str(port)})
    try:
        wait_for(podman, name, f"http://127.0.0.1:{port}/health")
        health = httpx.get(f"http://127.0.0.1:{port}/health", timeout=30).json()
        assert health["status"] == "UP" and health["model_class"] == "sam2serve", health
    finally:
        podman.run("rm", "-f", name, check=False)


def test_the_baked_target_serves_its_artifacts_by_default(podman, cpu_image):
    """Target baked: `sam2serve export` at build time (random weights, eager decoder: the
    cheapest export), and the image's default command serves them."""
    seconds = podman.build(
        BAKED_IMAGE,
        "--target",
        "baked",
        "--build-arg",
        "BAKE_ARGS=--random-weights --decoder eager",
    )
    print(f"\n{BAKED_IMAGE}: built in {seconds:.0f} s (on top of {cpu_image})")
    config = json.loads(podman.run("image", "inspect", BAKED_IMAGE).stdout)[0]["Config"]
    assert "--artifacts" in config["Cmd"] and config["Cmd"][:3] == ["serve", "--host", "0.0.0.0"]
    name = f"sam2serve-test-baked-{os.getpid()}"
    port = free_port()
    # the default command, with a loopback address and a free port instead of 0.0.0.0:8000
    args = [*config["Cmd"], "--port", str(port)]
    args[args.index("--host") + 1] = "127.0.0.1"
    podman.start(name, BAKED_IMAGE, *args, env={"SAM2SERVE_PORT": str(port)})
    try:
        url = f"http://127.0.0.1:{port}"
        seconds = wait_for(podman, name, f"{url}/readyz")
        print(f"\n{BAKED_IMAGE}: start -> /readyz in {seconds:.0f} s")
        ready = httpx.get(f"{url}/readyz", timeout=30).json()
        assert (ready["model"], ready["mode"], ready["backend"]) == ("tiny", "fast", "artifacts")
        segment_once(url)
    finally:
        podman.run("rm", "-f", name, check=False)
