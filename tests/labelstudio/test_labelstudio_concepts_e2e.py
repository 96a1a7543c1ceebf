"""Concept prompts against real Label Studio (second tier): a project whose config has a
BrushLabels tag of two labels and a TextArea, two uploaded images, and ``sam2serve
labelstudio --random-weights --concepts --sam3-size tiny --concept-score-thresh 0`` connected
as its ML backend. Label Studio's "Retrieve predictions" over the whole project stores a
prediction for every task whose regions are the engine's instances of both label names
(decoded with Label Studio's own brush decoder), and a TextArea interaction sent through
Label Studio answers the typed phrase.

Label Studio runs from its own virtual environment as in ``test_labelstudio_e2e`` (whose
fixtures start it); this module starts its own backend.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator

import httpx
import numpy as np
import pytest
from support import picture, png
from test_labelstudio_e2e import (  # the real Label Studio's fixtures and helpers
    START_TIMEOUT_S,
    TOKEN,
    api,
    free_port,
    label_studio,
    ls_decode,
    start,
    stop,
    venv_python,
    wait_for,
)

pytestmark = [pytest.mark.labelstudio, pytest.mark.extended, pytest.mark.slow]
__all__ = ["api", "label_studio", "venv_python"]  # fixtures used by name

LABELS = ("Object", "Cat")
CONFIG = """\
<View>
  <Image name="image" value="$image"/>
  <BrushLabels name="mask" toName="image">
    <Label value="Object" background="#ff0000"/>
    <Label value="Cat" background="#ffaa00"/>
  </BrushLabels>
  <TextArea name="concept" toName="image" editable="true" rows="1" maxSubmissions="1"/>
</View>"""
SIZES = [(160, 120, 5), (128, 96, 6)]  # width, height, seed of each task's image


@pytest.fixture(scope="module")
def concept_backend(label_studio, tmp_path_factory) -> Iterator[str]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {
        **os.environ,
        "LABEL_STUDIO_URL": label_studio,
        "LABEL_STUDIO_API_KEY": TOKEN,
    }
    command = [
        sys.executable,
        "-m",
        "sam2serve",
        "labelstudio",
        "--random-weights",
        "--seed",
        "0",
        "--port",
        str(port),
        "--no-warmup",
        "--concepts",
        "--sam3-size",
        "tiny",
        "--concept-score-thresh",
        "0",
        "--request-timeout",
        "600",
    ]
    log = tmp_path_factory.mktemp("concept-backend") / "backend.log"
    process = start(command, env, log)
    try:
        wait_for(f"{url}/health", process, log, START_TIMEOUT_S)
        yield url
    finally:
        stop(process)


@pytest.fixture(scope="module")
def concept_project(api, concept_backend) -> dict:
    created = api.post("/api/projects", json={"title": "concepts", "label_config": CONFIG})
    assert created.status_code == 201, created.text
    project_id = created.json()["id"]
    pixels = {}
    for width, height, seed in SIZES:
        image = picture(width, height, seed=seed)
        imported = api.post(
            f"/api/projects/{project_id}/import",
            files={"file": (f"photo{seed}.png", png(image), "image/png")},
        )
        assert imported.status_code == 201, imported.text
        pixels[(width, height)] = image
    tasks = api.get("/api/tasks", params={"project": project_id}).json()
    tasks = tasks["tasks"] if isinstance(tasks, dict) else tasks
    assert len(tasks) == len(SIZES)
    ml = api.post(
        "/api/ml", json={"url": concept_backend, "project": project_id, "is_interactive": True}
    )
    assert ml.status_code == 201, ml.text
    return {
        "id": project_id,
        "tasks": [t["id"] for t in tasks],
        "ml": ml.json()["id"],
        "pixels": pixels,
    }


@pytest.fixture(scope="module")
def engine():
    from sam2serve.concepts.runtime import ConceptsSpec, load_concepts

    return load_concepts(ConceptsSpec(random_weights=True, size="tiny", seed=0))


def engine_instances(engine, image: np.ndarray, phrases) -> dict[str, list]:
    [found] = engine.segment([image], phrases, (), 0.0)
    return {
        phrase: sorted((i for i in found[phrase] if i.mask.any()), key=lambda i: -i.score)
        for phrase in phrases
    }


def check_regions(regions, expected, venv_python, width, height) -> None:
    for label, instances in expected.items():
        own = [r for r in regions if r["value"]["brushlabels"] == [label]]
        assert len(own) == len(instances) > 0, (label, len(own), len(instances))
        masks = ls_decode(venv_python, [(r["value"]["rle"], height, width) for r in own])
        for region, mask, instance in zip(own, masks, instances, strict=True):
            assert region["score"] == pytest.approx(instance.score, abs=1e-4)
            assert (mask != instance.mask).mean() <= 1e-3


def test_retrieve_predictions_segments_every_label_of_every_task(
    api, concept_project, engine, venv_python
):
    action = api.post(
        "/api/dm/actions",
        params={"id": "retrieve_tasks_predictions", "project": concept_project["id"]},
        json={"selectedItems": {"all": True, "excluded": []}},
    )
    assert action.status_code == 200, action.text
    for task_id in concept_project["tasks"]:
        task = api.get(f"/api/tasks/{task_id}").json()
        predictions = api.get("/api/predictions", params={"task": task_id}).json()
        ours = [
            p
            for p in predictions
            if str(p.get("model_version", "")).endswith("+sam3-tiny-random-seed0")
        ]
        assert ours, predictions
        regions = ours[-1]["result"]
        assert {r["value"]["brushlabels"][0] for r in regions} == set(LABELS)
        width, height = regions[0]["original_width"], regions[0]["original_height"]
        image = concept_project["pixels"][(width, height)]
        assert task["data"]["image"].startswith("/data/upload/")
        expected = engine_instances(engine, image, LABELS)
        check_regions(regions, expected, venv_python, width, height)


def test_a_textarea_phrase_through_label_studio(api, concept_project, engine, venv_python):
    task_id = concept_project["tasks"][0]
    context = {
        "result": [
            {
                "type": "textarea",
                "from_name": "concept",
                "to_name": "image",
                "value": {"text": ["cat"]},
            }
        ]
    }
    response = api.post(
        f"/api/ml/{concept_project['ml']}/interactive-annotating",
        json={"task": task_id, "context": context},
    )
    assert response.status_code == 200, response.text
    answer = response.json()
    assert "errors" not in answer, answer
    regions = answer["data"]["result"]
    assert regions and all(r["value"]["brushlabels"] == ["Cat"] for r in regions)
    width, height = regions[0]["original_width"], regions[0]["original_height"]
    image = concept_project["pixels"][(width, height)]
    expected = engine_instances(engine, image, ["cat"])
    check_regions(
        [{**r, "value": {**r["value"], "brushlabels": ["cat"]}} for r in regions],
        expected,
        venv_python,
        width,
        height,
    )


def test_the_backend_names_sam3_in_its_version(concept_backend):
    version = httpx.get(f"{concept_backend}/health", timeout=10).json()["model_version"]
    assert version.endswith("+sam3-tiny-random-seed0")
