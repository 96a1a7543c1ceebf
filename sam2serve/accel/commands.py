"""``sam2serve export``: write ahead-of-time artifacts for fast start-up."""

from __future__ import annotations

import argparse
import shlex
import sys

from sam2serve.config import MODEL_SIZES

EXPORT_DESCRIPTION = """\
Export the model for the fast or furious mode as ahead-of-time artifacts: the whole image
path as OpenVINO IR (converted from sam2serve's own PyTorch modules) and compiled for this
CPU, or with --backend aoti as a torch.export + AOTInductor package; the fast mask decoder
as three torch.export + AOTInductor packages (per image, per chunk of prompts, per chunk
of kept masks) unless --decoder eager; the prompt encoder and mask decoder weights; and
manifest.json (model, mode, precision, runtime versions, shapes, sha256 of every file,
the command). Load them with --artifacts DIR in 'sam2serve run', 'sam2serve serve' and
'sam2serve bench': no compilation and no checkpoint at start-up; a mismatch with the
manifest is a clear error. Compiling takes a few minutes (tiny: ~2 min on 2 cores).

example:
  sam2serve export --model tiny --mode furious --checkpoint sam2.1_hiera_tiny.pt --out art/
"""


def add_commands(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "export",
        help="ahead-of-time artifacts (OpenVINO IR or AOTInductor packages + manifest)",
        description=EXPORT_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--model", choices=MODEL_SIZES, default="tiny", help="model size (default: %(default)s)"
    )
    parser.add_argument(
        "--mode",
        choices=("fast", "furious"),
        default="furious",
        help="fast: f32 encoder (lossless); furious: bf16 encoder (default: %(default)s)",
    )
    parser.add_argument(
        "--backend",
        choices=("openvino", "aoti"),
        default="openvino",
        help="image path runtime: openvino (IR + the IR compiled for this CPU; the fastest "
        "here) or aoti (torch.export + AOTInductor .pt2 package, batch 1) "
        "(default: %(default)s)",
    )
    parser.add_argument(
        "--decoder",
        choices=("aoti", "eager"),
        default="aoti",
        help="mask decoder: aoti (compiled ahead of time; its transformer 1.15-1.6x faster "
        "per prompt here, ~2 min more to export) or eager (runs from the weights) "
        "(default: %(default)s)",
    )
    parser.add_argument("--out", required=True, metavar="DIR", help="directory to write")
    weights = parser.add_mutually_exclusive_group()
    weights.add_argument("--checkpoint", metavar="PATH", help="official checkpoint file")
    weights.add_argument(
        "--random-weights", action="store_true", help="a seeded random model (smoke tests only)"
    )
    parser.add_argument("--seed", type=int, default=0, help="seed for --random-weights")
    parser.set_defaults(handler=export_command)


def export_command(args: argparse.Namespace) -> int:
    from sam2serve.accel.export import ArtifactError, export_artifacts
    from sam2serve.checkpoint import CheckpointError

    try:
        manifest = export_artifacts(
            args.model,
            args.mode,
            args.out,
            backend=args.backend,
            decoder=args.decoder,
            checkpoint=args.checkpoint,
            random_weights=args.random_weights,
            seed=args.seed,
            command=shlex.join(["sam2serve", *sys.argv[1:]]),
            progress=lambda step: print(f"sam2serve: {step}", file=sys.stderr, flush=True),
        )
    except (ArtifactError, CheckpointError, OSError) as exc:
        print(f"sam2serve: error: {exc}", file=sys.stderr)
        return 2
    if args.random_weights:
        print("sam2serve: WARNING: exported RANDOM WEIGHTS - not a trained model", file=sys.stderr)
    print(
        f"sam2serve: wrote {args.out} ({manifest['model']}, {manifest['mode']}, "
        f"{manifest['precision']}) in {manifest['export_seconds']} s",
        file=sys.stderr,
    )
    return 0
