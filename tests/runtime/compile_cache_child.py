"""A child process of the compile-cache tests: compile something through
:class:`CompileCached` under ``$SAM2SERVE_CACHE``, save its output (``--save FILE``, a
torch file) and print the cache's report as the last line (JSON).

``toy``: one fused pointwise kernel (seconds to compile); ``image``: backend compile's image
path of tiny on a photo (minutes on a CPU), built as 'serve' builds it."""

from __future__ import annotations

import argparse
import json
import logging
import sys

import numpy as np
import torch


def toy(args: argparse.Namespace) -> tuple[dict, dict]:
    from sam2serve.runtime.compile_cache import CompileCached, compile_identity

    def fn(x: torch.Tensor) -> torch.Tensor:
        return (x * 1.5).sin() + x.cos()

    identity = compile_identity("toy", "fast", "float32", args.device)
    if args.torch_version is not None:  # pretend another torch made / reads the entry
        identity["torch"] = args.torch_version
    compiled = CompileCached(torch.compile(fn, dynamic=False), identity)
    x = torch.linspace(-3, 3, 4096, device=args.device).reshape(64, 64)
    return {"y": compiled(x).cpu()}, compiled.report.as_dict()


def image(args: argparse.Namespace) -> tuple[dict, dict]:
    from skimage import data

    from sam2serve.runtime.build import build_predictor
    from sam2serve.runtime.process import configure_process
    from sam2serve.runtime.spec import RuntimeSpec, WeightsSource

    spec = RuntimeSpec("tiny", args.mode, "compile", device=args.device)
    configure_process(spec)
    predictor = build_predictor(spec, WeightsSource(random_weights=True, seed=3))
    embedding = predictor.encode(data.chelsea())
    masks = predictor.predict(
        embedding, point_coords=np.array([[200.0, 150.0]]), point_labels=np.array([1])
    )
    outputs = {
        "image_embed": embedding.image_embed.float().cpu(),
        **{f"high_res_{i}": t.float().cpu() for i, t in enumerate(embedding.high_res_feats)},
        "logits": torch.as_tensor(masks.low_res_logits).float().cpu(),
    }
    return outputs, predictor.image_encoder.report.as_dict()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("what", choices=("toy", "image"))
    parser.add_argument("--save", required=True)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--mode", default="fast")
    parser.add_argument("--torch-version")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(name)s %(levelname)s: %(message)s")
    outputs, report = (toy if args.what == "toy" else image)(args)
    torch.save(outputs, args.save)
    sys.stdout.write(json.dumps(report) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
