"""Where the tiny image encoder's time goes on this CPU: eager bf16 (furious's weights cast
to bf16) by op and by Hiera block, and OpenVINO bf16 by layer type and kernel.

    python bench/encoder_profile.py --part eager --threads 1      # torch.profiler + block hooks
    python bench/encoder_profile.py --part onednn --threads 1     # which oneDNN kernels run
    python bench/encoder_profile.py --part openvino --threads 1   # OpenVINO's perf counters

Each part prints Markdown. Random weights (seed 0): the work is the real model's. One thread
by default: per-op CPU time on one core is robust to the load other processes put on a
shared machine (the full rate on 2 threads is the bench's to measure). ``onednn`` re-runs
itself under ONEDNN_VERBOSE=1 and counts the primitives by implementation (e.g.
``brg_matmul:avx512_core_bf16`` against ``...amx``).
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
from torch import nn

from sam2serve.modeling.hiera import Hiera, MultiScaleBlock
from sam2serve.modeling.sam2 import ImageEncoder, SAM2Image

SIDE = 1024
# tiny, one 1024 x 1024 image, attention included (sam2serve.bench.concepts.count_flops)
ENCODER_GFLOP = 292.4


def _model() -> SAM2Image:
    from sam2serve.checkpoint import load_model

    return load_model("tiny", random_weights=True, seed=0)


def _encoder(model: SAM2Image) -> ImageEncoder:
    assert model.image_encoder is not None  # built with one
    return model.image_encoder


def _image() -> torch.Tensor:
    return torch.randn(1, 3, SIDE, SIDE, generator=torch.Generator().manual_seed(0))


def _category(name: str, shapes: list[list[int]]) -> str:
    """An aten op's row in the profile: attention split by window vs global by its batch
    (Hiera's windows are the batch of a windowed attention)."""
    if "scaled_dot_product" in name or "flash_attention" in name:
        batch = shapes[0][0] if shapes and shapes[0] else 0
        return "attention, windowed (SDPA)" if batch > 1 else "attention, global (SDPA)"
    if name in ("aten::addmm", "aten::mm", "aten::bmm", "aten::linear", "aten::matmul"):
        return "linear (qkv, proj, MLP)"
    if "convolution" in name or name == "aten::conv2d":
        return "convolution (patch embed, neck)"
    if "layer_norm" in name:
        return "LayerNorm"
    if "gelu" in name:
        return "GELU"
    if name in ("aten::copy_", "aten::clone", "aten::contiguous", "aten::_to_copy"):
        return "copies (permute/reshape -> contiguous, casts)"
    if name in ("aten::constant_pad_nd", "aten::pad"):
        return "pad (window partition)"
    if "max_pool" in name:
        return "max-pool (q-pooling)"
    if name in ("aten::add", "aten::add_", "aten::mul", "aten::div"):
        return "elementwise (residual adds)"
    if "upsample" in name or "interpolate" in name:
        return "interpolate (pos embed, FPN)"
    return "other"


def _linear_gflop(shapes: list[list[int]]) -> float:
    # aten::addmm(bias, x (M, K), w^T (K, N)); aten::mm(x (M, K), w (K, N))
    mats = [s for s in shapes if len(s) == 2]
    if len(mats) < 2:
        return 0.0
    (m, k), (_, n) = mats[-2], mats[-1]
    return 2.0 * m * k * n / 1e9


def _sdpa_gflop(shapes: list[list[int]]) -> float:
    if len(shapes) < 2 or len(shapes[0]) != 4:
        return 0.0
    b, h, lq, d = shapes[0]
    lk = shapes[1][2]
    return 4.0 * b * h * lq * lk * d / 1e9


@contextmanager
def _block_timer(trunk: Hiera, times: dict[str, float]) -> Iterator[None]:
    """Inclusive wall time of every Hiera block and of its norm/attention/MLP children
    (one thread, synchronous CPU: wall time is CPU time)."""
    starts: dict[str, float] = {}
    handles = []

    def pre(name: str) -> Callable[..., None]:
        def hook(module: nn.Module, args: object) -> None:
            starts[name] = time.perf_counter()

        return hook

    def post(name: str) -> Callable[..., None]:
        def hook(module: nn.Module, args: object, out: object) -> None:
            times[name] = times.get(name, 0.0) + time.perf_counter() - starts[name]

        return hook

    blocks: list[MultiScaleBlock] = list(trunk.blocks)  # type: ignore[arg-type]  # a ModuleList of them
    for i, block in enumerate(blocks):
        for part, module in (
            ("block", block),
            ("norm", block.norm1),
            ("norm2", block.norm2),
            ("attn", block.attn),
            ("mlp", block.mlp),
        ):
            key = f"{i}.{part}"
            handles.append(module.register_forward_pre_hook(pre(key)))
            handles.append(module.register_forward_hook(post(key)))
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def eager(iters: int) -> str:
    from torch.profiler import ProfilerActivity, profile

    model = _model()
    encoder = _encoder(model)
    encoder.to(torch.bfloat16)  # furious on a CPU (runtime.build.encoder_precision)
    image = _image()
    with torch.inference_mode():
        model.encode_image(image)  # warm-up
        started = time.perf_counter()
        for _ in range(iters):
            model.encode_image(image)
        wall = (time.perf_counter() - started) / iters
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
            for _ in range(iters):
                model.encode_image(image)
        times: dict[str, float] = {}
        with _block_timer(encoder.trunk, times):
            for _ in range(iters):
                model.encode_image(image)

    rows: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0.0, 0.0])
    for event in prof.key_averages(group_by_input_shape=True):
        shapes = [list(s) for s in event.input_shapes]
        row = rows[_category(event.key, shapes)]
        row[0] += event.self_cpu_time_total / 1e3 / iters
        if row is rows["linear (qkv, proj, MLP)"] and event.key in ("aten::addmm", "aten::mm"):
            row[1] += _linear_gflop(shapes) * event.count / iters
        if "flash_attention" in event.key and "for_cpu" in event.key:
            row[1] += _sdpa_gflop(shapes) * event.count / iters
        if event.key != "aten::scaled_dot_product_attention":  # its kernel is counted
            row[2] += event.count / iters
    total = sum(r[0] for r in rows.values())
    out = [
        f"### Eager bf16, by op ({torch.get_num_threads()} thread(s))",
        "",
        (
            f"Encoder wall time {wall * 1e3:,.0f} ms per image "
            f"({ENCODER_GFLOP / wall:.0f} GFLOP/s); profiled self CPU time {total:,.0f} ms."
        ),
        "",
        "| op group | ms per image | share | GFLOP | GFLOP/s | calls |",
        "|---|---|---|---|---|---|",
    ]
    for name, (ms, gflop, calls) in sorted(rows.items(), key=lambda kv: -kv[1][0]):
        rate = f"{gflop / (ms / 1e3):.0f}" if gflop and ms else ""
        out.append(
            f"| {name} | {ms:,.1f} | {100 * ms / total:.1f} % | "
            f"{gflop:.1f} | {rate} | {calls:.0f} |"
            if gflop
            else f"| {name} | {ms:,.1f} | {100 * ms / total:.1f} % | | | {calls:.0f} |"
        )
    out += [
        "",
        "Top aten ops by self CPU time:",
        "",
        "| op | ms per image | calls |",
        "|---|---|---|",
    ]
    by_op = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)[:15]
    for event in by_op:
        out.append(
            f"| `{event.key}` | {event.self_cpu_time_total / 1e3 / iters:,.1f} | "
            f"{event.count // iters} |"
        )
    out += ["", _block_table(encoder.trunk, times, iters)]
    return "\n".join(out)


def _block_table(trunk: Hiera, times: dict[str, float], iters: int) -> str:
    out = [
        "### Eager bf16, by Hiera block (inclusive wall ms per image; *layout* = the block",
        "minus its norms, attention and MLP: window partition/unpartition, pads, residual adds)",
        "",
        "| block | window | tokens (H x W x C) | norms | attention | MLP | layout + adds | block |",
        "|---|---|---|---|---|---|---|---|",
    ]
    hw = SIDE // 4
    blocks: list[MultiScaleBlock] = list(trunk.blocks)  # type: ignore[arg-type]  # a ModuleList of them
    for i, block in enumerate(blocks):
        if block.q_stride:
            hw //= block.q_stride[0]
        ms = {
            p: times.get(f"{i}.{p}", 0.0) * 1e3 / iters
            for p in ("block", "norm", "norm2", "attn", "mlp")
        }
        norms = ms["norm"] + ms["norm2"]
        layout = ms["block"] - norms - ms["attn"] - ms["mlp"]
        window = "global" if block.window_size == 0 else str(block.window_size)
        out.append(
            f"| {i} | {window} | {hw} x {hw} x {block.dim_out} | {norms:.1f} | {ms['attn']:.1f} | "
            f"{ms['mlp']:.1f} | {layout:.1f} | {ms['block']:.1f} |"
        )
    return "\n".join(out)


_VERBOSE = re.compile(r"^onednn_verbose,[^,]*,?exec,cpu,(\w+),([^,]+),.*,([\d.]+)$")


def onednn(threads: int) -> str:
    env = {**os.environ, "ONEDNN_VERBOSE": "1"}
    code = (
        f"import torch, sys; sys.path.insert(0, 'bench'); torch.set_num_threads({threads});"
        "import encoder_profile as p; m = p._model(); m.image_encoder.to(torch.bfloat16);"
        "x = p._image();\nwith torch.inference_mode():\n m.encode_image(x);"
        " print('MARK', flush=True); m.encode_image(x)"
    )
    run = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False
    )
    lines = run.stdout.split("MARK", 1)[-1].splitlines()
    counts: dict[tuple[str, str], list[float]] = collections.defaultdict(lambda: [0, 0.0])
    for line in lines:
        parts = line.split(",")
        if len(parts) < 6 or parts[0] != "onednn_verbose" or "exec" not in parts[1:4]:
            continue
        at = parts.index("exec")
        kind, impl = parts[at + 2], parts[at + 3]
        try:
            ms = float(parts[-1])
        except ValueError:
            continue
        counts[(kind, impl)][0] += 1
        counts[(kind, impl)][1] += ms
    out = [
        "### oneDNN primitives in eager bf16 (ONEDNN_VERBOSE=1, one encoder call after a warm-up)",
        "",
        "| primitive | implementation | calls | ms |",
        "|---|---|---|---|",
    ]
    for (kind, impl), (n, ms) in sorted(counts.items(), key=lambda kv: -kv[1][1]):
        out.append(f"| {kind} | `{impl}` | {n:.0f} | {ms:,.1f} |")
    if not counts:
        out.append(f"| (none seen) | | | |\n\nstderr tail: {run.stderr[-400:]!r}")
    return "\n".join(out)


def openvino(threads: int, iters: int, hints: dict[str, str]) -> str:
    import openvino as ov  # type: ignore[import-untyped]  # no stubs

    from sam2serve.runtime.export import convert_image_path

    model = _model()
    converted, _ = convert_image_path(model)
    config = {
        "INFERENCE_PRECISION_HINT": "bf16",
        "INFERENCE_NUM_THREADS": str(threads),
        "NUM_STREAMS": "1",
        "PERF_COUNT": "YES",
        **hints,
    }
    compiled = ov.Core().compile_model(converted, "CPU", config)
    request = compiled.create_infer_request()
    image = _image().numpy()
    request.infer({0: image})
    started = time.perf_counter()
    for _ in range(iters):
        request.infer({0: image})
    wall = (time.perf_counter() - started) / iters
    by_type: dict[tuple[str, str], list[float]] = collections.defaultdict(lambda: [0, 0.0])
    for info in request.get_profiling_info():
        if info.status != info.Status.EXECUTED:
            continue
        row = by_type[(info.node_type, info.exec_type)]
        row[0] += 1
        row[1] += info.real_time.total_seconds() * 1e3
    total = sum(r[1] for r in by_type.values())
    out = [
        (
            f"### OpenVINO {ov.__version__} bf16, by layer type and kernel ({threads} "
            f"thread(s); config {config})"
        ),
        "",
        (
            f"Wall time {wall * 1e3:,.0f} ms per image ({ENCODER_GFLOP / wall:.0f} GFLOP/s); "
            f"layers sum {total:,.0f} ms (last inference)."
        ),
        "",
        "| layer type | kernel (exec type) | layers | ms | share |",
        "|---|---|---|---|---|",
    ]
    for (kind, impl), (n, ms) in sorted(by_type.items(), key=lambda kv: -kv[1][1])[:25]:
        out.append(f"| {kind} | `{impl}` | {n:.0f} | {ms:,.1f} | {100 * ms / total:.1f} % |")
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=("eager", "onednn", "openvino"), required=True)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--iters", type=int, default=2)
    parser.add_argument(
        "--ov-hint", action="append", default=[], help="extra OpenVINO config KEY=VALUE"
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.part == "eager":
        print(eager(args.iters))
    elif args.part == "onednn":
        print(onednn(args.threads))
    else:
        hints = dict(h.split("=", 1) for h in args.ov_hint)
        print(openvino(args.threads, args.iters, hints))


if __name__ == "__main__":
    main()
