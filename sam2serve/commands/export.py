"""``sam2serve export``: ahead-of-time artifacts for a start-up without compilation."""

from __future__ import annotations

import argparse

from sam2serve.commands import model as model_flags
from sam2serve.commands.common import (
    EXIT_OK,
    EXIT_STATUS_HELP,
    PROG,
    CommandParser,
    UsageError,
    add_command,
    add_device_flag,
    add_mode_flag,
    add_model_flag,
    add_threads_flag,
    add_weights_flags,
    command_line,
    info_line,
    warning_line,
)
from sam2serve.runtime.backends import (
    ARTIFACT_DECODERS,
    ARTIFACT_IMAGE_PATH_DEVICES,
    ARTIFACT_IMAGE_PATHS,
)
from sam2serve.runtime.modes import MODES

EXPORT_IMAGE_PATHS = ARTIFACT_IMAGE_PATHS
EXPORT_DECODERS = ARTIFACT_DECODERS
# Artifacts hold the fast decoder: the modes that run it.
EXPORT_MODES = tuple(name for name, mode in MODES.items() if mode.decoder == "fast")

DESCRIPTION = f"""\
Export the model for the {" or ".join(EXPORT_MODES)} mode as ahead-of-time artifacts: the
whole image path as OpenVINO IR (converted from sam2serve's own PyTorch modules) and
compiled for this CPU, or with --backend aoti as a torch.export + AOTInductor package; the
fast mask decoder as three torch.export + AOTInductor packages (per image, per chunk of
prompts, per chunk of kept masks) unless --decoder eager; the prompt encoder and mask
decoder weights; and manifest.json (model, mode, precision, runtime versions, shapes,
sha256 of every file, the command). Load them with --artifacts DIR in '{PROG} run',
'{PROG} serve' and '{PROG} bench': no compilation and no checkpoint at start-up; a
mismatch with the manifest (model, mode, device, GPU architecture, runtime versions,
checksums) is a clear error. Compiling takes a few minutes (tiny: ~2 min on 2 cores).

{EXIT_STATUS_HELP}
"""

EPILOG = f"""\
example:
  {PROG} export --model tiny --mode furious --checkpoint sam2.1_hiera_tiny.pt --out art/
"""


def register(subcommands: argparse._SubParsersAction) -> None:
    add_command(
        subcommands,
        "export",
        help="ahead-of-time artifacts (OpenVINO IR or AOTInductor packages + manifest)",
        description=DESCRIPTION,
        epilog=EPILOG,
        handler=export_command,
        add_arguments=add_arguments,
    )


def add_arguments(parser: CommandParser) -> None:
    parser.add_argument("--out", required=True, metavar="DIR", help="directory to write")
    add_model_flag(parser)
    add_mode_flag(parser, default="furious", modes=EXPORT_MODES)
    parser.add_argument(
        "--backend",
        choices=EXPORT_IMAGE_PATHS,
        default=None,
        help="image path runtime: openvino (IR + the IR compiled for this CPU; the fastest "
        "here) or aoti (torch.export + AOTInductor .pt2 package, batch 1) (default: openvino; "
        "artifacts are CPU-only: AOTInductor packages compiled for CUDA crashed when loaded "
        "on an H100, measured)",
    )
    parser.add_argument(
        "--decoder",
        choices=EXPORT_DECODERS,
        default="aoti",
        help="mask decoder: aoti (compiled ahead of time; its transformer 1.15-1.6x faster "
        "per prompt here, ~2 min more to export) or eager (runs from the weights) "
        "(default: %(default)s)",
    )
    add_weights_flags(parser, artifacts=False)
    add_device_flag(parser)
    add_threads_flag(parser)


def export_command(args: argparse.Namespace) -> int:
    from sam2serve.runtime.export import export_artifacts
    from sam2serve.runtime.threads import apply_threads

    device_type = args.device.split(":", 1)[0]
    backend = args.backend or ("openvino" if device_type == "cpu" else "aoti")
    if device_type not in ARTIFACT_IMAGE_PATH_DEVICES[backend]:
        devices = ", ".join(ARTIFACT_IMAGE_PATH_DEVICES[backend])
        why = (
            ": AOTInductor packages compiled for CUDA crashed when loaded (torch 2.11 on an "
            "H100, measured); on a GPU, run with --backend eager or compile instead"
            if device_type == "cuda"
            else ""
        )
        raise UsageError(
            f"--backend {backend} exports for {devices}, not --device {args.device}{why}"
        )
    model_flags.check_device(args.device)
    apply_threads(args.threads)
    try:
        with model_flags.load_errors_as_usage(args.checkpoint, args.model):
            manifest = export_artifacts(
                args.model,
                args.mode,
                args.out,
                backend=backend,
                decoder=args.decoder,
                device=args.device,
                checkpoint=args.checkpoint,
                random_weights=args.random_weights,
                seed=args.seed,
                command=command_line(args),
                progress=info_line,
            )
    except OSError as exc:
        raise UsageError(f"cannot write --out {args.out!r}: {exc.strerror or exc}") from None
    if args.random_weights:
        warning_line("exported RANDOM WEIGHTS - not a trained model")
    info_line(
        f"wrote {args.out} ({manifest['model']}, {manifest['mode']}, "
        f"{manifest['precision']}, for {manifest['target']}) in {manifest['export_seconds']} s"
    )
    return EXIT_OK
