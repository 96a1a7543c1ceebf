"""The mask formats (engine.formats): each one written from the engine's RLE and read back
by something independent (pycocotools, PIL, hand-computed polygons), and the one registry
that the library, the command line and the service take their formats from."""

from __future__ import annotations

import argparse
import base64
import io
import json
import typing
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image
from pycocotools import mask as mask_utils

from sam2serve.engine.amg_params import OUTPUT_MODES, AMGParamError, AMGParams
from sam2serve.engine.formats import (
    FORMATS,
    JSON_FORMATS,
    encode_mask,
    mask_to_png_base64,
    mask_to_polygons,
)
from sam2serve.engine.rle import masks_to_rle


def square_with_hole_and_dot() -> np.ndarray:
    mask = np.zeros((20, 30), dtype=bool)
    mask[5:15, 8:20] = True
    mask[8:11, 12:15] = False  # a hole
    mask[0:3, 0:3] = True  # a second region touching the border
    return mask


def speckle() -> np.ndarray:
    return np.random.default_rng(0).random((17, 23)) > 0.6


SHAPES: dict[str, Callable[[], np.ndarray]] = {
    "square_with_hole_and_dot": square_with_hole_and_dot,
    "speckle": speckle,
    "empty": lambda: np.zeros((6, 9), dtype=bool),
    "full": lambda: np.ones((6, 9), dtype=bool),
    "first_pixel_only": lambda: np.pad(np.ones((1, 1), dtype=bool), ((0, 4), (0, 7))),
}


def rle_of(mask: np.ndarray) -> dict[str, Any]:
    return masks_to_rle(torch.from_numpy(mask)[None])[0]


def read_back(name: str, value: Any, shape: tuple[int, int]) -> np.ndarray:
    """A written mask decoded without our code: pycocotools for RLEs, PIL for the PNG."""
    h, w = shape
    if name == "coco_rle":
        return mask_utils.decode({"size": value["size"], "counts": value["counts"].encode()})
    if name == "uncompressed_rle":
        return mask_utils.decode(mask_utils.frPyObjects(value, h, w))
    if name == "png_base64":
        image = Image.open(io.BytesIO(base64.b64decode(value)))
        assert image.format == "PNG" and image.mode == "1" and image.size == (w, h)
        return np.asarray(image)
    if name == "binary_mask":
        assert isinstance(value, np.ndarray) and value.dtype == bool and value.shape == shape
        return value
    if name == "polygon":
        if not value:
            return np.zeros(shape, dtype=bool)
        return mask_utils.decode(mask_utils.merge(mask_utils.frPyObjects(value, h, w)))
    raise AssertionError(f"no independent reader for format {name!r}: add one here")


# --------------------------------------------------------------------------- round trips


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("name", [n for n in FORMATS if n != "polygon"])
def test_every_exact_format_decodes_back_to_the_mask(name, shape):
    mask = SHAPES[shape]()
    value = encode_mask(rle_of(mask), name)
    assert np.array_equal(read_back(name, value, mask.shape).astype(bool), mask)
    if FORMATS[name].json:
        assert json.loads(json.dumps(value)) == value  # plain JSON, nothing numpy


def test_coco_rle_is_pycocotools_own_encoding():
    mask = speckle()
    expected = mask_utils.encode(np.asfortranarray(mask.astype(np.uint8)))
    coco = encode_mask(rle_of(mask), "coco_rle")
    assert coco == {"size": list(expected["size"]), "counts": expected["counts"].decode()}


# Speckle is left out: pixels touching only at a corner make marching squares' saddles,
# where a polygon may pass outside the mask (the format is an approximation there).
@pytest.mark.parametrize("shape", [name for name in SHAPES if name != "speckle"])
def test_polygons_cover_each_region_and_nothing_outside(shape):
    """Polygons trace outer boundaries through pixel-edge midpoints: drawn back, they lose
    at most the corner pixels' cut halves and add nothing outside the (hole-filled) mask."""
    from scipy import ndimage

    mask = SHAPES[shape]()
    polygons = encode_mask(rle_of(mask), "polygon")
    assert json.loads(json.dumps(polygons)) == polygons
    drawn = read_back("polygon", polygons, mask.shape).astype(bool)
    filled = ndimage.binary_fill_holes(mask)
    assert not (drawn & ~filled).any()
    assert (drawn & mask).sum() >= mask.sum() - 4 * len(polygons)


def test_polygons_leave_out_holes_and_count_regions():
    polygons = mask_to_polygons(square_with_hole_and_dot())
    assert len(polygons) == 2  # two regions; the hole's boundary is not a polygon
    assert mask_to_polygons(np.zeros((5, 5), dtype=bool)) == []


def test_polygon_of_one_pixel_is_the_diamond_of_its_edge_midpoints():
    mask = np.zeros((4, 5), dtype=bool)
    mask[1, 2] = True  # row 1, column 2: x = 2, y = 1
    [polygon] = mask_to_polygons(mask)
    vertices = set(zip(polygon[0::2], polygon[1::2], strict=True))
    assert vertices == {(1.5, 1.0), (2.0, 0.5), (2.5, 1.0), (2.0, 1.5)}
    xs, ys = np.array(polygon[0::2]), np.array(polygon[1::2])
    # Counter-clockwise in image coordinates (y down): negative shoelace area.
    assert 0.5 * (np.dot(xs, np.roll(ys, -1)) - np.dot(ys, np.roll(xs, -1))) < 0


def test_png_is_one_bit_and_the_same_as_the_direct_encoder():
    mask = square_with_hole_and_dot()
    assert encode_mask(rle_of(mask), "png_base64") == mask_to_png_base64(mask)


# --------------------------------------------------------------------------- one registry


def test_registry_names_and_json_formats():
    assert set(FORMATS) == {"coco_rle", "uncompressed_rle", "png_base64", "polygon", "binary_mask"}
    assert all(name == info.name and info.description for name, info in FORMATS.items())
    assert JSON_FORMATS == ("coco_rle", "uncompressed_rle", "png_base64", "polygon")
    assert not FORMATS["binary_mask"].json


def test_an_unknown_format_is_named_with_the_accepted_ones():
    with pytest.raises(ValueError, match="got 'jpeg'") as caught:
        encode_mask(rle_of(speckle()), "jpeg")
    assert all(repr(name) in str(caught.value) for name in FORMATS)


def test_library_output_modes_are_the_registry():
    assert OUTPUT_MODES == tuple(FORMATS)
    for name in FORMATS:
        assert AMGParams(output_mode=name).output_mode == name
    with pytest.raises(AMGParamError, match="output_mode must be one of 'coco_rle', .*got 'png'"):
        AMGParams(output_mode="png")


def test_service_formats_are_the_registry_json_formats():
    from sam2serve.server import schemas

    assert schemas.MASK_FORMATS == JSON_FORMATS
    assert typing.get_args(schemas.MaskFormat) == JSON_FORMATS
    for model in (schemas.SegmentRequest, schemas.AMGRequest):
        field = model.model_json_schema()["properties"]["mask_format"]
        assert field["enum"] == list(JSON_FORMATS) and field["default"] == "coco_rle"
    described = schemas.SegmentRequest.model_json_schema()["properties"]["mask_format"]
    for name in JSON_FORMATS:
        assert f"'{name}': {FORMATS[name].description}" in described["description"]
    rle = rle_of(square_with_hole_and_dot())
    for name in JSON_FORMATS:
        assert schemas.encode_segmentation(rle, name) == encode_mask(rle, name)
    with pytest.raises(ValueError, match="mask_format"):
        schemas.encode_segmentation(rle, "binary_mask")  # not a wire format


def test_cli_mask_format_choices_are_the_registry_json_formats():
    from sam2serve import cli

    parser = cli.build_parser()
    args = parser.parse_args(["run", "--task", "amg", "x.jpg", "--out", "o"])
    assert args.mask_format == "coco_rle"
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    run = commands.choices["run"]
    run.format_help()  # adds its deferred arguments
    [action] = [a for a in run._actions if "--mask-format" in a.option_strings]
    assert tuple(action.choices) == JSON_FORMATS


# --------------------------------------------------------------------------- the generator


def test_mask_generator_writes_every_format_from_the_registry(tiny_model):
    import skimage.data

    from sam2serve.engine.amg import MaskGenerator
    from sam2serve.engine.predictor import Predictor

    predictor = Predictor(tiny_model)
    params = {"points_per_side": 2, "pred_iou_thresh": 0.0, "stability_score_thresh": 0.0}
    image = skimage.data.coffee()[::4, ::4].copy()
    embedding = predictor.encode(image)
    uncompressed = MaskGenerator(predictor, output_mode="uncompressed_rle", **params)
    rles = [r["segmentation"] for r in uncompressed.generate(image, embedding=embedding)]
    assert rles
    for name in FORMATS:
        generator = MaskGenerator(predictor, output_mode=name, **params)
        records = generator.generate(image, embedding=embedding)
        got = [record["segmentation"] for record in records]
        expected = [encode_mask(rle, name) for rle in rles]
        if name == "binary_mask":
            assert all(np.array_equal(g, e) for g, e in zip(got, expected, strict=True))
        else:
            assert got == expected, name
