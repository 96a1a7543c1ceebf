"""SAM 3's video predictor under the concept modes (reduced sizes, seeded random weights):
the tracker follows the mode (:func:`sam2serve.runtime.concepts.apply_tracker_mode`), a
bf16 / int8 run agrees with the fp32 run on the same frames, and the state a clip holds
stops growing. The fp32 path's equality with Meta's is test_video_sam3*.py's."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from sam2serve.concepts.agreement import mask_iou
from sam2serve.concepts.runtime import Concepts, ConceptsSpec, load_concepts
from sam2serve.concepts.tracker_heads import TrackerNeck
from sam2serve.concepts.video_association import VideoThresholds
from sam2serve.concepts.video_load import load_tracker, video_predictor
from sam2serve.concepts.video_predictor import FrameResult, Group, Record, VideoState
from sam2serve.concepts.video_tracker import MAX_COND_FRAMES, MAX_OBJ_PTRS, Sam3Tracker
from sam2serve.runtime.concepts import (
    apply_concepts_mode,
    apply_tracker_mode,
    concepts_dtype,
    tracker_precisions,
    video_predictor_in_mode,
)
from sam2serve.samples import sample_clip

# Random weights score every query within a few thousandths of 0.26 (about 0.2625 and
# 0.2647 for the objects of this clip): Meta's end-to-end test thresholds (the Meta-equality
# test's) sit between them, with a short hot start, so objects appear and are removed.
THRESHOLDS = VideoThresholds(
    score=0.262, new_det=0.262, hotstart_delay=3, hotstart_unmatch=2, hotstart_dup=2
)
# A frame's fp32 decisions are clear when every object's score on it is at least this far
# from both thresholds: bf16 moved the scores of this clip by 1e-4 at most.
CLEAR_MARGIN = 2e-4
# Mask IoU of each object with its fp32 mask, and the mean on a frame (bf16 measured
# 0.93..1.0 per object on this clip, int8 0.94..1.0).
MIN_IOU, MIN_MEAN_IOU = 0.85, 0.9
FRAMES, HEIGHT, WIDTH = 6, 120, 160


@pytest.fixture(scope="module")
def concepts() -> Iterator[Concepts]:
    torch.set_num_threads(1)  # one core: the first tier shares the machine
    yield load_concepts(ConceptsSpec(random_weights=True, size="tiny", seed=0))


def _run(concepts: Concepts, mode: str) -> list[FrameResult]:
    converted = apply_concepts_mode(concepts, mode, reduced=torch.bfloat16, copy=True)
    predictor = video_predictor_in_mode(converted, THRESHOLDS, mode=mode, reduced=torch.bfloat16)
    frames, _ = sample_clip(num_frames=FRAMES, size=(HEIGHT, WIDTH))
    state = predictor.start(FRAMES, HEIGHT, WIDTH, "red disc")
    return list(predictor.run(state, frames))


@pytest.fixture(scope="module")
def fp32_run(concepts: Concepts) -> list[FrameResult]:
    return _run(concepts, "baseline")


def test_tracker_follows_the_mode(concepts: Concepts) -> None:
    neck, tracker = load_tracker(concepts)
    before = {k: v.clone() for k, v in tracker.state_dict().items()}
    assert apply_tracker_mode(neck, tracker, "baseline", "cpu") == torch.float32
    assert set(tracker_precisions(neck, tracker).values()) == {"fp32"}
    assert all(torch.equal(v, before[k]) for k, v in tracker.state_dict().items())
    for mode in ("furious", "int8"):
        neck, tracker = load_tracker(concepts)
        dtype = apply_tracker_mode(neck, tracker, mode, "cpu", reduced=torch.bfloat16)
        assert dtype == torch.bfloat16
        assert set(tracker_precisions(neck, tracker).values()) == {"bf16"}
        # never quantised: every Linear is still a float Linear
        assert all(
            type(m) is torch.nn.Linear for m in tracker.modules() if "Linear" in type(m).__name__
        )
        # what stays float32: the prompt encoder, pointer MLPs, embeddings
        assert tracker.obj_ptr_proj.layers[0].weight.dtype == torch.float32
        assert tracker.no_obj_embed_spatial.dtype == torch.float32


def test_every_surfaces_tracker_follows_the_mode_its_detector_was_loaded_in(
    concepts: Concepts,
) -> None:
    """The service's concepts/track and Label Studio video build the predictor with no
    mode of their own: the tracker takes the mode the concept model was converted to."""
    assert concepts.mode == "baseline"
    plain = video_predictor_in_mode(concepts)
    assert set(tracker_precisions(plain.neck, plain.tracker).values()) == {"fp32"}
    converted = apply_concepts_mode(concepts, "furious", reduced=torch.bfloat16, copy=True)
    assert (converted.mode, concepts.mode) == ("furious", "baseline")
    forced = video_predictor_in_mode(converted, reduced=torch.bfloat16)
    assert set(tracker_precisions(forced.neck, forced.tracker).values()) == {"bf16"}
    native = video_predictor_in_mode(converted)  # the host's own rule: bf16 where it is native
    want = {torch.bfloat16: "bf16", torch.float32: "fp32"}[concepts_dtype("furious", "cpu")]
    assert set(tracker_precisions(native.neck, native.tracker).values()) == {want}


def test_bounded_state_keeps_the_scores_of_one_frame(concepts: Concepts) -> None:
    """Per-frame scores are trimmed with the records: a long clip's state does not grow by
    a dict per frame (unbounded, every frame's stays)."""
    count = 3
    frames, _ = sample_clip(num_frames=count, size=(HEIGHT, WIDTH))
    for bounded, most in ((True, 1), (False, count)):
        predictor = video_predictor(concepts, THRESHOLDS, bounded=bounded)
        state = predictor.start(count, HEIGHT, WIDTH, "red disc")
        held = [len(state.tracker_scores) for _ in predictor.run(state, frames)]
        assert max(held) == most, (bounded, held)


def test_tracker_precision_keeps_float32_outputs() -> None:
    tracker = Sam3Tracker(112).eval().to_precision(torch.bfloat16)
    neck = TrackerNeck(64).eval()
    grid = tracker.grid
    g = torch.Generator().manual_seed(0)
    levels = tuple(torch.randn(1, 256, s * grid, s * grid, generator=g) for s in (4, 2, 1))
    with torch.inference_mode():
        frame = tracker.frame(levels, neck.position(levels[2]))  # type: ignore[arg-type]
        memory = torch.randn(1, 64, grid, grid, generator=g).to(torch.bfloat16)
        pix = tracker.condition(frame, 1, [(memory, 6)], [(1, torch.randn(1, 256))], 16)
        out = tracker.track(pix, frame)
        encoded = tracker.encode_memory(frame, out.low_res, out.object_score, False)
    assert pix.dtype == out.low_res.dtype == out.obj_ptr.dtype == encoded.dtype == torch.float32
    assert torch.isfinite(encoded).all() and torch.isfinite(out.low_res).all()


def _clear(result: FrameResult) -> bool:
    return all(
        abs(score - th) >= CLEAR_MARGIN
        for score in result.scores
        for th in (THRESHOLDS.score, THRESHOLDS.new_det)
    )


@pytest.mark.parametrize("mode", ["furious", "int8"])
def test_reduced_precision_video_agrees_with_fp32(
    concepts: Concepts, fp32_run: list[FrameResult], mode: str
) -> None:
    got = _run(concepts, mode)
    assert [r.frame for r in got] == [r.frame for r in fp32_run] == list(range(FRAMES))
    clear = [(ref, other) for ref, other in zip(fp32_run, got, strict=True) if _clear(ref)]
    assert len(clear) >= FRAMES // 2, "too few clear frames: the comparison would be empty"
    assert sum(len(ref.obj_ids) for ref, _ in clear) >= 2
    for ref, other in clear:
        assert other.obj_ids == ref.obj_ids, f"frame {ref.frame}"
        ious = [mask_iou(a, b) for a, b in zip(ref.masks, other.masks, strict=True)]
        assert min(ious) >= MIN_IOU, f"frame {ref.frame}: {ious}"
        assert float(np.mean(ious)) >= MIN_MEAN_IOU, f"frame {ref.frame}: {ious}"


def _record(eff_iou: float) -> Record:
    record = Record(
        torch.zeros(2, 1, 4, 4), torch.zeros(2, 256), torch.ones(2, 1), torch.ones(2, 1)
    )
    record.maskmem = torch.zeros(2, 64, 2, 2, dtype=torch.bfloat16)
    record.eff_iou = eff_iou
    return record


def test_state_held_per_clip_stops_growing(concepts: Concepts) -> None:
    """60 frames of a group's records as propagation writes them (a conditioning frame
    every 7th, tracked frames whose memory score is above or below the selection threshold
    in turn), trimmed after each frame as the predictor does: the records held stop
    growing at the 4 latest conditioning frames and the 16 tracked frames memory selection
    can still read."""
    predictor = video_predictor(concepts)
    length = 60
    state = VideoState(length, HEIGHT, WIDTH)
    group = Group([0, 1])
    state.groups.append(group)
    held: list[int] = []
    for frame in range(length):
        if frame % 7 == 0:
            group.cond[frame] = _record(1.0)
        else:
            group.non_cond[frame] = _record(0.5 if frame % 3 else 0.0)
        predictor.trim(state, frame)
        held.append(len(group.cond) + len(group.non_cond))
    bound = MAX_COND_FRAMES + MAX_OBJ_PTRS
    assert max(held) <= bound < length
    assert len(group.cond) == MAX_COND_FRAMES
    assert max(held[:20]) < max(held[30:])  # it did grow before the reach was hit
    assert min(group.non_cond) > length - 3 * MAX_OBJ_PTRS  # the old frames are gone


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ([], "--mode 'int8': tracking prompts runs the modes baseline, fast, furious"),
        (["--text", "cat", "--tracker", "sam2.1"], "--mode int8 runs with --tracker sam3 only"),
    ],
)
def test_track_takes_int8_for_sam3_only(
    extra: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from sam2serve.cli import main

    argv = ["track", "sample", "--mode", "int8", "--out", str(tmp_path / "out"), *extra]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
