"""``sam2serve export``: ahead-of-time artifacts for a start-up without compilation."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

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
    COMPILE_CACHE_EXPORT,
    COMPILE_CACHE_MODES,
    ONNX_EXPORT,
    ONNX_MODES,
)
from sam2serve.runtime.modes import MODES

EXPORT_IMAGE_PATHS = ARTIFACT_IMAGE_PATHS
EXPORT_FORMATS = (*ARTIFACT_IMAGE_PATHS, ONNX_EXPORT, COMPILE_CACHE_EXPORT)
EXPORT_DECODERS = ARTIFACT_DECODERS
# Artifacts hold the fast decoder: the modes that run it.
EXPORT_MODES = tuple(name for name, mode in MODES.items() if mode.decoder == "fast")
DEFAULT_EXPORT_MODE = "furious"

DESCRIPTION = f"""\
Export the model for the {" or ".join(EXPORT_MODES)} mode as ahead-of-time artifacts: the
whole image path as OpenVINO IR (converted from sam2serve's own PyTorch modules) and
compiled for this CPU, or with --format aoti as a torch.export + AOTInductor package; the
fast mask decoder as three torch.export + AOTInductor packages (per image, per chunk of
prompts, per chunk of kept masks) unless --decoder eager; the prompt encoder and mask
decoder weights; and manifest.json (model, mode, precision, runtime versions, shapes,
sha256 of every file, the command). Load them with --artifacts DIR in '{PROG} run',
'{PROG} serve' and '{PROG} bench': no compilation and no checkpoint at start-up; a
mismatch with the manifest (model, mode, device, GPU architecture, runtime versions,
checksums) is a clear error. Compiling takes a few minutes (tiny: ~2 min on 2 cores).
With --mode int8 the OpenVINO image path is first quantised by NNCF on calibration
photographs (pip install "sam2serve[int8]"); the manifest records precision int8 and the
calibration.
With --format onnx (modes {" and ".join(ONNX_MODES)}): image_encoder.onnx and
prompt_decoder.onnx in the interface annotation tools running SAM 2 through ONNX Runtime
consume (docs/onnx.md), int8-quantised encoder with --mode int8; run them with
'{PROG} run --backend onnxruntime --artifacts DIR' or plain onnxruntime. With --video
as well, the video path's graphs too (frame encoder, memory attention, video decoder,
memory encoder, with the tracking rules in the manifest): a plain onnxruntime + numpy
tracking loop runs them (docs/video.md, "ONNX").
With --format compile-cache (modes {" and ".join(COMPILE_CACHE_MODES)}, --device cpu or cuda):
what '--backend compile' compiles at its warm-up (torch's portable compile caches and the
C++ kernels Inductor built), for this torch, Python and CPU or GPU. Put the directory in
$SAM2SERVE_CACHE/compile/ (e.g. --out $SAM2SERVE_CACHE/compile/large-furious): '{PROG}
serve' and '{PROG} run' with --backend compile load a matching one there instead of
compiling; a mismatch is logged and ignored. They write one there themselves after their
first compilation when the cache is writable (docs/architecture.md, "Compile cache").

{EXIT_STATUS_HELP}
"""

EPILOG = f"""\
example:
  {PROG} export --model tiny --mode furious --checkpoint sam2.1_hiera_tiny.pt --out art/
  {PROG} export --format onnx --video --model tiny --checkpoint sam2.1_hiera_tiny.pt --out onnx/
  {PROG} export --format compile-cache --model tiny --mode furious --random-weights \\
      --out $SAM2SERVE_CACHE/compile/tiny-furious
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
    add_mode_flag(parser, default=None, modes=EXPORT_MODES)
    [mode_flag] = [a for a in parser._actions if "--mode" in a.option_strings]
    assert mode_flag.help is not None  # add_mode_flag writes one
    mode_flag.help = mode_flag.help.replace(
        "%(default)s", f"{DEFAULT_EXPORT_MODE}; {ONNX_MODES[0]} with --format onnx"
    )
    parser.add_argument(
        "--format",
        choices=EXPORT_FORMATS,
        default=None,
        help="what is written: openvino (the image path as OpenVINO IR, plus the IR compiled "
        "for this CPU) or aoti (the image path as a torch.export + AOTInductor .pt2 package, "
        "batch 1), both run by backend artifacts (default: openvino; CPU-only: AOTInductor "
        "packages compiled for CUDA crashed when loaded on a GPU); or onnx: ONNX graphs for "
        "backend onnxruntime and the annotation tools (docs/onnx.md; --mode fast or int8, "
        "default fast); or compile-cache: backend compile's compilation, loaded from "
        "$SAM2SERVE_CACHE/compile/ at start-up (--mode fast or furious; cpu or cuda)",
    )
    parser.add_argument(
        "--video",
        action="store_true",
        help="with --format onnx (mode fast): also write the video path's graphs "
        "(frame_encoder, memory_attention, video_decoder, memory_encoder .onnx) and the "
        "tracking rules, for tracking with ONNX Runtime (docs/video.md)",
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

    if args.format == ONNX_EXPORT:
        return export_onnx_command(args)
    if args.format == COMPILE_CACHE_EXPORT:
        return export_compile_cache_command(args)
    if args.video:
        raise UsageError("--video exports ONNX graphs: use it with --format onnx")
    args.mode = args.mode or DEFAULT_EXPORT_MODE
    device_type = args.device.split(":", 1)[0]
    backend = args.format or ("openvino" if device_type == "cpu" else "aoti")
    if device_type not in ARTIFACT_IMAGE_PATH_DEVICES[backend]:
        devices = ", ".join(ARTIFACT_IMAGE_PATH_DEVICES[backend])
        why = (
            ": AOTInductor packages compiled for CUDA crashed when loaded (docs/benchmarks.md, "
            "GPU); on a GPU, run with --backend eager or compile instead"
            if device_type == "cuda"
            else ""
        )
        raise UsageError(
            f"--format {backend} exports for {devices}, not --device {args.device}{why}"
        )
    if MODES[args.mode].quantized_encoder is not None:
        if backend != "openvino":
            raise UsageError(
                f"--mode {args.mode} exports its image path through OpenVINO (NNCF "
                f"quantisation), not --format {backend} (or use --format onnx)"
            )
        model_flags.check_quantizer()
    model_flags.check_device(args.device)
    apply_threads(args.threads)
    return _write(
        args,
        lambda: export_artifacts(
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
        ),
        lambda manifest: f"for {manifest['target']}",
    )


def export_onnx_command(args: argparse.Namespace) -> int:
    """--format onnx: the ONNX graphs, the video path's too with --video (CPU export;
    they run on any provider)."""
    mode = args.mode or ONNX_MODES[0]
    if mode not in ONNX_MODES:
        raise UsageError(
            f"--format onnx exports the {' and '.join(ONNX_MODES)} modes, not --mode {mode}"
        )
    if args.video and mode != "fast":
        raise UsageError(
            f"--video exports the video graphs in mode fast (tracking has no {mode} path), "
            f"not --mode {mode}"
        )
    if args.device != "cpu":
        raise UsageError(
            f"--format onnx exports on the cpu (the graphs then run on any ONNX Runtime "
            f"execution provider), not --device {args.device}"
        )
    from sam2serve.runtime.onnx_export import export_onnx, require_onnx
    from sam2serve.runtime.threads import apply_threads

    with model_flags.load_errors_as_usage():
        require_onnx()
    apply_threads(args.threads)
    return _write(
        args,
        lambda: export_onnx(
            args.model,
            mode,
            args.out,
            checkpoint=args.checkpoint,
            random_weights=args.random_weights,
            seed=args.seed,
            video=args.video,
            command=command_line(args),
            progress=info_line,
        ),
        lambda manifest: (
            f"ONNX opset {manifest['opset']}"
            + (", with the video graphs" if manifest.get("video") is not None else "")
        ),
    )


def export_compile_cache_command(args: argparse.Namespace) -> int:
    """--format compile-cache: backend compile's compilation, on any device it runs on."""
    mode = args.mode or DEFAULT_EXPORT_MODE
    if mode not in COMPILE_CACHE_MODES:
        raise UsageError(
            f"--format {COMPILE_CACHE_EXPORT} keeps backend compile's compilation: modes "
            f"{' and '.join(COMPILE_CACHE_MODES)}, not --mode {mode}"
        )
    if args.video:
        raise UsageError("--video exports ONNX graphs: use it with --format onnx")
    from sam2serve.runtime.backends.compiled import export_compile_cache
    from sam2serve.runtime.process import configure_process
    from sam2serve.runtime.spec import RuntimeSpec

    model_flags.check_device(args.device)
    # Threads and TF32 as 'serve' sets them: the compiled kernels depend on both.
    configure_process(RuntimeSpec(args.model, mode, "compile", args.device, args.threads))
    return _write(
        args,
        lambda: export_compile_cache(
            args.model,
            mode,
            args.out,
            device=args.device,
            checkpoint=args.checkpoint,
            random_weights=args.random_weights,
            seed=args.seed,
            command=command_line(args),
            progress=info_line,
        ),
        lambda manifest: f"torch {manifest['identity']['torch']} on {manifest['target']}",
        weights_inside=False,
    )


def _write(
    args: argparse.Namespace,
    export: Callable[[], dict[str, Any]],
    target: Callable[[dict[str, Any]], str],
    weights_inside: bool = True,
) -> int:
    """Run ``export``, with checkpoint and --out errors as usage errors, and announce what
    it wrote (``target`` names what the manifest is for; ``weights_inside``: whether the
    export holds the weights, which random weights are then said of)."""
    try:
        with model_flags.load_errors_as_usage(args.checkpoint, args.model):
            manifest = export()
    except OSError as exc:
        raise UsageError(f"cannot write --out {args.out!r}: {exc.strerror or exc}") from None
    if args.random_weights and weights_inside:
        warning_line("exported RANDOM WEIGHTS - not a trained model")
    info_line(
        f"wrote {args.out} ({manifest['model']}, {manifest['mode']}, {manifest['precision']}, "
        f"{target(manifest)}) in {manifest['export_seconds']} s"
    )
    return EXIT_OK
