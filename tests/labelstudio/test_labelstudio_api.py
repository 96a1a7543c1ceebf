"""The backend's endpoints as Label Studio calls them, on the tiny random model: masks equal
to the engine's for the same prompt, decoded from the brush RLE; every bad request a 4xx
in the one error shape."""

from __future__ import annotations

import base64
import re

import httpx
import numpy as np
import pytest
from support import (
    CONFIG,
    data_uri,
    decode_brush,
    engine_mask,
    keypoint,
    picture,
    png,
    predict_body,
    rectangle,
)

from sam2serve.server.settings import ServerSettings

PIXELS = picture()
IMAGE = png(PIXELS)
H, W = PIXELS.shape[:2]


def only_region(response) -> dict:
    assert response.status_code == 200, response.text
    body = response.json()
    assert len(body["results"]) == 1
    prediction = body["results"][0]
    assert prediction["model_version"] == body["model_version"]
    [region] = prediction["result"]
    assert prediction["score"] == pytest.approx(region["score"])
    return region


def region_mask(region: dict) -> np.ndarray:
    assert region["type"] == "brushlabels" and region["value"]["format"] == "rle"
    assert (region["original_width"], region["original_height"]) == (W, H)
    return decode_brush(region["value"]["rle"], H, W)


def assert_same_mask(mask: np.ndarray, expected: np.ndarray) -> None:
    # The same predictor on the same prompt; only float reassociation may flip a pixel.
    assert mask.shape == expected.shape
    assert (mask != expected).mean() <= 1e-3, (mask != expected).sum()


def test_health_setup_versions(client):
    health = client.get("/health").json()
    assert health["status"] == "UP"
    assert health["model_version"] == "sam2serve-tiny-fast-random-seed0"
    setup = client.post("/setup", json={"project": "3.1700000000", "schema": CONFIG})
    assert setup.status_code == 200, setup.text
    assert setup.json() == {"model_version": health["model_version"]}
    assert client.get("/versions").json() == {"versions": [health["model_version"]]}
    assert client.post("/webhook", json={"action": "ANNOTATION_CREATED"}).status_code == 200


def test_a_click_gives_the_engines_best_mask(client, ls_predictor):
    response = client.post("/predict", json=predict_body([data_uri(IMAGE)], [keypoint(30, 50)]))
    region = only_region(response)
    expected, score = engine_mask(ls_predictor, PIXELS, [[0.3 * W, 0.5 * H]], [1], multimask=True)
    assert_same_mask(region_mask(region), expected)
    assert region["score"] == pytest.approx(score, abs=1e-4)
    assert (region["from_name"], region["to_name"]) == ("mask", "image")
    assert region["value"]["brushlabels"] == ["Object"]


def test_negative_click_and_box(client, ls_predictor):
    context = [keypoint(30, 50), keypoint(70, 60, positive=False), rectangle(10, 20, 50, 60, "Cat")]
    region = only_region(client.post("/predict", json=predict_body([data_uri(IMAGE)], context)))
    expected, _ = engine_mask(
        ls_predictor,
        PIXELS,
        [[0.3 * W, 0.5 * H], [0.7 * W, 0.6 * H]],
        [1, 0],
        box=[0.1 * W, 0.2 * H, 0.6 * W, 0.8 * H],
    )
    assert_same_mask(region_mask(region), expected)
    assert region["value"]["brushlabels"] == ["Cat"]


def test_preannotation_clicks_each_tasks_centre(make_client, ls_predictor, remote):
    client = make_client(url="http://ls.test")
    remote.files["http://ls.test/data/upload/1/a.png"] = IMAGE
    body = predict_body(["/data/upload/1/a.png", data_uri(IMAGE)])
    response = client.post("/predict", json=body)
    assert response.status_code == 200, response.text
    results = response.json()["results"]
    assert len(results) == 2
    expected, _ = engine_mask(ls_predictor, PIXELS, [[W / 2, H / 2]], [1], multimask=True)
    for prediction in results:
        [region] = prediction["result"]
        assert_same_mask(region_mask(region), expected)


def test_preannotation_none_and_empty_context(make_client):
    client = make_client(preannotate="none")
    response = client.post("/predict", json=predict_body([data_uri(IMAGE)]))
    assert response.status_code == 200, response.text
    assert response.json()["results"][0]["result"] == []
    client = make_client()
    response = client.post("/predict", json=predict_body([data_uri(IMAGE)], context=[]))
    assert response.json()["results"][0]["result"] == []


def test_in_a_batch_a_broken_task_gets_an_empty_prediction(client):
    body = predict_body([data_uri(IMAGE), "/nowhere/b.png"])
    response = client.post("/predict", json=body)
    assert response.status_code == 200, response.text
    first, second = response.json()["results"]
    assert len(first["result"]) == 1 and second["result"] == []


def test_label_studio_paths_carry_the_token(make_client, remote):
    client = make_client(
        url="http://ls.test", api_key="legacy-token", allow_fetch_hosts=("elsewhere.test",)
    )
    remote.files["http://ls.test/data/upload/1/a.png"] = IMAGE
    remote.files["http://elsewhere.test/a.png"] = IMAGE
    body = predict_body(["/data/upload/1/a.png", "http://elsewhere.test/a.png"])
    body["params"]["context"] = None
    assert client.post("/predict", json=body).status_code == 200
    sent = {str(r.url): r.headers.get("authorization") for r in remote.requests}
    assert sent == {
        "http://ls.test/data/upload/1/a.png": "Token legacy-token",
        "http://elsewhere.test/a.png": None,  # never to another host
    }


def test_setup_gives_the_address_and_token_of_an_allowed_host(make_client, remote):
    client = make_client(allow_fetch_hosts=("ls.setup",))
    remote.files["http://ls.setup/data/upload/9/a.png"] = IMAGE
    setup = {"project": "9.123", "hostname": "http://ls.setup/", "access_token": "owner-token"}
    assert client.post("/setup", json=setup).status_code == 200
    body = predict_body(["/data/upload/9/a.png"], [keypoint(50, 50)])
    body["project"] = "9.123"
    assert client.post("/predict", json=body).status_code == 200
    assert remote.requests[-1].headers["authorization"] == "Token owner-token"


@pytest.mark.parametrize("operator_token", ["legacy-operator-token", "aaa.bbb.ccc"])
def test_setup_cannot_send_the_operators_token_anywhere(make_client, remote, operator_token):
    """The operator's token goes to the operator's Label Studio only: a /setup host, even an
    allowed one, never gets it (nor its personal-token exchange), and a host the operator
    did not allow is not used at all."""
    remote.handler = lambda request: httpx.Response(200, content=IMAGE)
    for allowed in ((), ("attacker.test",)):
        remote.requests.clear()
        client = make_client(api_key=operator_token, allow_fetch_hosts=allowed)
        setup = {"project": "4.1", "hostname": "http://attacker.test", "access_token": None}
        assert client.post("/setup", json=setup).status_code == 200
        body = predict_body(["/data/upload/4/a.png"], [keypoint(50, 50)])
        body["project"] = "4.1"
        answer = client.post("/predict", json=body)
        for request in remote.requests:
            assert operator_token not in str(request.headers) + request.content.decode()
        if not allowed:
            assert answer.status_code == 422 and not remote.requests
            assert "--label-studio-url" in answer.json()["error"]["message"]
        else:  # fetched from the allowed host, without any token
            assert answer.status_code == 200, answer.text
            assert [r.headers.get("authorization") for r in remote.requests] == [None]


def test_redirects_are_checked_and_counted(make_client, remote):
    def handler(request):
        if request.url.path == "/away":
            return httpx.Response(302, headers={"location": "http://internal.test/a.png"})
        if request.url.path == "/round":
            return httpx.Response(302, headers={"location": "/round"})
        return httpx.Response(200, content=IMAGE)

    remote.handler = handler
    client = make_client(allow_fetch_hosts=("images.test",))
    away = client.post("/predict", json=predict_body(["http://images.test/away"], [keypoint(5, 5)]))
    assert away.status_code == 422
    assert "redirected to 'http://internal.test/a.png'" in away.json()["error"]["message"]
    assert [r.url.host for r in remote.requests] == ["images.test"]
    looping = client.post(
        "/predict", json=predict_body(["http://images.test/round"], [keypoint(5, 5)])
    )
    assert looping.status_code == 422 and "redirected more than" in looping.text


def test_a_personal_access_token_is_exchanged(make_client, remote):
    jwt = "aaa.bbb.ccc"

    def handler(request):
        if request.url.path == "/api/token/refresh":
            return httpx.Response(200, json={"access": "short-lived"})
        assert request.headers["authorization"] == "Bearer short-lived"
        return httpx.Response(200, content=IMAGE)

    remote.handler = handler
    client = make_client(url="http://ls.test", api_key=jwt)
    response = client.post(
        "/predict", json=predict_body(["/data/upload/1/a.png"], [keypoint(5, 5)])
    )
    assert response.status_code == 200, response.text
    assert [r.url.path for r in remote.requests] == ["/api/token/refresh", "/data/upload/1/a.png"]


def test_local_files_only_inside_a_root(make_client, tmp_path):
    inside = tmp_path / "photos"
    inside.mkdir()
    (inside / "a.png").write_bytes(IMAGE)
    (tmp_path / "secret.png").write_bytes(IMAGE)
    client = make_client(local_roots=(str(inside),))
    ok = client.post("/predict", json=predict_body([str(inside / "a.png")], [keypoint(5, 5)]))
    assert ok.status_code == 200, ok.text
    refused = client.post(
        "/predict", json=predict_body([f"file://{tmp_path}/photos/../secret.png"], [keypoint(5, 5)])
    )
    assert refused.status_code == 422
    assert "outside the folders" in refused.json()["error"]["message"]


def test_api_key_as_basic_auth_password(make_client):
    client = make_client(ServerSettings.from_flat(warmup=False, api_key="s3cret"))
    body = predict_body([data_uri(IMAGE)], [keypoint(50, 50)])
    assert client.get("/health").status_code == 200  # the probe stays open
    refused = client.post("/predict", json=body)
    assert refused.status_code == 401 and "Basic" in refused.json()["error"]["message"]
    basic = "Basic " + base64.b64encode(b"labelstudio:s3cret").decode()
    assert client.post("/predict", json=body, headers={"Authorization": basic}).status_code == 200
    wrong = "Basic " + base64.b64encode(b"labelstudio:nope").decode()
    assert client.post("/setup", json={}, headers={"Authorization": wrong}).status_code == 401


def _bad(body_change):
    body = predict_body([data_uri(IMAGE)], [keypoint(50, 50)])
    body_change(body)
    return body


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        ({"project": "1"}, 422, "tasks: field required"),
        (_bad(lambda b: b.update(tasks=[])), 422, "tasks"),
        (_bad(lambda b: b.update(tasks=[{"id": 1}])), 422, r"tasks\[0\].data: field required"),
        (_bad(lambda b: b.update(label_config="<View/>")), 422, "no <Image"),
        (
            _bad(lambda b: b.update(label_config=CONFIG.replace("BrushLabels", "PolygonLabels"))),
            422,
            "no BrushLabels",
        ),
        (
            _bad(lambda b: b["tasks"][0].update(data={"img": "x"})),
            422,
            r"no field 'image'.*the task's fields: img",
        ),
        (
            _bad(lambda b: b["tasks"][0]["data"].update(image="/data/upload/1/a.png")),
            422,
            "--label-studio-url",
        ),
        (_bad(lambda b: b["tasks"][0]["data"].update(image=42)), 422, "expected an image URL"),
        (
            _bad(lambda b: b["tasks"][0]["data"].update(image="http://nowhere.test/a.png")),
            422,
            "is not fetched",
        ),
        (
            _bad(lambda b: b["tasks"][0]["data"].update(image="http://127.0.0.1:9/a.png")),
            422,
            "is not fetched",
        ),
        (
            _bad(lambda b: b.update(label_config="<View/>" + " " * 1_000_001)),
            422,
            "label_config",
        ),
        (
            _bad(lambda b: b["tasks"][0]["data"].update(image="data:image/png;base64,AAAA")),
            400,
            "",
        ),
        (
            _bad(lambda b: b["params"]["context"]["result"][0]["value"].update(x=101)),
            422,
            "101 is outside",
        ),
        (
            _bad(lambda b: b["params"]["context"]["result"][0].update(type="brushlabels")),
            422,
            "is not a prompt",
        ),
        (
            _bad(lambda b: b["params"]["context"].update(result=[keypoint(1, 1)] * 40)),
            422,
            "max_points_per_object",
        ),
        (
            _bad(lambda b: b["params"]["context"]["result"][0]["value"].update(x="left")),
            422,
            "value.x",
        ),
    ],
)
def test_bad_requests_are_4xx_with_a_message(client, body, status, message):
    response = client.post("/predict", json=body)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["message"]
    assert re.search(message, error["message"]), error["message"]


def test_not_json_is_4xx(client):
    response = client.post(
        "/predict", content=b"{not json", headers={"content-type": "application/json"}
    )
    assert 400 <= response.status_code < 500
    assert response.json()["error"]["message"]


def test_a_huge_download_is_refused(make_client, remote):
    client = make_client(url="http://ls.test")
    remote.files["http://ls.test/data/upload/big.png"] = b"x" * (2 * 1024 * 1024)
    response = client.post(
        "/predict", json=predict_body(["/data/upload/big.png"], [keypoint(5, 5)])
    )
    assert response.status_code == 413
    assert "max_upload_bytes" in response.json()["error"]["message"]


def test_preannotation_by_amg_gives_one_region_per_mask(make_client, monkeypatch):
    # A 2x2 grid and no thresholds: the AMG path, quickly, with masks from random weights.
    import sam2serve.labelstudio.predict as predict_module
    from sam2serve.engine.amg_params import AMGParams

    small = {"points_per_side": 2, "pred_iou_thresh": 0.0, "stability_score_thresh": 0.0}
    monkeypatch.setattr(
        predict_module.AMGParams,
        "from_dict",
        classmethod(lambda cls, values: AMGParams(**{**values, **small})),
    )
    client = make_client(preannotate="amg")
    response = client.post("/predict", json=predict_body([data_uri(IMAGE)]))
    assert response.status_code == 200, response.text
    [prediction] = response.json()["results"]
    assert prediction["result"], "AMG found no mask with every threshold at 0"
    areas = [int(region_mask(region).sum()) for region in prediction["result"]]
    assert areas == sorted(areas, reverse=True)
    assert all(region["value"]["brushlabels"] == ["Object"] for region in prediction["result"])
