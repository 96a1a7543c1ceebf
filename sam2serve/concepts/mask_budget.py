"""What a concept detection's masks hold at most, for every surface that answers one
(/v1/concepts, video concept seeding, Label Studio's ``--concepts``): one formula and one
refusal, so the same phrases on the same image fit, or are refused, wherever they are asked.

A detection keeps at most ``instances`` per phrase (the highest scores, chosen before any
mask is upsampled: :func:`sam2serve.concepts.engine.postprocess`), and each kept instance's
mask is full size. While one phrase's masks are made its logits are upsampled (float, 4
bytes a pixel), their sigmoid taken (4) and thresholded (1), and the bool masks copied once
more by whoever writes them (1): ``MASK_BYTES_PER_PIXEL``. The bool masks of every phrase
held together count a byte a pixel; a surface that packs finished phrases' masks a bit a
pixel (Label Studio, between its detector batches) counts those at an eighth. Torch-free:
the surfaces check a request against it before any model work.
"""

from __future__ import annotations

from dataclasses import dataclass

MiB = 1024 * 1024
# Per kept instance and pixel while a phrase's masks are made: its float logits upsampled
# (4) and their sigmoid (4), the bool mask (1) and its copy stacked for writing (1).
MASK_BYTES_PER_PIXEL = 10


@dataclass(frozen=True)
class DetectionMasks:
    """The masks of one detection of ``phrases`` phrases on one image, ``instances`` kept
    per phrase. ``unpacked``: how many phrases' bool masks are held at once (None: every
    phrase's, as /v1/concepts holds them until its RLEs are made); when fewer, every
    phrase's kept masks are held a bit a pixel besides (Label Studio packs each detector
    batch's before the next batch runs)."""

    phrases: int
    instances: int
    height: int
    width: int
    unpacked: int | None = None

    @classmethod
    def of(
        cls,
        phrases: int,
        max_instances: int,
        queries: int,
        size: tuple[int, int],
        unpacked: int | None = None,
    ) -> DetectionMasks:
        """``max_instances`` per phrase, no more than the detector's ``queries``; ``size``
        is (height, width)."""
        height, width = size
        return cls(phrases, min(max_instances, queries), int(height), int(width), unpacked)

    @property
    def nbytes(self) -> int:
        """The held phrases' bool masks, the packed ones, plus one phrase's upsampling and
        writing copies."""
        pixels = self.height * self.width
        kept = self.instances * pixels
        if self.unpacked is None or self.unpacked >= self.phrases:
            return self.phrases * kept + kept * (MASK_BYTES_PER_PIXEL - 1)
        packed = self.phrases * self.instances * -(-pixels // 8)
        return self.unpacked * kept + kept * (MASK_BYTES_PER_PIXEL - 1) + packed

    def describe(self) -> str:
        return (
            f"masks of {self.phrases} phrase(s) x {self.instances} instances on a "
            f"{self.width}x{self.height} image"
        )

    def refusal(self, limit: int, remedy: str) -> str | None:
        """Why these masks can never be held within ``limit`` bytes (the decode budget,
        ``max_decoded_bytes_in_flight``), ending with ``remedy``; None when they fit."""
        need = self.nbytes
        if need <= limit:
            return None
        return (
            f"{self.describe()} would take {need / MiB:,.0f} MiB, more than this server holds "
            f"at once ({limit / MiB:,.0f} MiB, max_decoded_bytes_in_flight); {remedy}"
        )


__all__ = ["MASK_BYTES_PER_PIXEL", "DetectionMasks"]
