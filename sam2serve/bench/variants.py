"""AMG variants of the benchmark: the same AMG task under different quality filters.

With random weights every prompt of the default AMG fails the predicted-IoU filter, so
upscaling, stability scores, NMS and RLE never run and the AMG rows time the encoder and
the decoder alone. Variant ``keep-all`` turns both quality filters off
(``pred_iou_thresh=0, stability_score_thresh=0``): every mask goes through the whole
post-processing, the realistic AMG workload. Each variant is its own set of rows, its
baseline run included, and each mode's masks are compared with the baseline's masks of the
same variant. Torch-free, so the command line can check names before importing torch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from sam2serve.engine.amg_params import AMGParams

__all__ = ["AMG_VARIANTS", "DEFAULT_VARIANT", "AMGVariant", "parse_variants"]


@dataclass(frozen=True)
class AMGVariant:
    name: str
    help: str  # one phrase for --help and the report
    apply: Callable[[AMGParams], AMGParams]  # the run's AMG parameters from the flags'


DEFAULT_VARIANT = "default"
AMG_VARIANTS: dict[str, AMGVariant] = {
    variant.name: variant
    for variant in (
        AMGVariant(DEFAULT_VARIANT, "the AMG flags as given", lambda params: params),
        AMGVariant(
            "keep-all",
            "the AMG flags with --pred-iou-thresh 0 --stability-score-thresh 0: every mask "
            "is kept, so upscaling, stability scores, NMS and RLE run on all of them",
            lambda params: params.replace(pred_iou_thresh=0.0, stability_score_thresh=0.0),
        ),
    )
}


def parse_variants(text: str | Sequence[str]) -> tuple[str, ...]:
    """Variant names from ``"a,b"`` (or a sequence), in order, duplicates dropped; a
    ValueError names an unknown one and the known ones."""
    names = text.split(",") if isinstance(text, str) else list(text)
    names = [name.strip() for name in names if name.strip()]
    if not names:
        raise ValueError(f"--amg-variants is empty; expected some of {', '.join(AMG_VARIANTS)}")
    unknown = [name for name in names if name not in AMG_VARIANTS]
    if unknown:
        raise ValueError(
            f"unknown AMG variant(s) {', '.join(map(repr, unknown))}; expected some of "
            f"{', '.join(AMG_VARIANTS)}"
        )
    return tuple(dict.fromkeys(names))
