"""Live video at camera rate: a sender pushes frames at a fixed rate (30/s) to a real
server (``sam2serve serve --video --random-weights``: the real tiny network, random
weights) over /v1/videos/{id}/live, in each mode, and this reports what was tracked,
skipped and refused, frames/s tracked, each tracked frame's latency, and how long the last
answer came after the last frame was sent (a backlog shows there).

    python scripts/live_rate.py --seconds 60 --fps 30 --out bench/results/live_rate_cpu.md

One object is prompted (a click, by seq, on the first frame). Traffic stays on 127.0.0.1.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
from websockets.sync.client import connect


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def http(url: str, body: dict | None = None) -> dict:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data, {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=600) as answer:
        return json.loads(answer.read())


def wait_ready(base: str, server: subprocess.Popen, limit_s: float = 900) -> None:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise SystemExit(f"the server exited ({server.returncode})")
        try:
            with urllib.request.urlopen(base + "/readyz", timeout=5) as answer:
                if answer.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise SystemExit("the server never became ready")


def camera(count: int, height: int, width: int) -> list[bytes]:
    """Frames of a moving red block on grey: raw RGB bytes."""
    out = []
    for i in range(count):
        frame = np.full((height, width, 3), 90, np.uint8)
        x = (4 * i) % (width - 64)
        frame[height // 3 : height // 3 + 64, x : x + 64, 0] = 230
        out.append(frame.tobytes())
    return out


def run_mode(base: str, mode: str, frames: list[bytes], fps: float, size: tuple[int, int]):
    height, width = size
    session = http(base + "/v1/videos/live", {"width": width, "height": height, "mode": mode})
    url = base.replace("http://", "ws://") + f"/v1/videos/{session['session_id']}/live"
    answers: list[tuple[float, dict]] = []
    with connect(url, max_size=None) as ws:

        def receive() -> None:
            while True:
                try:
                    message = json.loads(ws.recv())
                except Exception:  # noqa: BLE001 - closed, however: the stream is over
                    return
                answers.append((time.perf_counter(), message))

        reader = threading.Thread(target=receive, daemon=True)
        reader.start()
        start = time.perf_counter()
        for i, frame in enumerate(frames):
            time.sleep(max(0.0, start + i / fps - time.perf_counter()))
            ws.send(frame)
            if i == 0:
                click = {"x": width // 2, "y": height // 3 + 32}
                ws.send(json.dumps({"type": "prompt", "seq": 0, "obj_id": 1, "points": [click]}))
        last_sent = time.perf_counter()
        ws.send(json.dumps({"type": "end"}))
        reader.join(timeout=900)
    http_delete(base + f"/v1/videos/{session['session_id']}")
    return summarise(mode, answers, start, last_sent, len(frames), fps)


def http_delete(url: str) -> None:
    with urllib.request.urlopen(urllib.request.Request(url, method="DELETE"), timeout=60):
        pass


def summarise(mode, answers, start, last_sent, sent, fps) -> dict:
    frames = [(t, a) for t, a in answers if a.get("type") == "frame"]
    tracked = [(t, a) for t, a in frames if not a.get("skipped")]
    skipped = [a for _, a in frames if a.get("skipped")]
    refused = [a for _, a in answers if a.get("type") == "error" and "seq" in a]
    codes = sorted({a["code"] for a in refused})
    latency = np.array([a["latency_ms"] for _, a in tracked]) if tracked else np.zeros(1)
    track = np.array([a["track_ms"] for _, a in tracked]) if tracked else np.zeros(1)
    end = max(t for t, _ in answers) if answers else last_sent
    return {
        "mode": mode,
        "sent": sent,
        "send_s": last_sent - start,
        "tracked": len(tracked),
        "skipped": len(skipped),
        "refused": len(refused),
        "codes": ",".join(codes) or "-",
        "answered": len({a["seq"] for _, a in frames} | {a["seq"] for a in refused}),
        "tracked_per_s": len(tracked) / (end - start),
        "track_p50": float(np.percentile(track, 50)),
        "latency_p50": float(np.percentile(latency, 50)),
        "latency_p90": float(np.percentile(latency, 90)),
        "latency_max": float(latency.max()),
        "drain_s": end - last_sent,
        "fps": fps,
    }


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--fps", type=float, default=30)
    parser.add_argument("--width", type=int, default=320)
    parser.add_argument("--height", type=int, default=240)
    parser.add_argument("--modes", default="latest,every")
    parser.add_argument("--host-label", default="CPU, 2 cores, Intel Xeon AVX-512 + VNNI (no bf16)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    command = [
        sys.executable, "-m", "sam2serve", "serve", "--model", "tiny", "--random-weights",
        "--video", "--host", "127.0.0.1", "--port", str(port),
    ]  # fmt: skip
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    rows, loads = [], [os.getloadavg()[0]]
    try:
        wait_ready(base, server)
        frames = camera(int(args.seconds * args.fps), args.height, args.width)
        for mode in args.modes.split(","):
            rows.append(run_mode(base, mode, frames, args.fps, (args.height, args.width)))
            loads.append(os.getloadavg()[0])
    finally:
        server.terminate()
        server.wait(timeout=60)
    report = render(args, rows, loads, " ".join(command[1:]))
    print(report)
    if args.out is not None:
        args.out.write_text(report)


def render(args, rows, loads, server_command) -> str:
    import torch

    lines = [
        f"# Live video at {args.fps:g} frames/s: latest-frame-wins vs every frame",
        "",
        f"- **command:** `python {' '.join(sys.argv)}`",
        f"- **server:** `python {server_command}` (the real tiny network, random weights)",
        f"- **date (UTC):** {datetime.now(UTC):%Y-%m-%d %H:%M}",
        f"- **host:** {args.host_label}; {cpu_name()}, {os.cpu_count()} logical cores, "
        f"torch {torch.__version__}, server and sender not niced "
        f"(nice {os.nice(0)}); load average (1 min) "
        + " → ".join(f"{load:.1f}" for load in loads)
        + " (start, after each mode): other jobs shared the machine",
        (
            f"- **stream:** {args.seconds:g} s of {args.width}x{args.height} raw RGB frames "
            f"sent at {args.fps:g}/s, one object prompted by a click on the first frame"
        ),
        "",
        (
            "| mode | sent | tracked | skipped | refused (code) | every seq answered | "
            "tracked frames/s | track p50 | tracked latency p50 / p90 / max | "
            "last answer after last send |"
        ),
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['mode']} | {r['sent']} | {r['tracked']} | {r['skipped']} | "
            f"{r['refused']} ({r['codes']}) | {r['answered']} of {r['sent']} | "
            f"{r['tracked_per_s']:.2f} | {r['track_p50']:.0f} ms | "
            f"{r['latency_p50']:.0f} / {r['latency_p90']:.0f} / {r['latency_max']:.0f} ms | "
            f"{r['drain_s']:.2f} s |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
