"""engine.prompts: one Prompt value from every form a surface has (the CLI's JSON, the API's
objects, Meta's arrays), checked once with errors that name the part and the value, and
padded into the decoder's arrays with Meta's semantics (box corners first, -1 padding)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from sam2serve.engine.prompts import (
    Prompt,
    PromptError,
    as_prompt,
    prompt_arrays,
    prompts_from_json,
)

BOX = [120.0, 60.0, 330.0, 260.0]


def api_object(points: list[tuple[float, float, int]], box: list[float] | None) -> object:
    """An object shaped as the HTTP API's ObjectPrompt: points with x, y, label; a box."""
    return SimpleNamespace(
        points=[SimpleNamespace(x=x, y=y, label=label) for x, y, label in points], box=box
    )


def test_every_form_gives_the_same_value():
    expected = Prompt(((200.0, 150.0), (60.0, 40.0)), (1, 0), tuple(BOX))
    forms = [
        Prompt.from_json({"points": [[200, 150], [60, 40]], "labels": [1, 0], "box": BOX}),
        Prompt.from_api(api_object([(200, 150, 1), (60, 40, 0)], BOX)),
        Prompt.from_arrays(np.array([[200, 150], [60, 40]]), np.array([1, 0]), np.array(BOX)),
        as_prompt({"points": [[200, 150], [60, 40]], "labels": [1, 0], "box": BOX}),
    ]
    for prompt in forms:
        assert prompt == expected
        assert prompt.points == ((200.0, 150.0), (60.0, 40.0)) and prompt.labels == (1, 0)
    assert Prompt.from_json({"points": [[1, 2]]}).labels == (1,)  # labels default to 1


def test_a_bare_click_is_a_foreground_point_that_remembers_its_form():
    for click in (Prompt.from_json([5, 6]), as_prompt((5, 6)), as_prompt(np.array([5.0, 6.0]))):
        assert click == Prompt(((5, 6),), (1,)) and click.bare_click
    assert not Prompt.from_json({"points": [[5, 6]]}).bare_click
    marker = object()
    refined = Prompt.click(5, 6).with_mask(marker)
    assert refined.mask_input is marker and refined == Prompt.click(5, 6)  # not in the value


def test_arrays_put_box_corners_first_and_pad_with_minus_one():
    prompts = [
        Prompt.from_json([5, 6]),
        Prompt.from_json({"points": [[200, 150]], "labels": [0], "box": BOX}),
        Prompt(box=(1, 2, 3, 4)),
    ]
    coords, labels = prompt_arrays(prompts)
    assert coords.dtype == np.float32 and labels.dtype == np.int32
    np.testing.assert_array_equal(
        coords, [[[5, 6], [0, 0], [0, 0]], [[120, 60], [330, 260], [200, 150]], [[1, 2], [3, 4], [0, 0]]]
    )  # fmt: skip
    np.testing.assert_array_equal(labels, [[1, -1, -1], [2, 3, 0], [2, 3, -1]])
    coords, labels = prompt_arrays([Prompt.click(5, 6), Prompt.click(7, 8)])  # no padding
    assert coords.shape == (2, 1, 2) and labels.tolist() == [[1], [1]]
    with pytest.raises(PromptError, match="at least one prompt"):
        prompt_arrays([])


@pytest.mark.parametrize(
    ("fields", "part", "problem"),
    [
        ({"points": [(1, 2)], "labels": [2]}, "labels[0]", "a label is 1 (foreground) or 0 (background), got 2"),
        ({"points": [(1, 2)], "labels": [True]}, "labels[0]", "got True"),
        ({"points": [(1, 2), (3, 4)], "labels": [1]}, None, "one label per point (2), got [1]"),
        ({"points": [(1, float("nan"))], "labels": [1]}, "points[0]", "two finite numbers"),
        ({"points": [(1, 2, 3)], "labels": [1]}, "points[0]", "expected [x, y]"),
        ({"box": (1, 2, 3)}, None, "box must be [x0, y0, x1, y1] with four finite numbers"),
        ({"box": (5, 2, 3, 4)}, None, "box [5, 2, 3, 4] must have x0 <= x1 and y0 <= y1"),
        ({}, None, "an object needs at least one point or a box"),
    ],
)  # fmt: skip
def test_a_bad_value_is_refused_naming_its_part(fields, part, problem):
    with pytest.raises(PromptError) as caught:
        Prompt(**fields)
    assert caught.value.part == part and problem in caught.value.problem
    assert caught.value.at("objects[3]", ".").startswith(
        "objects[3]: " if part is None else f"objects[3].{part}: "
    )


def test_the_json_form_names_each_entry_and_refuses_what_a_file_gets_wrong():
    good = [[1, 2], {"points": [[1, 2]], "labels": [0]}]
    for bad, fragment in [
        ("x", "prompt 2: expected [x, y] or an object"),
        ({"box": [1, 2, 1, 9]}, "object 2: box [1, 2, 1, 9] is empty: it needs x1 > x0"),
    ]:
        with pytest.raises(PromptError) as caught:
            prompts_from_json([*good, bad])
        assert caught.value.at("image 'a.jpg'").startswith(f"image 'a.jpg', {fragment}")
    assert len(prompts_from_json(good)) == 2
    assert Prompt(box=(1, 2, 1, 9)).box == (1, 2, 1, 9)  # a line is a box to the API
    with pytest.raises(PromptError, match="unknown key 'point'; an object has points"):
        Prompt.from_json({"point": [[1, 2]]})
    with pytest.raises(PromptError, match=r"one label per point \(1\), got 1"):
        Prompt.from_json({"points": [[1, 2]], "labels": 1})  # not a list, even of one
    with pytest.raises(PromptError, match=r"object 0, points\[1\]: expected \[x, y\]"):
        prompts_from_json([{"points": [[1, 2], [3, True]]}])


@pytest.mark.parametrize(
    ("points", "labels", "box", "message"),
    [
        ([[1, 1]], None, None, "points and labels must be given together"),
        (None, None, None, "give points"),
        ([1, 1], [1], None, r"points must have shape \(P, 2\), got \(2,\)"),
        ([[1, 1]], [1, 0], None, r"labels must have shape \(1,\) to match the points"),
        ("ab", [1], None, "points must be numbers"),
        (None, None, [1, 2, 3], r"box must be \[x0, y0, x1, y1\], got shape \(3,\)"),
    ],
)
def test_metas_arrays_are_checked_for_shape(points, labels, box, message):
    with pytest.raises(PromptError, match=message):
        Prompt.from_arrays(points, labels, box)


def test_inside_means_on_the_image_edges_included():
    Prompt(((0, 0), (40, 30)), (1, 0), (0, 0, 40, 30)).check_inside(40, 30)
    cases = [
        (Prompt(((1, 1), (40.5, 2)), (1, 1)), "points[1]", "[40.5, 2] lies outside the 40x30 image; accepted: 0 <= x <= 40, 0 <= y <= 30"),
        (Prompt(((1, -1),), (1,)), "points[0]", "[1, -1] lies outside"),
        (Prompt(box=(0, 0, 40, 31)), "box", "[0, 0, 40, 31] is not inside the 40x30 image; accepted: 0 <= x0 <= x1 <= 40, 0 <= y0 <= y1 <= 30"),
        (Prompt(box=(-1, 0, 4, 3)), "box", "is not inside"),
    ]  # fmt: skip
    for prompt, part, problem in cases:
        with pytest.raises(PromptError) as caught:
            prompt.check_inside(40, 30)
        assert caught.value.part == part and problem in caught.value.problem
    with pytest.raises(PromptError, match="outside the 40x30 frame"):
        Prompt.click(50, 1).check_inside(40, 30, "frame")
