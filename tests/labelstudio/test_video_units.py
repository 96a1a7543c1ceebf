"""Video tasks without the model: the Video config, the annotator's keyframes as prompts,
tracked boxes as Label Studio's keyframes, and the frames a request decodes."""

from __future__ import annotations

import pytest
from video_support import (
    CLIP_FPS,
    VIDEO_CONFIG,
    clip_bytes,
    clip_bytes_with_keyframes,
    clip_frames,
    video_region,
)

from sam2serve.engine.video_io import VideoError, VideoLimitError, decode_video
from sam2serve.labelstudio.label_config import (
    EXAMPLE_VIDEO_CONFIG,
    LabelConfigError,
    parse_label_config,
)
from sam2serve.labelstudio.protocol import Context
from sam2serve.labelstudio.video_context import is_video_context, track_prompts
from sam2serve.labelstudio.video_frames import ClipWindow, decode_window, read_header
from sam2serve.labelstudio.video_result import tracked_keyframes
from sam2serve.labelstudio.video_result import video_region as answer_region
from sam2serve.server.errors import ApiError

pytest.importorskip("av")


def context(*regions: dict) -> Context:
    return Context.model_validate({"result": list(regions)})


# ---------------------------------------------------------------- the config


def test_video_config_tags_and_frame_rate():
    config = parse_label_config(VIDEO_CONFIG)
    control = config.video_rectangle_for()
    video = config.video_of(control)
    assert (control.name, video.name, video.field) == ("box", "video", "video")
    assert video.frame_rate_of({}) == CLIP_FPS
    assert config.images == {}
    example = parse_label_config(EXAMPLE_VIDEO_CONFIG)
    assert example.video_of(example.video_rectangle_for()).frame_rate_of({}) == 25.0


def test_a_config_with_images_and_a_video_parses_for_both():
    config = parse_label_config(
        '<View><Image name="i" value="$image"/><Video name="v" value="$video"/>'
        '<VideoRectangle name="b" toName="v"/></View>'
    )
    assert config.images == {"i": "image"} and config.video_rectangle_for().name == "b"
    with pytest.raises(LabelConfigError, match="no BrushLabels"):
        config.brush_for()


@pytest.mark.parametrize(
    ("attribute", "data", "rate"),
    [
        ("", {}, 24.0),  # Label Studio's default
        ('framerate="30"', {}, 30.0),
        ('frameRate="$fps"', {"fps": 12.5}, 12.5),
        ('frameRate="$fps"', {"fps": "29.97"}, 29.97),
    ],
)
def test_frame_rate_forms(attribute, data, rate):
    config = parse_label_config(
        f'<View><Video name="v" value="$url" {attribute}/>'
        '<VideoRectangle name="b" toName="v"/></View>'
    )
    assert config.videos["v"].frame_rate_of(data) == pytest.approx(rate)


@pytest.mark.parametrize(
    ("xml", "message"),
    [
        ('<View><Video name="v" value="$v"/></View>', "no VideoRectangle"),
        (
            (
                '<View><Video name="v" value="$v" frameRate="fast"/>'
                '<VideoRectangle name="b" toName="v"/></View>'
            ),
            "frameRate 'fast'",
        ),
        (
            (
                '<View><Video name="v" value="$v" frameRate="0"/>'
                '<VideoRectangle name="b" toName="v"/></View>'
            ),
            "number from 0.01 to 1000",
        ),
    ],
)
def test_video_config_errors(xml, message):
    with pytest.raises(LabelConfigError, match=message):
        parse_label_config(xml)


@pytest.mark.parametrize("fps", [None, "x", 0, -3, float("inf"), 1e9])
def test_a_bad_frame_rate_from_task_data_is_named(fps):
    config = parse_label_config(
        '<View><Video name="v" value="$v" frameRate="$fps"/>'
        '<VideoRectangle name="b" toName="v"/></View>'
    )
    with pytest.raises(LabelConfigError, match=r"\$fps"):
        config.videos["v"].frame_rate_of({"fps": fps})


# ---------------------------------------------------------------- the keyframes


def test_each_region_is_an_object_and_its_enabled_keyframes_its_boxes():
    first = video_region("a", [(1, 10, 20, 30, 40)], labels=["Disc"])
    second = video_region("b", [(2, 50, 10, 20, 20), (4, 0, 0, 10, 10, False)])
    hidden = video_region("c", [(3, 5, 5, 5, 5, False)])
    ctx = context(first, second, hidden)
    assert is_video_context(ctx)
    prompts = track_prompts(ctx)
    assert [p.region_id for p in prompts] == ["a", "b"]  # c is hidden from its first keyframe
    a, b = prompts
    assert a.labels == ("Disc",) and a.first_frame == 1
    [box] = a.boxes
    assert (box.box.x0, box.box.y0, box.box.x1, box.box.y1) == (10, 20, 40, 60)
    assert [k.frame for k in b.boxes] == [2]  # frame 4 hides it: no prompt there
    assert len(b.sequence) == 2 and b.frames_count == 3


def test_image_contexts_are_not_video_contexts():
    ctx = context({"type": "rectanglelabels", "value": {"x": 1, "y": 1, "width": 2, "height": 2}})
    assert not is_video_context(ctx)
    assert not is_video_context(None)


@pytest.mark.parametrize(
    ("regions", "message"),
    [
        (
            [video_region("a", [(1, 10, 10, 10, 10)]), {"type": "keypointlabels", "value": {}}],
            "VideoRectangle regions",
        ),
        ([video_region("a", [(1, 10, 10, 10, 10, True, 30)])], "rotation"),
        ([video_region("a", [(1, 95, 10, 10, 10)])], "outside the frame"),
        ([video_region("a", [(1, 10, 10, -1, 10)])], "must be >= 0"),
        ([video_region("a", [])], "needs its keyframes"),
        (
            [video_region("a", [(1, 1, 1, 1, 1)]), video_region("a", [(1, 2, 2, 2, 2)])],
            "id of an earlier region",
        ),
        (
            [
                video_region("a", [(1, 1, 1, 1, 1)]),
                {**video_region("b", [(1, 2, 2, 2, 2)]), "to_name": "other"},
            ],
            "one prediction is on one video",
        ),
    ],
)
def test_bad_keyframes_are_named(regions, message):
    with pytest.raises(ApiError, match=message) as raised:
        track_prompts(context(*regions))
    assert raised.value.status == 422


def test_frame_numbers_are_bounded_by_the_schema():
    from pydantic import ValidationError

    with pytest.raises(ValidationError):
        context(video_region("a", [(0, 1, 1, 1, 1)]))  # Label Studio counts from 1
    with pytest.raises(ValidationError):
        context(video_region("a", [(10**9, 1, 1, 1, 1)]))


# ---------------------------------------------------------------- the answer


def test_tracked_boxes_become_keyframes_in_percent_and_disappearance_disables():
    boxes = [[10, 8, 20, 16], [12, 8, 20, 16], None, None, [0, 0, 50, 40]]
    keyframes = tracked_keyframes(boxes, [1, 2, 3, 4, 5], width=100, height=80, frame_rate=10)
    assert [(k["frame"], k["enabled"]) for k in keyframes] == [
        (1, True),
        (2, True),
        (3, False),  # gone from frame 3 on: one disabled keyframe, its last box
        (5, True),
    ]
    assert keyframes[0] | {} == {
        "frame": 1,
        "x": 10.0,
        "y": 10.0,
        "width": 20.0,
        "height": 20.0,
        "rotation": 0,
        "enabled": True,
        "time": 0.1,
    }
    assert keyframes[2]["x"] == 12.0 and keyframes[3]["width"] == 50.0
    assert keyframes[3]["time"] == pytest.approx(0.5)


def test_never_seen_gives_no_keyframe_and_a_shared_frame_keeps_the_first_box():
    assert tracked_keyframes([None, None], [1, 2], 10, 10, 24) == []
    keyframes = tracked_keyframes([[0, 0, 5, 5], [5, 5, 5, 5]], [3, 3], 10, 10, 24)
    assert [(k["frame"], k["x"]) for k in keyframes] == [(3, 0.0)]


def test_the_annotators_keyframes_win_and_keep_hidden_frames_hidden():
    region = video_region(
        "a",
        [(2, 10, 10, 10, 10), (4, 10, 10, 10, 10, False), (6, 20, 20, 10, 10)],
        labels=["Disc"],
    )
    [prompt] = track_prompts(context(region))
    tracked = tracked_keyframes([[1, 1, 1, 1]] * 7, [1, 2, 3, 4, 5, 6, 7], 10, 10, 10)
    out = answer_region(prompt, tracked, "box", "video")
    assert out["id"] == "a" and out["type"] == "videorectangle"
    assert (out["from_name"], out["to_name"]) == ("box", "video")
    assert out["value"]["labels"] == ["Disc"] and out["value"]["framesCount"] == 3
    by_frame = {k["frame"]: k for k in out["value"]["sequence"]}
    assert sorted(by_frame) == [1, 2, 3, 4, 6, 7]  # 5 hidden by the annotator (from 4)
    assert by_frame[4]["enabled"] is False and by_frame[4]["x"] == 10  # theirs, as sent
    assert by_frame[2]["x"] == 10 and by_frame[3]["x"] == 10.0
    assert by_frame[6]["enabled"] is True and by_frame[6]["x"] == 20
    assert out["value"]["sequence"] == sorted(out["value"]["sequence"], key=lambda k: k["frame"])


# ---------------------------------------------------------------- the frames


def test_the_window_starts_at_the_first_keyframe_and_numbers_frames_as_label_studio():
    data = clip_bytes(5)
    header = read_header(data, "clip", max_pixels=10**6)
    reference = decode_video(__import__("io").BytesIO(data), "clip").frames
    window = decode_window(
        data, "clip", header, frame_rate=CLIP_FPS, first_frame=2, max_frames=3, max_skipped=5,
        max_pixels=10**6,
    )  # fmt: skip
    assert window.ls_frames == [2, 3, 4]
    for got, expected in zip(window.frames, reference[1:4], strict=True):
        assert (got == expected).all()  # the engine's own decoder's frames
    # The Video tag at twice the file's rate: every frame is two of Label Studio's.
    window = decode_window(
        data, "clip", header, frame_rate=2 * CLIP_FPS, first_frame=5, max_frames=10,
        max_skipped=5, max_pixels=10**6,
    )  # fmt: skip
    assert window.ls_frames == [5, 7, 9]
    assert window.index_of(6) == 0 and window.index_of(9) == 2 and window.index_of(13) is None
    assert window.index_of(10) == 2 and window.index_of(11) is None  # a frame's half


def test_keyframes_map_to_the_nearest_kept_frame_or_none_outside():
    window = ClipWindow([__import__("numpy").zeros((2, 2, 3), "uint8")] * 3, [4, 5, 6])
    assert [window.index_of(f) for f in (3, 4, 5, 6, 7, 1, 10**8)] == [
        None, 0, 1, 2, None, None, None,
    ]  # fmt: skip


def test_frames_before_the_window_and_pixels_are_bounded():
    data = clip_bytes(5)
    header = read_header(data, "clip", max_pixels=10**6)
    with pytest.raises(VideoLimitError, match="more than 2 frames"):
        decode_window(
            data, "clip", header, frame_rate=CLIP_FPS, first_frame=5, max_frames=1,
            max_skipped=2, max_pixels=10**6,
        )  # fmt: skip
    height, width = clip_frames(1)[0].shape[:2]
    with pytest.raises(VideoLimitError, match="pixel limit"):
        read_header(data, "clip", max_pixels=width * height - 1)
    with pytest.raises(VideoError, match="no frame at"):
        decode_window(
            data, "clip", header, frame_rate=CLIP_FPS, first_frame=50, max_frames=1,
            max_skipped=100, max_pixels=10**6,
        )  # fmt: skip
    with pytest.raises(VideoError):
        read_header(b"not a video at all" * 10, "junk", max_pixels=10**6)


def test_a_late_first_keyframe_is_sought_not_decoded_from_the_start():
    data = clip_bytes_with_keyframes(10, gop=2)
    header = read_header(data, "clip", max_pixels=10**6)
    reference = decode_video(__import__("io").BytesIO(data), "clip").frames
    # Frame 10 (index 9): sought to the keyframe at index 8, so one frame is dropped; from
    # the start it would be nine, over max_skipped.
    window = decode_window(
        data, "clip", header, frame_rate=CLIP_FPS, first_frame=10, max_frames=5,
        max_skipped=1, max_pixels=10**6,
    )  # fmt: skip
    assert window.ls_frames == [10]
    assert (window.frames[0] == reference[9]).all()
    window = decode_window(
        data, "clip", header, frame_rate=CLIP_FPS, first_frame=5, max_frames=3,
        max_skipped=1, max_pixels=10**6,
    )  # fmt: skip
    assert window.ls_frames == [5, 6, 7]
    for got, expected in zip(window.frames, reference[4:7], strict=True):
        assert (got == expected).all()


def test_a_gif_gives_the_same_frames_sought_or_not():
    data = clip_bytes_with_keyframes(6, gop=1, suffix=".gif")
    header = read_header(data, "clip.gif", max_pixels=10**6)
    reference = decode_video(__import__("io").BytesIO(data), "clip.gif").frames
    window = decode_window(
        data, "clip.gif", header, frame_rate=CLIP_FPS, first_frame=4, max_frames=2,
        max_skipped=6, max_pixels=10**6,
    )  # fmt: skip
    assert window.ls_frames == [4, 5]
    for got, expected in zip(window.frames, reference[3:5], strict=True):
        assert (got == expected).all()
