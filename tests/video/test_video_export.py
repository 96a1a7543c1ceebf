"""engine.video.export: tracked masks -> COCO (an image per frame) and YouTube-VIS, checked
with pycocotools (it decodes every RLE back to the masks that went in) and by hand."""

from __future__ import annotations

import json

import numpy as np
import pytest
from pycocotools import mask as mask_utils
from pycocotools.coco import COCO

from sam2serve.engine.rle import masks_to_rle
from sam2serve.engine.video.export import (
    FrameMask,
    TrackedObject,
    VideoInfo,
    frame_file_name,
    video_coco,
    video_youtube_vis,
)
from sam2serve.samples import sample_clip

NUM_FRAMES, SIZE = 5, (48, 64)


@pytest.fixture(scope="module")
def clip() -> dict[int, list[np.ndarray]]:
    _, truth = sample_clip(NUM_FRAMES, SIZE)
    return truth


def rle_of(mask: np.ndarray) -> dict:
    import torch

    return masks_to_rle(torch.from_numpy(mask)[None])[0]


def tracked(truth: dict[int, list[np.ndarray]]) -> list[FrameMask]:
    """The disc on every frame; the square on frames 1-3 (absent on 0, empty on 4)."""
    masks = [FrameMask(f, 1, rle_of(truth[1][f]), score=0.9) for f in range(NUM_FRAMES)]
    masks += [FrameMask(f, 2, rle_of(truth[2][f])) for f in (1, 2, 3)]
    masks.append(FrameMask(4, 2, rle_of(np.zeros(SIZE, bool))))
    return masks


VIDEO = VideoInfo(name="clips/street.mp4", width=SIZE[1], height=SIZE[0], num_frames=NUM_FRAMES)
OBJECTS = [TrackedObject(1, "ball"), TrackedObject(2, "box")]


def test_coco_has_an_image_per_frame_and_pycocotools_decodes_every_mask(clip, tmp_path):
    data = video_coco(VIDEO, OBJECTS, tracked(clip))
    path = tmp_path / "coco.json"
    path.write_text(json.dumps(data, allow_nan=False))
    coco = COCO(str(path))
    images = coco.loadImgs(sorted(coco.getImgIds()))
    assert [i["frame_index"] for i in images] == list(range(NUM_FRAMES))
    assert images[2] == {
        "id": 3, "file_name": "street/00002.jpg", "width": 64, "height": 48,
        "video_id": 1, "video": "clips/street.mp4", "frame_index": 2,
    }  # fmt: skip
    assert data["videos"] == [
        {"id": 1, "name": "clips/street.mp4", "width": 64, "height": 48, "length": 5}
    ]
    assert [c["name"] for c in coco.loadCats(coco.getCatIds())] == ["ball", "box"]
    annotations = coco.loadAnns(coco.getAnnIds())
    # The square's empty mask on frame 4 is no annotation.
    assert len(annotations) == NUM_FRAMES + 3
    for annotation in annotations:
        obj, frame = annotation["track_id"], annotation["frame_index"]
        expected = clip[obj][frame]
        assert annotation["image_id"] == frame + 1
        assert annotation["category_id"] == obj  # ball 1, box 2
        assert np.array_equal(coco.annToMask(annotation).astype(bool), expected)
        assert annotation["area"] == int(expected.sum())
        rows, cols = np.nonzero(expected)
        x, y = cols.min(), rows.min()
        assert annotation["bbox"] == [x, y, cols.max() - x + 1, rows.max() - y + 1]
        assert annotation["bbox"] == list(mask_utils.toBbox(annotation["segmentation"]))
        assert annotation.get("score") == (0.9 if obj == 1 else None)


def test_youtube_vis_lists_every_frame_with_null_where_the_object_is_absent(clip):
    data = json.loads(json.dumps(video_youtube_vis(VIDEO, OBJECTS, tracked(clip))))
    (video,) = data["videos"]
    assert video["length"] == NUM_FRAMES
    assert video["file_names"] == [f"street/{i:05d}.jpg" for i in range(NUM_FRAMES)]
    ball, square = data["annotations"]
    assert (ball["obj_id"], ball["category_id"], square["obj_id"]) == (1, 1, 2)
    assert square["segmentations"][0] is None and square["segmentations"][4] is None
    assert square["areas"][0] is None and square["bboxes"][4] is None
    for annotation in (ball, square):
        assert len(annotation["segmentations"]) == NUM_FRAMES
        assert (annotation["height"], annotation["width"], annotation["iscrowd"]) == (48, 64, 0)
        for frame, rle in enumerate(annotation["segmentations"]):
            if rle is None:
                continue
            expected = clip[annotation["obj_id"]][frame]
            assert np.array_equal(mask_utils.decode(rle).astype(bool), expected)
            assert annotation["areas"][frame] == int(expected.sum())
            assert annotation["bboxes"][frame] == list(mask_utils.toBbox(rle))


def test_an_object_never_present_is_left_out_and_names_share_categories(clip):
    objects = [TrackedObject(1, "ball"), TrackedObject(2, "ball"), TrackedObject(7)]
    data = video_youtube_vis(VIDEO, objects, tracked(clip))
    assert [a["obj_id"] for a in data["annotations"]] == [1, 2]
    assert data["categories"] == [
        {"id": 1, "name": "ball", "supercategory": "object"},
        {"id": 2, "name": "object", "supercategory": "object"},
    ]
    assert {a["category_id"] for a in data["annotations"]} == {1}


def test_compressed_masks_and_frame_names_are_taken(clip):
    coco_rle = mask_utils.encode(np.asfortranarray(clip[1][3].astype(np.uint8)))
    coco_rle["counts"] = coco_rle["counts"].decode()
    names = [f"/data/frames/{i:03d}.png" for i in range(NUM_FRAMES)]
    video = VideoInfo("street", 64, 48, NUM_FRAMES, frame_names=names, fps=12.5)
    data = video_coco(video, OBJECTS, [FrameMask(3, 1, coco_rle)])
    assert data["annotations"][0]["segmentation"] == coco_rle
    assert data["images"][3]["file_name"] == "street/003.png"
    assert frame_file_name(video, 0) == "street/000.png"
    assert data["videos"][0]["fps"] == 12.5


@pytest.mark.parametrize(
    ("mask", "message"),
    [
        (FrameMask(5, 1, {"size": [48, 64], "counts": [3072]}), "frames 0 to 4"),
        (FrameMask(0, 3, {"size": [48, 64], "counts": [3072]}), "not one of the objects"),
        (FrameMask(0, 1, {"size": [64, 48], "counts": [3072]}), "not the video's"),
        (FrameMask(0, 1, {"size": [48, 64], "counts": [3000, 10]}), "cover"),
        (FrameMask(0, 1, {"size": [48, 64], "counts": [3073, -1]}), "cover"),
    ],
)
def test_bad_masks_are_named(mask, message):
    with pytest.raises(ValueError, match=message):
        video_coco(VIDEO, OBJECTS, [mask])


def test_a_repeated_mask_or_object_is_refused():
    empty = {"size": [48, 64], "counts": [3072]}
    with pytest.raises(ValueError, match="second mask"):
        video_youtube_vis(VIDEO, OBJECTS, [FrameMask(0, 1, empty), FrameMask(0, 1, empty)])
    with pytest.raises(ValueError, match="listed twice"):
        video_coco(VIDEO, [TrackedObject(1), TrackedObject(1)], [])
