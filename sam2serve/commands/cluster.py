"""``sam2serve cluster up | status | down | burst``: the service as a Ray Serve application.

Ray is imported only when a handler runs, so the parsers work without it.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

from sam2serve.commands.common import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_STATUS_HELP,
    PROG,
    CommandParser,
    StartError,
    UsageError,
    add_command,
    command_line,
    info_line,
    port_value,
    positive_int,
)
from sam2serve.config_text import Number, http_url
from sam2serve.options import add_options, option_values

DEFAULT_CONFIG = "deploy/serve_tiny.yaml"
# BurstConfig's fields that are flags of 'cluster burst' (sam2serve.options); the target
# (--url | --config, --app, --min-replicas) and the outputs are the command's own.
BURST_FLAGS = (
    "n",
    "tasks",
    "points_per_side",
    "mps_points",
    "max_side",
    "multiplex",
    "ray_address",
    "timeout_s",
)
GPU_CONFIG = "deploy/serve_tiny_cuda.yaml"

DESCRIPTION = f"""\
Run the service as a Ray Serve application: one deployment per model/mode, autoscaled
replicas that report ready only when warm. Replicas start from shared '{PROG} export'
artifacts (CPU) or from an official checkpoint (CPU or GPU: {GPU_CONFIG}).
The config file is a Ray Serve config file (see {DEFAULT_CONFIG} and docs/cluster.md),
so the same file works with 'serve deploy' and KubeRay's RayService; each application's
args give its model, mode, backend, device and threads per replica.

commands:
  up      start a local Ray (or use --address) and deploy every application of the file
  status  applications, deployments, replicas by state, replica actors
  down    delete the applications; stop the local Ray that 'up' started
  burst   N images at once per task (AMG, SPS, MPS): execution and queue time p50/p90,
          replicas over time, replica cold start; Markdown + CSV

{EXIT_STATUS_HELP} (3: 'up' could not start Ray or the applications)
"""

UP_EPILOG = f"""\
examples:
  {PROG} export --model tiny --mode fast --random-weights \\
      --out /tmp/sam2serve/artifacts/tiny-fast
  {PROG} cluster up --config {DEFAULT_CONFIG}
  {PROG} cluster status
  curl -s -F image=@photo.jpg http://127.0.0.1:8000/v1/embeddings
  {PROG} cluster down
"""

BURST_EPILOG = f"""\
example (the committed result):
  {PROG} cluster burst --config deploy/serve_burst.yaml --n 16 --points-per-side 8 \\
      --ray-address auto --out bench/results/burst_cpu.md --csv bench/results/burst_cpu.csv
"""


def register(subcommands: argparse._SubParsersAction) -> None:
    cluster = subcommands.add_parser(
        "cluster",
        help="the service on Ray Serve: up, status, down, burst benchmark",
        description=DESCRIPTION,
    )
    commands = cluster.add_subparsers(dest="cluster_command", metavar="COMMAND", required=True)
    add_command(
        commands,
        "up",
        help="deploy the config file's applications (local Ray unless --address)",
        description="Deploy every application of a cluster config file and wait until its "
        "replicas are warm. Without --address, a local Ray head is started with 'ray start' "
        "(it keeps running after this command; 'cluster down' stops it), every artifacts "
        "directory and checkpoint file the file names by path must exist here, and the "
        "GPUs its replicas reserve must be visible to Ray.",
        epilog=UP_EPILOG,
        handler=up_command,
        environment=True,
        add_arguments=_up_arguments,
    )
    add_command(
        commands,
        "status",
        help="applications, deployments and replicas by state",
        description="Applications, deployments and replicas by state, and the replica actors.",
        handler=status_command,
        environment=True,
        add_arguments=_add_address,
    )
    add_command(
        commands,
        "down",
        help="delete the applications; stop the local Ray that 'up' started",
        description="Delete the applications; stop the local Ray that 'cluster up' started.",
        handler=down_command,
        environment=True,
        add_arguments=_add_address,
    )
    add_command(
        commands,
        "burst",
        help="burst benchmark: N images at once per task, autoscaling",
        description="",  # the burst module's docstring, set with the arguments
        epilog=BURST_EPILOG,
        handler=burst_command,
        environment=True,
        add_arguments=_burst_arguments,
    )


def _add_address(parser: CommandParser) -> None:
    parser.add_argument(
        "--address",
        metavar="ADDR",
        help="an existing Ray cluster (e.g. 'auto', 'ray://head:10001', 'head:6379'); "
        "default: the local Ray that 'cluster up' started",
    )


def _up_arguments(parser: CommandParser) -> None:
    parser.add_argument(
        "--config",
        required=True,
        type=Path,
        metavar="FILE",
        help=f"Ray Serve config file with sam2serve applications (e.g. {DEFAULT_CONFIG})",
    )
    _add_address(parser)
    parser.add_argument(
        "--num-cpus",
        type=positive_int,
        default=os.cpu_count() or 1,
        metavar="N",
        help="CPUs the local Ray offers; each replica takes ray_actor_options.num_cpus "
        "(default: this machine's, %(default)s)",
    )
    parser.add_argument(
        "--ray-port", type=port_value, default=6379, metavar="PORT", help="local Ray's GCS port"
    )
    parser.add_argument(
        "--metrics-port",
        type=port_value,
        default=8080,
        metavar="PORT",
        help="local Ray's Prometheus endpoint: ray_serve_* and ray_sam2serve_* metrics "
        "(default: %(default)s)",
    )
    parser.add_argument(
        "--timeout",
        type=Number(low=0, low_open=True),
        default=600.0,
        metavar="S",
        help="give up if the applications are not running after this long (default: %(default)s)",
    )


def _burst_arguments(parser: CommandParser) -> None:
    from sam2serve.cluster import burst
    from sam2serve.cluster.burst import BurstConfig

    parser.description = (burst.__doc__ or "").strip()
    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument(
        "--url", type=http_url, help="the application's URL, e.g. http://127.0.0.1:8000"
    )
    target.add_argument(
        "--config",
        type=Path,
        metavar="FILE",
        help="take the URL and min_replicas from this config file's application",
    )
    parser.add_argument(
        "--app", metavar="NAME", help="with --config: which application (default: the first)"
    )
    add_options(parser, BurstConfig, BURST_FLAGS)
    parser.add_argument(
        "--min-replicas",
        type=positive_int,
        metavar="N",
        help="replicas to wait for before each task (default: the config's min_replicas, or 1)",
    )
    parser.add_argument("--out", type=Path, metavar="FILE.md", help="write the Markdown report")
    parser.add_argument("--csv", type=Path, metavar="FILE.csv", help="write every request as CSV")


def up_command(args: argparse.Namespace) -> int:
    from sam2serve.cluster.config import ConfigError, load_config

    try:
        config = load_config(args.config)
    except ConfigError as exc:
        raise UsageError(str(exc)) from None
    from sam2serve.cluster.lifecycle import ClusterError, LocalRay, status_lines, up

    local = LocalRay(args.num_cpus, args.ray_port, args.metrics_port)
    try:
        urls = up(config, args.address, local, args.timeout)
    except ConfigError as exc:
        raise UsageError(str(exc)) from None
    except ClusterError as exc:
        raise StartError(str(exc)) from None
    for spec, url in zip(config.apps, urls, strict=True):
        print(f"{PROG}: {spec.name} ({spec.args.model}, {spec.args.mode}) at {url}")
    print("\n".join(status_lines(args.address)))
    return EXIT_OK


def status_command(args: argparse.Namespace) -> int:
    from sam2serve.cluster.lifecycle import ClusterError, status_lines

    try:
        print("\n".join(status_lines(args.address)))
    except ClusterError as exc:
        raise UsageError(str(exc)) from None
    return EXIT_OK


def down_command(args: argparse.Namespace) -> int:
    from sam2serve.cluster.lifecycle import ClusterError, down

    try:
        for line in down(args.address):
            print(f"{PROG}: {line}")
    except ClusterError as exc:
        raise UsageError(str(exc)) from None
    return EXIT_OK


def _burst_target(args: argparse.Namespace) -> tuple[str, int, str | None, dict[str, Any]]:
    """URL, min_replicas, application name and deployment options of the target."""
    from sam2serve.cluster.config import load_config

    if args.config is None:
        return args.url, args.min_replicas or 1, args.app, {}
    config = load_config(args.config)
    apps = [a for a in config.apps if args.app in (None, a.name)]
    if not apps:
        names = ", ".join(a.name for a in config.apps)
        raise UsageError(f"--app {args.app!r} is not in {args.config}; it has: {names}")
    spec = apps[0]
    scaling = spec.deployment.get("autoscaling_config") or {}
    minimum = args.min_replicas or scaling.get(
        "min_replicas", spec.deployment.get("num_replicas", 1)
    )
    return config.url(spec), int(minimum), spec.name, spec.deployment


def burst_command(args: argparse.Namespace) -> int:
    import httpx

    from sam2serve.bench.machine import load_average, machine_info
    from sam2serve.cluster.burst import BurstConfig, BurstError, markdown, run_burst, write_csv
    from sam2serve.cluster.config import ConfigError

    try:
        url, minimum, app, deployment = _burst_target(args)
        config = BurstConfig(
            url=url,
            app=app,
            min_replicas=minimum,
            **option_values(args, BurstConfig, BURST_FLAGS),
        )
        config.check(getattr(args, "env_sources", None))
    except (ConfigError, BurstError, ValueError) as exc:
        raise UsageError(str(exc)) from None
    try:
        replica = httpx.get(url.rstrip("/") + "/cluster/replica", timeout=30).json()
    except (httpx.HTTPError, ValueError) as exc:
        raise UsageError(f"no sam2serve cluster answers at {url}: {exc}") from None
    load_before = load_average()
    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    result = run_burst(config, say=info_line)
    load_after = load_average()
    machine = machine_info()
    weights = replica.get("weights", {})
    header = {
        "command": f"`{command_line(args)}`",
        "date": started,
        "machine": f"{machine.cpu}, {machine.logical_cores} logical cores, "
        f"{machine.memory_gb:.0f} GiB, {machine.os}, Python {machine.python}, torch {machine.torch}",
        "load average (1/5/15 min)": f"before {'/'.join(f'{x:.2f}' for x in load_before)}, "
        f"after {'/'.join(f'{x:.2f}' for x in load_after)}",
        "model": f"{replica.get('model')} ({replica.get('mode')}), backend "
        f"{replica.get('backend')} on {replica.get('device')}, from {replica.get('source_kind')} "
        f"{replica.get('source_location')} (sha256 {str(replica.get('source_sha256'))[:12]}...)",
        "weights": "RANDOM WEIGHTS (no checkpoint can be downloaded here): masks are "
        "meaningless, the work is real"
        if weights.get("source") == "random"
        else str(weights),
        "workload": f"{config.n} distinct images per task (bundled samples, longer side "
        f"{config.max_side} px); AMG points_per_side {config.points_per_side}; SPS 1 point; "
        f"MPS {config.mps_points} points; all N sent at once; client retries 5xx",
        "deployment": ", ".join(f"{k}={v}" for k, v in deployment.items()) or "(not given)",
    }
    report = markdown(result, header)
    print(report)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(report, encoding="utf-8")
    if args.csv is not None:
        args.csv.parent.mkdir(parents=True, exist_ok=True)
        write_csv(result, args.csv)
    failed = sum(not r.ok for r in result.records)
    if failed:
        print(f"{PROG}: burst: {failed} request(s) were not answered", file=sys.stderr)
        return EXIT_FAILED
    return EXIT_OK
