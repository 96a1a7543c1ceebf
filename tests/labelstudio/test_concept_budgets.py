"""Label Studio's concept path under the service's budgets (issue 36), against the real
command: ``sam2serve labelstudio --concepts --random-weights --sam3-size tiny
--concept-score-thresh 0 --concept-max-instances 3 --max-decoded-mib 256`` in a subprocess on
loopback (every query of the tiny random SAM 3 scores above 0, so every detection keeps all
it may).

What is asserted, from outside: a small PNG data URI that declares a large image (a 12 Mpx
1-bit PNG is 4.5 KB; its masks, 3 instances x 2 labels, would take ~400 MiB, more than the
256 MiB decode budget, while decoding it alone would fit) is refused with /v1/concepts' 413
``over_decode_budget`` before it is decoded, by Label Studio's /predict and by /v1/concepts
on the same image, and the backend's peak RSS barely moves (before the fix Label Studio
answered it, its peak RSS 2 GiB higher); a label config of more labels than
``--concept-max-labels`` and hostile TextArea texts (an entry of 64,000 characters; a
thousand entries of a thousand repeated phrases, 29 s of the event loop before the fix; a
thousand distinct phrases) are 422s naming the bound, without stalling /healthz, while a
phrase repeated a thousand times within the text's bound is answered once; at threshold 0
each label gets at most ``--concept-max-instances`` instances; the log has no traceback.
The peak growths are printed (``-s``).
"""

from __future__ import annotations

import base64
import io
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest
from PIL import Image
from support import data_uri, picture, png, predict_body

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "server"))

from hostile import REPO, SpawnedServer, StallProbe, free_port, subprocess_env
from surfaces import MAX_STALL_S, MiB, peak_growth

MAX_INSTANCES = 3
DECODE_BUDGET_MIB = 256
START_TIMEOUT_S = 180.0
TIMEOUT_S = 120.0
# What a refused request may add to the backend's peak RSS: the body, its text and the
# base64 decoded (a few KiB here), the header probe, the JSON error; no pixels, no masks.
REFUSED_GROWTH = 96 * MiB
LABELS = ("Object", "Cat")


def config(labels: tuple[str, ...] = LABELS) -> str:
    values = "".join(f'<Label value="{label}"/>' for label in labels)
    return (
        '<View><Image name="image" value="$image"/>'
        f'<BrushLabels name="mask" toName="image">{values}</BrushLabels>'
        '<TextArea name="concept" toName="image"/></View>'
    )


def bomb(width: int, height: int) -> bytes:
    """A 1-bit PNG of one colour: a few KiB that declare ``width`` x ``height`` pixels."""
    buffer = io.BytesIO()
    Image.new("1", (width, height), 1).save(buffer, format="PNG", optimize=True)
    return buffer.getvalue()


def textarea(text: str | list[str]) -> dict:
    return {"type": "textarea", "from_name": "concept", "to_name": "image", "value": {"text": text}}


@pytest.fixture(scope="module")
def backend() -> Iterator[SpawnedServer]:
    port = free_port()
    command = [
        sys.executable,
        "-m",
        "sam2serve",
        "labelstudio",
        "--random-weights",
        "--seed",
        "0",
        "--concepts",
        "--sam3-size",
        "tiny",
        "--concept-score-thresh",
        "0",
        "--concept-max-instances",
        str(MAX_INSTANCES),
        "--max-decoded-mib",
        str(DECODE_BUDGET_MIB),
        "--no-warmup",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--log-level",
        "warning",
    ]
    env = subprocess_env(MALLOC_ARENA_MAX="2")
    for name in ("SAM2SERVE_API_KEY", "LABEL_STUDIO_URL", "LABEL_STUDIO_API_KEY"):
        env.pop(name, None)
    with tempfile.NamedTemporaryFile(
        prefix="sam2serve-ls-budgets-", suffix=".log", delete=False
    ) as log:
        log_path = Path(log.name)
        proc = subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env, cwd=REPO
        )
    live = SpawnedServer(f"http://127.0.0.1:{port}", proc, log_path)
    deadline = time.monotonic() + START_TIMEOUT_S
    while not live.alive(timeout=2):
        if proc.poll() is not None or time.monotonic() > deadline:
            tail = live.log()[-3000:]
            live.stop()
            pytest.fail(f"sam2serve labelstudio did not start; its log ends:\n{tail}")
        time.sleep(0.3)
    yield live
    live.stop()


def post(live: SpawnedServer, path: str, body: dict) -> httpx.Response:
    with live.client(timeout=TIMEOUT_S) as client:
        return client.post(path, json=body)


def measured(live: SpawnedServer, path: str, body: dict) -> tuple[httpx.Response, int, float]:
    """The answer, the backend's peak RSS growth over it, and the worst /healthz latency."""
    rss_before = psutil.Process(live.pid).memory_info().rss
    with StallProbe(live.url) as probe:
        answer, growth = peak_growth(live, lambda: post(live, path, body))
    rss_after = psutil.Process(live.pid).memory_info().rss
    print(
        f"\n{path} {answer.status_code}: peak RSS +{growth / MiB:.0f} MiB, RSS "
        f"{rss_before / MiB:.0f} -> {rss_after / MiB:.0f} MiB, /healthz worst "
        f"{probe.worst_s:.3f} s"
    )
    return answer, growth, probe.worst_s


def images_decoded(live: SpawnedServer) -> float:
    """How many images the backend has decoded (its decode_image stage count)."""
    with live.client() as client:
        metrics = client.get("/metrics").text
    name = 'sam2serve_stage_duration_seconds_count{stage="decode_image"}'
    counts = [line.split()[-1] for line in metrics.splitlines() if line.startswith(name)]
    return float(counts[0]) if counts else 0.0


def error_of(answer: httpx.Response) -> dict:
    return answer.json()["error"]


@pytest.mark.parametrize("size", [(4000, 3000), (6000, 6000)], ids=["12mpx", "36mpx"])
def test_a_small_png_declaring_a_large_image_is_refused_before_decoding(backend, size):
    data = bomb(*size)
    assert len(data) < 16 * 1024  # the was 15.6 KB
    decoded = images_decoded(backend)
    answer, growth, stall = measured(
        backend, "/predict", predict_body([data_uri(data)], config=config())
    )
    assert images_decoded(backend) == decoded  # refused from the header
    assert answer.status_code == 413, answer.text[:500]
    error = error_of(answer)
    assert error["code"] == "over_decode_budget", error
    assert f"{size[0]}x{size[1]}" in error["message"], error
    assert "--concept-max-instances" in error["message"], error
    assert growth <= REFUSED_GROWTH, f"peak RSS grew {growth / MiB:.0f} MiB"
    assert stall <= MAX_STALL_S, f"/healthz stalled {stall:.2f} s"


def test_the_same_image_is_refused_by_v1_concepts_too(backend):
    """One budget: the phrase that Label Studio refuses on an image, /v1/concepts refuses."""
    data = bomb(4000, 3000)
    image = base64.b64encode(data).decode("ascii")
    concepts, _, _ = measured(
        backend, "/v1/concepts", {"image": image, "phrases": ["object"], "max_instances": 3}
    )
    labelled = post(backend, "/predict", predict_body([data_uri(data)], config=config(("Object",))))
    assert concepts.status_code == labelled.status_code == 413, (concepts.text, labelled.text)
    assert error_of(concepts)["code"] == error_of(labelled)["code"] == "over_decode_budget"


def test_a_config_of_more_labels_than_the_limit_is_refused(backend):
    labels = tuple(f"thing {i}" for i in range(1000))
    body = predict_body([data_uri(png(picture()))], config=config(labels))
    answer, growth, stall = measured(backend, "/predict", body)
    assert answer.status_code == 422, answer.text[:500]
    assert "--concept-max-labels" in error_of(answer)["message"]
    assert growth <= REFUSED_GROWTH, f"peak RSS grew {growth / MiB:.0f} MiB"
    assert stall <= MAX_STALL_S, f"/healthz stalled {stall:.2f} s"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("cat\n" * 16_000, "64000 characters; a TextArea prompt is at most 32 phrases"),
        (["a\n" * 1000] * 1000, "TextArea text passes 2080 characters"),
        ([f"p{i}" for i in range(1000)], "more than 32 phrases"),
    ],
    ids=["huge_entry", "many_entries_of_many_phrases", "many_phrases"],
)
def test_a_hostile_textarea_is_refused_naming_the_bound(backend, text, message):
    body = predict_body([data_uri(png(picture()))], [textarea(text)], config=config())
    answer, growth, stall = measured(backend, "/predict", body)
    assert answer.status_code == 422, answer.text[:500]
    assert message in error_of(answer)["message"], error_of(answer)
    assert "--concept-max-labels" in error_of(answer)["message"]
    assert growth <= REFUSED_GROWTH, f"peak RSS grew {growth / MiB:.0f} MiB"
    assert stall <= MAX_STALL_S, f"/healthz stalled {stall:.2f} s"


def test_a_phrase_repeated_a_thousand_times_is_asked_once(backend):
    body = predict_body([data_uri(png(picture()))], [textarea(["a"] * 999 + ["Object"])])
    answer = post(backend, "/predict", {**body, "label_config": config()})
    assert answer.status_code == 200, answer.text[:500]
    [prediction] = answer.json()["results"]
    labels = {region["value"]["brushlabels"][0] for region in prediction["result"]}
    assert labels == {"Object"}  # "a" gets the tag's first label, "Object" its own
    assert 0 < len(prediction["result"]) <= 2 * MAX_INSTANCES


def test_at_threshold_zero_each_label_gets_at_most_max_instances(backend):
    body = predict_body([data_uri(png(picture(160, 120)))], config=config())
    decoded = images_decoded(backend)
    answer = post(backend, "/predict", body)
    assert answer.status_code == 200, answer.text[:500]
    assert images_decoded(backend) == decoded + 1  # what the refusals above did not do
    [prediction] = answer.json()["results"]
    for label in LABELS:
        own = [r for r in prediction["result"] if r["value"]["brushlabels"] == [label]]
        assert 0 < len(own) <= MAX_INSTANCES, (label, len(own))
        scores = [r["score"] for r in own]
        assert scores == sorted(scores, reverse=True)


def test_the_log_has_no_traceback(backend):
    assert backend.alive()
    log = backend.log()
    assert "Traceback" not in log, log[log.find("Traceback") : log.find("Traceback") + 2000]
