"""The tiny image encoder (furious: bf16) through each candidate path, timed in one process
against eager bf16 of the same process, with its agreement with eager fp32.

    python bench/encoder_paths.py --path openvino [--ov-hint KEY=VALUE ...]
    python bench/encoder_paths.py --path inductor            # torch.compile, freezing
    python bench/encoder_paths.py --path inductor-max-autotune  # + cpp GEMM templates
    python bench/encoder_paths.py --path eager-channels-last

Prints one Markdown row per path: ms per image (median of ``--iters``), GFLOP/s, share of
``--bf16-peak``, the path's time over eager bf16's measured in the same process (robust to
a shared machine's load), the worst relative error and the cosine of the image embedding
against eager fp32, and what the path cost to build (compile / convert).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from sam2serve.checkpoint import load_model
from sam2serve.modeling.sam2 import SAM2Image

# tiny, one 1024 x 1024 image, attention included (sam2serve.bench.concepts.count_flops)
ENCODER_GFLOP = 292.4
Encode = Callable[[torch.Tensor], tuple[torch.Tensor, ...]]


def _tensors(features: object) -> tuple[torch.Tensor, ...]:
    return (features.image_embed, *features.high_res_feats)  # type: ignore[attr-defined]  # ImageFeatures


def _timed(
    encode: Encode, image: torch.Tensor, iters: int
) -> tuple[float, tuple[torch.Tensor, ...]]:
    out = encode(image)  # warm-up (and compilation)
    times = []
    for _ in range(iters):
        started = time.perf_counter()
        out = encode(image)
        times.append(time.perf_counter() - started)
    return statistics.median(times), out


def _agreement(out: tuple[torch.Tensor, ...], ref: tuple[torch.Tensor, ...]) -> tuple[float, float]:
    a, b = out[0].float().flatten(), ref[0].float().flatten()
    rel = ((a - b).abs().max() / b.abs().max()).item()
    cos = torch.nn.functional.cosine_similarity(a, b, dim=0).item()
    return rel, cos


def _bf16_encoder(model: SAM2Image) -> None:
    """furious on a CPU: the encoder's weights cast (runtime.build.encoder_precision)."""
    assert model.image_encoder is not None  # built with one
    model.image_encoder.to(torch.bfloat16)


def build(path: str, hints: dict[str, str]) -> tuple[Encode, float]:
    """The path's encode function and its build time in seconds."""
    started = time.perf_counter()
    if path == "openvino":
        import openvino as ov  # type: ignore[import-untyped]  # no stubs

        from sam2serve.runtime.export import convert_image_path

        fp32 = load_model("tiny", random_weights=True, seed=0)
        converted, _ = convert_image_path(fp32)
        config = {"INFERENCE_PRECISION_HINT": "bf16", **hints}
        compiled = ov.Core().compile_model(converted, "CPU", config)
        request = compiled.create_infer_request()

        def encode_ov(image: torch.Tensor) -> tuple[torch.Tensor, ...]:
            result = request.infer({0: image.numpy()})
            return tuple(torch.from_numpy(result[i]) for i in range(3))

        return encode_ov, time.perf_counter() - started

    model = load_model("tiny", random_weights=True, seed=0)
    _bf16_encoder(model)
    if path == "eager-channels-last":
        model.to(memory_format=torch.channels_last)  # type: ignore[call-overload]  # accepted at run time

        def encode_cl(image: torch.Tensor) -> tuple[torch.Tensor, ...]:
            return _tensors(model.encode_image(image.contiguous(memory_format=torch.channels_last)))

        return encode_cl, time.perf_counter() - started
    import torch._inductor.config as inductor

    inductor.freezing = True
    inductor.cpp_wrapper = hints.get("cpp_wrapper", "0") == "1"
    mode = "max-autotune" if path == "inductor-max-autotune" else None
    if mode:
        inductor.max_autotune_gemm_backends = hints.get("backends", "CPP,ATEN")
    compiled = torch.compile(model.encode_image, dynamic=False, mode=mode)

    def encode_compiled(image: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return _tensors(compiled(image))

    with torch.inference_mode():
        encode_compiled(torch.zeros(1, 3, 1024, 1024))
    return encode_compiled, time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--path", required=True)
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--bf16-peak", type=float, default=400.0, help="GFLOP/s (host-peak)")
    parser.add_argument("--ov-hint", action="append", default=[], help="KEY=VALUE")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    hints = dict(h.split("=", 1) for h in args.ov_hint)
    image = torch.randn(1, 3, 1024, 1024, generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        fp32 = load_model("tiny", random_weights=True, seed=0)
        reference = _tensors(fp32.encode_image(image))
        del fp32
        encode, build_s = build(args.path, hints)
        eager = load_model("tiny", random_weights=True, seed=0)
        _bf16_encoder(eager)

        def encode_eager(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
            return _tensors(eager.encode_image(x))

        t_eager, _ = _timed(encode_eager, image, args.iters)
        t_path, out = _timed(encode, image, args.iters)
        t_eager2, _ = _timed(encode_eager, image, args.iters)
    t_eager = min(t_eager, t_eager2)
    rel, cos = _agreement(out, reference)
    rate = ENCODER_GFLOP / t_path
    print(
        "| path | ms | GFLOP/s | share of bf16 peak | vs eager bf16 (same process) | "
        "max rel err vs fp32 | cosine | build s |"
    )
    print("|---|---|---|---|---|---|---|---|")
    label = args.path + "".join(f" {k}={v}" for k, v in hints.items())
    print(
        f"| {label} | {t_path * 1e3:,.0f} | {rate:.0f} | {100 * rate / args.bf16_peak:.0f} % | "
        f"{t_eager / t_path:.2f}x (eager {t_eager * 1e3:,.0f} ms) | {rel:.4f} | {cos:.6f} | "
        f"{build_s:.0f} |"
    )


if __name__ == "__main__":
    main()
