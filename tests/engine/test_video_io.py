"""Video input and output: frame folders in Meta's order, video files through PyAV, the
limits, and the sample clip."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from sam2serve.engine.video_io import (
    VideoError,
    VideoLimitError,
    VideoProbe,
    decode_video,
    probe_video,
    read_frames,
    write_video,
)
from sam2serve.samples import sample_clip


@pytest.fixture(scope="module")
def clip():
    return sample_clip(num_frames=6, size=(64, 96))


def _write_folder(folder, frames, names):
    folder.mkdir()
    for frame, name in zip(frames, names, strict=True):
        Image.fromarray(frame).save(folder / name)
    return folder


def test_integer_stems_are_read_in_numeric_order(clip, tmp_path):
    frames, _ = clip
    names = [f"{i}.png" for i in range(len(frames))]  # 0.png .. 5.png: name order differs at 10
    # written last to first: the directory's own order is no help
    folder = _write_folder(tmp_path / "f", frames[::-1], names[::-1])
    (folder / "10.png").write_bytes((folder / "0.png").read_bytes())
    video = read_frames(folder)
    assert video.names == [*names, "10.png"]
    assert video.fps is None and video.size == (64, 96)
    for got, want in zip(video.frames, frames, strict=False):
        np.testing.assert_array_equal(got, want)  # PNG is lossless


def test_other_stems_are_read_by_name(clip, tmp_path):
    frames, _ = clip
    folder = _write_folder(tmp_path / "f", frames[:3], ["b.png", "a.png", "c10.png"])
    assert read_frames(folder).names == ["a.png", "b.png", "c10.png"]


@pytest.mark.parametrize("suffix", [".mp4", ".gif"])
def test_video_files_round_trip(clip, tmp_path, suffix):
    frames, _ = clip
    path = write_video(tmp_path / f"clip{suffix}", frames, fps=5)
    video = read_frames(path)
    assert len(video) == len(frames) and video.size == (64, 96) and video.fps == 5
    # lossy codecs: the same pictures up to compression noise
    errors = [np.abs(a.astype(int) - b).mean() for a, b in zip(video.frames, frames, strict=True)]
    assert max(errors) < 8, errors


def test_limits_and_bad_sources_are_named(clip, tmp_path):
    frames, _ = clip
    path = write_video(tmp_path / "clip.mp4", frames, fps=5)
    with pytest.raises(VideoError, match="more than 3 frames"):
        read_frames(path, max_frames=3)
    with pytest.raises(VideoError, match="pixel limit"):
        read_frames(path, max_pixels=100)
    with pytest.raises(VideoError, match="no such video"):
        read_frames(tmp_path / "missing.mp4")
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(VideoError, match="neither a folder of frames nor a video"):
        read_frames(tmp_path / "notes.txt")
    (tmp_path / "broken.mp4").write_bytes(b"not a video at all")
    with pytest.raises(VideoError, match="cannot decode"):
        read_frames(tmp_path / "broken.mp4")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(VideoError, match="has no images"):
        read_frames(empty)
    folder = _write_folder(tmp_path / "mixed", [frames[0], frames[1][:32]], ["0.png", "1.png"])
    with pytest.raises(VideoError, match="frame 1.png is 96x32, the first is 96x64"):
        read_frames(folder)
    with pytest.raises(VideoError, match="more than the limit of 1"):
        read_frames(folder, max_frames=1)


def test_the_sample_clip_has_an_occlusion(clip):
    frames, truth = clip
    assert len(frames) == 6 and frames[0].shape == (64, 96, 3)
    disc, square = truth[1], truth[2]
    assert all(not (d & s).any() for d, s in zip(disc, square, strict=True))
    visible = [int(d.sum()) for d in disc]
    assert min(visible) < 0.5 * max(visible)  # the square passes in front of the disc
    with pytest.raises(ValueError, match="num_frames=0"):
        sample_clip(num_frames=0)


def _gif_screen(width: int, height: int) -> bytes:
    """A GIF whose logical screen is width x height, with one 1-pixel image."""
    import struct

    return (
        b"GIF89a"
        + struct.pack("<HHBBB", width, height, 0x80, 0, 0)
        + b"\x00\x00\x00\xff\xff\xff,"
        + struct.pack("<HHHHB", 0, 0, 1, 1, 0)
        + b"\x02\x02\x44\x01\x00;"
    )


def test_a_probe_reads_size_and_frames_without_decoding(clip, tmp_path):
    pytest.importorskip("av")
    frames, _ = clip
    path = str(write_video(tmp_path / "clip.mp4", frames, fps=5))
    probe = probe_video(path, "clip.mp4")
    assert (probe.width, probe.height, probe.frames) == (96, 64, len(frames))
    with pytest.raises(VideoLimitError, match="more than 3 frames"):
        probe_video(path, "clip.mp4", max_frames=3)
    with pytest.raises(VideoLimitError, match="pixel limit"):
        probe_video(path, "clip.mp4", max_pixels=100)
    # A file holding more frames than its probe counted is not decoded past the count.
    with pytest.raises(VideoLimitError, match="more than 2 frames"):
        decode_video(path, "clip.mp4", probe=VideoProbe(96, 64, 2, None))
    bomb = tmp_path / "bomb.gif"
    bomb.write_bytes(_gif_screen(16000, 16000))  # 60 bytes; 1 GB a frame once composed
    with pytest.raises(VideoLimitError, match="pixel limit"):
        probe_video(str(bomb), "bomb.gif", max_pixels=40_000_000)


def test_what_pyav_raises_on_a_bad_file_is_a_video_error_naming_it():
    """Besides FFmpeg's own errors, PyAV raises builtin ones (a ValueError for a container
    that shows its streams only after probing, UnicodeDecodeError for metadata that is not
    UTF-8, a stream without a codec context for a file cut inside its index): each is a
    VideoError naming the file, and the first and last a VideoFormatError (not taken)."""
    import io
    import sys
    from pathlib import Path

    from sam2serve.engine.video_io import VideoFormatError

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "server"))
    from round3_videos import hostile_videos

    for name, (data, codes) in hostile_videos().items():
        for read in (probe_video, decode_video):
            with pytest.raises(VideoError) as raised:
                read(io.BytesIO(data), name, max_pixels=4_000_000)
            assert name in str(raised.value)
            if codes == {"unsupported_video"}:
                assert isinstance(raised.value, VideoFormatError), raised.value
