"""Start -> first compiled answer of backend compile, cold (empty compile cache) and from
the compile cache the cold run wrote (docs/benchmarks.md, "Cold starts").

Each run is a fresh process: ``sam2serve run --task sps`` on one sample photo with one
click, ``--backend compile --random-weights`` (the compile cache does not depend on the
weights' values), timed from the process's start to its exit, with the CPU time it used
(user + system, children included: on a shared host the wall time depends on the load,
the CPU time much less) and the compile cache's report (hits, kernels built) that the run
logs. Usage:

    python scripts/coldstart.py --mode fast --device cpu --runs 2 [--out results.md]
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPORT = "sam2serve.runtime: "
# The CLI, with the runtime's INFO lines (the compile cache's report) on stderr.
LOGGED_CLI = (
    "import logging, sys; logging.basicConfig(level=logging.INFO, "
    "format='%(name)s: %(message)s'); from sam2serve.cli import main; sys.exit(main())"
)


def summary(logged: str) -> str:
    """The compile cache's report, short: where the compilation came from and torch's counts."""
    report = ast.literal_eval(logged)
    how = "loaded from the cache" if report["loaded"] else "compiled, cache written"
    return (
        f"{how}: FX graph {report['fx_graph_hits']} hit / {report['fx_graph_misses']} miss, "
        f"AOTAutograd {report['aot_autograd_hits']} / {report['aot_autograd_misses']}, "
        f"{report['kernels_built']} C++ kernels built; first call {report['seconds']} s"
    )


def one_run(args: argparse.Namespace, cache: Path, work: Path) -> dict:
    from PIL import Image

    from sam2serve.samples import load_sample

    image, prompts = work / "chelsea.png", work / "prompts.json"
    if not image.exists():
        Image.fromarray(load_sample("chelsea")).save(image)
    prompts.write_text(json.dumps({"chelsea": [[200, 150]]}))
    command = [
        sys.executable,
        "-c",
        LOGGED_CLI,
        "run",
        "--task",
        "sps",
        str(image),
        "--prompts",
        str(prompts),
        "--out",
        str(work / "out"),
        "--model",
        args.model,
        "--mode",
        args.mode,
        "--backend",
        "compile",
        "--device",
        args.device,
        "--random-weights",
    ]
    env = {**os.environ, "SAM2SERVE_CACHE": str(cache)}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"run failed ({done.returncode}):\n{done.stderr[-3000:]}")
    report = [line for line in done.stderr.splitlines() if REPORT in line and "{" in line]
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {
        "wall_s": round(wall, 1),
        "cpu_s": round(cpu, 1),
        "report": summary(report[-1][report[-1].index("{") :]) if report else "(no report)",
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--mode", default="fast", choices=("fast", "furious"))
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--runs", type=int, default=2, help="runs from the cache")
    parser.add_argument("--out", type=Path, help="append a Markdown table here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="coldstart-") as tmp:
        cache, work = Path(tmp) / "cache", Path(tmp)
        rows = [("cold (empty compile cache)", one_run(args, cache, work))]
        rows += [
            (f"from the cache, run {i + 1}", one_run(args, cache, work)) for i in range(args.runs)
        ]
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    lines = [
        f"`{args.model}` {args.mode}+compile on {args.device}, load average after: {load}",
        "",
        "| start | start -> first answer (s) | CPU time (s) | compile cache |",
        "| --- | --- | --- | --- |",
        *(f"| {name} | {r['wall_s']} | {r['cpu_s']} | {r['report']} |" for name, r in rows),
        "",
    ]
    print("\n".join(lines))
    if args.out is not None:
        with args.out.open("a") as f:
            f.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
