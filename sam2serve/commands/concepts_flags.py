"""The flags that choose SAM 3's concept model, shared by every command that runs it
(``run --task concepts``, ``serve --concepts``, ``labelstudio``, ``bench``); torch-free."""

from __future__ import annotations

import argparse
from pathlib import Path

from sam2serve.commands.common import PROG, UsageError

SAM3_SIZES = ("full", "tiny")
# The backends SAM 3 runs on (sam2serve.runtime.concepts.CONCEPTS_BACKEND; auto picks it).
SAM3_BACKENDS = ("auto", "eager")


def add_concepts_flags(group: argparse._ActionsContainer) -> None:
    """--sam3-weights DIR and --sam3-size (random weights and --seed come from the
    command's --random-weights / --seed)."""
    group.add_argument(
        "--sam3-weights",
        metavar="DIR",
        help="folder holding SAM 3's sam3.pt, vocab.json and merges.txt (default: the "
        f"cache's sam3 folder, filled by '{PROG} download --model sam3', which needs "
        "HF_TOKEN: the weights are gated under the SAM License)",
    )
    group.add_argument(
        "--sam3-size",
        choices=SAM3_SIZES,
        default="full",
        help="SAM 3's size with --random-weights: full (SAM 3's own, 842M parameters) or "
        "tiny (every module, small widths: tests and smoke runs) (default: %(default)s)",
    )


def concepts_spec(args: argparse.Namespace, device: str = "cpu"):
    """The :class:`~sam2serve.concepts.runtime.ConceptsSpec` of parsed flags (a
    :class:`UsageError` naming a contradiction)."""
    from sam2serve.concepts.runtime import ConceptsSpec

    random_weights = bool(getattr(args, "random_weights", False))
    if random_weights and args.sam3_weights:
        raise UsageError("--sam3-weights and --random-weights exclude each other")
    try:
        return ConceptsSpec(
            weights=Path(args.sam3_weights) if args.sam3_weights else None,
            random_weights=random_weights,
            seed=int(getattr(args, "seed", 0) or 0),
            size=args.sam3_size,
            device=device,
        )
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def check_concepts_backend(backend: str | None) -> None:
    """SAM 3 runs on the eager backend (no other measured faster yet): ``--backend`` must
    leave it to ``auto`` or name ``eager``."""
    if backend not in (None, *SAM3_BACKENDS):
        raise UsageError(
            f"--backend {backend} is SAM 2.1's; SAM 3 runs on the eager backend (give "
            "--backend auto or eager)"
        )
