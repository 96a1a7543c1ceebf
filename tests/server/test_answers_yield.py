"""A large answer lets the event loop have the GIL while it is serialised; a small one
(a click's) is serialised without handing it over (each hand-over waits to get it back)."""

from __future__ import annotations

import pytest

from sam2serve.server import answers, schemas


def _answer(masks: int) -> schemas.SegmentResponse:
    rle = {"size": [3, 2], "counts": [1, 2, 3]}
    mask = schemas.MaskOut(mask_id="m", score=0.5, bbox=[0, 0, 1, 1], area=2, segmentation=rle)
    return schemas.SegmentResponse(
        image_id="1" * 64, width=2, height=3, model="tiny", cached=True,
        objects=[schemas.ObjectOut(masks=[mask] * masks)], inference_ms=1.0, queue_ms=0.0,
    )  # fmt: skip


@pytest.fixture
def sleeps(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    calls: list[float] = []
    monkeypatch.setattr(answers.time, "sleep", calls.append)
    return calls


def test_a_small_answer_keeps_the_gil(sleeps: list[float]) -> None:
    answer = _answer(3)
    assert answers.dump_json(answer, ("objects", "masks")) == answer.model_dump_json()
    assert sleeps == []


def test_pieces_hand_the_gil_over_once_the_budget_is_spent(
    sleeps: list[float], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(answers, "YIELD_EVERY_S", 0.0)  # every piece is over the budget
    answer = _answer(3)
    assert answers.dump_json(answer, ("objects", "masks")) == answer.model_dump_json()
    assert sleeps == [0] * 4  # after each of the 3 masks, then after the object
