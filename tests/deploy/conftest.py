"""The container tests' podman (skipped, with the reason, where it cannot run) and the CPU
image built once for the session (test_container_image.py, test_compose.py)."""

from __future__ import annotations

import pytest
from podman_support import CPU_IMAGE, STATE, Podman, why_podman_cannot_run


@pytest.fixture(scope="session")
def podman() -> Podman:
    reason = why_podman_cannot_run()
    if reason is not None:
        pytest.skip(reason)
    podman = Podman(STATE)
    probe = podman.run("info", check=False, timeout=120)
    if probe.returncode != 0:
        pytest.skip(f"podman cannot run here: {(probe.stdout + probe.stderr).strip()[-300:]}")
    return podman


@pytest.fixture(scope="session")
def cpu_image(podman: Podman) -> str:
    podman.ensure_base()
    seconds = podman.build(CPU_IMAGE)
    size = podman.run("image", "inspect", "--format", "{{.Size}}", CPU_IMAGE).stdout.strip()
    print(f"\n{CPU_IMAGE}: built in {seconds:.0f} s, {int(size) / 1e6:.0f} MB")
    return CPU_IMAGE
