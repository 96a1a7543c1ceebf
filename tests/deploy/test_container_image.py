"""The CPU container image from deploy/Containerfile, built with podman from a Debian 12
base and run: its default command with SAM2SERVE_RANDOM_WEIGHTS=1 (docs/deploy.md's first
Run line) becomes ready, encodes, segments and serves the annotation page; SAM2SERVE_HOST
and SAM2SERVE_PORT win over the image's defaults; `labelstudio` answers /health and logs
an address to open; the image runs as a non-root user, holds a CPU torch and no sources,
leaves no volume behind, and its HEALTHCHECK passes. A torch index out of reach fails the
build with one line instead of installing another torch. Build and start times are printed
(pytest -s), never asserted.

Second tier (downloads and a build of several minutes the first time): pytest -m extended
tests/deploy. Skipped, with the reason, where podman cannot run."""

from __future__ import annotations

import base64
import io
import json
import os
from collections.abc import Iterator

import httpx
import numpy as np
import pytest
from PIL import Image
from podman_support import BAKED_IMAGE, Podman, extra_ca_certs, free_port, wait_for

pytestmark = pytest.mark.extended

CACHE_DIR = "/var/cache/sam2serve"
USER_ID = "10001"


def png_b64() -> str:
    pixels = np.zeros((96, 128, 3), dtype=np.uint8)
    pixels[20:70, 30:90] = (200, 60, 40)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return base64.b64encode(buffer.getvalue()).decode()


@pytest.fixture(scope="module")
def served(podman: Podman, cpu_image: str) -> Iterator[tuple[str, str]]:
    """The image's default command (`serve`) with docs/deploy.md's try-it variables, its
    address and port from the environment (a loopback port instead of 0.0.0.0:8000): its
    container name and URL."""
    name = f"sam2serve-test-serve-{os.getpid()}"
    port = free_port()
    env = {
        "SAM2SERVE_RANDOM_WEIGHTS": "1",
        "SAM2SERVE_MODEL": "tiny",
        "SAM2SERVE_HOST": "127.0.0.1",
        "SAM2SERVE_PORT": str(port),
    }
    podman.start(name, cpu_image, env=env)
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
    # the address from the environment, so that SAM2SERVE_HOST wins; no flag in CMD
    assert config["Cmd"] == ["serve"]
    assert "SAM2SERVE_HOST=0.0.0.0" in config["Env"]
    assert config["User"].split(":")[0] == USER_ID
    assert not config.get("Volumes"), config.get("Volumes")
    assert f"SAM2SERVE_CACHE={CACHE_DIR}" in config["Env"]
    # podman's inspect holds the health check beside Config, docker's inside it
    healthcheck = inspected.get("Healthcheck") or config["Healthcheck"]
    assert "/readyz" in " ".join(healthcheck["Test"])


def test_the_image_holds_a_cpu_torch_no_sources_and_the_extra_cas(podman, cpu_image):
    script = (
        "import pathlib, torch; print(torch.__version__, torch.version.cuda); "
        "print(*[p for p in ('/src', '/tmp/sam2serve-src', '/tmp/sam2serve-deps') "
        "if pathlib.Path(p).exists()])"
    )
    done = podman.run("run", "--rm", "--entrypoint", "python", cpu_image, "-c", script)
    torch_line, leftovers = done.stdout.splitlines()[-2:]
    version, cuda = torch_line.split()
    assert version.endswith("+cpu") and cuda == "None", torch_line
    assert leftovers == "", f"sources left in the image: {leftovers}"
    pems = extra_ca_certs()
    if pems:  # the build used EXTRA_CA_CERTS: pip and the system trust them
        bundle = podman.run(
            "run",
            "--rm",
            "--entrypoint",
            "cat",
            cpu_image,
            "/etc/ssl/certs/ca-certificates.crt",
            "/etc/pip.conf",
        ).stdout
        first = pems.split("-----END CERTIFICATE-----")[0].strip().splitlines()[-1]
        assert first in bundle
        assert "cert = /etc/ssl/certs/ca-certificates.crt" in bundle


def test_a_run_without_a_mount_leaves_no_volume(podman, cpu_image):
    before = podman.volumes()
    podman.run("run", "--rm", "--entrypoint", "true", cpu_image)
    assert podman.volumes() == before


def test_serve_encodes_segments_and_serves_the_page(served):
    _, url = served
    segment_once(url)
    with httpx.Client(base_url=url, timeout=120) as client:
        page = client.get("/")
        assert page.status_code == 200
        assert "text/html" in page.headers["content-type"]
        assert "<html" in page.text.lower()


def test_container_user_cache_and_healthcheck(podman, served):
    name, _ = served
    assert podman.run("exec", name, "id", "-u").stdout.strip() == USER_ID
    # the cache is writable by that user, and no volume is mounted
    podman.run("exec", name, "sh", "-c", f"touch {CACHE_DIR}/probe && rm {CACHE_DIR}/probe")
    mounts = podman.run("inspect", "--format", "{{json .Mounts}}", name).stdout.strip()
    assert json.loads(mounts) in ([], None), mounts
    assert podman.run("healthcheck", "run", name, check=False).returncode == 0, podman.logs(name)


def test_labelstudio_in_the_image_answers_health_and_logs_where_it_is(podman, cpu_image):
    name = f"sam2serve-test-labelstudio-{os.getpid()}"
    port = free_port()
    args = ["labelstudio", "--random-weights", "--model", "tiny", "--no-warmup"]
    env = {"SAM2SERVE_HOST": "127.0.0.1", "SAM2SERVE_PORT": str(port)}
    podman.start(name, cpu_image, *args, env=env)
    try:
        wait_for(podman, name, f"http://127.0.0.1:{port}/health")
        health = httpx.get(f"http://127.0.0.1:{port}/health", timeout=30).json()
        assert health["status"] == "UP" and health["model_class"] == "sam2serve", health
        assert f"on http://127.0.0.1:{port} - connect it in Label Studio" in podman.logs(name)
    finally:
        podman.run("rm", "-f", name, check=False)


def test_an_unreachable_torch_index_fails_the_build_in_one_line(podman, cpu_image):
    """The index refuses connections (PyPI stays reachable, as when a proxy blocks only
    download.pytorch.org): pip must not fall back to PyPI's torch (a CUDA build)."""
    index = "http://127.0.0.1:9/simple"
    code, log = podman.try_build(
        "localhost/sam2serve:no-torch-index",
        "--build-arg",
        f"TORCH_INDEX={index}",
        "--build-arg",
        "TORCH_VERSION=2.13.0",
        local_torch=False,
    )
    assert code != 0
    assert f"sam2serve build: no torch==2.13.0+cpu from TORCH_INDEX={index}" in log
    assert "Successfully installed" not in log.split("STEP")[-1]
    assert "nvidia" not in log.split("STEP")[-1].lower()


def test_extra_ca_certs_that_are_no_certificate_fail_the_build_in_one_line(podman, cpu_image):
    code, log = podman.try_build(
        "localhost/sam2serve:bad-ca",
        "--build-arg",
        "EXTRA_CA_CERTS=not a certificate",
        local_cas=False,
    )
    assert code != 0
    assert "sam2serve build: EXTRA_CA_CERTS holds no PEM certificate" in log


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
    assert config["Cmd"] == ["serve"]
    assert "SAM2SERVE_ARTIFACTS=/opt/sam2serve/artifacts/model" in config["Env"]
    name = f"sam2serve-test-baked-{os.getpid()}"
    port = free_port()
    # the default command, with a loopback address and a free port instead of 0.0.0.0:8000
    env = {"SAM2SERVE_HOST": "127.0.0.1", "SAM2SERVE_PORT": str(port)}
    podman.start(name, BAKED_IMAGE, env=env)
    try:
        url = f"http://127.0.0.1:{port}"
        seconds = wait_for(podman, name, f"{url}/readyz")
        print(f"\n{BAKED_IMAGE}: start -> /readyz in {seconds:.0f} s")
        ready = httpx.get(f"{url}/readyz", timeout=30).json()
        assert (ready["model"], ready["mode"], ready["backend"]) == ("tiny", "fast", "artifacts")
        segment_once(url)
    finally:
        podman.run("rm", "-f", name, check=False)
