"""Video in and out: the frames of a video file or of a folder of images, as uint8 RGB
arrays, and an overlay clip written back as MP4 or GIF.

Video files are decoded with PyAV (FFmpeg's libraries; ``pip install av``), imported only
when a video file is read or written, so image-only use never needs it. Every container
is opened by :class:`VideoReader`, the one reader of files (``sam2serve track``'s
:class:`~sam2serve.engine.video.sources.VideoFileFrames`), uploads (the server's
``/v1/videos``: :func:`probe_video`, :func:`decode_video`) and Label Studio's downloads
(:mod:`sam2serve.labelstudio.video_frames`): the same pixel limit before a frame is
allocated, the same checks of the stream and of every frame, and the same errors
(:class:`VideoLimitError`, :class:`VideoFormatError`, :class:`VideoDecodeError`) that the
surfaces map to their 413, 415 and 400. A folder is read
in Meta's order: by the integer of the file stem when every stem is an integer (``0.jpg,
1.jpg, ..., 10.jpg``), else by name. Every frame must have the same size (a tracker's
memory is per pixel), and the count is limited before anything large is held.
"""

from __future__ import annotations

import io
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Literal, Self

import numpy as np

from sam2serve.engine.image import DEFAULT_MAX_PIXELS, ImageError, load_image

FRAME_EXTENSIONS = (".jpg", ".jpeg", ".png", ".webp", ".bmp", ".tif", ".tiff")
VIDEO_EXTENSIONS = (".mp4", ".mov", ".mkv", ".avi", ".webm", ".m4v", ".gif")
# Frames read at most unless the caller says otherwise: a bound on memory (a 1080p frame
# is 6 MB as uint8, 2,000 frames 12 GB) that a long video hits with a clear message.
DEFAULT_MAX_FRAMES = 2_000


class VideoError(ValueError):
    """A video or frame folder that cannot be read (the message names it and why)."""


class VideoLimitError(VideoError):
    """A video past a limit: frames, pixels per frame or decoded bytes."""


class VideoDecodeError(VideoError):
    """What PyAV raised on a file it could not read (truncated, corrupt, not a video)."""


class VideoFormatError(VideoError):
    """A container or codec this reader does not take (one that shows its streams only
    after FFmpeg has probed them unbounded, a codec FFmpeg has no decoder for)."""


# What PyAV raises on a file it cannot read, besides its own FFmpegError: builtin errors
# from its Python layer (a metadata string that is not UTF-8, a stream option it cannot
# apply, a container cut short). MemoryError is not among them: it is the process's.
_READ_ERRORS: tuple[type[BaseException], ...] = (
    ValueError,  # av.error.ValueError too, and UnicodeDecodeError of metadata
    EOFError,
    IndexError,
    OSError,  # most of av.error.*
    RuntimeError,
    StopIteration,
)
# PyAV's message for a container (MPEG-TS, MPEG-PS, raw H.264 ...) whose streams appear
# only once FFmpeg has probed (decoded) them: the per-stream max_pixels cannot apply there.
_PROBED_STREAMS_MESSAGE = "does not expose its streams before"


class reading_video:  # a context manager: ``with reading_video(name):``
    """Within it, whatever PyAV raises on a bad file is a :class:`VideoError` naming the
    file (:class:`VideoFormatError` for a container or codec not taken); a VideoError
    raised inside passes as it is."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __enter__(self) -> None:
        return None

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, _tb: object
    ) -> Literal[False]:
        if exc is None or isinstance(exc, VideoError):
            return False
        if isinstance(exc, read_errors()):
            raise video_error(exc, self.name) from None
        return False


def read_errors() -> tuple[type[BaseException], ...]:
    """What PyAV may raise on a file it cannot read (its FFmpegError and builtin errors)."""
    av = _import_av("read video files")
    return (av.error.FFmpegError, *_READ_ERRORS)


def video_error(exc: BaseException, name: str) -> VideoError:
    """The VideoError for what PyAV raised on ``name``."""
    reason = str(exc)[:200] or type(exc).__name__
    if _PROBED_STREAMS_MESSAGE in reason:
        return VideoFormatError(
            f"{name!r} is a container that shows its streams only after they are decoded "
            "(MPEG-TS, MPEG-PS or a raw H.264/H.265/MPEG stream): the frame-size limit "
            "cannot be applied before decoding, so it is not read; remux it to MP4, MKV or "
            "WebM (ffmpeg -i IN -c copy OUT.mp4)"
        )
    return VideoDecodeError(f"cannot decode {name!r}: {reason}")


def video_stream(container: Any, name: str) -> Any:
    """The container's first video stream, which FFmpeg can decode."""
    if not container.streams.video:
        raise VideoError(f"{name!r} has no video stream")
    stream = container.streams.video[0]
    if stream.codec_context is None:
        codec = getattr(getattr(stream, "codec", None), "name", None)
        named = f"its video codec {codec!r}" if codec else "a video stream of no codec it knows"
        raise VideoFormatError(
            f"{name!r}: FFmpeg has no decoder for {named} (a codec not supported, or a file "
            "cut short); send MP4 (H.264), WebM (VP8/VP9) or another common codec"
        )
    return stream


class VideoReader:
    """One video container opened by PyAV, the one way this package opens one: a path, an
    open binary file (read from its start) or bytes; ``name`` is what messages call it.

    Opening it reads the stream's header only: its first video stream, which FFmpeg must
    have a decoder for, and its declared frame size, within ``max_pixels`` (FFmpeg is told
    the limit as well, so neither its probing nor its decoder allocates a larger frame).
    :meth:`frames` decodes, every frame checked against the declared size. What PyAV
    raises, on opening or within ``with reader:``, is a :class:`VideoError` naming the file
    (:func:`video_error`); the container is closed on leaving it.
    """

    def __init__(
        self,
        source: str | Path | BinaryIO | bytes,
        name: str,
        *,
        max_pixels: int | None = DEFAULT_MAX_PIXELS,
    ) -> None:
        av = _import_av("read video files")
        if isinstance(source, (bytes, bytearray, memoryview)):
            source = io.BytesIO(source)
        elif isinstance(source, Path):
            source = str(source)
        elif not isinstance(source, str):
            source.seek(0)
        self.name = name
        options = _decoder_options(max_pixels)
        with reading_video(name):  # not a video, truncated, unknown codec or container
            self.container = av.open(source, mode="r", stream_options=options)
            try:
                self.stream = video_stream(self.container, name)
                self.width, self.height = _declared_size(self.stream, max_pixels, name)
                # The decoder refuses frames past the limit before it allocates them.
                self.stream.codec_context.options = options[0]
            except BaseException:
                self.container.close()
                raise
        rate = self.stream.average_rate
        self.fps: float | None = float(rate) if rate else None

    @property
    def origin(self) -> float:
        """The stream's first timestamp in seconds (what a player shows as 0)."""
        stream = self.stream
        if stream.start_time is None or stream.time_base is None:
            return 0.0
        return float(stream.start_time * stream.time_base)

    def packets(self) -> Iterator[Any]:
        """The video stream's packets that hold data (one per frame), demuxed only."""
        for packet in self.container.demux(self.stream):
            if packet.size:
                yield packet

    def frames(self) -> Iterator[Any]:
        """The decoded frames (PyAV's), from the start or from where :meth:`seek` went;
        VideoError on a frame of another size than the stream declares."""
        for frame in self.container.decode(self.stream):
            if (frame.width, frame.height) != (self.width, self.height):
                raise VideoError(
                    f"{self.name!r}: a frame is {frame.width}x{frame.height}, its stream "
                    f"declares {self.width}x{self.height}; every frame of a video must have "
                    "one size"
                )
            yield frame

    def seek(self, timestamp: int) -> None:
        """To the last keyframe at or before ``timestamp`` (the stream's time base)."""
        self.container.seek(timestamp, backward=True, stream=self.stream)

    def close(self) -> None:
        self.container.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: object
    ) -> Literal[False]:
        self.close()
        return reading_video(self.name).__exit__(kind, exc, tb)


def as_rgb(frame: Any) -> np.ndarray:
    """A decoded frame as uint8 (H, W, 3), contiguous."""
    return np.ascontiguousarray(frame.to_ndarray(format="rgb24"))


@dataclass(frozen=True)
class VideoProbe:
    """What a video file declares, read without decoding a frame."""

    width: int
    height: int
    # The video stream's packets (one per frame), counted up to the probe's limit + 1.
    frames: int
    fps: float | None

    @property
    def pixels(self) -> int:
        return self.width * self.height


@dataclass(frozen=True)
class VideoFrames:
    """The decoded frames of one video: uint8 (H, W, 3) arrays, all the same size."""

    frames: list[np.ndarray]
    # Frames per second of the source; None for a folder of images.
    fps: float | None
    # One name per frame: the file name for a folder, the frame index for a video.
    names: list[str]
    source: str

    @property
    def size(self) -> tuple[int, int]:
        """(height, width) of every frame."""
        height, width = self.frames[0].shape[:2]
        return height, width

    def __len__(self) -> int:
        return len(self.frames)


def read_frames(
    source: str | Path,
    *,
    max_frames: int | None = DEFAULT_MAX_FRAMES,
    max_pixels: int | None = DEFAULT_MAX_PIXELS,
    max_bytes: int | None = None,
) -> VideoFrames:
    """The frames of ``source``: a video file (by its extension) or a folder of images.
    ``max_bytes`` bounds the decoded frames (uint8 RGB) together; decoding stops as soon
    as the next frame would pass it."""
    path = Path(source)
    if path.is_dir():
        return _read_folder(path, max_frames, max_pixels, max_bytes)
    if not path.exists():
        raise VideoError(f"no such video or frame folder: {str(path)!r}")
    if path.suffix.lower() not in VIDEO_EXTENSIONS:
        raise VideoError(
            f"{str(path)!r} is neither a folder of frames nor a video file "
            f"({', '.join(VIDEO_EXTENSIONS)})"
        )
    return decode_video(str(path), str(path), max_frames, max_pixels, max_bytes)


def _frame_order(paths: list[Path]) -> list[Path]:
    if all(p.stem.isdigit() for p in paths):
        return sorted(paths, key=lambda p: (int(p.stem), p.name))
    return sorted(paths, key=lambda p: p.name)


def _read_folder(
    folder: Path, max_frames: int | None, max_pixels: int | None, max_bytes: int | None
) -> VideoFrames:
    paths = [p for p in folder.iterdir() if p.is_file() and p.suffix.lower() in FRAME_EXTENSIONS]
    if not paths:
        raise VideoError(
            f"frame folder {str(folder)!r} has no images ({', '.join(FRAME_EXTENSIONS)})"
        )
    _check_count(len(paths), max_frames, str(folder))
    frames: list[np.ndarray] = []
    held = 0
    for path in _frame_order(paths):
        try:
            frames.append(load_image(path, max_pixels=max_pixels))
        except ImageError as exc:
            raise VideoError(f"frame {str(path)!r}: {exc}") from None
        held += frames[-1].nbytes
        _check_bytes(held, max_bytes, str(folder))
    names = [p.name for p in _frame_order(paths)]
    check_frame_sizes(frames, names, str(folder))
    return VideoFrames(frames=frames, fps=None, names=names, source=str(folder))


def probe_video(
    source: str | BinaryIO,
    name: str,
    max_frames: int | None = DEFAULT_MAX_FRAMES,
    max_pixels: int | None = DEFAULT_MAX_PIXELS,
) -> VideoProbe:
    """The size and frame count of a video file, without decoding any frame: the size from
    the stream's header (FFmpeg's own probing may not allocate frames past ``max_pixels``),
    the frames by counting the stream's packets (demuxing only), stopping past
    ``max_frames``. VideoLimitError past either limit, VideoError if it is no video."""
    with VideoReader(source, name, max_pixels=max_pixels) as video:
        width, height, fps = video.width, video.height, video.fps
        frames = 0
        for _ in video.packets():
            frames += 1
            if max_frames is not None and frames > max_frames:
                break
    if frames == 0:
        raise VideoError(f"{name!r} has no frames")
    _check_count(frames, max_frames, name, exact=max_frames is None or frames <= max_frames)
    return VideoProbe(width, height, frames, fps)


def decode_video(
    source: str | BinaryIO,
    name: str,
    max_frames: int | None = DEFAULT_MAX_FRAMES,
    max_pixels: int | None = DEFAULT_MAX_PIXELS,
    max_bytes: int | None = None,
    probe: VideoProbe | None = None,
) -> VideoFrames:
    """The frames of a video file: a path, or an open binary file (an upload), decoded by
    PyAV whatever its container; ``name`` is what messages call it. With the ``probe`` of
    the same file, every frame must have its size and there may be no more frames than it
    counted (a file that says less than it holds is refused, not decoded further)."""
    if probe is not None:
        max_frames = probe.frames if max_frames is None else min(max_frames, probe.frames)
    frames: list[np.ndarray] = []
    held = 0
    with VideoReader(source, name, max_pixels=max_pixels) as video:
        if probe is not None and (video.width, video.height) != (probe.width, probe.height):
            raise VideoError(
                f"{name!r} declares {video.width}x{video.height} now, "
                f"{probe.width}x{probe.height} when it was probed"
            )
        fps = video.fps
        for frame in video.frames():
            if max_frames is not None and len(frames) >= max_frames:
                raise VideoLimitError(
                    f"{name!r} has more than {max_frames} frames (the limit; "
                    "cut the video or raise the limit)"
                )
            held += frame.width * frame.height * 3
            _check_bytes(held, max_bytes, name)
            frames.append(as_rgb(frame))
    if not frames:
        raise VideoError(f"{name!r} has no frames")
    names = [str(i) for i in range(len(frames))]
    check_frame_sizes(frames, names, name)
    return VideoFrames(frames=frames, fps=fps, names=names, source=name)


def _declared_size(stream: Any, max_pixels: int | None, name: str) -> tuple[int, int]:
    """(width, height) the video stream declares; VideoLimitError past ``max_pixels``."""
    width, height = stream.codec_context.width, stream.codec_context.height
    if width <= 0 or height <= 0:
        # FFmpeg leaves the size unset when its decoder refuses one past max_pixels.
        limit = "" if max_pixels is None else f" over the {max_pixels:,}-pixel limit, or"
        raise VideoLimitError(f"{name!r} has frames{limit} of no size FFmpeg can read")
    _check_pixels(width, height, max_pixels, name)
    return width, height


def _decoder_options(max_pixels: int | None) -> list[dict[str, str]]:
    """FFmpeg's per-stream decoder options (for the first streams of a container): no
    frame of more than ``max_pixels`` is allocated, while probing or decoding."""
    if max_pixels is None:
        return [{}] * _PROBED_STREAMS
    return [{"max_pixels": str(max_pixels)}] * _PROBED_STREAMS


_PROBED_STREAMS = 16


def _check_pixels(width: int, height: int, max_pixels: int | None, name: str) -> None:
    if max_pixels is not None and width * height > max_pixels:
        raise VideoLimitError(
            f"{name!r}: frames of {width}x{height} exceed the {max_pixels:,}-pixel limit"
        )


def _check_count(count: int, max_frames: int | None, source: str, exact: bool = True) -> None:
    if max_frames is not None and count > max_frames:
        has = f"{count} frames" if exact else f"more than {max_frames} frames"
        raise VideoLimitError(
            f"{source!r} has {has}, more than the limit of {max_frames} (cut the "
            "video or raise the limit)"
        )


def _check_bytes(held: int, max_bytes: int | None, source: str) -> None:
    if max_bytes is not None and held > max_bytes:
        raise VideoLimitError(
            f"{source!r}: its decoded frames pass {max_bytes:,} bytes (the limit on one "
            "video's frames held in memory; send fewer or smaller frames)"
        )


def check_frame_sizes(frames: Sequence[np.ndarray], names: Sequence[str], source: str) -> None:
    """VideoError unless every frame has the first one's size."""
    first = frames[0].shape[:2]
    for frame, name in zip(frames, names, strict=True):
        if frame.shape[:2] != first:
            raise VideoError(
                f"{source!r}: frame {name} is {frame.shape[1]}x{frame.shape[0]}, the first "
                f"is {first[1]}x{first[0]}; every frame of a video must have one size"
            )


def _import_av(purpose: str) -> Any:  # the av module
    try:
        import av
    except ImportError:
        raise VideoError(f"PyAV is needed to {purpose}: pip install av") from None
    return av


def write_video(path: str | Path, frames: Sequence[np.ndarray], fps: float | None = None) -> Path:
    """Write uint8 (H, W, 3) ``frames`` as an MP4 (H.264 through PyAV) or, for a ``.gif``
    path, an animated GIF (Pillow). Returns the path written."""
    path = Path(path)
    fps = fps or 10.0
    if not frames:
        raise VideoError("no frames to write")
    if path.suffix.lower() == ".gif":
        from PIL import Image

        images = [Image.fromarray(frame) for frame in frames]
        images[0].save(
            path, save_all=True, append_images=images[1:], duration=round(1000 / fps), loop=0
        )
        return path
    av = _import_av("write video files")
    height, width = frames[0].shape[:2]
    with av.open(str(path), mode="w") as container:
        stream = container.add_stream("libx264", rate=round(fps))
        # H.264 with 4:2:0 chroma needs even sizes.
        stream.width, stream.height = width - width % 2, height - height % 2
        stream.pix_fmt = "yuv420p"
        for frame in frames:
            even = np.ascontiguousarray(frame[: stream.height, : stream.width])
            for packet in stream.encode(av.VideoFrame.from_ndarray(even, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return path
