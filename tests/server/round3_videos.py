"""Hostile video files of the round-3 suites (issue 26), built in memory, a few KB each:
legal containers that show their streams only after FFmpeg has probed them, files cut
short inside their index, metadata that is not UTF-8."""

from __future__ import annotations

import functools
import io

import numpy as np

NOT_UTF8 = b"\xc5(" * 8  # two bytes that no UTF-8 decoder takes, eight times
_TAG = "Z" * 16


def encoded(container: str, codec: str, *, frames: int = 4, title: str | None = None) -> bytes:
    """``frames`` small grey frames (32x24, 25 fps) as ``codec`` in ``container``."""
    import av

    buffer = io.BytesIO()
    with av.open(buffer, mode="w", format=container) as out:
        if title is not None:
            out.metadata["title"] = title
        stream = out.add_stream(codec, rate=25)
        stream.width, stream.height, stream.pix_fmt = 32, 24, "yuv420p"
        for i in range(frames):
            pixels = np.full((24, 32, 3), 30 * i, np.uint8)
            for packet in stream.encode(av.VideoFrame.from_ndarray(pixels, format="rgb24")):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    return buffer.getvalue()


@functools.cache
def hostile_videos() -> dict[str, tuple[bytes, frozenset[str]]]:
    """name -> (file, the error codes accepted for it)."""
    unsupported = frozenset({"unsupported_video"})
    unreadable = frozenset({"unsupported_video", "invalid_video"})
    mp4 = encoded("mp4", "libx264")
    titled = {kind: encoded(kind, "libx264", title=_TAG) for kind in ("mp4", "matroska")}
    return {
        # Legal containers whose streams appear only after probing (decoding).
        "mpeg_ts.ts": (encoded("mpegts", "mpeg2video"), unsupported),
        "mpeg_ps.mpg": (encoded("mpeg", "mpeg1video"), unsupported),
        # A title that is not UTF-8: PyAV's metadata decoding raises UnicodeDecodeError.
        "title_not_utf8.mp4": (titled["mp4"].replace(_TAG.encode(), NOT_UTF8), unreadable),
        "title_not_utf8.mkv": (titled["matroska"].replace(_TAG.encode(), NOT_UTF8), unreadable),
        # Cut inside its index (the moov box at the end): a stream of no known codec.
        "cut_in_index.mp4": (mp4[: int(len(mp4) * 0.7)], unreadable),
        "cut_early.mp4": (mp4[: int(len(mp4) * 0.3)], unreadable),
        "cut_late.mp4": (mp4[: int(len(mp4) * 0.9)], unreadable),
    }
