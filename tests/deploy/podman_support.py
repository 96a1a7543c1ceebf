"""Podman for the container tests: its own storage under a cache folder, a Debian 12 base
made with mmdebstrap (no image registry is needed), the image built from
deploy/Containerfile, containers on the host's network (loopback addresses only).

The state folder is ``$SAM2SERVE_CONTAINERS_DIR``, default ~/.cache/sam2serve/containers:
the base tarball and the layers stay there, so a rerun rebuilds only what changed."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

REPO = Path(__file__).resolve().parents[2]
CONTAINERFILE = REPO / "deploy" / "Containerfile"
STATE = Path(
    os.environ.get("SAM2SERVE_CONTAINERS_DIR")
    or Path.home() / ".cache" / "sam2serve" / "containers"
)
# plain Debian (an earlier base had the host's CA bundle inside: a new name, a new base)
BASE_IMAGE = "localhost/sam2serve-base:bookworm-plain"
CPU_IMAGE = "localhost/sam2serve:cpu"
BAKED_IMAGE = "localhost/sam2serve:cpu-tiny-fast-smoke"
BASE_TIMEOUT_S = 1800  # mmdebstrap downloads ~60 MB of packages
READY_WAIT_S = 900  # a bound on waiting for a container, never asserted as a duration
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
# Where Debian keeps a machine's own CAs (a TLS-intercepting proxy's, where there is one):
# the build gets them through the recipe's EXTRA_CA_CERTS argument, as a user would pass
# theirs; the base stays plain Debian.
LOCAL_CA_DIR = Path("/usr/local/share/ca-certificates")


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


def extra_ca_certs() -> str:
    """The PEM text of this machine's own CAs (LOCAL_CA_DIR), empty where it has none."""
    if not LOCAL_CA_DIR.is_dir():
        return ""
    pems = [path.read_text() for path in sorted(LOCAL_CA_DIR.glob("**/*.crt"))]
    return "".join(pem if pem.endswith("\n") else pem + "\n" for pem in pems)


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
        tarball = self.state / "base-plain.tar"
        if not tarball.exists():
            partial = self.state / "base-plain.tar.partial"
            if partial.is_dir():
                shutil.rmtree(partial)
            # its chroot (with /proc mounted) outside /tmp, where tree walks could keep
            # the mount busy at clean-up
            scratch = self.state / "tmp"
            scratch.mkdir(exist_ok=True)
            made = subprocess.run(
                [
                    "mmdebstrap",
                    "--variant=minbase",
                    "--format=tar",
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
        self.run("import", str(tarball), BASE_IMAGE, timeout=600)

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
            "--build-arg",
            "TORCH_VARIANT=cpu",
        ]

    def ca_arguments(self) -> list[str]:
        """The recipe's EXTRA_CA_CERTS with this machine's own CAs, where it has some."""
        pems = extra_ca_certs()
        return ["--build-arg", f"EXTRA_CA_CERTS={pems}"] if pems else []

    def build(self, tag: str, *extra: str, local_torch: bool = True) -> float:
        """deploy/Containerfile built from the base into ``tag``; the seconds it took.
        ``local_torch``: torch from this host's wheel (:meth:`torch_index`)."""
        started = time.monotonic()
        self.try_build(tag, *extra, local_torch=local_torch, check=True)
        return time.monotonic() - started

    def try_build(
        self,
        tag: str,
        *extra: str,
        local_torch: bool = True,
        local_cas: bool = True,
        check: bool = False,
    ) -> tuple[int, str]:
        """The build's exit status and its log (``extra``: more podman build flags;
        ``local_cas``: this machine's own CAs as EXTRA_CA_CERTS)."""
        log = self.state / f"build-{tag.rsplit(':', 1)[-1]}.log"
        done = self.run(
            "build",
            "--format",
            "docker",
            "--network",
            "host",
            "--runtime",
            "runc",
            "--force-rm",  # no build container left behind by a failed step
            "--build-arg",
            f"BASE={BASE_IMAGE}",
            *(self.torch_index() if local_torch else []),
            *(self.ca_arguments() if local_cas else []),
            *extra,
            "-f",
            str(CONTAINERFILE),
            "-t",
            tag,
            str(REPO),
            timeout=BUILD_TIMEOUT_S,
            log=log,
            check=check,
        )
        return done.returncode, log.read_text()

    def start(self, name: str, image: str, *args: str, env: dict[str, str]) -> None:
        self.run("rm", "-f", name, check=False)
        flags = [item for key, value in env.items() for item in ("-e", f"{key}={value}")]
        self.run("run", "-d", "--name", name, "--network", "host", *flags, image, *args)

    def volumes(self) -> set[str]:
        return set(self.run("volume", "ls", "--quiet").stdout.split())

    def networks(self) -> set[str]:
        return set(self.run("network", "ls", "--format", "{{.Name}}").stdout.split())

    def running(self, name: str) -> bool:
        done = self.run("inspect", "--format", "{{.State.Running}}", name, check=False)
        return done.stdout.strip() == "true"

    def logs(self, name: str) -> str:
        done = self.run("logs", name, check=False)
        return (done.stdout + done.stderr)[-4000:]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


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
