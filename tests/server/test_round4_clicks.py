"""Issue 36: one client's SAM 3 work does not hold the model worker for everyone.

Against the real command (``serve --random-weights --concepts --sam3-size tiny --video``,
a subprocess): while a many-phrase detection, or a video concept seed, is running on the
model worker, a click (/v1/segment on a cached embedding) is answered before that work
ends, not after it (the detection is a long job: clicks run between its torch
operations; "before" is read from the job counts of /metrics: a job is counted as it
ends). The detection's answer is the same with clicks interleaved as without, and
the server logs no traceback.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import httpx
import pytest
from hostile import SpawnedServer, spawn_cli_server
from server_logs import ESCAPED, log_mark
from server_support import b64, photo, png_bytes
from surfaces import mp4

pytest.importorskip("av")

IMAGE = png_bytes(photo("astronaut", 320))
PHRASES = [f"thing {i}" for i in range(16)]  # max_concept_phrases' default
WAIT_S = 300  # an upper bound on waiting for the server; never asserted as a time
IN_FLIGHT = "sam2serve_decoded_bytes_in_flight"


@pytest.fixture(scope="module")
def server() -> Iterator[SpawnedServer]:
    live = spawn_cli_server(
        ["--random-weights", "--concepts", "--sam3-size", "tiny", "--video"]
        + ["--request-timeout", str(WAIT_S)]
    )
    yield live
    live.stop()


@pytest.fixture(scope="module")
def image_id(server) -> str:
    """The image, encoded by SAM 2.1 (for clicks) and by SAM 3 (for concepts)."""
    with server.client(timeout=WAIT_S) as client:
        embedded = client.post("/v1/embeddings", json={"image": b64(IMAGE)})
        assert embedded.status_code == 200, embedded.text
        found = client.post("/v1/concepts", json={"image": b64(IMAGE), "phrases": ["x"]})
        assert found.status_code == 200, found.text
    return embedded.json()["image_id"]


def assert_no_traceback(live: SpawnedServer, mark: int) -> None:
    """server_logs' check without its SIGUSR1 (the real command has no handler for it)."""
    text = live.log()[mark:]
    for marker in ESCAPED:
        assert marker not in text, text[-3000:]


def metric(client: httpx.Client, name: str) -> float:
    """A sample of /metrics (0 when it has none yet)."""
    for line in client.get("/metrics").text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return 0.0


def click_during(
    server: SpawnedServer,
    image_id: str,
    work: Callable[[httpx.Client], httpx.Response],
    job: str,
):
    """Start ``work`` (a request whose model job, of kind ``job``, holds bytes in the
    decode budget while it runs); once the job is under way, click. (click answer, whether
    the job was still running when the click was answered, the work's answer)."""
    result: dict[str, httpx.Response] = {}
    finished = threading.Event()
    jobs_done = f'sam2serve_batch_size_count{{kind="{job}"}}'  # counted as a job ends

    def run() -> None:
        with server.client(timeout=WAIT_S) as client:
            result["work"] = work(client)
        finished.set()

    with server.client(timeout=WAIT_S) as client:
        before = metric(client, jobs_done)
        thread = threading.Thread(target=run)
        thread.start()
        deadline = time.monotonic() + WAIT_S
        while metric(client, IN_FLIGHT) == 0 and not finished.is_set():
            assert time.monotonic() < deadline, "the work never started"
            time.sleep(0.02)
        assert not finished.is_set(), "the work ended before a click could be sent"
        click = client.post(
            "/v1/segment",
            json={"image_id": image_id, "objects": [{"points": [{"x": 90, "y": 90, "label": 1}]}]},
        )
        during = metric(client, jobs_done) == before
    thread.join(WAIT_S)
    return click, during, result["work"]


def detection(image_id: str) -> Callable[[httpx.Client], httpx.Response]:
    body = {"image_id": image_id, "phrases": PHRASES, "score_thresh": 0}
    return lambda client: client.post("/v1/concepts", json=body)


def test_a_click_is_answered_during_a_many_phrase_detection(server, image_id):
    mark = log_mark(server)
    click, during, found = click_during(server, image_id, detection(image_id), "concepts_detect")
    assert click.status_code == 200, click.text
    assert found.status_code == 200, found.text
    assert during, "the click waited for the whole detection"
    # The same answer with nothing interleaved (the encoding cached: detection alone).
    with server.client(timeout=WAIT_S) as client:
        alone = detection(image_id)(client)
    assert alone.status_code == 200, alone.text
    assert alone.json()["concepts"] == found.json()["concepts"]
    assert_no_traceback(server, mark)


def test_a_click_is_answered_during_a_video_concept_seed(server, image_id):
    mark = log_mark(server)
    with server.client(timeout=WAIT_S) as client:
        created = client.post(
            "/v1/videos", files={"video": ("clip.mp4", mp4(4, 320, 192), "video/mp4")}
        )
    assert created.status_code == 201, created.text
    session_id = created.json()["session_id"]
    body = {"frame_idx": 0, "phrases": PHRASES[:8], "score_thresh": 0, "max_instances": 8}

    def seed(client: httpx.Client) -> httpx.Response:
        return client.post(f"/v1/videos/{session_id}/concepts", json=body)

    click, during, seeded = click_during(server, image_id, seed, "video_concepts")
    assert click.status_code == 200, click.text
    assert seeded.status_code == 200, seeded.text
    assert during, "the click waited for the whole seeding"
    assert 1 <= len(seeded.json()["objects"]) <= 8
    assert_no_traceback(server, mark)
