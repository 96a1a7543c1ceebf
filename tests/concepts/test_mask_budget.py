"""The concept mask budget shared by /v1/concepts and Label Studio, on hand-computed cases."""

from __future__ import annotations

from sam2serve.concepts.mask_budget import MASK_BYTES_PER_PIXEL, DetectionMasks

MiB = 1024 * 1024


def test_every_phrase_held_unpacked_is_the_services_formula():
    masks = DetectionMasks.of(3, 100, 20, (120, 90))  # 100 asked, 20 queries: 20 kept
    assert masks.instances == 20
    pixels = 120 * 90
    assert masks.nbytes == 3 * 20 * pixels + 20 * pixels * (MASK_BYTES_PER_PIXEL - 1)
    same = DetectionMasks.of(3, 100, 20, (120, 90), unpacked=3)
    assert same.nbytes == masks.nbytes


def test_phrases_packed_between_batches_count_a_bit_a_pixel():
    masks = DetectionMasks(32, 10, 100, 99, unpacked=2)  # 9,900 pixels: 1,238 bytes packed
    assert masks.nbytes == 2 * 10 * 9_900 + 10 * 9_900 * 9 + 32 * 10 * 1_238
    assert masks.nbytes < DetectionMasks(32, 10, 100, 99).nbytes


def test_the_refusal_names_the_masks_the_budget_and_the_remedy():
    masks = DetectionMasks.of(2, 3, 20, (3000, 4000))
    assert masks.nbytes == 2 * 3 * 12_000_000 + 3 * 12_000_000 * 9  # 396,000,000
    assert masks.refusal(400_000_000, "ask less") is None
    message = masks.refusal(256 * MiB, "ask less")
    assert message is not None
    assert message.startswith("masks of 2 phrase(s) x 3 instances on a 4000x3000 image")
    assert "378 MiB" in message and "(256 MiB, max_decoded_bytes_in_flight)" in message
    assert message.endswith("; ask less")
