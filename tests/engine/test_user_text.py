"""The one rule for names and phrases and the one for dataset file names
(:mod:`sam2serve.engine.user_text`), on the shared hostile and legitimate lists: each
refused class names its code point and where it is, every legitimate text passes as it is,
and no file name it takes can leave a dataset's folder."""

from __future__ import annotations

import subprocess
import sys
import unicodedata
from pathlib import PurePosixPath, PureWindowsPath

import pytest
from user_text_cases import (
    ACCEPTED_FILE_NAMES,
    ACCEPTED_NAMES,
    REFUSED_FILE_NAMES,
    REFUSED_NAMES,
)

from sam2serve.engine.user_text import (
    MAX_FILE_NAME_BYTES,
    MAX_NAME_CHARS,
    check_file_name,
    check_name,
    refused_character,
)
from sam2serve.engine.video.export import VideoInfo, frame_file_name


@pytest.mark.parametrize(("text", "named"), REFUSED_NAMES)
def test_each_refused_class_is_named_with_its_code_point(text, named):
    with pytest.raises(ValueError) as refused:
        check_name(text, "phrase")
    message = str(refused.value)
    assert message.startswith("phrase ") and named in message, message
    assert message.isprintable(), message  # the message itself forges nothing
    assert "\n" not in message


@pytest.mark.parametrize("text", ACCEPTED_NAMES)
def test_readable_text_of_any_script_and_emoji_pass_as_they_are(text):
    assert check_name(text) == text
    assert check_name(f"  {text}\t") == text  # surrounding white space is stripped


def test_the_message_names_the_code_point_its_name_and_its_index():
    with pytest.raises(ValueError) as refused:
        check_name("a\u202eb", "phrase")
    assert str(refused.value).startswith(
        "phrase 'a\\u202eb' has U+202E RIGHT-TO-LEFT OVERRIDE (a direction control) at 1; "
    )
    assert refused_character("ok\x00") == "U+0000 (a control character) at 2"
    assert refused_character("fine") is None


def test_length_is_counted_after_stripping_in_code_points():
    assert check_name(" " + "x" * MAX_NAME_CHARS + " ") == "x" * MAX_NAME_CHARS
    with pytest.raises(ValueError, match="65 characters; the limit is 64"):
        check_name("x" * (MAX_NAME_CHARS + 1))
    with pytest.raises(ValueError, match="is empty"):
        check_name(" \t ")
    assert check_name("y" * 200, max_chars=200) == "y" * 200


def test_every_joiner_and_format_character_is_judged():
    """Every format character (Cf) of Python's tables is refused alone between two Latin
    letters: only ZWJ and ZWNJ have a context in which they are taken."""
    format_chars = [
        chr(code) for code in range(sys.maxunicode + 1) if unicodedata.category(chr(code)) == "Cf"
    ]
    assert len(format_chars) > 150
    taken = [c for c in format_chars if refused_character(f"a{c}b") is None]
    assert taken == []


@pytest.mark.parametrize(("text", "named"), REFUSED_FILE_NAMES)
def test_file_names_that_leave_the_folder_or_hide_text_are_refused(text, named):
    with pytest.raises(ValueError) as refused:
        check_file_name(text, "images[0].file_name")
    message = str(refused.value)
    assert message.startswith("images[0].file_name ") and named in message, message


@pytest.mark.parametrize("text", ACCEPTED_FILE_NAMES)
def test_a_taken_file_name_stays_one_component_on_every_system(text):
    assert check_file_name(text) == text
    assert len(text.encode()) <= MAX_FILE_NAME_BYTES
    for path in (PurePosixPath(text), PureWindowsPath(text)):
        assert path.parts == (text,) and not path.is_absolute() and not path.drive


def test_the_video_writer_files_frames_only_inside_the_videos_folder():
    assert frame_file_name(VideoInfo("clips/street.mp4", 4, 4, 2), 1) == "street/00001.jpg"
    named = VideoInfo("street", 4, 4, 2, frame_names=["a.png", "sub/b.png"])
    assert frame_file_name(named, 1) == "street/b.png"  # a path's last part (the library's)
    for video in (
        VideoInfo("..", 4, 4, 1),
        VideoInfo("C:\\x", 4, 4, 1),
        VideoInfo("a\x00.mp4", 4, 4, 1),
        VideoInfo("..mp4", 4, 4, 1),  # its stem is "."
        VideoInfo("street", 4, 4, 1, frame_names=[".."]),
        VideoInfo("street", 4, 4, 1, frame_names=["a\\..\\..\\b.png"]),
    ):
        with pytest.raises(ValueError):
            frame_file_name(video, 0)


@pytest.mark.parametrize("module", ["sam2serve.engine.user_text", "sam2serve.concepts.phrases"])
def test_the_rules_import_no_torch(module):
    """The command line checks its flags with them before a model loads."""
    code = f"import sys, {module}; print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"
