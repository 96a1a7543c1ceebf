"""The model a command asks for: its flags as a RuntimeSpec, checked before anything loads,
and the predictor built from them, with every device, checkpoint and artifacts mistake
reported as one usage-error line.

The spec is checked without torch (a backend that cannot run on the device is a usage
error in milliseconds); the device, the checkpoint and the artifacts are checked when the
handler loads the model, after the command's inputs.
"""

from __future__ import annotations

import argparse
import contextlib
import time
import warnings
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from sam2serve.commands.common import UsageError, info_line, message, warning_line
from sam2serve.runtime.backend_choice import choose_backend
from sam2serve.runtime.backends import BACKENDS
from sam2serve.runtime.modes import get_mode
from sam2serve.runtime.spec import RuntimeSpec, WeightsSource

if TYPE_CHECKING:
    from sam2serve.engine.predictor import Predictor


def runtime_spec(args: argparse.Namespace) -> RuntimeSpec:
    """The RuntimeSpec of --model, --mode, --backend, --device and --threads; the backend
    is decided by the runtime's one rule (runtime.backend_choice: auto, or --artifacts'
    manifest); a combination that cannot run is a usage error."""
    artifacts = getattr(args, "artifacts", None)
    try:
        backend = choose_backend(args.backend, args.mode, args.device, artifacts)
        spec = RuntimeSpec(
            model=args.model,
            mode=args.mode,
            backend=backend,
            device=args.device,
            threads=args.threads,
        )
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    assert spec.backend is not None  # RuntimeSpec sets it
    if get_mode(spec.mode).quantized_encoder and not BACKENDS[spec.backend].needs_artifacts:
        check_quantizer()  # quantised at start-up: say what to install before loading
    return spec


def check_quantizer() -> None:
    """NNCF must be installed to quantise (mode int8 without artifacts); torch-free."""
    from sam2serve.runtime.quantize import QuantizerMissing, require_nncf

    try:
        require_nncf()
    except QuantizerMissing as exc:
        raise UsageError(str(exc)) from None


def weights_source(args: argparse.Namespace) -> WeightsSource:
    return WeightsSource(
        checkpoint=None if args.checkpoint is None else str(args.checkpoint),
        random_weights=args.random_weights,
        seed=args.seed,
        artifacts=None if getattr(args, "artifacts", None) is None else str(args.artifacts),
    )


def check_device(device: str) -> None:
    """A CUDA device must exist here (imports torch)."""
    if not device.startswith("cuda"):
        return
    import torch

    if not torch.cuda.is_available():
        why = "a CPU-only build" if torch.version.cuda is None else "a CUDA build that sees no GPU"
        raise UsageError(
            f"--device {device}: CUDA is not available here (torch {torch.__version__} is "
            f"{why}); use --device cpu"
        )
    _, _, index = device.partition(":")
    count = torch.cuda.device_count()
    if index and int(index) >= count:
        raise UsageError(
            f"--device {device}: there are {count} GPU(s) here, cuda:0 to cuda:{count - 1}"
        )


def add_image_decode_flag(parser: argparse._ActionsContainer, applies: str = "") -> None:
    """--image-decode {auto,host,device} (engine.decode_choice: its choices and help, as
    the service's image_decode setting and the bench's flag)."""
    from sam2serve.engine.decode_choice import (
        DEFAULT_IMAGE_DECODE,
        IMAGE_DECODE_HELP,
        IMAGE_DECODES,
    )

    parser.add_argument(
        "--image-decode",
        choices=IMAGE_DECODES,
        default=DEFAULT_IMAGE_DECODE,
        help=IMAGE_DECODE_HELP + applies + " (default: %(default)s)",
    )


def check_image_decode(choice: str, device: str, decode: bool = True) -> Any:
    """The decoder --image-decode means on --device, made and tested now (``decode``
    False: only checked, for a process whose workers decode); 'device' where it cannot
    run is a usage error naming what is missing (at start-up, not per image)."""
    from sam2serve.engine.decode_choice import (
        ImageDecodeUnavailable,
        check_device_decode,
        image_decoder,
    )

    try:
        if not decode:
            check_device_decode(choice, device)
            return None
        return image_decoder(choice, device)
    except ImageDecodeUnavailable as exc:
        raise UsageError(f"--image-decode {choice}: {exc}") from None


@contextlib.contextmanager
def load_errors_as_usage(checkpoint: str | None = None, model: str = "tiny") -> Iterator[None]:
    """Checkpoint and artifacts errors become one usage-error line (no torch advice), and
    so does a device image decoder that fails its test decode when the service starts."""
    from sam2serve.checkpoint import CheckpointError
    from sam2serve.engine.decode_choice import ImageDecodeUnavailable
    from sam2serve.runtime.export import ArtifactError

    try:
        with warnings.catch_warnings():
            # torch's unpickler warns about pickle protocols of files it then refuses.
            warnings.filterwarnings("ignore", module=r"torch\._weights_only_unpickler")
            yield
    except CheckpointError as exc:
        raise UsageError(checkpoint_message(exc, checkpoint, model)) from None
    except ArtifactError as exc:
        raise UsageError(str(exc)) from None
    except ImageDecodeUnavailable as exc:
        raise UsageError(f"--image-decode device: {exc}") from None


def checkpoint_message(exc: Exception, checkpoint: str | None, model: str) -> str:
    """The CheckpointError's message, except for a file torch.load refused: torch's own
    message suggests loading it with ``weights_only=False``, which runs any code the file
    holds. Say what the file is not instead."""
    cause = exc.__cause__
    if cause is None or isinstance(cause, OSError):  # our own message, or a download's
        return str(exc)
    if checkpoint is None:
        from sam2serve.checkpoint import resolve_checkpoint
        from sam2serve.config import get_config

        checkpoint = str(resolve_checkpoint(get_config(model), None))
    return (
        f"{checkpoint!r} is not a checkpoint sam2serve can read: it must be a PyTorch file of "
        f"tensors (like Meta's sam2.1_hiera_*.pt), which loads without running code; this "
        f"one does not ({type(cause).__name__})"
    )


def build(args: argparse.Namespace, spec: RuntimeSpec) -> Predictor:
    """The predictor the flags ask for. --fallback-random-weights (where a command has it)
    turns a checkpoint that cannot be found or read into random weights, loudly."""
    from sam2serve.checkpoint import CheckpointError, load_model
    from sam2serve.runtime.build import build_predictor
    from sam2serve.runtime.process import configure_process

    check_device(spec.device)
    configure_process(spec)  # the command's process runs this one spec; before any loading
    weights = weights_source(args)
    start = time.perf_counter()
    if weights.artifacts is not None:
        with load_errors_as_usage():
            predictor = build_predictor(spec, weights)
        announce_weights(
            spec.model,
            predictor.model.weights_info,
            f"from artifacts {weights.artifacts!r}",
            f"ready in {time.perf_counter() - start:.1f} s, nothing compiled",
        )
        return predictor
    with load_errors_as_usage(weights.checkpoint, spec.model):
        try:
            model = load_model(
                spec.model,
                checkpoint=weights.checkpoint,
                random_weights=weights.random_weights,
                seed=weights.seed,
                device=spec.device,
            )
        except CheckpointError as exc:
            if not getattr(args, "fallback_random_weights", False):
                raise
            warning_line(checkpoint_message(exc, weights.checkpoint, spec.model))
            warning_line("--fallback-random-weights: using random weights")
            model = load_model(
                spec.model, random_weights=True, seed=weights.seed, device=spec.device
            )
    try:
        predictor = build_predictor(spec, model=model)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    announce_weights(
        spec.model,
        model.weights_info,
        f"on {spec.device}",
        f"loaded in {time.perf_counter() - start:.1f} s",
    )
    return predictor


def random_weights_banner(size: str, seed: int | None) -> str:
    from sam2serve.checkpoint import DOWNLOAD_COMMAND, cache_dir
    from sam2serve.config import get_config

    bar = "!" * 78
    return "\n".join(
        [
            bar,
            f"!!! RANDOM WEIGHTS (seed {seed}): the {size} model is NOT a trained model.",
            "!!! Every mask is meaningless: use this run only to test the pipeline.",
            f"!!! For real masks run '{DOWNLOAD_COMMAND} --model {size}' (Meta's",
            f"!!! {get_config(size).checkpoint_names[0]} into {cache_dir()})",
            '!!! or pass --checkpoint PATH. Each JSON records "random": true.',
            bar,
        ]
    )


def announce_weights(size: str, info: Any, where: str, how: str) -> None:
    """The model line on stderr, after the banner when the weights are random."""
    if info.is_random:
        message(random_weights_banner(size, info.seed))
    info_line(f"model {size} {where}, {info.describe()} ({how})")


def weights_record(info: Any) -> dict[str, Any]:
    record = {**info.as_dict(), "random": info.is_random}
    if info.is_random:
        record["warning"] = info.describe()
    return record
