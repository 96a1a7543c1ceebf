"""All objects of a frame in one batch: memory attention once per shape of memory bank
(each object reading its own frames, temporal slots and pointer distances), the heads and
the memory encoder once, and per object the logits of the per-object path (Meta's
SAM2VideoPredictor tracks object by object; SAM 2.1's objects never interact).

The per-object path is each object tracked alone in its own state, on the same frame
features. Prompts on different frames (one object with two prompted frames) make the
objects' banks differ in frames, in length and in pointer distances."""

from __future__ import annotations

from collections import defaultdict

import pytest
import torch
from small_tracker import small_tiny_tracker

from sam2serve.engine.video import VideoPredictor
from sam2serve.modeling.sam2_video import NO_OBJ_SCORE
from sam2serve.samples import sample_clip

NUM_FRAMES = 3
LOGIT_ATOL = 1e-4


@pytest.fixture(scope="module")
def tracker():
    # Every object in one frame step (a GPU's default; a CPU's runs them one at a time).
    return VideoPredictor(
        small_tiny_tracker(seed=5), feature_cache_frames=NUM_FRAMES, objects_per_call=8
    )


@pytest.fixture(scope="module")
def frames():
    clip, _ = sample_clip(NUM_FRAMES, (64, 80))
    return clip


def prompts(num_objects: int) -> dict[int, list[tuple[int, list[float]]]]:
    """obj_id -> [(frame, click)]: objects prompted on frames 0, 1 and 2 in turn; object 3
    on a second frame too (two prompted frames: a longer bank)."""
    out = {}
    for obj in range(1, num_objects + 1):
        out[obj] = [(obj % NUM_FRAMES, [8.0 + 7 * obj, 12.0 + 5 * obj])]
    out[3].append((2, [30.0, 30.0]))
    return out


def prompt(predictor, state, obj, clicks):
    for frame_idx, click in clicks:
        predictor.add_points(state, frame_idx, obj, [click], [1])


class Calls:
    """Per tracked frame, the calls of the model's batched stages and their batch sizes."""

    def __init__(self, model) -> None:
        self.frame = None
        self.calls = defaultdict(list)
        self.per_object_slots = 0
        for name in ("condition_on_memory", "forward_heads", "encode_memory"):
            setattr(model, name, self._wrap(name, getattr(model, name)))

    def _wrap(self, name, fn):
        def run(*args, **kwargs):
            if self.frame is not None:
                if name == "condition_on_memory":
                    batch = args[1]
                elif name == "forward_heads":
                    batch = args[0].shape[0]
                else:  # encode_memory(frame, low_res_masks, ...)
                    batch = args[1].shape[0]
                self.calls[(self.frame, name)].append(batch)
                if name == "condition_on_memory":
                    memories = args[2]
                    self.per_object_slots += sum(isinstance(m.tpos_index, tuple) for m in memories)
            return fn(*args, **kwargs)

        return run


@pytest.mark.parametrize("num_objects", [3, 8])
def test_objects_batched_equal_the_per_object_path(tracker, frames, num_objects):
    calls = Calls(tracker.model)
    try:
        state = tracker.init_state(frames)
        clicks = prompts(num_objects)
        for obj, obj_clicks in clicks.items():
            prompt(tracker, state, obj, obj_clicks)
        tracker.commit_prompts(state)
        batched = {}
        generator = tracker.propagate(state, start_frame_idx=0)
        for frame_idx in range(NUM_FRAMES):
            calls.frame = frame_idx
            out = next(generator)
            calls.frame = None
            assert out.frame_idx == frame_idx
            batched[frame_idx] = out.mask_logits
        assert next(generator, None) is None

        # One batch per frame: the heads and the memory encoder once for every tracked
        # object, memory attention once per bank shape; and banks that differ per object
        # (temporal slots) did share a call.
        attention_calls = tracked_objects = 0
        for frame_idx in range(NUM_FRAMES):
            tracked = [obj for obj, c in clicks.items() if frame_idx not in {f for f, _ in c}]
            assert calls.calls[(frame_idx, "forward_heads")] == [len(tracked)]
            assert calls.calls[(frame_idx, "encode_memory")] == [len(tracked)]
            attention = calls.calls[(frame_idx, "condition_on_memory")]
            assert sum(attention) == len(tracked)
            attention_calls += len(attention)
            tracked_objects += len(tracked)
        assert attention_calls < tracked_objects
        assert calls.per_object_slots > 0

        # Per object alone, on the same frame features.
        for row, (obj, obj_clicks) in enumerate(clicks.items()):
            single = tracker.init_state(frames)
            for frame_idx in range(NUM_FRAMES):
                single.features.put(frame_idx, state.features.get(frame_idx))
            prompt(tracker, single, obj, obj_clicks)
            for out in tracker.propagate(single, start_frame_idx=0):
                got = batched[out.frame_idx][row]
                want = out.mask_logits[0]
                diff = (got - want).abs().max().item()
                assert diff <= LOGIT_ATOL, f"object {obj} frame {out.frame_idx}: {diff:.3g}"
                # Not vacuous: the object is present, its mask neither empty nor full.
                assert (want > 0).any() and (want < 0).any()
                assert (want != NO_OBJ_SCORE).all()
    finally:
        for name in ("condition_on_memory", "forward_heads", "encode_memory"):
            tracker.model.__dict__.pop(name, None)


def test_reverse_and_bounded_batched_equal_the_per_object_path(tracker, frames):
    """Reverse tracking in a bounded state: the same rule."""
    clicks = prompts(3)
    state = tracker.init_state(frames, retention="bounded")
    for obj, obj_clicks in clicks.items():
        prompt(tracker, state, obj, obj_clicks)
    batched = {
        out.frame_idx: out.mask_logits
        for out in tracker.propagate(state, start_frame_idx=NUM_FRAMES - 1, reverse=True)
    }
    assert sorted(batched) == list(range(NUM_FRAMES))
    for row, (obj, obj_clicks) in enumerate(clicks.items()):
        single = tracker.init_state(frames, retention="bounded")
        for frame_idx in range(NUM_FRAMES):
            single.features.put(frame_idx, state.features.get(frame_idx))
        prompt(tracker, single, obj, obj_clicks)
        for out in tracker.propagate(single, start_frame_idx=NUM_FRAMES - 1, reverse=True):
            diff = (batched[out.frame_idx][row] - out.mask_logits[0]).abs().max().item()
            assert diff <= LOGIT_ATOL, f"object {obj} frame {out.frame_idx}: {diff:.3g}"


def test_gathered_banks_must_have_one_shape(tracker, frames):
    from sam2serve.engine.video.memory import MemorySelection, gather_memories

    state = tracker.init_state(frames)
    one = MemorySelection(((6, 0, True),), (), 2)
    two = MemorySelection(((6, 0, True), (0, 1, False)), (), 2)
    tracks = [tracker._track_for(state, 1), tracker._track_for(state, 2)]
    with pytest.raises(ValueError, match="memory banks of one shape"):
        gather_memories(tracks, [one, two], torch.device("cpu"))
    with pytest.raises(ValueError, match="2 memory selections for 1 objects"):
        gather_memories(tracks[:1], [one, one], torch.device("cpu"))


def test_objects_per_call_splits_the_frame_step_and_keeps_the_answers(tracker, frames):
    """8 objects, at most 3 per call: each tracked frame's heads and memory encoder run in
    batches of 3, 3 and the rest, and the masks are the all-at-once batch's."""
    clicks = prompts(8)
    shared = tracker.init_state(frames)
    for frame_idx in range(NUM_FRAMES):
        tracker.frame_features(shared, frame_idx)

    def run(predictor, calls=None):
        state = predictor.init_state(frames)
        for frame_idx in range(NUM_FRAMES):
            state.features.put(frame_idx, shared.features.get(frame_idx))
        for obj, obj_clicks in clicks.items():
            prompt(predictor, state, obj, obj_clicks)
        predictor.commit_prompts(state)
        out = {}
        generator = predictor.propagate(state, start_frame_idx=0)
        for frame_idx in range(NUM_FRAMES):
            if calls is not None:
                calls.frame = frame_idx
            out[frame_idx] = next(generator).mask_logits
            if calls is not None:
                calls.frame = None
        return out

    whole = run(tracker)
    chunked = VideoPredictor(tracker.model, feature_cache_frames=NUM_FRAMES, objects_per_call=3)
    calls = Calls(tracker.model)
    try:
        split = run(chunked, calls)
    finally:
        for name in ("condition_on_memory", "forward_heads", "encode_memory"):
            tracker.model.__dict__.pop(name, None)
    for frame_idx in range(NUM_FRAMES):
        tracked = len([o for o, c in clicks.items() if frame_idx not in {f for f, _ in c}])
        want = [3] * (tracked // 3) + ([tracked % 3] if tracked % 3 else [])
        assert calls.calls[(frame_idx, "forward_heads")] == want
        assert calls.calls[(frame_idx, "encode_memory")] == want
        torch.testing.assert_close(split[frame_idx], whole[frame_idx], atol=LOGIT_ATOL, rtol=0)


def test_the_cpu_tracks_one_object_per_call_by_default():
    from sam2serve.engine.video.predictor import default_objects_per_call

    assert default_objects_per_call(torch.device("cpu")) == 1
    assert default_objects_per_call(torch.device("cuda")) > 64
    assert VideoPredictor(small_tiny_tracker(seed=5)).objects_per_call == 1
    with pytest.raises(ValueError, match="objects_per_call must be at least 1, got 0"):
        VideoPredictor(small_tiny_tracker(seed=5), objects_per_call=0)
