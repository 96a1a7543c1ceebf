"""Would int8 beat bf16 in the batched decoder? Its per-prompt products, timed each way.

A batched click's decoder time (MPS, AMG) is mostly the upscaling's two per-prompt
products (``FastMaskDecoder.upscale``): the first transposed convolution of the final keys
through their low rank (4096 x R @ R x 256, R ~115) and the second (16384 x 64 @ 64 x 128).
Their operands are activations, so int8 means quantising them per call. Each product is
timed (thread CPU time, median) as mode furious runs it (bf16), as int8 through
``torch._int_mm`` with per-row activation and per-column weight scales (quantise, multiply,
dequantise), and through torch's dynamically quantised Linear (fbgemm: fp32 in and out,
the activation quantised inside). Prints each path's time, its ratio to bf16 and its
relative error against fp32.

    python bench/decoder_int8.py --threads 1 --n 50
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
import warnings
from collections.abc import Callable

import torch

BF16 = torch.bfloat16


def _ms(fn: Callable[[], object], n: int) -> float:
    for _ in range(5):
        fn()
    times = []
    for _ in range(n):
        start = time.thread_time()
        fn()
        times.append((time.thread_time() - start) * 1000)
    return statistics.median(times)


def _quantise_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 per row: (int8 values, fp32 scales (rows, 1))."""
    scale = x.abs().amax(1, keepdim=True).float().clamp_min(1e-12) / 127
    return torch.round(x.float() / scale).to(torch.int8), scale


def _int8_product(
    x: torch.Tensor, weight_q: torch.Tensor, weight_scale: torch.Tensor
) -> torch.Tensor:
    """x (M, K) bf16 @ the int8 weight (K, N): quantise x, int32 product, dequantise."""
    xq, scale = _quantise_rows(x)
    return (torch._int_mm(xq, weight_q).float() * scale * weight_scale).to(BF16)


def _error(ours: torch.Tensor, ref: torch.Tensor) -> float:
    return float((ours.float() - ref).norm() / ref.norm())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--n", type=int, default=50)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    g = torch.Generator().manual_seed(0)
    print(
        f"decoder products, bf16 vs int8, {args.threads} thread(s), n={args.n}, torch "
        f"{torch.__version__}, {platform.processor() or platform.machine()}, "
        f"load average {os.getloadavg()[0]:.2f}"
    )
    print("| product | bf16 ms | int8 _int_mm ms (x bf16) | dynamic int8 Linear ms (x bf16) "
          "| error bf16 / int8 / dynamic |")  # fmt: skip
    print("| --- | ---: | ---: | ---: | --- |")
    # K rounded to a multiple of 8 for _int_mm (R = 115 -> 120, zero rows of coefficients).
    _row("upscale dc1 (4096 x 120 @ 120 x 256)", (4096, 120, 256), g, args.n)
    _row("upscale dc2 (16384 x 64 @ 64 x 128)", (16384, 64, 128), g, args.n)


def _row(name: str, shape: tuple[int, int, int], g: torch.Generator, iterations: int) -> None:
    """One product's line of the table."""
    m, k, n = shape
    x = torch.randn(m, k, generator=g)
    w = torch.randn(k, n, generator=g) / k**0.5
    ref = x @ w
    xb, wb = x.to(BF16), w.to(BF16)
    wscale = w.abs().amax(0).clamp_min(1e-12) / 127
    wq = torch.round(w / wscale).to(torch.int8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        linear = torch.nn.Linear(k, n, bias=False)
        linear.weight.data = w.T.contiguous()
        dynamic = torch.ao.quantization.quantize_dynamic(
            torch.nn.Sequential(linear), {torch.nn.Linear}, dtype=torch.qint8
        )
    bf16 = _ms(lambda: xb @ wb, iterations)
    int8 = _ms(lambda: _int8_product(xb, wq, wscale), iterations)
    dyn = _ms(lambda: dynamic(x), iterations)
    errors = (
        _error(xb @ wb, ref),
        _error(_int8_product(xb, wq, wscale), ref),
        _error(dynamic(x).detach(), ref),
    )
    print(
        f"| {name} | {bf16:.2f} | {int8:.2f} ({int8 / bf16:.2f}x) | {dyn:.2f} "
        f"({dyn / bf16:.2f}x) | {' / '.join(f'{e:.4f}' for e in errors)} |"
    )
    xq, _ = _quantise_rows(xb)
    alone = _ms(lambda: torch._int_mm(xq, wq), iterations)
    print(f"| of which the int8 product alone | | {alone:.2f} ({alone / bf16:.2f}x) | | |")


if __name__ == "__main__":
    main()
