"""Helpers of the video task tests: a small clip (the sample clip's moving disc and square,
written as MP4 at a known rate), its labelling config and VideoRectangle regions."""

from __future__ import annotations

import functools
import io
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from sam2serve.engine.video_io import write_video
from sam2serve.samples import sample_clip

CLIP_FPS = 10.0
CLIP_SIZE = (64, 96)  # height, width
VIDEO_CONFIG = f"""\
<View>
  <Video name="video" value="$video" frameRate="{CLIP_FPS:g}"/>
  <VideoRectangle name="box" toName="video" smart="true"/>
  <Labels name="videoLabels" toName="video">
    <Label value="Disc" background="#ff0000"/>
    <Label value="Square" background="#0000ff"/>
  </Labels>
</View>"""


@functools.lru_cache(maxsize=8)
def _clip(num_frames: int) -> tuple[tuple[np.ndarray, ...], bytes, dict]:
    frames, truth = sample_clip(num_frames, CLIP_SIZE)
    with tempfile.TemporaryDirectory() as folder:
        path = write_video(Path(folder) / "clip.mp4", frames, fps=CLIP_FPS)
        data = path.read_bytes()
    return tuple(frames), data, truth


@functools.lru_cache(maxsize=4)
def clip_bytes_with_keyframes(num_frames: int, gop: int, suffix: str = ".mp4") -> bytes:
    """The clip as H.264 MP4 with a keyframe every ``gop`` frames (so it can be sought),
    or, for ``.gif``, as an animated GIF."""
    frames = clip_frames(num_frames)
    if suffix == ".gif":
        with tempfile.TemporaryDirectory() as folder:
            return write_video(Path(folder) / "clip.gif", frames, fps=CLIP_FPS).read_bytes()
    import av

    buffer = io.BytesIO()
    with av.open(buffer, mode="w", format="mp4") as container:
        stream = container.add_stream("libx264", rate=round(CLIP_FPS))
        stream.height, stream.width = CLIP_SIZE
        stream.pix_fmt = "yuv420p"
        stream.codec_context.gop_size = gop
        stream.codec_context.options = {"keyint_min": str(gop), "sc_threshold": "0"}
        for frame in frames:
            for packet in stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return buffer.getvalue()


def clip_frames(num_frames: int) -> list[np.ndarray]:
    return list(_clip(num_frames)[0])


def clip_bytes(num_frames: int) -> bytes:
    return _clip(num_frames)[1]


def clip_truth(num_frames: int) -> dict[int, list[np.ndarray]]:
    return _clip(num_frames)[2]


def video_region(
    region_id: str, keyframes: list[tuple], labels: list[str] | None = None
) -> dict[str, Any]:
    """A VideoRectangle region as Label Studio's editor sends it: keyframes ``(frame, x, y,
    width, height[, enabled[, rotation]])`` in percent."""
    sequence = []
    for keyframe in keyframes:
        frame, x, y, width, height, *rest = keyframe
        enabled = rest[0] if rest else True
        rotation = rest[1] if len(rest) > 1 else 0
        sequence.append(
            {
                "frame": frame,
                "x": x,
                "y": y,
                "width": width,
                "height": height,
                "rotation": rotation,
                "enabled": enabled,
                "time": frame / CLIP_FPS,
            }
        )
    value: dict[str, Any] = {"framesCount": 3, "duration": 0.3, "sequence": sequence}
    if labels is not None:
        value["labels"] = labels
    return {
        "id": region_id,
        "type": "videorectangle",
        "from_name": "box",
        "to_name": "video",
        "origin": "manual",
        "value": value,
    }


def truth_box_percent(truth: np.ndarray) -> tuple[float, float, float, float]:
    """(x, y, width, height) in percent of a true mask's bounding box."""
    rows, cols = np.nonzero(truth)
    height, width = truth.shape
    x0, x1 = cols.min(), cols.max() + 1
    y0, y1 = rows.min(), rows.max() + 1
    return (
        x0 / width * 100,
        y0 / height * 100,
        (x1 - x0) / width * 100,
        (y1 - y0) / height * 100,
    )
