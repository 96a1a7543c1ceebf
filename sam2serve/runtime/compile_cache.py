"""Backend compile's compilation, kept: a later process loads it instead of compiling.

torch.compile compiles on the first call (the warm-up): Dynamo traces, AOTAutograd and
Inductor lower the graph, and Inductor builds its kernels (C++ libraries on the CPU, Triton
kernels on CUDA). The first call of :class:`CompileCached` runs in a private, empty
Inductor cache directory (torch's ``temporary_cache_dir``) and afterwards keeps what it
made as an *entry*, a directory holding:

- ``torch_compile_cache.bin``: ``torch.compiler.save_cache_artifacts()``, torch's portable
  caches: the AOTAutograd and Inductor FX-graph entries (on CUDA with the Triton kernels,
  which Inductor bundles into them) and autotuning results;
- ``kernels.tar``: the C++ libraries Inductor built. The FX-graph entries hold their
  source only, so without them every kernel is compiled again: most of the compile time
  on the CPU (35 kernels for tiny's image path);
- ``manifest.json``: the entry's identity (what was compiled: model, mode, dtype, device,
  the first call's input shape; with what: torch, Python, the CPU's name or the GPU's name
  and architecture, Inductor's CPU vector ISA and threads) and the sha256 of both files.

A later first call with the same identity extracts ``kernels.tar`` into a fresh private
directory and loads the artifacts into it (``torch.compiler.load_cache_artifacts``) before
calling: Dynamo still traces (seconds), AOTAutograd and Inductor are cache hits, and no
kernel is built. Because the directory starts empty, every hit is the entry's.

Entries live in ``$SAM2SERVE_CACHE/compile/`` (any sub-directory holding a manifest): the
first process writes ``<model>-<mode>-<device>-<digest>/`` there when the cache is
writable (a read-only cache costs the next start, never this one); ``sam2serve export
--format compile-cache --out DIR`` writes one explicitly (bake it into an image as
``$SAM2SERVE_CACHE/compile/NAME``). An entry made for another identity is not used, with
one log line naming the difference; one whose files do not match their checksums (or
torch cannot read) gives one warning and the process compiles from scratch. torch keys
its own caches on the graph, its inputs and the compiler's configuration as well, so an
entry it cannot use is a cache miss, never a wrong program.
"""

from __future__ import annotations

import atexit
import hashlib
import json
import logging
import platform
import shutil
import tarfile
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from sam2serve.cache import cache_path
from sam2serve.runtime.cache_entry import (
    checked_manifest,
    publish,
    read_manifest,
    staging_folder,
    write_manifest,
)

log = logging.getLogger("sam2serve.runtime")

__all__ = [
    "ARTIFACTS_FILE",
    "CACHE_NAME",
    "ENTRY_FORMAT",
    "KERNELS_FILE",
    "CompileCached",
    "CompileReport",
    "compile_identity",
    "find_entry",
]

CACHE_NAME = "compile"
ENTRY_FORMAT = "compile-cache"
ENTRY_VERSION = 1
ARTIFACTS_FILE = "torch_compile_cache.bin"
KERNELS_FILE = "kernels.tar"
# What an entry was compiled FOR; the other identity fields say what it was compiled WITH.
WHAT = ("model", "mode", "dtype", "device")


def compile_identity(
    model: str, mode: str, dtype: str, device: torch.device | str
) -> dict[str, Any]:
    """What decides whether a compilation can be reused (without the first call's input,
    which :class:`CompileCached` adds)."""
    from sam2serve.runtime.aoti import compile_target

    device = torch.device(device)
    identity: dict[str, Any] = {
        "model": model,
        "mode": mode,
        "dtype": dtype,
        "device": device.type,
        "target": compile_target(device),
        "torch": torch.__version__,
        "python": platform.python_version(),
    }
    if device.type == "cpu":
        # Inductor's C++ kernels are specialised on both (CPU names are often generic:
        # "Intel Xeon Processor" covers AVX2-only and AVX-512 hosts).
        from torch._inductor.cpu_vec_isa import pick_vec_isa
        from torch._inductor.utils import parallel_num_threads

        identity["isa"] = str(pick_vec_isa())
        identity["threads"] = parallel_num_threads()
    return identity


def entry_name(identity: dict[str, Any]) -> str:
    digest = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:12]
    return "-".join(str(identity.get(k)) for k in ("model", "mode", "device")) + f"-{digest}"


def read_entry_manifest(entry: Path) -> dict[str, Any] | None:
    """The manifest of a compile-cache entry, or None if ``entry`` is not one."""
    return read_manifest(entry, ENTRY_FORMAT)


def _difference(found: dict[str, Any], wanted: dict[str, Any]) -> str:
    return ", ".join(
        f"{name} {found.get(name)!r} (here {wanted.get(name)!r})"
        for name in sorted(set(found) | set(wanted))
        if found.get(name) != wanted.get(name)
    )


def find_entry(identity: dict[str, Any], root: Path | None = None) -> Path | None:
    """The entry under ``root`` (default ``$SAM2SERVE_CACHE/compile``) made for exactly
    ``identity``. If there is none but one was made for the same model, mode, dtype and
    device under other conditions (torch, GPU, CPU, threads, input), one log line says
    what differs."""
    root = cache_path(CACHE_NAME) if root is None else root
    try:
        entries = sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    except OSError:
        return None
    near = None
    for entry in entries:
        manifest = read_entry_manifest(entry)
        if manifest is None:
            continue
        found = manifest.get("identity")
        if found == identity and manifest.get("version") == ENTRY_VERSION:
            return entry
        if isinstance(found, dict) and all(found.get(k) == identity.get(k) for k in WHAT):
            near = near or (entry, _difference(found, identity))
    if near is not None:
        log.warning("compile cache %s not used: made for %s; compiling", near[0], near[1])
    return None


@dataclass
class CompileReport:
    """What the first call did: where its compilation came from and torch's counts."""

    source: str = "not compiled yet"
    entry: str | None = None
    loaded: bool = False
    written: bool = False
    # torch._dynamo.utils.counters over the first call: FX-graph and AOTAutograd cache hits
    # and misses, and the C++ kernel libraries Inductor built (not found in the entry).
    fx_graph_hits: int = 0
    fx_graph_misses: int = 0
    aot_autograd_hits: int = 0
    aot_autograd_misses: int = 0
    kernels_built: int = 0
    seconds: float = 0.0
    problems: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "problems"}


class CompileCached:
    """``compiled`` (a torch.compile'd callable) whose first call loads a matching entry
    before compiling and writes one afterwards. ``out``: write the entry there (export)
    instead of into the cache, and do not look for one."""

    def __init__(
        self,
        compiled: Callable[..., Any],
        identity: dict[str, Any],
        *,
        root: Path | None = None,
        out: Path | None = None,
        describe: dict[str, Any] | None = None,
    ) -> None:
        # describe: what else the entry's manifest records (export: the weights, the command).
        self.compiled = compiled
        self.identity = identity
        self.root = root
        self.out = out
        self.describe = describe or {}
        self.report = CompileReport()
        self.manifest: dict[str, Any] | None = None
        self._first_done = False
        self._lock = threading.Lock()

    def __call__(self, *args: Any) -> Any:
        if not self._first_done:
            with self._lock:
                if not self._first_done:
                    result = self._first_call(*args)
                    self._first_done = True
                    return result
        return self.compiled(*args)

    def _first_call(self, *args: Any) -> Any:
        identity = {**self.identity, "input": _shapes(args)}
        root = cache_path(CACHE_NAME) if self.root is None else self.root
        entry = None if self.out is not None else find_entry(identity, root)
        work = Path(tempfile.mkdtemp(prefix="sam2serve-inductor-"))
        # The loaded kernels and the wrapper modules stay there for the process's life.
        atexit.register(shutil.rmtree, work, ignore_errors=True)
        artifacts = self._read(entry, work) if entry is not None else None
        started = time.perf_counter()
        result, saved, counts = _compile_in(work, self.compiled, args, artifacts)
        report = self.report
        report.seconds = round(time.perf_counter() - started, 2)
        report.fx_graph_hits, report.fx_graph_misses = counts["fx_hit"], counts["fx_miss"]
        report.aot_autograd_hits = counts["aot_hit"]
        report.aot_autograd_misses = counts["aot_miss"]
        report.kernels_built = counts["kernels_built"]
        if artifacts is not None:
            report.loaded, report.entry = True, str(entry)
            missed = report.fx_graph_misses + report.aot_autograd_misses
            report.source = f"loaded from the compile cache {entry}" + (
                f" ({missed} graphs compiled again)" if missed else ""
            )
            log.info("%s: %s", report.source, report.as_dict())
            if not missed:
                return result
        # A damaged or stale entry is written again where it was found.
        destination = self.out or entry or root / entry_name(identity)
        if saved is None:
            log.warning("torch.compile left nothing to keep in the compile cache")
            return result
        try:
            describe = {**self.describe, "compile_seconds": report.seconds}
            self.manifest = _write_entry(
                destination, identity, saved, work, describe, replace=self.out is None
            )
        except OSError as exc:
            if self.out is not None:
                raise
            log.warning("could not keep the compilation in %s: %s", destination, exc)
            return result
        report.written, report.entry = True, str(destination)
        if artifacts is None:
            report.source = f"compiled, kept in {destination}"
        log.info("%s: %s", report.source, report.as_dict())
        return result

    def _read(self, entry: Path, work: Path) -> bytes | None:
        """The entry's artifacts, its kernels extracted into ``work``; None (one warning)
        if a file is missing, does not match its sha256 or cannot be extracted."""
        _, problems = checked_manifest(entry, ENTRY_FORMAT, (ARTIFACTS_FILE, KERNELS_FILE))
        if not problems:
            try:
                with tarfile.open(entry / KERNELS_FILE) as archive:
                    archive.extractall(work, filter="data")
                return (entry / ARTIFACTS_FILE).read_bytes()
            except (OSError, tarfile.TarError) as exc:
                problems = [f"{KERNELS_FILE}: {exc}"]
        self.report.problems = problems
        log.warning(
            "compile cache %s is damaged (%s): compiling from scratch", entry, "; ".join(problems)
        )
        return None


def _shapes(args: tuple[Any, ...]) -> list[Any]:
    return [
        [*arg.shape, str(arg.dtype).removeprefix("torch.")]
        if isinstance(arg, torch.Tensor)
        else None
        for arg in args
    ]


def _compile_in(
    work: Path, compiled: Callable[..., Any], args: tuple[Any, ...], artifacts: bytes | None
) -> tuple[Any, bytes | None, dict[str, int]]:
    """Call ``compiled`` with Inductor's caches in ``work`` (after loading ``artifacts``
    into them); returns its result, the artifacts it produced and the cache counts."""
    from torch._dynamo.utils import counters
    from torch._inductor.runtime.cache_dir_utils import temporary_cache_dir
    from torch.compiler._cache import CacheArtifactManager

    before = {k: dict(v) for k, v in counters.items()}
    kernels_before = _kernels(work)
    with temporary_cache_dir(str(work)), CacheArtifactManager.with_fresh_cache():
        if artifacts is not None:
            try:  # None: torch could not read them (it logs why)
                loaded = torch.compiler.load_cache_artifacts(artifacts)
            except (OSError, AssertionError, ValueError) as exc:  # writing them into work
                loaded, why = None, str(exc)
            else:
                why = "torch could not read them"
            if loaded is None:
                log.warning("compile cache not loaded (%s): compiling from scratch", why)
        result = compiled(*args)
        saved = torch.compiler.save_cache_artifacts()

    def delta(group: str, name: str) -> int:
        return counters[group][name] - before.get(group, {}).get(name, 0)

    counts = {
        "fx_hit": delta("inductor", "fxgraph_cache_hit"),
        "fx_miss": delta("inductor", "fxgraph_cache_miss"),
        "aot_hit": delta("aot_autograd", "autograd_cache_hit"),
        "aot_miss": delta("aot_autograd", "autograd_cache_miss"),
        "kernels_built": len(_kernels(work) - kernels_before),
    }
    return result, None if saved is None else saved[0], counts


def _kernels(work: Path) -> set[Path]:
    """The C++ libraries Inductor built in ``work``."""
    return {p.relative_to(work) for p in work.rglob("*.so") if p.is_file()}


def _empty(directory: Path) -> bool:
    return directory.is_dir() and not any(directory.iterdir())


def _write_entry(
    destination: Path,
    identity: dict[str, Any],
    artifacts: bytes,
    work: Path,
    describe: dict[str, Any],
    replace: bool,
) -> dict[str, Any]:
    """Write the entry (runtime.cache_entry: staged, then renamed into place). An existing
    ``destination`` is replaced if it is an entry or empty (or ``replace``: the cache's own
    name for this identity)."""
    with staging_folder(destination) as staging:
        (staging / ARTIFACTS_FILE).write_bytes(artifacts)
        kernels = sorted(_kernels(work))
        with tarfile.open(staging / KERNELS_FILE, "w") as archive:
            for kernel in kernels:
                archive.add(work / kernel, arcname=str(kernel))
        fields = {
            "format": ENTRY_FORMAT,
            "version": ENTRY_VERSION,
            "identity": identity,
            **describe,
            "kernels": len(kernels),
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        manifest = write_manifest(staging, fields, (ARTIFACTS_FILE, KERNELS_FILE))
        staging.chmod(0o755)  # mkdtemp's 0700 would hide a baked entry from other users

        def replaceable(existing: Path) -> bool:  # a damaged, stale or re-exported entry
            return replace or read_entry_manifest(existing) is not None or _empty(existing)

        publish(staging, destination, ENTRY_FORMAT, replaceable)
    return manifest
