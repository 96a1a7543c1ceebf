"""ServerSettings is composed of one group per concern; flat names route to the groups,
each group checks its own values, and the flags are derived by walking the groups."""

from __future__ import annotations

import dataclasses

import pytest

from sam2serve.cli import build_parser
from sam2serve.options import OptionError
from sam2serve.server.settings import (
    LimitSettings,
    ServerSettings,
    StoreSettings,
    VideoSettings,
    flat_keys,
)

GROUPS = (
    "runtime",
    "access",
    "page",
    "limits",
    "connections",
    "batching",
    "caches",
    "store",
    "video",
    "live",
    "concepts",
)


def test_the_groups_and_every_flat_name_routed_to_one_field():
    assert tuple(f.name for f in dataclasses.fields(ServerSettings)) == GROUPS
    routes = flat_keys()
    # The 50 flat fields ServerSettings had before the groups, the 6 of concepts and
    # image_decode.
    assert len(routes) == 57
    assert routes["max_pixels"] == ("limits", "max_pixels")
    assert routes["video"] == ("video", "enabled")
    assert (routes["store"], routes["store_dtype"]) == (("store", "location"), ("store", "dtype"))
    defaults = ServerSettings()
    for name, (group, attribute) in routes.items():
        assert hasattr(getattr(defaults, group), attribute), name
    assert not hasattr(defaults, "max_pixels")  # no flat names kept alive


def test_from_flat_and_replace_route_to_the_groups():
    settings = ServerSettings.from_flat(max_pixels=1000, video=True, store="emb", max_queue=3)
    assert settings.limits.max_pixels == 1000 and settings.video.enabled is True
    assert settings.store.location == "emb" and settings.batching.max_queue == 3
    changed = settings.replace(max_pixels=7, store_dtype="float16")
    assert (changed.limits.max_pixels, changed.store.dtype) == (7, "float16")
    assert changed.batching is settings.batching  # untouched groups are shared
    assert settings.limits.max_pixels == 1000  # frozen: a copy
    assert ServerSettings.from_flat(**settings.flat()) == settings
    assert ServerSettings(limits=LimitSettings(max_pixels=1000)).limits.max_pixels == 1000


def test_an_unknown_flat_name_is_named():
    with pytest.raises(TypeError, match=r"ServerSettings has no setting 'max_pixel'"):
        ServerSettings.from_flat(max_pixel=3)
    with pytest.raises(TypeError, match="'enabled'"):  # a group's field is no flat name
        ServerSettings().replace(enabled=True)


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: LimitSettings(max_pixels=0), r"max_pixels must be an integer >= 1, got 0"),
        (lambda: VideoSettings(max_video_frames=-1), r"max_video_frames must be an integer"),
        (lambda: StoreSettings(dtype="int4"), r"store_dtype must be one of"),
        (lambda: ServerSettings.from_flat(max_queue=0), r"max_queue must be an integer >= 1"),
        (lambda: ServerSettings.from_flat(api_key=" "), r"api_key must not be empty"),
        (lambda: ServerSettings.from_flat(store=""), r"store must be a directory or an fsspec"),
        (lambda: ServerSettings.from_flat(images_dir="/no/such/dir"), r"images_dir must be"),
    ],
)
def test_each_group_checks_its_own_values_naming_the_flat_name(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_a_group_of_the_wrong_kind_is_refused():
    with pytest.raises(TypeError, match=r"ServerSettings.limits must be a LimitSettings"):
        ServerSettings(limits=VideoSettings())  # type: ignore[arg-type]


def test_a_bad_flag_error_names_the_flag():
    with pytest.raises(OptionError) as error:
        ServerSettings.from_flat(max_upload_bytes=0)
    assert error.value.for_flag().startswith("--max-upload-mib must be")


def test_every_setting_with_an_option_is_a_serve_flag_of_its_flat_name():
    parser = build_parser()._subparsers._group_actions[0].choices["serve"]
    parser.format_help()  # adds the deferred flags
    dests = {action.dest for action in parser._actions}
    missing = [name for name in flat_keys() if name not in dests and name != "api_key"]
    assert missing == []  # api_key comes from --api-key-env's variable, never a flag
    titles = {
        action.dest: group.title
        for group in parser._action_groups
        for action in group._group_actions
    }
    assert titles["video"] == titles["max_video_frames"]  # --video in the video group
    assert titles["warmup"] == titles["model"] == "model and runtime"
    assert titles["store"] == titles["store_dtype"]
