"""Where do AOTInductor packages compiled for CUDA crash when loaded? (docs/benchmarks.md,
"GPU": a segfault in AOTIModelPackageLoader on an H100 with torch 2.11, for every package.)

Not yet run on a GPU. Each probe compiles a package in this process and loads it in a
fresh child process (a segfault kills the child only; ``-X faulthandler`` prints where),
then prints one line: ``PROBE: ok | exit N (signal) | wrong answer``. The ladder separates
the suspects:

- ``linear-public``: a one-layer package through torch's own ``aoti_load_package``: if this
  crashes, the torch build or the driver is at fault, not sam2serve;
- ``linear-loader``: the same package through sam2serve's call of the C++ loader
  (``AOTIProgram``: model "model", run_single_threaded False, 1 runner, device index -1);
- ``linear-index0``: device index 0 given explicitly instead of -1;
- ``linear-embedded``: kernels embedded in the library (``aot_inductor.embed_kernel_binary``)
  instead of cubin files extracted beside it;
- ``linear-constants``: the weights outside the library (``package_constants_in_so``
  False);
- ``image-path``: tiny's image path as 'export --format aoti' compiles it, loaded by
  ``AOTImageEncoder``.

Usage (scripts/gpu-check.sh --part aoti): python scripts/aoti_cuda_probe.py [OUT_DIR]
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

import torch

LOAD = """
import sys, torch
path, how, expected = sys.argv[1], sys.argv[2], sys.argv[3]
x = torch.load(sys.argv[4], weights_only=True).cuda()
if how == "public":
    out = torch._inductor.aoti_load_package(path)(x)
    out = out[0] if isinstance(out, (list, tuple)) else out
elif how == "image":
    from sam2serve.runtime.export import AOTImageEncoder
    out = AOTImageEncoder(path, torch.device("cuda")) (x).image_embed
else:
    from sam2serve.runtime.aoti import AOTIProgram
    device = "cuda:0" if how == "index0" else "cuda"
    out = AOTIProgram(path, device)([x])[0]
torch.cuda.synchronize()
ref = torch.load(expected, weights_only=True).cuda()
ok = torch.allclose(out.float(), ref.float(), atol=1e-2, rtol=1e-2)
print("ok" if ok else f"wrong answer (max diff {(out.float() - ref.float()).abs().max():.3g})")
"""


def compile_linear(path: Path, options: dict) -> tuple[torch.Tensor, torch.Tensor]:
    module = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU()).cuda().eval()
    x = torch.randn(8, 64, device="cuda")
    with torch.inference_mode():
        expected = module(x)
    program = torch.export.export(module, (x,))
    torch._inductor.aoti_compile_and_package(
        program, package_path=str(path), inductor_configs=options
    )
    return x, expected


def compile_image_path(path: Path) -> tuple[torch.Tensor, torch.Tensor]:
    from sam2serve.checkpoint import load_model
    from sam2serve.runtime.build import resolve_dtype
    from sam2serve.runtime.export import _export_aoti
    from sam2serve.runtime.spec import RuntimeSpec

    model = load_model("tiny", random_weights=True, device="cuda")
    spec = resolve_dtype(RuntimeSpec("tiny", "fast", "eager", device="cuda"))
    reference, _, _ = _export_aoti(model, spec, path.parent)
    (path.parent / "image_encoder.pt2").rename(path)
    return torch.zeros(1, 3, 1024, 1024), reference[0]


def probe(name: str, how: str, work: Path, make) -> str:
    package = work / f"{name}.pt2"
    try:
        x, expected = make(package)
    except Exception as exc:  # noqa: BLE001 - a probe reports whatever stopped it
        return f"{name}: compile failed: {type(exc).__name__}: {str(exc)[:300]}"
    torch.save(x.cpu(), work / f"{name}.x.pt")
    torch.save(expected.cpu(), work / f"{name}.y.pt")
    done = subprocess.run(
        [sys.executable, "-X", "faulthandler", "-c", LOAD, str(package), how]
        + [str(work / f"{name}.y.pt"), str(work / f"{name}.x.pt")],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    (work / f"{name}.stderr.txt").write_text(done.stderr)
    if done.returncode == 0:
        return f"{name}: {done.stdout.strip()}"
    signal = f" (signal {-done.returncode})" if done.returncode < 0 else ""
    tail = " | ".join(done.stderr.strip().splitlines()[-6:])
    return f"{name}: exit {done.returncode}{signal}: {tail}"


def main() -> int:
    assert torch.cuda.is_available(), "no CUDA GPU here"
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tempfile.mkdtemp(prefix="aoti-"))
    out.mkdir(parents=True, exist_ok=True)
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}; files in {out}")
    probes = [
        ("linear-public", "public", lambda p: compile_linear(p, {})),
        ("linear-loader", "loader", lambda p: compile_linear(p, {})),
        ("linear-index0", "index0", lambda p: compile_linear(p, {})),
        (
            "linear-embedded",
            "loader",
            lambda p: compile_linear(p, {"aot_inductor.embed_kernel_binary": True}),
        ),
        (
            "linear-constants",
            "loader",
            lambda p: compile_linear(p, {"aot_inductor.package_constants_in_so": False}),
        ),
        ("image-path", "image", compile_image_path),
    ]
    for name, how, make in probes:
        print(probe(name, how, out, make), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
