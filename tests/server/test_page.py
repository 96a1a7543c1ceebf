"""The annotation page's server side, on real servers: the page and its assets (offline: no
URL leaves the server), the image folder of ``serve --images`` and its refusals (path
traversal, hidden files, other extensions, links out of the folder, size), the COCO
export endpoint against pycocotools, and the ``--images`` flag. The page's behaviour in a
browser is test_page_browser.py's."""

from __future__ import annotations

import contextlib
import io
import os
import re
from pathlib import Path

import numpy as np
import pycocotools.mask as mask_utils
import pytest
from pycocotools.coco import COCO
from server_support import error_of, png_bytes

from sam2serve import cli
from sam2serve.commands.common import EXIT_USAGE
from sam2serve.commands.inputs import IMAGE_EXTENSIONS as CLI_IMAGE_EXTENSIONS
from sam2serve.server.routes import images, page

API_KEY = "page-test-key"
HERE_ONLY = re.compile(r"\b(?:https?:)?//[\w.-]+", re.IGNORECASE)


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """An image folder with everything the listing must leave out, and a secret beside it."""
    root = tmp_path_factory.mktemp("labelling")
    pictures = root / "pictures"
    pictures.mkdir()
    grey = png_bytes(np.full((12, 16, 3), 90, np.uint8))
    (pictures / "b.png").write_bytes(grey)
    (pictures / "a photo.JPG").write_bytes(b"not really a jpeg")
    (pictures / "big.png").write_bytes(b"\0" * (1024 * 1024 + 1))
    (pictures / ".hidden.png").write_bytes(grey)
    (pictures / "notes.txt").write_text("not an image")
    (pictures / "nested.png").mkdir()
    (pictures / "sub").mkdir()
    (pictures / "sub" / "deep.png").write_bytes(grey)
    (root / "secret.png").write_bytes(b"outside the folder")
    (pictures / "link-out.png").symlink_to(root / "secret.png")
    (pictures / "link-in.png").symlink_to(pictures / "b.png")
    with contextlib.suppress(OSError):  # a name the file system cannot decode as UTF-8
        os.close(os.open(os.fsencode(pictures) + b"/bad\xff.png", os.O_CREAT | os.O_WRONLY))
    return pictures


@pytest.fixture(scope="module")
def page_server(predictor, folder):
    from server_support import start_server, wait_ready

    from sam2serve.server.settings import MiB, ServerSettings

    settings = ServerSettings.from_flat(
        warmup=False, images_dir=str(folder), max_upload_bytes=1 * MiB
    )
    live = start_server(settings, predictor)
    wait_ready(live)
    yield live
    live.stop()


# --------------------------------------------------------------------------- the page


def referenced_assets(html: str, scripts: dict[str, str]) -> set[str]:
    """The /page/ paths index.html loads and the modules the scripts import."""
    found = set(re.findall(r'(?:src|href)="(/page/[^"]+)"', html))
    for text in scripts.values():
        found |= {f"/page/{name}" for name in re.findall(r'from\s+"\./([\w.-]+)"', text)}
    return found


def test_the_page_and_every_asset_it_loads_are_served_offline(main_server):
    with main_server.client() as client:
        index = client.get("/")
        assert index.status_code == 200
        assert index.headers["content-type"].startswith("text/html")
        assert "default-src 'self'" in index.headers["content-security-policy"]
        scripts = {}
        for name in page.ASSETS:
            if name.endswith(".js"):
                answer = client.get(f"/page/{name}")
                assert answer.status_code == 200, name
                assert answer.headers["content-type"].startswith("text/javascript"), name
                scripts[name] = answer.text
        wanted = referenced_assets(index.text, scripts)
        assert "/page/app.js" in wanted and "/page/style.css" in wanted
        for path in wanted:
            answer = client.get(path)
            assert answer.status_code == 200, path
        served = {f"/page/{name}" for name in page.ASSETS if name != page.INDEX}
        assert served == wanted, "an asset is never loaded, or one that is loaded is missing"
        # Offline: nothing names another host (no CDN, no font service).
        for name, asset in page.ASSETS.items():
            assert not HERE_ONLY.search(asset.content.decode("utf-8")), name


def test_assets_revalidate_by_etag_and_unknown_assets_are_404(main_server):
    with main_server.client() as client:
        first = client.get("/page/app.js")
        again = client.get("/page/app.js", headers={"If-None-Match": first.headers["etag"]})
        assert again.status_code == 304 and again.content == b""
        for stray in ("/page/nothing.js", "/page/../app.py", "/page/%2e%2e/routes/page.py"):
            answer = client.get(stray)
            assert answer.status_code == 404, stray
            assert error_of(answer)["code"] == "not_found"


def test_the_page_calls_only_public_api_endpoints(main_server):
    """Every endpoint the scripts call is an operation of the OpenAPI document."""
    with main_server.client() as client:
        paths = client.get("/openapi.json").json()["paths"]
    calls = set()
    for asset in page.ASSETS.values():
        text = asset.content.decode("utf-8")
        found = re.findall(
            r'api\s*\.(?:call|stream)\("(?:GET|POST|PATCH|DELETE)", [`"](/[\w/.${}()-]+)', text
        )
        # A template's ${...} is a path parameter: {} on both sides.
        calls |= {re.sub(r"\$\{[^}]*\}+", "{}", path) for path in found}
    assert calls == {
        "/v1/embeddings",
        "/v1/segment",
        "/v1/amg",
        "/v1/concepts",
        "/v1/coco",
        "/v1/images",
        "/v1/images/file",
        "/v1/videos",
        "/v1/videos/{}",
        "/v1/videos/{}/frames/{}",
        "/v1/videos/{}/prompts",
        "/v1/videos/{}/propagate",
        "/v1/videos/{}/concepts/track",
        "/v1/videos/{}/objects/{}",
        "/v1/video-export",
        "/readyz",
    }
    assert calls <= {re.sub(r"\{[^}]*\}", "{}", path) for path in paths}


def test_the_page_is_open_and_the_api_behind_it_keeps_its_key(server_factory, predictor, folder):
    live = server_factory(predictor, api_key=API_KEY, images_dir=str(folder))
    with live.client() as client:
        assert client.get("/").status_code == 200
        assert client.get("/page/app.js").status_code == 200
        for path in ("/v1/images", "/v1/images/file?name=b.png"):
            denied = client.get(path)
            assert denied.status_code == 401, path
            assert error_of(denied)["code"] == "unauthorized"
            allowed = client.get(path, headers={"Authorization": f"Bearer {API_KEY}"})
            assert allowed.status_code == 200, path
        spec = client.get("/openapi.json").json()["paths"]
    for path, method in (("/v1/images", "get"), ("/v1/images/file", "get"), ("/v1/coco", "post")):
        assert "401" in spec[path][method]["responses"], path
    assert "/" not in spec and not any(path.startswith("/page") for path in spec)


# --------------------------------------------------------------------------- the folder


def test_the_folder_lists_its_image_files_only(page_server):
    with page_server.client() as client:
        listing = client.get("/v1/images").json()
        assert listing["folder"] == "pictures"
        names = [entry["name"] for entry in listing["images"]]
        assert names == ["a photo.JPG", "b.png", "big.png", "link-in.png"]
        assert listing["total"] == 4 and listing["offset"] == 0
        sizes = {entry["name"]: entry["bytes"] for entry in listing["images"]}
        assert sizes["big.png"] == 1024 * 1024 + 1
        page_two = client.get("/v1/images", params={"offset": 1, "limit": 2}).json()
        assert [entry["name"] for entry in page_two["images"]] == ["b.png", "big.png"]
        assert page_two["total"] == 4 and page_two["offset"] == 1
        for bad in ({"limit": 0}, {"limit": 10_001}, {"offset": -1}, {"limit": "x"}):
            answer = client.get("/v1/images", params=bad)
            assert answer.status_code == 422, bad
            assert error_of(answer)["code"] == "invalid_request"


def test_an_image_is_served_as_stored(page_server, folder):
    with page_server.client() as client:
        answer = client.get("/v1/images/file", params={"name": "b.png"})
        assert answer.status_code == 200
        assert answer.headers["content-type"] == "image/png"
        assert answer.content == (folder / "b.png").read_bytes()
        spaced = client.get("/v1/images/file", params={"name": "a photo.JPG"})
        assert spaced.status_code == 200 and spaced.headers["content-type"] == "image/jpeg"


@pytest.mark.parametrize(
    ("name", "status", "code"),
    [
        ("../secret.png", 422, "invalid_request"),
        ("sub/deep.png", 422, "invalid_request"),
        ("..\\secret.png", 422, "invalid_request"),
        ("/etc/passwd", 422, "invalid_request"),
        ("..", 422, "invalid_request"),
        (".hidden.png", 422, "invalid_request"),
        ("notes.txt", 422, "invalid_request"),
        ("b.png\x00.txt", 422, "invalid_request"),
        ("b.png\n", 422, "invalid_request"),
        ("", 422, "invalid_request"),
        ("x" * 300 + ".png", 422, "invalid_request"),
        ("missing.png", 404, "unknown_image"),
        ("nested.png", 404, "unknown_image"),
        ("link-out.png", 404, "unknown_image"),
        ("big.png", 413, "upload_too_large"),
    ],
)
def test_a_name_that_is_not_an_image_of_the_folder_is_refused(page_server, name, status, code):
    with page_server.client() as client:
        answer = client.get("/v1/images/file", params={"name": name})
    assert answer.status_code == status, answer.text
    error = error_of(answer)
    assert error["code"] == code
    assert "name" in error["message"] or "query.name" in error["message"]
    assert "outside the folder" not in answer.text
    assert str(page_server.service.folder.root_dir) not in answer.text


def test_the_name_is_never_a_path_even_when_encoded(page_server):
    """Raw request targets that a client library would normalise: still refused."""
    with page_server.client() as client:
        for target in (
            "/v1/images/file?name=..%2Fsecret.png",
            "/v1/images/file?name=%2E%2E%2Fsecret.png",
            "/v1/images/file?name=sub%2Fdeep.png",
            "/v1/images/file/../../secret.png",
        ):
            answer = client.get(target)
            assert answer.status_code in (404, 422), target
            assert b"outside the folder" not in answer.content


def test_without_a_folder_the_endpoints_say_so(main_server):
    with main_server.client() as client:
        for path in ("/v1/images", "/v1/images/file?name=b.png"):
            answer = client.get(path)
            assert answer.status_code == 404, path
            error = error_of(answer)
            assert error["code"] == "no_image_folder"
            assert "--images" in error["message"]


def test_the_folder_takes_the_command_lines_image_extensions():
    assert set(images.IMAGE_EXTENSIONS) == set(CLI_IMAGE_EXTENSIONS)


def test_images_flag_names_a_missing_folder_before_the_model_loads(tmp_path):
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr):
        code = cli.main(["serve", "--random-weights", "--images", str(tmp_path / "nowhere")])
    assert code == EXIT_USAGE
    [line] = [line for line in stderr.getvalue().splitlines() if line.startswith("sam2serve: ")]
    assert line.startswith("sam2serve: error: --images: ") and "nowhere" in line
    file_instead = tmp_path / "file.png"
    file_instead.write_bytes(b"x")
    with contextlib.redirect_stderr(io.StringIO()):
        assert cli.main(["serve", "--random-weights", "--images", str(file_instead)]) == EXIT_USAGE


# --------------------------------------------------------------------------- COCO export


def coco_request(masks: dict[str, np.ndarray], file_name: str = "photo.png") -> dict:
    height, width = next(iter(masks.values())).shape
    objects = []
    for name, mask in masks.items():
        rle = mask_utils.encode(np.asfortranarray(mask.astype(np.uint8)))
        segmentation = {"size": rle["size"], "counts": rle["counts"].decode("ascii")}
        objects.append({"name": name.split("#")[0], "segmentation": segmentation, "score": 0.5})
    return {
        "images": [{"file_name": file_name, "width": width, "height": height, "objects": objects}]
    }


def test_coco_export_round_trips_through_pycocotools(main_server, tmp_path):
    rng = np.random.default_rng(3)
    height, width = 31, 45
    cat = np.zeros((height, width), bool)
    cat[4:20, 6:30] = True
    dog = rng.random((height, width)) < 0.3
    second_cat = np.zeros((height, width), bool)
    second_cat[25:, 40:] = True
    body = coco_request({"cat#1": cat, "dog": dog, "cat#2": second_cat})
    # One object as the runs themselves (the other form the endpoint takes).
    flat = second_cat.flatten(order="F").astype(np.int8)
    edges = np.flatnonzero(np.diff(np.concatenate(([0], flat, [1 - flat[-1]]))))
    runs = np.diff(np.concatenate(([0], edges))).tolist()
    body["images"][0]["objects"][2]["segmentation"] = {"size": [height, width], "counts": runs}
    body["images"][0]["objects"][2]["score"] = None
    with main_server.client() as client:
        answer = client.post("/v1/coco", json=body)
    assert answer.status_code == 200, answer.text
    path = tmp_path / "export.json"
    path.write_text(answer.text)
    coco = COCO(str(path))
    assert [c["name"] for c in coco.loadCats(coco.getCatIds())] == ["cat", "dog"]
    [image] = coco.loadImgs(coco.getImgIds())
    assert (image["file_name"], image["width"], image["height"]) == ("photo.png", width, height)
    annotations = coco.loadAnns(coco.getAnnIds())
    assert [a["category_id"] for a in annotations] == [1, 2, 1]
    for annotation, expected in zip(annotations, (cat, dog, second_cat), strict=True):
        assert np.array_equal(coco.annToMask(annotation).astype(bool), expected)
        assert annotation["area"] == expected.sum() and annotation["iscrowd"] == 0
        assert (
            annotation["bbox"]
            == mask_utils.toBbox(
                mask_utils.encode(np.asfortranarray(expected.astype(np.uint8)))
            ).tolist()
        )
    assert annotations[0]["score"] == 0.5 and "score" not in annotations[2]


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"size": [30, 45]}, "segmentation.size"),
        ({"counts": "not an rle!"}, "segmentation.counts"),
        ({"counts": [10, 5]}, "segmentation.counts"),
        ({"counts": [-1, 31 * 45 + 1]}, "counts"),
    ],
)
def test_coco_export_refuses_masks_that_do_not_fit_the_image(main_server, change, field):
    body = coco_request({"cat": np.ones((31, 45), bool)})
    body["images"][0]["objects"][0]["segmentation"].update(change)
    with main_server.client() as client:
        answer = client.post("/v1/coco", json=body)
    assert answer.status_code == 422, answer.text
    assert field in error_of(answer)["message"]


def test_coco_export_refuses_an_image_over_the_pixel_limit(main_server):
    side = 10_000  # 10^8 pixels: over the main server's max_pixels, and no mask is made
    body = {
        "images": [
            {
                "file_name": "huge.png",
                "width": side,
                "height": side,
                "objects": [{"segmentation": {"size": [side, side], "counts": [side * side]}}],
            }
        ]
    }
    with main_server.client() as client:
        answer = client.post("/v1/coco", json=body)
    assert answer.status_code == 422
    assert "max_pixels" in error_of(answer)["message"]
