"""A click over HTTP, as the annotation page sends it: the latency a client sees.

Starts ``sam2serve serve`` (random weights) on a loopback port, uploads one sample photo
to /v1/embeddings (so the embedding is cached), then sends ``--n`` POST /v1/segment
requests by image_id, one at a time on one kept-alive connection: one point per request
(a different one each time, on a grid), ``multimask_output`` on, uncompressed RLE, and
``best_mask_only`` as the page sends it (``--all-masks``: the three candidates). Prints
the client's p50/p90/min and the server's own ``inference_ms`` (the model job) p50, so
what lies outside the model job (event loop, validation, JSON) is their difference.

    python bench/click_http.py --mode fast --n 200
    python bench/click_http.py --mode furious --n 200 --all-masks --size 1500x2000

Run it alone on the machine, or say how loaded it was.
"""

from __future__ import annotations

import argparse
import base64
import io
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
from PIL import Image

from sam2serve.samples import load_sample


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _jpeg_b64(image: np.ndarray) -> str:
    buffer = io.BytesIO()
    Image.fromarray(image).save(buffer, format="JPEG", quality=90)
    return base64.b64encode(buffer.getvalue()).decode()


def _image(name: str, size: str | None) -> np.ndarray:
    image = load_sample(name)
    if size:
        width, height = (int(v) for v in size.lower().split("x"))
        image = np.asarray(Image.fromarray(image).resize((width, height), Image.BILINEAR))
    return image


def _wait_ready(url: str, proc: subprocess.Popen, timeout: float = 300.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode}")
        try:
            if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise RuntimeError("the server did not become ready")


def _cpu_and_faults(pid: int) -> tuple[float, int]:
    """User + system CPU seconds and minor page faults of process ``pid`` (all its
    threads) so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK"), int(fields[7])


def _percentile(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", default="fast")
    parser.add_argument("--model", default="tiny")
    parser.add_argument(
        "--artifacts",
        metavar="DIR",
        help="serve 'sam2serve export' artifacts (the image path and the AOTInductor mask "
        "decoder) instead of random weights",
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--n", type=int, default=200, help="timed clicks")
    parser.add_argument("--warmup", type=int, default=10, help="untimed clicks first")
    parser.add_argument("--sample", default="astronaut")
    parser.add_argument("--size", default=None, help="resize the photo to WxH first")
    parser.add_argument("--all-masks", action="store_true", help="three masks, not the best")
    parser.add_argument(
        "--format", default="uncompressed_rle", help="mask_format (the page's by default)"
    )
    parser.add_argument(
        "--profile",
        type=Path,
        default=None,
        help="py-spy record of the server to this file (.txt: collapsed stacks, else an SVG)",
    )
    args = parser.parse_args()

    image = _image(args.sample, args.size)
    height, width = image.shape[:2]
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    weights = ["--artifacts", args.artifacts] if args.artifacts else ["--random-weights"]
    command = [
        sys.executable, "-m", "sam2serve", "serve", "--model", args.model, "--mode", args.mode,
        *weights, "--threads", str(args.threads), "--port", str(port),
        "--log-level", "warning",
    ]  # fmt: skip
    env = {**os.environ, "SAM2SERVE_API_KEY": ""}
    # Stopped by a signal, the server it started is stopped too (the finally below).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    proc = subprocess.Popen(command, env=env)
    spy: subprocess.Popen | None = None
    try:
        _wait_ready(url, proc)
        with httpx.Client(base_url=url, timeout=60) as client:
            answer = client.post("/v1/embeddings", json={"image": _jpeg_b64(image)})
            answer.raise_for_status()
            image_id = answer.json()["image_id"]
            grid = [(x, y) for y in np.linspace(0.1, 0.9, 9) for x in np.linspace(0.1, 0.9, 9)]

            def click(i: int) -> tuple[float, dict]:
                fx, fy = grid[i % len(grid)]
                body = {
                    "image_id": image_id,
                    "objects": [{"points": [{"x": fx * width, "y": fy * height, "label": 1}]}],
                    "multimask_output": True,
                    "best_mask_only": not args.all_masks,
                    "mask_format": args.format,
                }
                start = time.perf_counter()
                response = client.post("/v1/segment", json=body)
                elapsed = time.perf_counter() - start
                response.raise_for_status()
                return elapsed * 1000, response.json()

            for i in range(args.warmup):
                click(i)
            if args.profile is not None:
                spy = subprocess.Popen(
                    ["py-spy", "record", "-p", str(proc.pid), "-o", str(args.profile),
                     "--rate", "250", "--threads", "--nonblocking", "--format",
                     "raw" if args.profile.suffix == ".txt" else "flamegraph"]
                )  # fmt: skip
                time.sleep(1.0)
            client_ms, server_ms, sizes = [], [], []
            cpu_start, faults_start = _cpu_and_faults(proc.pid)
            for i in range(args.n):
                ms, payload = click(i)
                client_ms.append(ms)
                server_ms.append(payload["inference_ms"])
                sizes.append(
                    sum(len(str(m["segmentation"])) for m in payload["objects"][0]["masks"])
                )
            cpu_end, faults_end = _cpu_and_faults(proc.pid)
            server_cpu_ms = (cpu_end - cpu_start) * 1000 / args.n
            faults = (faults_end - faults_start) / args.n
    finally:
        if spy is not None:
            spy.send_signal(2)
            spy.wait(60)
        proc.terminate()
        proc.wait(30)
    load = os.getloadavg()[0]
    masks = "3 masks" if args.all_masks else "best mask"
    print(
        f"click over HTTP, {args.model} {args.mode}, {width}x{height}, {masks}, {args.format}, "
        f"{args.threads} threads, n={args.n}, load average {load:.2f}"
    )
    print(
        f"  client p50 {_percentile(client_ms, 50):.1f} ms  p90 {_percentile(client_ms, 90):.1f}"
        f"  min {min(client_ms):.1f}  | server inference_ms p50 "
        f"{_percentile(server_ms, 50):.1f}  | outside the job p50 "
        f"{statistics.median(c - s for c, s in zip(client_ms, server_ms, strict=True)):.1f} ms"
        f"  | segmentation chars p50 {int(statistics.median(sizes))}"
    )
    print(
        f"  server per click: CPU (all threads, user + system) {server_cpu_ms:.1f} ms, "
        f"minor page faults {faults:.0f}"
    )


if __name__ == "__main__":
    main()
