"""The labelling config and the annotator's context, without the model."""

from __future__ import annotations

import pytest
from support import CONFIG, keypoint, rectangle

from sam2serve.labelstudio.context import prompt_from_context
from sam2serve.labelstudio.label_config import LabelConfigError, parse_label_config
from sam2serve.labelstudio.protocol import Context
from sam2serve.server.errors import ApiError


def context(*regions: dict) -> Context:
    return Context.model_validate({"result": list(regions)})


def test_config_tags():
    config = parse_label_config(CONFIG)
    brush = config.brush_for()
    assert (brush.name, brush.to_names, brush.labels) == ("mask", ("image",), ("Object", "Cat"))
    assert config.images == {"image": "image"}
    assert config.label_for(brush, "Cat") == "Cat"
    assert config.label_for(brush, "Dog") == "Object"  # not a brush label: the first one
    assert config.label_for(brush, None) == "Object"


def test_config_with_other_names_and_case():
    config = parse_label_config(
        '<view><image name="photo" value="$url"/><brushlabels name="seg" toName="photo">'
        '<label value="Tree"/></brushlabels></view>'
    )
    assert config.images == {"photo": "url"}
    assert config.brush_for("photo").name == "seg"


@pytest.mark.parametrize(
    ("xml", "message"),
    [
        ("<View><Image", "not valid XML"),
        ('<View><Text name="t" value="$text"/></View>', "no <Image"),
        ('<View><Image name="i" value="$i"/></View>', "no BrushLabels"),
        (
            '<View><Image name="i" value="$i"/><BrushLabels name="b" toName="other">'
            + '<Label value="A"/></BrushLabels></View>',
            "no BrushLabels",
        ),
        (
            '<View><Image name="i" value="$i"/><BrushLabels name="b" toName="i"/></View>',
            "has no <Label",
        ),
    ],
)
def test_config_errors_say_what_is_missing(xml, message):
    with pytest.raises(LabelConfigError, match=message):
        parse_label_config(xml)


def test_clicks_and_box_in_percent_become_pixels():
    prompt = prompt_from_context(
        context(
            keypoint(25, 50),
            keypoint(75, 10, positive=False),
            rectangle(10, 20, 30, 40, label="Cat"),
        )
    )
    assert prompt is not None
    obj = prompt.in_pixels(width=200, height=100)
    assert obj.points == ((50, 50), (150, 10)) and obj.labels == (1, 0)
    assert obj.box == pytest.approx((20, 20, 80, 60))
    assert prompt.label == "Cat" and prompt.image_name == "image"
    assert not prompt.single_click


def test_a_single_click_is_ambiguous_and_positive_by_default():
    region = keypoint(1, 2)
    del region["is_positive"]
    prompt = prompt_from_context(context(region))
    assert prompt is not None and prompt.single_click and prompt.points[0].positive


def test_the_last_box_counts():
    prompt = prompt_from_context(context(rectangle(0, 0, 10, 10), rectangle(50, 50, 10, 20)))
    assert prompt is not None
    assert prompt.in_pixels(100, 100).box == pytest.approx((50, 50, 60, 70))


def test_rounding_past_100_percent_is_clamped():
    prompt = prompt_from_context(context(keypoint(100.0004, 0)))
    assert prompt is not None and prompt.in_pixels(10, 10).points[0][0] == 10


def test_no_regions_no_prompt():
    assert prompt_from_context(context()) is None


@pytest.mark.parametrize(
    ("region", "message"),
    [
        ({**keypoint(10, 10), "type": "polygonlabels"}, "is not a prompt; accepted"),
        (keypoint(150, 10), r"context.result\[0\].value.x: 150 is outside"),
        (keypoint(10, -5), r"value.y: -5 is outside"),
        ({**keypoint(10, 10), "image_rotation": 90}, "unrotated"),
        (
            {
                **rectangle(10, 10, 5, 5),
                "value": {**rectangle(10, 10, 5, 5)["value"], "rotation": 30},
            },
            "axis-aligned",
        ),
        (rectangle(90, 10, 20, 5), r"value.x \+ width: 110 is outside"),
        ({**rectangle(10, 10, 5, 5), "value": {"x": 1, "y": 2}}, "needs width and height"),
    ],
)
def test_bad_regions_are_named(region, message):
    with pytest.raises(ApiError, match=message) as caught:
        prompt_from_context(context(region))
    assert caught.value.status == 422


def test_regions_on_two_images_are_refused():
    with pytest.raises(ApiError, match="one prediction is on one image"):
        prompt_from_context(context(keypoint(1, 1), {**keypoint(2, 2), "to_name": "other"}))


def test_smart_tool_regions_carry_labels_and_negatives():
    # Label Studio's editor serialises a smart keypoint with value.labels and is_positive
    # (false for an Alt-click).
    region = keypoint(40, 60, positive=False)
    region["value"] = {"x": 40, "y": 60, "width": 0.5, "labels": ["Cat"]}
    prompt = prompt_from_context(context(region))
    assert prompt is not None and prompt.label == "Cat"
    assert prompt.in_pixels(10, 10).labels[0] == 0
