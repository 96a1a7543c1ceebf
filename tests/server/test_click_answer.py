"""A click's answer: its decode on one intra-op thread, and a small answer formatted, built
and serialised on the event loop (no worker-thread hops); larger ones go on as before."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import torch

from sam2serve.engine.rle import Rle
from sam2serve.server import answers, schemas, segmentations
from sam2serve.server.metrics import Metrics
from sam2serve.server.prompts import CLICK_OBJECTS, click_threads


def _rle(runs: int) -> Rle:
    return {"size": [runs, 1], "counts": [1] * runs}


class _Measured:
    def __init__(self) -> None:
        self.metrics = Metrics()


@pytest.fixture
def no_threads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """asyncio.to_thread, recorded: the calls that hopped to a worker thread."""
    hops: list[str] = []
    real = asyncio.to_thread

    async def recorded(fn: Any, *args: Any) -> Any:
        hops.append(getattr(fn, "__name__", "?"))
        return await real(fn, *args)

    monkeypatch.setattr(asyncio, "to_thread", recorded)
    return hops


def test_small_answer_is_few_runs_of_uncompressed_rle() -> None:
    limit = segmentations.INLINE_RUNS
    assert segmentations.small_answer([_rle(limit // 2), _rle(limit // 2)], "uncompressed_rle")
    assert not segmentations.small_answer(
        [_rle(limit // 2), _rle(limit // 2 + 1)], "uncompressed_rle"
    )
    assert not segmentations.small_answer([_rle(3)], "coco_rle")
    assert not segmentations.small_answer([_rle(3)], "png")


@pytest.mark.parametrize("runs, mask_format, hops", [
    (10, "uncompressed_rle", 0),
    (segmentations.INLINE_RUNS + 1, "uncompressed_rle", 1),
    (10, "coco_rle", 1),
])  # fmt: skip
def test_only_a_small_answer_is_formatted_on_the_event_loop(
    no_threads: list[str], runs: int, mask_format: str, hops: int
) -> None:
    rles = [_rle(runs)]
    out = asyncio.run(segmentations.format_segmentations(rles, mask_format, _Measured()))
    assert out == [schemas.encode_segmentation(rle, mask_format) for rle in rles]
    assert len(no_threads) == hops


def test_an_inline_json_answer_is_the_same_bytes(no_threads: list[str]) -> None:
    mask = schemas.MaskOut(mask_id="m", score=0.5, bbox=[0, 0, 1, 1], area=2, segmentation=_rle(3))
    answer = schemas.SegmentResponse(
        image_id="1" * 64, width=1, height=3, model="tiny", cached=True,
        objects=[schemas.ObjectOut(masks=[mask] * 2)], inference_ms=1.0, queue_ms=0.0,
    )  # fmt: skip
    pieces = ("objects", "masks")
    inline = asyncio.run(answers.json_answer(lambda: answer, pieces, inline=True))
    assert no_threads == []
    threaded = asyncio.run(answers.json_answer(lambda: answer, pieces))
    assert len(no_threads) == 1
    assert inline.body == threaded.body == answer.model_dump_json().encode()


@pytest.fixture
def two_threads() -> Any:
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def test_a_clicks_decode_runs_on_one_thread_then_the_count_is_back(two_threads: None) -> None:
    with click_threads(torch.device("cpu"), CLICK_OBJECTS):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == 2
    with pytest.raises(RuntimeError), click_threads(torch.device("cpu"), 1):
        raise RuntimeError("the decode failed")
    assert torch.get_num_threads() == 2


@pytest.mark.parametrize("device, objects", [("cpu", CLICK_OBJECTS + 1), ("cuda", 1)])
def test_larger_decodes_and_gpus_keep_the_threads(
    two_threads: None, device: str, objects: int
) -> None:
    with click_threads(torch.device(device), objects):
        assert torch.get_num_threads() == 2
    assert torch.get_num_threads() == 2
