"""Where a tracked video's frames come from: one concept, three sources.

A :class:`FrameSource` is what a :class:`~sam2serve.engine.video.state.VideoState` reads a
frame from when its features are needed (``frame(i)``: uint8 (H, W, 3)). Its length may
grow (a live source), and a source may hold only some frames in memory:

- :class:`ArrayFrames`: the caller's arrays, all held (what ``init_state`` wraps a list
  in; Meta's predictor holds every frame too).
- :class:`VideoFileFrames`: a video file decoded on demand, a small window of decoded
  frames held: reading forward decodes on; a frame before the window seeks to the key
  frame before it (by its presentation timestamp, counted when the file is opened) and
  decodes from there. The frames are PyAV's, as :func:`sam2serve.engine.video_io.decode_video`
  decodes them (the same arrays).
- :class:`LiveFrames`: frames appended as they arrive (a camera, a stream); the newest
  ``keep`` are held, an older one is gone (:class:`FrameGone`).

Every source checks what it hands out: uint8 (H, W, 3) of the source's size.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections import OrderedDict, deque
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from sam2serve.engine.video.frames import FrameError, check_frames


class FrameGone(FrameError):
    """A frame the source no longer holds and cannot read again (a live source's old
    frame); the message says which and what is held."""


class FrameSource(ABC):
    """A video's frames, by index; ``height``/``width`` shared by all of them."""

    height: int
    width: int

    @abstractmethod
    def __len__(self) -> int:
        """The frames there are now (a live source's grows)."""

    @property
    def final(self) -> bool:
        """Whether ``len`` is the video's length (False: more frames may come)."""
        return True

    @abstractmethod
    def frame(self, index: int) -> np.ndarray:
        """Frame ``index`` as uint8 (H, W, 3); FrameGone if the source cannot give it."""

    @abstractmethod
    def held_bytes(self) -> int:
        """Bytes of decoded frames this source holds now."""

    def held_frames(self) -> int:
        """Decoded frames this source holds now."""
        return self.held_bytes() // max(1, self.height * self.width * 3)

    # Sequence-like reading (``state.frames[i]``, ``for frame in state.frames``).
    def __getitem__(self, index: int) -> np.ndarray:
        return self.frame(index)

    def __iter__(self) -> Iterator[np.ndarray]:
        for index in range(len(self)):
            yield self.frame(index)

    def _check_index(self, index: int) -> int:
        if isinstance(index, bool) or not isinstance(index, (int, np.integer)):
            raise FrameError(f"frame index must be an integer, got {index!r}")
        if not 0 <= index < len(self):
            raise FrameError(f"frame {index} is out of range: the source has {len(self)} frames")
        return int(index)


class ArrayFrames(FrameSource):
    """Frames held as the caller's uint8 arrays (kept, not copied)."""

    def __init__(self, frames: Sequence[np.ndarray]) -> None:
        self.height, self.width = check_frames(frames)
        self._frames = list(frames)

    def __len__(self) -> int:
        return len(self._frames)

    def frame(self, index: int) -> np.ndarray:
        return self._frames[self._check_index(index)]

    def held_bytes(self) -> int:
        return sum(frame.nbytes for frame in self._frames)


class VideoFileFrames(FrameSource):
    """A video file decoded on demand: at most ``window`` decoded frames held.

    Opening it demuxes the file once (no decoding) to count its frames and note each one's
    presentation timestamp (8 bytes a frame), within ``max_frames`` and ``max_pixels``.
    Not safe to read from two threads at once (one decoder); a lock serialises readers.
    """

    def __init__(
        self,
        source: str | Path | BinaryIO,
        name: str | None = None,
        *,
        window: int = 4,
        max_frames: int | None = None,
        max_pixels: int | None = None,
    ) -> None:
        from sam2serve.engine.video_io import VideoError, probe_video, reading_video

        if window < 1:
            raise ValueError(f"window must be at least 1, got {window}")
        self._source = str(source) if isinstance(source, Path) else source
        self.name = name or str(source)
        self.window = window
        self._max_pixels = max_pixels
        probe = probe_video(self._source, self.name, max_frames=max_frames, max_pixels=max_pixels)
        self.width, self.height, self.fps = probe.width, probe.height, probe.fps
        with reading_video(self.name):
            self._pts = self._frame_timestamps()
        if self._pts is None:
            self._count = probe.frames
        else:
            self._count = len(self._pts)
        if self._count == 0:
            raise VideoError(f"{self.name!r} has no frames")
        self._held: OrderedDict[int, np.ndarray] = OrderedDict()
        self._lock = threading.Lock()
        self._reader: Any = None  # the open VideoReader
        self._decoded: Iterator[Any] | None = None
        self._next = 0  # the index of the frame the open decoder yields next
        self.decoded_frames = 0  # frames decoded since opening (what re-reading costs)
        self.seeks = 0

    def __len__(self) -> int:
        return self._count

    def held_bytes(self) -> int:
        return sum(frame.nbytes for frame in self._held.values())

    def frame(self, index: int) -> np.ndarray:
        from sam2serve.engine.video_io import reading_video

        index = self._check_index(index)
        with self._lock:
            held = self._held.get(index)
            if held is not None:
                self._held.move_to_end(index)
                return held
            with reading_video(self.name):  # what PyAV raises on a file cut short, as a VideoError
                if self._decoded is None or index < self._next:
                    self._restart(index, seek=True)
                while True:
                    frame = self._decode_next()
                    if self._next - 1 == index:
                        return frame
                    if self._next - 1 > index:  # a seek that landed past it: from the start
                        self._restart(index, seek=False)

    def close(self) -> None:
        with self._lock:
            if self._reader is not None:
                self._reader.close()
            self._reader, self._decoded = None, None
            self._held.clear()

    # -- decoding ---------------------------------------------------------------------------

    def _open(self) -> Any:
        """A VideoReader of the file (an open file is read again from its start)."""
        from sam2serve.engine.video_io import VideoReader

        return VideoReader(self._source, self.name, max_pixels=self._max_pixels)

    def _frame_timestamps(self) -> np.ndarray | None:
        """Each frame's pts in presentation order (the i-th smallest is frame i), or None
        when some packet has none (then reading back re-decodes from the start)."""
        pts = []
        with self._open() as video:
            for packet in video.packets():
                if packet.pts is None:
                    return None
                pts.append(packet.pts)
        return np.sort(np.asarray(pts, dtype=np.int64))

    def _restart(self, index: int, seek: bool) -> None:
        """Open the decoder so that it yields frame ``index`` or an earlier one next."""
        if self._reader is None:
            self._reader = self._open()
        if seek and self._decoded is not None and self._pts is not None and index > 0:
            self._reader.seek(int(self._pts[index]))
            self.seeks += 1
            self._decoded = self._reader.frames()
            self._next = -1  # known from the first frame's pts
        else:
            if self._decoded is not None:  # back to the start: open the file again
                self._reader.close()
                self._reader = self._open()
            self._decoded = self._reader.frames()
            self._next = 0

    def _decode_next(self) -> np.ndarray:
        from sam2serve.engine.video_io import VideoError, as_rgb

        assert self._decoded is not None
        try:
            frame = next(self._decoded)
        except StopIteration:
            raise VideoError(f"{self.name!r} ended before frame {self._next}") from None
        if self._next == -1:  # after a seek: the frame's index from its timestamp
            assert self._pts is not None
            if frame.pts is None:
                raise VideoError(f"{self.name!r}: a frame without a timestamp after a seek")
            self._next = int(np.searchsorted(self._pts, frame.pts))
        array = as_rgb(frame)  # the reader checked its size
        self.decoded_frames += 1
        self._held[self._next] = array
        self._held.move_to_end(self._next)
        while len(self._held) > self.window:
            self._held.popitem(last=False)
        self._next += 1
        return array


class LiveFrames(FrameSource):
    """Frames appended as they arrive; the newest ``keep`` held (an older one is gone)."""

    def __init__(self, height: int, width: int, *, keep: int = 8) -> None:
        if height < 1 or width < 1:
            raise FrameError(f"a live video needs a size, got {width}x{height}")
        if keep < 1:
            raise ValueError(f"keep must be at least 1, got {keep}")
        self.height, self.width, self.keep = height, width, keep
        self._frames: deque[np.ndarray] = deque(maxlen=keep)
        self._count = 0
        self._ended = False
        # Frames are appended on the model worker while a request may read one on the
        # event loop: the count and the held frames change together.
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return self._count

    @property
    def final(self) -> bool:
        return self._ended

    def end(self) -> None:
        """No more frames will come."""
        self._ended = True

    @property
    def oldest_held(self) -> int:
        return self._count - len(self._frames)

    def append(self, frame: np.ndarray) -> int:
        """Add the next frame (uint8 (H, W, 3) of the source's size); its index."""
        if self._ended:
            raise FrameError("the live video has ended: no more frames are taken")
        if not isinstance(frame, np.ndarray) or frame.dtype != np.uint8 or frame.ndim != 3:
            raise FrameError(f"frame {self._count} must be a uint8 (H, W, 3) numpy array")
        if frame.shape != (self.height, self.width, 3):
            raise FrameError(
                f"frame {self._count} is {frame.shape[1]}x{frame.shape[0]}; this live video's "
                f"frames are {self.width}x{self.height}"
            )
        with self._lock:
            self._frames.append(frame)
            self._count += 1
            return self._count - 1

    def frame(self, index: int) -> np.ndarray:
        with self._lock:
            index = self._check_index(index)
            oldest = self.oldest_held
            if index < oldest:
                raise FrameGone(
                    f"frame {index} is gone: a live video holds its newest {self.keep} frames "
                    f"({oldest}..{self._count - 1})"
                )
            return self._frames[index - oldest]

    def held_bytes(self) -> int:
        return sum(frame.nbytes for frame in self._frames)


def as_source(frames: FrameSource | Sequence[np.ndarray]) -> FrameSource:
    """``frames`` as a source: a source as it is, arrays held as ArrayFrames."""
    return frames if isinstance(frames, FrameSource) else ArrayFrames(frames)


__all__ = ["ArrayFrames", "FrameGone", "FrameSource", "LiveFrames", "VideoFileFrames", "as_source"]
