"""Podman for the container tests: its own storage under a cache folder, a Debian 12 base
made with mmdebstrap (no image registry is needed), the image built from
deploy/Containerfile, containers on the host's network (loopback addresses only).

The state folder is ``$SAM2SERVE_CONTAINERS_DIR``, default ~/.cache/sam2serve/containers:
the base tarball and the layers stay there, so a rerun rebuilds only what changed."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CONTAINERFILE = REPO / "deploy" / "Containerfile"
STATE = Path(
    os.environ.get("SAM2SERVE_CONTAINERS_DIR")
    or Path.home() / ".cache" / "sam2serve" / "containers"
)
BASE_IMAGE = "localhost/sam2serve-base:bookworm"
CPU_IMAGE = "localhost/sam2serve:cpu"
BAKED_IMAGE = "localhost/sam2serve:cpu-tiny-fast-smoke"
BASE_TIMEOUT_S = 1800  # mmdebstrap downloads ~60 MB of packages
BUILD_TIMEOUT_S = 3600  # the first build downloads torch's dependencies and the rest
# This machine's runtime settings: crun refuses its hybrid cgroups (so runc, cgroupfs), and
# the default ulimits cannot be set in its containers.
CONTAINERS_CONF = """\
[containers]
default_ulimits = []

[engine]
cgroup_manager = "cgroupfs"
runtime = "runc"
"""
# The host's CA bundle (a TLS-intercepting proxy's CA, where there is one) goes into the
# base, and pip inside the build uses it: the recipe keeps the ordinary indexes.
HOST_CA_BUNDLE = "/etc/ssl/host-ca-bundle.crt"


def why_podman_cannot_run() -> str | None:
    """The one reason the container tests are skipped here, or None."""
    if not sys.platform.startswith("linux"):
        return f"podman containers need Linux (this is {sys.platform})"
    if os.geteuid() != 0:
        return "the container tests run podman as root (rootless podman needs subuid setup)"
    missing = [tool for tool in ("podman", "mmdebstrap", "runc") if shutil.which(tool) is None]
    if missing:
        return f"missing {', '.join(missing)} (apt-get install podman mmdebstrap runc)"
    return None


def host_ca_bundle() -> Path | None:
    for candidate in (os.environ.get("PIP_CERT"), "/etc/ssl/certs/ca-certificates.crt"):
        if candidate and Path(candidate).is_file():
            return Path(candidate)
    return None


@dataclass
class Podman:
    state: Path

    def __post_init__(self) -> None:
        self.state.mkdir(parents=True, exist_ok=True)
        self.conf = self.state / "containers.conf"
        self.conf.write_text(CONTAINERS_CONF)

    def command(self, *args: str) -> list[str]:
        return [
            "podman",
            "--root",
            str(self.state / "storage"),
            "--runroot",
            str(self.state / "run"),
            *args,
        ]

    def run(
        self, *args: str, timeout: float = 120, check: bool = True, log: Path | None = None
    ) -> subprocess.CompletedProcess:
        __tracebackhide__ = True  # a failure shows podman's output, not this function
        env = {**os.environ, "CONTAINERS_CONF": str(self.conf)}
        if log is None:
            done = subprocess.run(
                self.command(*args),
                check=False,
                env=env,
                capture_output=True,
                text=True,
                timeout=timeout,
            )
            output = done.stdout + done.stderr
        else:
            with log.open("w") as sink:
                done = subprocess.run(
                    self.command(*args),
                    check=False,
                    env=env,
                    stdout=sink,
                    stderr=subprocess.STDOUT,
                    text=True,
                    timeout=timeout,
                )
            output = log.read_text()
        if check and done.returncode != 0:
            raise AssertionError(
                f"podman {' '.join(args[:3])} ... exited {done.returncode}:\n{output[-4000:]}"
            )
        return done

    def exists(self, image: str) -> bool:
        return self.run("image", "exists", image, check=False).returncode == 0

    def ensure_base(self) -> None:
        """Debian 12 minbase from mmdebstrap, imported once (the tarball kept for reruns)."""
        if self.exists(BASE_IMAGE):
            return
        tarball = self.state / "base.tar"
        if not tarball.exists():
            partial = self.state / "base.tar.partial"
            if partial.is_dir():
                shutil.rmtree(partial)
            hooks: list[str] = []
            ca = host_ca_bundle()
            if ca is not None:
                target = f'"$1{HOST_CA_BUNDLE}"'
                hooks = [f"--customize-hook=mkdir -p $(dirname {target}) && cp {ca} {target}"]
            # its chroot (with /proc mounted) outside /tmp, where tree walks could keep
            # the mount busy at clean-up
            scratch = self.state / "tmp"
            scratch.mkdir(exist_ok=True)
            made = subprocess.run(
                [
                    "mmdebstrap",
                    "--variant=minbase",
                    "--format=tar",
                    *hooks,
                    "bookworm",
                    str(partial),
                ],
                check=False,
                capture_output=True,
                text=True,
                timeout=BASE_TIMEOUT_S,
                env={**os.environ, "TMPDIR": str(scratch)},
            )
            if made.returncode != 0:
                raise AssertionError(f"mmdebstrap exited {made.returncode}:\n{made.stderr[-3000:]}")
            partial.rename(tarball)
        changes = []
        if host_ca_bundle() is not None:
            changes = ["--change", f"ENV PIP_CERT={HOST_CA_BUNDLE}"]
        self.run("import", *changes, str(tarball), BASE_IMAGE, timeout=600)

    def torch_index(self) -> list[str]:
        """Build arguments that take torch from the CPU wheel this host's pip finds (the
        recipe's default index, download.pytorch.org, may be out of reach): a one-package
        index mounted into the build. None where the installed torch is no CPU build."""
        import torch

        version = torch.__version__
        if not version.endswith("+cpu"):
            return []
        wheels = self.state / "wheels"
        wheels.mkdir(exist_ok=True)
        found = list(wheels.glob(f"torch-{version}-cp311-*.whl"))
        if not found:
            subprocess.run(
                [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps"]
                + ["--only-binary=:all:", "--python-version", "3.11", "--platform"]
                + ["manylinux_2_28_x86_64", "-d", str(wheels), f"torch=={version}"],
                check=False,
                capture_output=True,
                timeout=1200,
            )
            found = list(wheels.glob(f"torch-{version}-cp311-*.whl"))
        if not found:
            return []
        index = self.state / "torch-index"
        (index / "torch").mkdir(parents=True, exist_ok=True)
        name = found[0].name
        (index / "torch" / "index.html").write_text(
            f'<html><body><a href="file:///torch-wheels/{name}">{name}</a></body></html>\n'
        )
        return [
            "-v",
            f"{index}:/torch-index:ro",
            "-v",
            f"{wheels}:/torch-wheels:ro",
            "--build-arg",
            "TORCH_INDEX=file:///torch-index",
            "--build-arg",
            f"TORCH_VERSION={version.split('+')[0]}",
        ]

    def build(self, tag: str, *extra: str) -> float:
        """deploy/Containerfile built from the base into ``tag``; the seconds it took."""
        started = time.monotonic()
        self.run(
            "build",
            "--format",
            "docker",
            "--network",
            "host",
            "--runtime",
            "runc",
            "--build-arg",
            f"BASE={BASE_IMAGE}",
            *self.torch_index(),
            *extra,
            "-f",
            str(CONTAINERFILE),
            "-t",
            tag,
            str(REPO),
            timeout=BUILD_TIMEOUT_S,
            log=self.state / f"build-{tag.rsplit(':', 1)[-1]}.log",
        )
        return time.monotonic() - started

    def start(self, name: str, image: str, *args: str, env: dict[str, str]) -> None:
        self.run("rm", "-f", name, check=False)
        flags = [item for key, value in env.items() for item in ("-e", f"{key}={value}")]
        self.run("run", "-d", "--name", name, "--network", "host", *flags, image, *args)

    def running(self, name: str) -> bool:
        done = self.run("inspect", "--format", "{{.State.Running}}", name, check=False)
        return done.stdout.strip() == "true"

    def logs(self, name: str) -> str:
        done = self.run("logs", name, check=False)
        return (done.stdout + done.stderr)[-4000:]
