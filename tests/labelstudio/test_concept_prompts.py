"""Concept prompts in the Label Studio backend (``labelstudio --concepts``), in process, on the
session's tiny random SAM 3 (``concepts_tiny``, score threshold 0: every non-empty query is
an instance): pre-annotation answers every label name of the config with the engine's own
instances (brush RLE decoded by the test's own decoder; polygons rasterised), a TextArea's
text is an interactive prompt, rectangles labelled with a concept label are its exemplar
boxes (``not <label>``: negative), clicks and other boxes are SAM 3's tracker heads' (SAM 2's
with ``--concept-clicks sam2``), and every
hostile request is a 4xx naming what is wrong, before any model work."""

from __future__ import annotations

import httpx
import numpy as np
import pytest
from fastapi.testclient import TestClient
from scipy import ndimage
from skimage.draw import polygon2mask
from support import (
    data_uri,
    decode_brush,
    engine_mask,
    keypoint,
    picture,
    png,
    predict_body,
    rectangle,
)

from sam2serve.concepts.engine import ExemplarBox
from sam2serve.labelstudio import concept_predict
from sam2serve.labelstudio.app import create_labelstudio_app
from sam2serve.labelstudio.concept_predict import (
    MASK_BATCH_BYTES,
    MAX_POLYGONS,
    detector_batches,
    polygons_percent,
)
from sam2serve.labelstudio.concept_prompts import (
    PercentExemplar,
    context_prompts,
    label_prompts,
)
from sam2serve.labelstudio.context import PercentBox
from sam2serve.labelstudio.label_config import parse_label_config
from sam2serve.labelstudio.options import LabelStudioOptions
from sam2serve.labelstudio.protocol import Context
from sam2serve.server.errors import ApiError
from sam2serve.server.settings import MiB, ServerSettings

SETTINGS = ServerSettings.from_flat(warmup=False, max_upload_bytes=1 * MiB, max_wait_ms=0)
PIXELS = picture()
IMAGE = data_uri(png(PIXELS))
H, W = PIXELS.shape[:2]
LABELS = ("Object", "Cat")


def config(tag: str = "BrushLabels", labels: tuple[str, ...] = LABELS) -> str:
    values = "".join(f'<Label value="{label}"/>' for label in labels)
    return (
        '<View><Image name="image" value="$image"/>'
        f'<{tag} name="mask" toName="image">{values}</{tag}>'
        '<KeyPointLabels name="click" toName="image" smart="true"><Label value="Object"/>'
        "</KeyPointLabels>"
        '<RectangleLabels name="box" toName="image" smart="true"><Label value="Cat"/>'
        '<Label value="not Cat"/><Label value="Box"/></RectangleLabels>'
        '<TextArea name="concept" toName="image" editable="true"/></View>'
    )


def textarea(*texts: str) -> dict:
    return {
        "type": "textarea",
        "from_name": "concept",
        "to_name": "image",
        "value": {"text": list(texts)},
    }


@pytest.fixture
def make_client(ls_predictor, concepts_tiny):
    clients: list[TestClient] = []

    def make(concepts: bool = True, settings: ServerSettings = SETTINGS, **options) -> TestClient:
        app = create_labelstudio_app(
            settings.replace(concepts=concepts),
            LabelStudioOptions(concepts=concepts, concept_score_thresh=0.0, **options),
            ls_predictor,
            concepts=concepts_tiny if concepts else None,
            transport=httpx.MockTransport(lambda request: httpx.Response(404)),
        )
        client = TestClient(app, raise_server_exceptions=False)
        client.__enter__()
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.__exit__(None, None, None)


@pytest.fixture(scope="module")
def expected(concepts_tiny) -> dict[str, list]:
    """The engine's instances of the two labels on the image: non-empty, best first."""
    [found] = concepts_tiny.segment([PIXELS], LABELS, (), 0.0)
    return {
        phrase: sorted((i for i in instances if i.mask.any()), key=lambda i: -i.score)
        for phrase, instances in found.items()
    }


@pytest.fixture(scope="module")
def ranked(concepts_tiny) -> dict[str, list]:
    """Every instance of the two labels on the image (empty masks too), best first."""
    [found] = concepts_tiny.segment([PIXELS], LABELS, (), 0.0)
    return {phrase: sorted(found[phrase], key=lambda i: -i.score) for phrase in LABELS}


def by_label(regions: list[dict], key: str) -> dict[str, list[dict]]:
    grouped: dict[str, list[dict]] = {}
    for region in regions:
        [label] = region["value"][key]
        grouped.setdefault(label, []).append(region)
    return grouped


def assert_engines(regions: list[dict], instances: list) -> None:
    assert len(regions) == len(instances) > 0
    for region, instance in zip(regions, instances, strict=True):
        assert region["score"] == pytest.approx(instance.score, abs=1e-4)
        mask = decode_brush(region["value"]["rle"], H, W)
        # The same model on the same pixels: only float reassociation may flip a pixel.
        assert (mask != instance.mask).mean() <= 1e-3


def test_preannotation_answers_every_label_with_the_engines_instances(make_client, expected):
    client = make_client()
    response = client.post("/predict", json=predict_body([IMAGE, IMAGE], config=config()))
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["model_version"].endswith("+sam3-tiny-random-seed0")
    assert len(body["results"]) == 2  # the second task's encoding comes from the cache
    for prediction in body["results"]:
        regions = prediction["result"]
        assert {(r["type"], r["from_name"], r["to_name"]) for r in regions} == {
            ("brushlabels", "mask", "image")
        }
        grouped = by_label(regions, "brushlabels")
        assert list(grouped) == list(LABELS)
        for label in LABELS:
            assert_engines(grouped[label], expected[label])
        scores = [r["score"] for r in regions]
        assert prediction["score"] == pytest.approx(sum(scores) / len(scores))


def rasterised(points: list[list[float]]) -> np.ndarray:
    """The pixels whose centres are inside the polygon (percent -> pixel-index frame)."""
    rows_cols = [(y / 100 * H - 0.5, x / 100 * W - 0.5) for x, y in points]
    return polygon2mask((H, W), np.asarray(rows_cols))


def test_polygonlabels_get_polygons_and_instances_are_bounded(make_client, ranked):
    client = make_client(concept_max_instances=3)
    body = predict_body([IMAGE], config=config("PolygonLabels"))
    response = client.post("/predict", json=body)
    assert response.status_code == 200, response.text
    regions = response.json()["results"][0]["result"]
    grouped = by_label(regions, "polygonlabels")
    assert list(grouped) == list(LABELS)
    for label in LABELS:
        # The three best-scored instances, in order, chosen before any mask is upsampled
        # (as /v1/concepts' max_instances); the empty ones among them left out.
        best = [instance for instance in ranked[label][:3] if instance.mask.any()]
        assert best
        assert sorted({r["score"] for r in grouped[label]}, reverse=True) == pytest.approx(
            [i.score for i in best], abs=1e-4
        )
        for instance in best:
            own = [r for r in grouped[label] if abs(r["score"] - instance.score) < 1e-6]
            assert 1 <= len(own) <= MAX_POLYGONS
            assert all(r["type"] == "polygonlabels" and r["value"]["closed"] for r in own)
            drawn = np.zeros((H, W), bool)
            for region in own:
                assert all(0 <= v <= 100 for point in region["value"]["points"] for v in point)
                drawn |= rasterised(region["value"]["points"])
            # Outer boundaries (holes filled), never outside the mask's outline; all of it
            # when the mask has fewer than MAX_POLYGONS of them. One pixel of slack for float
            # reassociation between the two runs of the model.
            outline = ndimage.binary_fill_holes(instance.mask)
            assert (drawn & ~outline).sum() <= 1
            if len(own) < MAX_POLYGONS:
                assert (drawn != outline).sum() <= 1


def test_a_rectangle_mask_is_a_polygon_on_its_pixel_edges():
    mask = np.zeros((8, 10), bool)
    mask[1:4, 2:6] = True  # rows 1-3, columns 2-5: x from 2 to 6, y from 1 to 4
    [points] = polygons_percent(mask)
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    assert (min(xs), max(xs), min(ys), max(ys)) == pytest.approx((20, 60, 12.5, 50))
    assert len(points) == 8  # marching squares cuts each corner by half a pixel
    assert polygons_percent(np.zeros((4, 4), bool)) == []


def test_textarea_phrases_are_answered_with_their_labels(make_client, expected, monkeypatch):
    # One phrase per detector batch (as a large image's would be): the text encoded once
    # for both, each batch its rows.
    monkeypatch.setattr(concept_predict, "MASK_BATCH_BYTES", 1)
    client = make_client()
    body = predict_body([IMAGE], [textarea("cat, object")], config=config())
    response = client.post("/predict", json=body)
    assert response.status_code == 200, response.text
    regions = response.json()["results"][0]["result"]
    # CLIP's tokenizer lowercases: "cat" is the label "Cat"'s prompt, labelled Cat.
    grouped = by_label(regions, "brushlabels")
    assert list(grouped) == ["Cat", "Object"]
    for label in grouped:
        assert_engines(grouped[label], expected[label])
    empty = client.post("/predict", json=predict_body([IMAGE], [textarea(" , ")], config=config()))
    assert empty.status_code == 200 and empty.json()["results"][0]["result"] == []


def sam3_mask(concepts, coords, labels, box=None, multimask=False):
    """SAM 3's tracker heads' answer on the image's SAM 3 encoding: the best-scored mask."""
    [encoding] = concepts.encode([PIXELS])
    out = concepts.interactive.predict(
        encoding.tracker,
        np.asarray([coords], np.float32) if coords else None,
        np.asarray([labels], np.int32) if coords else None,
        None if box is None else np.asarray([box], np.float32),
        multimask_output=multimask,
    )
    scores = out.iou_scores[0].numpy()
    best = int(scores.argmax())
    return out.masks[0, best].numpy(), float(scores[best])


def test_clicks_and_boxes_are_sam3s_with_concepts_on(make_client, concepts_tiny):
    """--concept-clicks sam3 (the default): the model that found the regions refines them,
    on the encoding its concept prompts used (one SAM 3 encode of the image)."""
    client = make_client()
    body = predict_body([IMAGE], [keypoint(30, 50)], config=config())
    response = client.post("/predict", json=body)
    assert response.status_code == 200, response.text
    [region] = response.json()["results"][0]["result"]
    want, score = sam3_mask(concepts_tiny, [[0.3 * W, 0.5 * H]], [1], multimask=True)
    assert (decode_brush(region["value"]["rle"], H, W) != want).mean() <= 1e-3
    assert region["score"] == pytest.approx(score, abs=1e-4)
    box = rectangle(10, 20, 40, 50, "Box")  # no concept label: a box prompt
    response = client.post("/predict", json=predict_body([IMAGE], [box], config=config()))
    assert response.status_code == 200, response.text
    [region] = response.json()["results"][0]["result"]
    want, score = sam3_mask(concepts_tiny, [], [], [0.1 * W, 0.2 * H, 0.5 * W, 0.7 * H])
    assert (decode_brush(region["value"]["rle"], H, W) != want).mean() <= 1e-3
    assert region["score"] == pytest.approx(score, abs=1e-4)
    cache = client.app.state.service.concepts.cache
    assert cache.stats().entries == 1  # both prompts on the one SAM 3 encoding


def test_clicks_stay_sam2s_with_concept_clicks_sam2(make_client, ls_predictor):
    client = make_client(concept_clicks="sam2")
    body = predict_body([IMAGE], [keypoint(30, 50)], config=config())
    response = client.post("/predict", json=body)
    assert response.status_code == 200, response.text
    [region] = response.json()["results"][0]["result"]
    want, score = engine_mask(ls_predictor, PIXELS, [[0.3 * W, 0.5 * H]], [1], multimask=True)
    assert (decode_brush(region["value"]["rle"], H, W) != want).mean() <= 1e-3
    assert region["score"] == pytest.approx(score, abs=1e-4)


def test_phrases_labels_and_the_selected_label():
    parsed = parse_label_config(config(labels=("Object", "Cat", "Cat")), concepts=True)
    prompt = label_prompts(parsed, 32)
    assert (prompt.phrases, prompt.labels, prompt.output.name) == (LABELS, LABELS, "mask")
    chosen = {"type": "keypointlabels", "value": {"x": 1, "y": 1, "keypointlabels": ["Cat"]}}
    context = Context.model_validate({"result": [chosen, textarea("red car,\nOBJECT", "cat")]})
    prompt = context_prompts(context, parsed, 32, 16)
    assert prompt.phrases == ("red car", "OBJECT", "cat")
    assert prompt.labels == ("Cat", "Object", "Cat")  # a label's name, else the chosen one
    assert prompt.exemplars == () and prompt.exemplars_of(2) == ()
    plain = Context.model_validate({"result": [textarea("red car")]})
    assert context_prompts(plain, parsed, 32, 16).labels == ("Object",)  # the first label


POLYGON_ONLY = (
    config("PolygonLabels")
    .replace("<KeyPointLabels", "<Skip")
    .replace("</KeyPointLabels>", "</Skip>")
)


@pytest.mark.parametrize(
    ("context", "xml", "status", "message"),
    [
        (
            [textarea("x" * 1_000_000)],
            config(),
            422,
            "value.text.list[constrained-str][0]: String should have at most 65536",
        ),
        ([textarea("x," * 5_000)], config(), 422, "10000 characters; a TextArea prompt"),
        ([textarea("y" * 65)], config(), 422, "is 65 characters; a concept prompt is at most 64"),
        ([textarea(",".join(f"p{i}" for i in range(40)))], config(), 422, "more than 32 phrases"),
        ([{**textarea(), "value": {"text": {"a": 1}}}], config(), 422, "text"),
        (None, config(labels=tuple(f"L{i}" for i in range(1000))), 422, "has 1000 labels"),
        (None, config(labels=("z" * 65,)), 422, "is 65 characters; a concept prompt is 1 to"),
        ([textarea("red\u202ecar")], config(), 422, "U+202E RIGHT-TO-LEFT OVERRIDE"),
        ([textarea("cat, c\u200bat")], config(), 422, "U+200B ZERO WIDTH SPACE"),
        ([textarea("a\x00b")], config(), 422, "U+0000"),
        (None, config(labels=("c\u200dat",)), 422, "label 'c\\u200dat' has U+200D"),
        (None, "<View><Image name='image' value='$image'", 422, "not valid XML"),
        (None, config("RectangleLabels"), 422, "no BrushLabels or PolygonLabels tag"),
        (None, config(labels=()), 422, "has no <Label value=...>"),
    ],
    ids=[
        "huge-text",
        "long-text",
        "long-phrase",
        "many-phrases",
        "text-not-a-list",
        "1000-labels",
        "long-label",
        "bidi-override",
        "zero-width-space",
        "nul",
        "joiner-in-a-label",
        "not-xml",
        "no-output-tag",
        "no-labels",
    ],
)
def test_hostile_requests_are_4xx_naming_the_problem(make_client, context, xml, status, message):
    client = make_client()
    response = client.post("/predict", json=predict_body([IMAGE], context, config=xml))
    assert response.status_code == status, response.text
    assert message in response.json()["error"]["message"], response.json()


def test_without_concepts_nothing_changes(make_client):
    client = make_client(concepts=False)
    assert "+sam3" not in client.get("/health").json()["model_version"]
    response = client.post("/predict", json=predict_body([IMAGE], [textarea("cat")]))
    assert response.status_code == 422  # a TextArea is no SAM 2 prompt, as before
    assert "'textarea' is not a prompt" in response.json()["error"]["message"]
    response = client.post("/predict", json=predict_body([IMAGE], config=POLYGON_ONLY))
    assert (
        response.status_code == 422 and "no BrushLabels tag" in response.json()["error"]["message"]
    )


def test_concepts_need_the_model():
    with pytest.raises(ValueError, match="needs the concept model"):
        create_labelstudio_app(SETTINGS, LabelStudioOptions(concepts=True), predictor=object())


def test_prompt_errors_are_api_errors():
    parsed = parse_label_config(config(labels=tuple(f"L{i}" for i in range(5))), concepts=True)
    with pytest.raises(ApiError, match="at most 4 "):
        label_prompts(parsed, 4)


def test_one_sam3_serves_label_studio_and_the_service(ls_predictor, concepts_tiny, monkeypatch):
    """With --concepts the service's /v1/concepts and Label Studio share the one model the
    command loaded: the service never loads its own (a second full SAM 3 is 3.4 GB)."""
    import sam2serve.server.app as server_app

    def no_second_load(settings):
        raise AssertionError("the service loaded a second SAM 3")

    monkeypatch.setattr(server_app, "load_concepts_model", no_second_load)
    settings = SETTINGS.replace(concepts=True)
    app = create_labelstudio_app(
        settings,
        LabelStudioOptions(concepts=True, concept_score_thresh=0.0),
        ls_predictor,
        concepts=concepts_tiny,
        transport=httpx.MockTransport(lambda request: httpx.Response(404)),
    )
    assert app.state.service.concepts.concepts is concepts_tiny


# --------------------------------------------------------------------------- exemplar boxes


def parsed_config():
    return parse_label_config(config(), concepts=True)


def prompt_of(*regions: dict, max_phrases: int = 32, max_boxes: int = 16):
    context = Context.model_validate({"result": list(regions)})
    return context_prompts(context, parsed_config(), max_phrases, max_boxes)


def test_rectangles_labelled_with_a_concept_are_its_exemplar_boxes():
    negative_flag = {**rectangle(0, 0, 5, 5, "cat"), "is_positive": False}
    prompt = prompt_of(
        rectangle(10, 20, 30, 40, "Cat"),
        rectangle(50, 10, 20, 20, " NOT cat "),  # the convention, any case
        negative_flag,  # Label Studio's negative flag, as on clicks
        rectangle(60, 60, 10, 10, "Box"),  # not a concept label: no exemplar, ignored here
        keypoint(5, 5, label="Object"),
    )
    assert prompt is not None
    assert (prompt.phrases, prompt.labels) == (("Cat",), ("Cat",))  # asked by its name
    assert prompt.exemplars_of(0) == (
        PercentExemplar(PercentBox(10, 20, 40, 60), True),
        PercentExemplar(PercentBox(50, 10, 70, 30), False),
        PercentExemplar(PercentBox(0, 0, 5, 5), False),
    )
    assert (prompt.output.name, prompt.image_name) == ("mask", "image")
    # Percent -> pixels of the 96 x 64 image, once its size is known: x% of the width.
    [(indices, boxes)] = detector_batches(prompt, W, H, worst_bytes=1)
    assert indices == [0]
    assert [b.positive for b in boxes] == [True, False, False]
    assert [b.xyxy for b in boxes] == [
        pytest.approx((9.6, 12.8, 38.4, 38.4)),
        pytest.approx((48.0, 6.4, 67.2, 19.2)),
        pytest.approx((0.0, 0.0, 4.8, 3.2)),
    ]
    # Label Studio's rounding past 100 % is clamped, as for SAM 2's boxes.
    [edge] = prompt_of(rectangle(90, 90, 10.0004, 10, "Cat")).exemplars_of(0)
    assert edge.box == PercentBox(90, 90, 100, 100)


def test_typed_phrases_take_the_exemplars_of_their_label():
    # "tabby" has no label of its own: the label chosen on the context (the first
    # rectangle's concept) answers it, with that concept's boxes; "object" is Object's and
    # gets Object's negative box. No label is asked twice.
    prompt = prompt_of(
        textarea("tabby, object"),
        rectangle(10, 10, 20, 20, "Cat"),
        rectangle(40, 40, 10, 10, "not Object"),
    )
    assert prompt.phrases == ("tabby", "object")
    assert prompt.labels == ("Cat", "Object")
    cat = (PercentExemplar(PercentBox(10, 10, 30, 30), True),)
    not_object = (PercentExemplar(PercentBox(40, 40, 50, 50), False),)
    assert prompt.exemplars == (cat, not_object)
    # A concept shown by example only is asked by its name after the typed phrases.
    prompt = prompt_of(textarea("object"), rectangle(10, 10, 20, 20, "cat"))
    assert (prompt.phrases, prompt.labels) == (("object", "Cat"), ("Object", "Cat"))
    assert prompt.exemplars == ((), cat)
    # Phrases of the same boxes share a detector batch; the others go without boxes.
    prompt = prompt_of(textarea("tabby, kitten, object"), rectangle(10, 10, 20, 20, "Cat"))
    assert prompt.labels == ("Cat", "Cat", "Object")
    batches = detector_batches(prompt, W, H, worst_bytes=1)
    assert [(indices, len(boxes)) for indices, boxes in batches] == [([0, 1], 1), ([2], 0)]
    # ... each cut where its masks would pass the batch's byte budget.
    cut = detector_batches(prompt, W, H, worst_bytes=MASK_BATCH_BYTES)
    assert [indices for indices, _ in cut] == [[0], [1], [2]]


def test_contexts_without_a_concept_stay_sam2s():
    assert prompt_of(keypoint(10, 10)) is None
    assert prompt_of(rectangle(10, 10, 20, 20, "Box")) is None  # not a concept label
    assert prompt_of(rectangle(10, 10, 20, 20, "not Dog")) is None  # no concept "Dog"
    assert prompt_of(rectangle(10, 10, 20, 20, "not ")) is None
    unlabelled = {"type": "rectangle", "to_name": "image", "value": {"x": 1, "y": 1}}
    assert prompt_of(unlabelled) is None


def test_exemplar_rectangles_are_answered_with_the_engines_instances(
    make_client, concepts_tiny, expected
):
    client = make_client()
    context = [rectangle(20, 25, 30, 50, "Cat"), rectangle(60, 33, 36, 67, "not cat")]
    response = client.post("/predict", json=predict_body([IMAGE], context, config=config()))
    assert response.status_code == 200, response.text
    regions = response.json()["results"][0]["result"]
    assert {(r["type"], r["from_name"], r["to_name"]) for r in regions} == {
        ("brushlabels", "mask", "image")
    }
    boxes = [
        ExemplarBox((0.2 * W, 0.25 * H, 0.5 * W, 0.75 * H), True),
        ExemplarBox((0.6 * W, 0.33 * H, 0.96 * W, 1.0 * H), False),
    ]
    [found] = concepts_tiny.segment([PIXELS], ["Cat"], boxes, 0.0)
    want = sorted((i for i in found["Cat"] if i.mask.any()), key=lambda i: -i.score)
    grouped = by_label(regions, "brushlabels")
    assert list(grouped) == ["Cat"]
    assert_engines(grouped["Cat"], want)
    # The boxes were used: the phrase alone scores otherwise.
    alone = [i.score for i in expected["Cat"]]
    assert [r["score"] for r in grouped["Cat"]] != pytest.approx(alone, abs=1e-4)


def test_more_exemplar_boxes_than_the_service_takes_are_refused_first(make_client):
    client = make_client(settings=SETTINGS.replace(max_concept_boxes=2))
    context = [rectangle(10 * i, 10, 5, 5, "Cat") for i in range(3)]
    broken = data_uri(b"not an image")  # never fetched: the prompt is refused before
    response = client.post("/predict", json=predict_body([broken], context, config=config()))
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["code"] == "too_many_prompts"
    assert "context.result[2]: more than 2 exemplar boxes" in error["message"]
    assert "max_concept_boxes" in error["message"]
    # Rectangles that are no exemplar do not count (they are SAM 2's box, one per object).
    fine = [*context[:2], rectangle(50, 50, 5, 5, "Box")]
    body = predict_body([IMAGE], fine, config=config())
    assert client.post("/predict", json=body).status_code == 200


def cat_box(**value) -> dict:
    region = rectangle(10, 10, 20, 20, "Cat")
    region["value"] = {**region["value"], **value}
    return region


@pytest.mark.parametrize(
    ("context", "message"),
    [
        ([cat_box(rotation=30)], "context.result[0].value.rotation: 30 degrees"),
        ([cat_box(x=150)], "context.result[0].value.x: 150 is outside the image"),
        ([cat_box(x=90, width=20)], "value.x + width: 110 is outside the image"),
        ([cat_box(width=None)], "a rectangle needs width and height"),
        ([cat_box(y=None)], "a rectangle needs x and y"),
        ([cat_box(height=-5)], "must be >= 0"),
        ([cat_box(x="ten")], "value.x"),
        ([{**cat_box(), "image_rotation": 90}], "image_rotation: 90 degrees"),
        (
            [textarea("cat"), {**cat_box(), "to_name": "other"}],
            "context.result[1].to_name: 'other', but an earlier concept prompt is on 'image'",
        ),
        ([cat_box(rectanglelabels=["Cat" * 100])], "String should have at most 256"),
        (
            [cat_box(rectanglelabels=[f"L{i}" for i in range(5)] + ["Cat"])],
            # the first label names the region: L0 is no concept, so a SAM 2 box it is
            None,
        ),
    ],
    ids=[
        "rotated",
        "outside",
        "past-the-edge",
        "no-width",
        "no-y",
        "negative-height",
        "not-a-number",
        "rotated-image",
        "other-image",
        "huge-label",
        "first-label-counts",
    ],
)
def test_hostile_exemplar_rectangles_are_422_naming_the_region(make_client, context, message):
    client = make_client()
    response = client.post("/predict", json=predict_body([IMAGE], context, config=config()))
    if message is None:
        assert response.status_code == 200, response.text
        return
    assert response.status_code == 422, response.text
    assert message in response.json()["error"]["message"], response.json()


def test_other_rectangles_stay_sam2_boxes_with_concept_clicks_sam2(make_client, ls_predictor):
    client = make_client(concept_clicks="sam2")
    body = predict_body([IMAGE], [rectangle(10, 20, 50, 60, "Box")], config=config())
    response = client.post("/predict", json=body)
    assert response.status_code == 200, response.text
    [region] = response.json()["results"][0]["result"]
    box = [0.1 * W, 0.2 * H, 0.6 * W, 0.8 * H]
    want, score = engine_mask(ls_predictor, PIXELS, [], [], box=box)
    assert (decode_brush(region["value"]["rle"], H, W) != want).mean() <= 1e-3
    assert region["score"] == pytest.approx(score, abs=1e-4)


def test_masks_past_the_decode_budget_are_refused_before_the_encode(make_client):
    """The same mask budget as /v1/concepts: 2 labels x 3 instances on the 96x64 image hold
    2 x 3 x 6,144 + 3 x 6,144 x 9 = 202,752 bytes at worst, more than a 150,000-byte decode
    budget that decoding the image alone (67,584 bytes) fits in; 4 labels x 1 instance,
    4 x 6,144 + 6,144 x 9 = 79,872 bytes, fit and are answered."""
    client = make_client(
        settings=SETTINGS.replace(max_decoded_bytes_in_flight=150_000), concept_max_instances=3
    )
    cache = client.app.state.service.concepts.cache
    response = client.post("/predict", json=predict_body([IMAGE], config=config()))
    assert response.status_code == 413, response.text
    error = response.json()["error"]
    assert error["code"] == "over_decode_budget"
    assert "masks of 2 phrase(s) x 3 instances on a 96x64 image" in error["message"]
    assert "--concept-max-instances" in error["message"]
    assert cache.stats().entries == 0  # nothing encoded
    client = make_client(
        settings=SETTINGS.replace(max_decoded_bytes_in_flight=150_000), concept_max_instances=1
    )
    body = predict_body([IMAGE], config=config(labels=("Object", "Cat", "Dog", "Car")))
    response = client.post("/predict", json=body)
    assert response.status_code == 200, response.text
    regions = response.json()["results"][0]["result"]
    assert 0 < len(regions) <= 4
    assert client.app.state.service.decoding.held == 0  # the masks' bytes given back
