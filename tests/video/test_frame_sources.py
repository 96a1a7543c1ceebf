"""Frame sources and retention: a video file decoded on demand gives the frames a full
decode gives (in any order of reading, seeking back included) while holding a small
window; live frames hold the newest few; and bounded retention keeps the tracked state
from growing with the clip (counted structurally: retained per-frame entries), through the
predictor's real propagation loop with the network stubbed out (the network's cost is
seconds a frame on CPU; what is counted here is bookkeeping)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from sam2serve.checkpoint import load_video_model
from sam2serve.engine.video import VideoPredictor, VideoPromptError
from sam2serve.engine.video.frames import FrameError
from sam2serve.engine.video.retention import memory_window
from sam2serve.engine.video.sources import FrameGone, LiveFrames, VideoFileFrames
from sam2serve.engine.video.state import FrameOutput
from sam2serve.engine.video_io import decode_video, write_video

pytest.importorskip("av")


def moving_square(num_frames: int, size=(48, 64)) -> list[np.ndarray]:
    frames = []
    for i in range(num_frames):
        frame = np.full((*size, 3), 40, np.uint8)
        x = (3 * i) % (size[1] - 16)
        frame[10:26, x : x + 16] = (200, 60 + i % 100, 30)
        frames.append(frame)
    return frames


@pytest.fixture(scope="module")
def clip(tmp_path_factory):
    path = tmp_path_factory.mktemp("clip") / "clip.mp4"
    write_video(path, moving_square(90), fps=30)
    return path


def test_a_file_source_decodes_what_a_full_decode_does_in_any_order(clip):
    full = decode_video(str(clip), "clip").frames
    source = VideoFileFrames(clip, window=3)
    assert len(source) == len(full) == 90
    assert (source.height, source.width) == full[0].shape[:2]
    order = [0, 1, 2, 50, 51, 10, 89, 3, 3, 88, 0]
    for i in order:
        np.testing.assert_array_equal(source.frame(i), full[i], err_msg=f"frame {i}")
        assert source.held_frames() <= 3
    assert source.seeks >= 2  # frames before the window were found by seeking, not held
    with pytest.raises(FrameError, match="out of range"):
        source.frame(90)
    source.close()


def test_a_live_source_holds_its_newest_frames():
    live = LiveFrames(48, 64, keep=3)
    frames = moving_square(5)
    assert [live.append(f) for f in frames] == [0, 1, 2, 3, 4]
    assert len(live) == 5 and not live.final and live.held_frames() == 3
    np.testing.assert_array_equal(live.frame(4), frames[4])
    with pytest.raises(FrameGone, match="frame 1 is gone"):
        live.frame(1)
    with pytest.raises(FrameError, match="32x48; this live video's frames are 64x48"):
        live.append(np.zeros((48, 32, 3), np.uint8))
    with pytest.raises(FrameError, match="uint8"):
        live.append(np.zeros((48, 64, 3), np.float32))
    assert len(live) == 5  # a refused frame takes no index
    live.end()
    assert live.final
    with pytest.raises(FrameError, match="ended"):
        live.append(frames[0])


class StubNetworkPredictor(VideoPredictor):
    """The real predictor's bookkeeping (prompts, memory selection, propagation, retention)
    over a network stub: every frame's "output" is a constant of the right kind."""

    def frame_features(self, state, frame_idx):
        state.source.frame(frame_idx)  # the frame is read as the real one would
        self.reads.append(frame_idx)

    def _track_frame(self, state, tracks, frame_idx, **kwargs):
        self.frame_features(state, frame_idx)
        batch = len(tracks)
        low_res = torch.full((batch, 1, 4, 4), 1.0)
        outputs = [
            FrameOutput(low_res[i : i + 1], torch.zeros(1, 8), torch.ones(1, 1), torch.zeros(1))
            for i in range(batch)
        ]
        return outputs, low_res


@pytest.fixture(scope="module")
def stub():
    predictor = StubNetworkPredictor(load_video_model("tiny", random_weights=True, seed=0))
    predictor.reads = []
    return predictor


def tracked_entries(stub, source, retention: str) -> tuple[int, list[int]]:
    state = stub.init_state(source, retention=retention)
    stub.add_points(state, 0, 1, [[20, 20]], [1])
    stub.add_points(state, 0, 2, [[40, 20]], [1])
    order = [frame.frame_idx for frame in stub.propagate(state)]
    return state.retained_entries(), order


def test_bounded_retention_does_not_grow_with_the_clip(stub):
    window = memory_window(stub.config)
    short, order_short = tracked_entries(stub, moving_square(3 * window), "bounded")
    long, order_long = tracked_entries(stub, moving_square(10 * window), "bounded")
    assert order_short == list(range(3 * window)) and order_long == list(range(10 * window))
    assert short == long  # the same entries whatever the length
    exact_short, _ = tracked_entries(stub, moving_square(3 * window), "exact")
    exact_long, _ = tracked_entries(stub, moving_square(10 * window), "exact")
    assert exact_long - exact_short == 2 * 2 * 7 * window  # 2 objects x (output + mark)


def test_a_long_file_in_bounded_mode_holds_a_window_of_frames(stub, clip):
    source = VideoFileFrames(clip, window=2)
    stub.reads.clear()
    entries, order = tracked_entries(stub, source, "bounded")
    assert order == list(range(90))
    assert source.held_frames() <= 2
    assert source.decoded_frames == 90  # one sequential decode, no frame twice
    assert entries == tracked_entries(stub, moving_square(40), "bounded")[0]


def test_a_correction_on_a_dropped_frame_is_refused(stub):
    state = stub.init_state(moving_square(60), retention="bounded")
    stub.add_points(state, 0, 1, [[20, 20]], [1])
    for _ in stub.propagate(state):
        pass
    with pytest.raises(VideoPromptError, match="retention 'bounded'"):
        stub.add_points(state, 30, 1, [[20, 20]], [1])
    stub.add_points(state, 58, 1, [[20, 20]], [1])  # a recent frame is kept: answered
    stub.add_points(state, 30, 2, [[20, 20]], [1])  # a new object there: not a correction


def test_live_tracking_answers_each_frame_in_order(stub):
    live = LiveFrames(48, 64, keep=4)
    state = stub.init_state(live, retention="bounded")
    answers = []
    for i, frame in enumerate(moving_square(50)):
        index = live.append(frame)
        if i == 2:
            stub.add_points(state, index, 7, [[20, 20]], [1])
            stub.commit_prompts(state)
        answers.append(stub.track_next(state, index))
    assert [a.frame_idx for a in answers] == list(range(50))
    assert [a.obj_ids for a in answers[:2]] == [[], []]
    assert all(a.obj_ids == [7] for a in answers[2:])
    # Cached features, and one object's prompted frame (output + mark) and the output and
    # mark of each frame of the window behind the newest.
    window = memory_window(stub.config)
    assert state.retained_entries() == stub.feature_cache_frames + 2 + 2 * (window - 1)
    assert live.held_frames() == 4


class SelectionRecorder(StubNetworkPredictor):
    """Records the memory bank each tracked frame reads (frame -> selection)."""

    def _track_frame(self, state, tracks, frame_idx, **kwargs):
        if kwargs.get("selection") is not None:
            self.selections[frame_idx] = kwargs["selection"]
        return super()._track_frame(state, tracks, frame_idx, **kwargs)


def selections(recorder, retention: str, passes) -> list[dict]:
    state = recorder.init_state(moving_square(70), retention=retention)
    recorder.add_points(state, 30, 1, [[20, 20]], [1])
    recorder.add_points(state, 50, 1, [[30, 20]], [1])
    out = []
    for start, reverse in passes:
        recorder.selections = {}
        for _ in recorder.propagate(state, start_frame_idx=start, reverse=reverse):
            pass
        out.append(recorder.selections)
    return out


def test_one_pass_reads_the_same_memories_in_both_modes():
    """Bounded mode drops only what no later frame of the pass reads: every frame's memory
    bank (the frames it reads) is the exact mode's, so the network computes the same."""
    recorder = SelectionRecorder(load_video_model("tiny", random_weights=True, seed=0))
    recorder.reads = []
    forward = [(30, False)]
    assert selections(recorder, "bounded", forward) == selections(recorder, "exact", forward)
    reverse = [(50, True)]
    assert selections(recorder, "bounded", reverse) == selections(recorder, "exact", reverse)
    # A reverse pass after a forward one: its first frames would read the forward pass's
    # memories just after the start, which bounded mode dropped (docs/video.md).
    both = [(30, False), (30, True)]
    exact, bounded = selections(recorder, "exact", both), selections(recorder, "bounded", both)
    assert exact[0] == bounded[0]
    # The frames within pointer reach of the dropped ones (the prompted frame 30 itself and
    # everything past the window read the same bank).
    differing = sorted(t for t in exact[1] if exact[1][t] != bounded[1][t])
    assert differing == list(range(30 - memory_window(recorder.config) + 2, 30))


@pytest.mark.extended
def test_live_tracking_computes_what_propagation_does():
    """The real network (tiny, seeded random weights): frames appended one at a time and
    tracked with track_next give, bit for bit, the masks propagate gives over the same
    frames (a video still growing in both: the memory's pointer horizon is a long clip's)."""
    from sam2serve.samples import sample_clip

    predictor = VideoPredictor(load_video_model("tiny", random_weights=True, seed=1))
    frames, _ = sample_clip(3, (64, 96))
    live = LiveFrames(64, 96, keep=3)
    state = predictor.init_state(live, retention="bounded")
    got = []
    for i, frame in enumerate(frames):
        index = live.append(frame)
        if i == 0:
            predictor.add_points(state, index, 1, [[30, 30]], [1])
            predictor.commit_prompts(state)
        got.append(predictor.track_next(state, index).mask_logits)
    held = LiveFrames(64, 96, keep=3)
    for frame in frames:
        held.append(frame)
    offline = predictor.init_state(held)
    predictor.add_points(offline, 0, 1, [[30, 30]], [1])
    want = [frame.mask_logits for frame in predictor.propagate(offline)]
    assert len(got) == len(want) == 3
    for i, (a, b) in enumerate(zip(got, want, strict=True)):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=f"frame {i}")


def test_a_live_source_read_while_frames_arrive_is_a_held_frame_or_gone():
    """A reader on another thread (the frames route) while frames are appended: every
    frame it gets is the one it asked for, or FrameGone; never another frame, never an
    IndexError."""
    import threading

    source = LiveFrames(2, 2, keep=2)
    stop = threading.Event()
    wrong: list[str] = []

    def read() -> None:
        while not stop.is_set():
            newest = len(source) - 1
            for index in (newest - 2, newest - 1, newest):
                if index < 0:
                    continue
                try:
                    frame = source.frame(index)
                except FrameGone:
                    continue
                except (IndexError, FrameError) as exc:  # what an unlocked read raised
                    wrong.append(repr(exc))
                    continue
                if int(frame[0, 0, 0]) != index % 256:
                    wrong.append(f"asked {index}, got {int(frame[0, 0, 0])}")

    reader = threading.Thread(target=read)
    reader.start()
    try:
        for i in range(20_000):
            source.append(np.full((2, 2, 3), i % 256, np.uint8))
    finally:
        stop.set()
        reader.join()
    assert not wrong, wrong[:5]
