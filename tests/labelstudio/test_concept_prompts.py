"""Concept prompts in the Label Studio backend (``labelstudio --concepts``), in process, on the
session's tiny random SAM 3 (``concepts_tiny``, score threshold 0: every non-empty query is
an instance): pre-annotation answers every label name of the config with the engine's own
instances (brush RLE decoded by the test's own decoder; polygons rasterised), a TextArea's
text is an interactive prompt, SAM 2's clicks are unchanged, and every hostile request is a
4xx naming what is wrong, before any model work."""

from __future__ import annotations

import httpx
import numpy as np
import pytest
from fastapi.testclient import TestClient
from scipy import ndimage
from skimage.draw import polygon2mask
from support import data_uri, decode_brush, engine_mask, keypoint, picture, png, predict_body

from sam2serve.labelstudio import concept_predict
from sam2serve.labelstudio.app import create_labelstudio_app
from sam2serve.labelstudio.concept_predict import MAX_POLYGONS, polygons_percent
from sam2serve.labelstudio.concept_prompts import label_prompts, text_prompts
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

    def make(concepts: bool = True, **options) -> TestClient:
        app = create_labelstudio_app(
            SETTINGS.replace(concepts=concepts),
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


def test_polygonlabels_get_polygons_and_instances_are_bounded(make_client, expected):
    client = make_client(concept_max_instances=3)
    body = predict_body([IMAGE], config=config("PolygonLabels"))
    response = client.post("/predict", json=body)
    assert response.status_code == 200, response.text
    regions = response.json()["results"][0]["result"]
    grouped = by_label(regions, "polygonlabels")
    assert list(grouped) == list(LABELS)
    for label in LABELS:
        best = expected[label][:3]  # the three best-scored instances, in order
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


def test_clicks_stay_sam2s_with_concepts_on(make_client, ls_predictor):
    client = make_client()
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
    chosen = {"type": "rectanglelabels", "value": {"rectanglelabels": ["Cat"]}}
    context = Context.model_validate({"result": [chosen, textarea("red car,\nOBJECT", "cat")]})
    prompt = text_prompts(context, parsed, 32)
    assert prompt.phrases == ("red car", "OBJECT", "cat")
    assert prompt.labels == ("Cat", "Object", "Cat")  # a label's name, else the chosen one
    plain = Context.model_validate({"result": [textarea("red car")]})
    assert text_prompts(plain, parsed, 32).labels == ("Object",)  # the tag's first label


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
