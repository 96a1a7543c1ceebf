"""A real local Ray Serve: two replicas on loopback, a replica killed mid-run, a new one
ready from the shared artifacts without compiling, image-id routing, back-pressure.

One Ray and one application for the whole module (replica start-up costs seconds)."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import io
import socket
import time

import httpx
import numpy as np
import pytest
from PIL import Image

from sam2serve.cluster.client import post_with_retries
from sam2serve.cluster.protocol import MULTIPLEX_HEADER, REPLICA_HEADER, SESSION_HEADER, image_id

pytestmark = pytest.mark.extended  # a real Ray cluster: the second tier

ray = pytest.importorskip("ray")
serve = pytest.importorskip("ray.serve")

APP = "tiny-fast"
REPLICA_PREFIX = "SERVE_REPLICA::"
RETRY_AFTER_S = 1
WAIT_S = 240  # upper bound on waiting for replicas; never asserted as a duration


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _config(artifacts_uri: str, cache: str, port: int, store: str) -> dict:
    return {
        "http_options": {"host": "127.0.0.1", "port": port},
        "applications": [
            {
                "name": APP,
                "route_prefix": "/",
                "import_path": "sam2serve.cluster.app:build_app",
                "args": {
                    "model": "tiny",
                    "mode": "fast",
                    "artifacts": artifacts_uri,
                    "artifacts_cache": cache,
                    # One embedding store for both replicas; video sessions on.
                    "server": {"max_batch_size": 2, "store": store, "video": True},
                },
                "deployments": [
                    {
                        "name": "sam2_tiny_fast",
                        "max_ongoing_requests": 2,
                        "max_queued_requests": 4,
                        "backpressure_config": {"status_code": 503, "retry_after_s": RETRY_AFTER_S},
                        "autoscaling_config": {"min_replicas": 2, "max_replicas": 2},
                        "ray_actor_options": {"num_cpus": 1},
                        "health_check_period_s": 2,
                    }
                ],
            }
        ],
    }


def replica_actors() -> set[str]:
    return {
        a["name"]
        for a in ray.util.list_named_actors(all_namespaces=True)
        if a["name"].startswith(REPLICA_PREFIX)
    }


def running_replicas() -> int:
    app = serve.status().applications.get(APP)
    if app is None:
        return 0
    return sum(d.replica_states.get("RUNNING", 0) for d in app.deployments.values())


def wait_for(predicate, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for {what}")
        time.sleep(0.5)


@pytest.fixture(scope="module")
def cluster(exported_programs, tmp_path_factory):
    from sam2serve.cluster.app import bind_app
    from sam2serve.cluster.config import parse_config

    port = _free_port()
    uri = exported_programs.resolve().as_uri()  # fsspec: every replica copies/verifies
    cache = str(tmp_path_factory.mktemp("replica_cache"))
    store = tmp_path_factory.mktemp("store").resolve().as_uri()  # an fsspec URI
    config = parse_config(_config(uri, cache, port, store))
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        serve.start(http_options=config.http_options)
        spec = config.apps[0]
        serve.run(bind_app(spec), name=spec.name, route_prefix=spec.route_prefix)
        wait_for(lambda: running_replicas() == 2, "two running replicas")
        manifest = (exported_programs / "manifest.json").read_bytes()
        yield {
            "url": f"http://127.0.0.1:{port}",
            "uri": uri,
            "manifest_sha256": hashlib.sha256(manifest).hexdigest(),
        }
    finally:
        serve.shutdown()
        ray.shutdown()


def png(seed: int, side: int = 96) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 255, (side, side, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


def sps_body(data: bytes) -> dict:
    return {
        "image": base64.b64encode(data).decode(),
        "objects": [{"points": [{"x": 40, "y": 40}]}],
        "multimask_output": False,
    }


def kill(replica_actor_name: str) -> None:
    ray.kill(ray.get_actor(replica_actor_name, namespace="serve"), no_restart=True)


def from_replica(client: httpx.Client, url: str, replica: str) -> httpx.Response:
    """GET ``url`` until the given replica answers (Ray picks one per request)."""
    for _ in range(100):
        answer = client.get(url)
        assert answer.status_code == 200, answer.text
        if answer.headers[REPLICA_HEADER] == replica:
            return answer
    raise AssertionError(f"replica {replica} never answered {url}")


def test_a_click_is_answered_by_a_replica_that_never_saw_the_image(cluster):
    """The replicas share one embedding store: an image encoded by one replica is answered
    by the other from its image_id alone (the request carries no image, so it cannot be
    encoded there: without the store the answer would be 404 unknown_image_id)."""
    data = png(700, side=112)
    with httpx.Client(timeout=120) as client:
        upload = client.post(
            cluster["url"] + "/v1/embeddings", json={"image": base64.b64encode(data).decode()}
        )
        assert upload.status_code == 200, upload.text
        encoder = upload.headers[REPLICA_HEADER]
        click = {
            "image_id": upload.json()["image_id"],
            "objects": [{"points": [{"x": 40, "y": 40}]}],
            "multimask_output": False,
        }
        answers = {}
        for _ in range(60):  # no routing header: Ray's router picks a replica per request
            answer = client.post(cluster["url"] + "/v1/segment", json=click)
            assert answer.status_code == 200, answer.text
            answers[answer.headers[REPLICA_HEADER]] = answer.json()
            if len(answers) == 2:
                break
    assert encoder in answers and len(answers) == 2, sorted(answers)
    (other,) = set(answers) - {encoder}
    masks = {
        replica: [(m["segmentation"], m["area"]) for m in answer["objects"][0]["masks"]]
        for replica, answer in answers.items()
    }
    assert masks[other] == masks[encoder]  # the same embedding, so the same mask


def test_no_request_is_lost_when_a_replica_dies_and_a_new_one_starts_warm(cluster):
    before = replica_actors()
    assert len(before) == 2
    held = png(500, side=120)
    held_header = {MULTIPLEX_HEADER: image_id(held)}
    with httpx.Client(timeout=120) as client:
        upload = client.post(
            cluster["url"] + "/v1/embeddings",
            json={"image": base64.b64encode(held).decode()},
            headers=held_header,
        )
    assert upload.status_code == 200
    victim_id = upload.headers[REPLICA_HEADER]
    (victim,) = [name for name in before if name.endswith("#" + victim_id)]
    time.sleep(2)  # the victim reports holding the image to Ray's routers

    async def run() -> tuple[list, list]:
        async with httpx.AsyncClient(timeout=120) as client:

            def send(path: str, body: dict, headers: dict | None = None) -> asyncio.Task:
                return asyncio.create_task(
                    post_with_retries(
                        client,
                        cluster["url"] + path,
                        json=body,
                        headers=headers,
                        max_attempts=60,
                        max_wait_s=2,
                    )
                )

            # AMG on the held image goes to the victim and keeps it busy for seconds.
            amg_body = {
                "image": base64.b64encode(held).decode(),
                "params": {"points_per_side": 8},
            }
            on_victim = [send("/v1/amg", amg_body, held_header) for _ in range(2)]
            spread = [send("/v1/segment", sps_body(png(i))) for i in range(10)]
            await asyncio.sleep(1.5)
            kill(victim)  # mid-run: the AMG requests are in flight on it
            return list(await asyncio.gather(*on_victim)), list(await asyncio.gather(*spread))

    on_victim, spread = asyncio.run(run())
    answers = on_victim + spread
    assert all(a.ok for a in answers), [a.statuses for a in answers]
    assert all(len(a.response.json()["objects"]) == 1 for a in spread)
    # The requests the victim held failed with it, were retried, and another replica answered.
    failed_over = [a for a in on_victim if any(s not in (200, 503) for s in a.statuses)]
    assert failed_over, [a.statuses for a in on_victim]
    assert all(a.response.headers[REPLICA_HEADER] != victim_id for a in failed_over)

    # Ray replaces the replica; the new one loads the shared artifacts, compiles nothing.
    wait_for(
        lambda: running_replicas() == 2 and len(replica_actors() - before) == 1, "a new replica"
    )
    (new_actor,) = replica_actors() - before
    new_id = new_actor.rsplit("#", 1)[1]
    with httpx.Client(timeout=60) as client:
        report = from_replica(client, cluster["url"] + "/cluster/replica", new_id).json()
        metrics = from_replica(client, cluster["url"] + "/metrics", new_id).text
    assert (report["source_kind"], report["backend"], report["device"]) == (
        "artifacts",
        "artifacts",
        "cpu",
    )
    assert report["source_location"] == cluster["uri"]
    assert report["source_sha256"] == cluster["manifest_sha256"]
    assert report["compile_frames"] == 0
    assert report["source_copied"] is False  # this node's cache already held the copy
    assert report["weights"]["source"] == "random"
    assert set(report["stages_s"]) == {
        "process_to_constructor",
        "fetch_model",
        "load_model",
        "warmup",
    }
    assert report["start_to_ready_s"] > 0
    line = f'sam2serve_replica_start_to_ready_seconds{{replica="{new_id}",stage="total"}}'
    assert line in metrics
    assert 'source_kind="artifacts"' in metrics  # sam2serve_replica_info
    assert "sam2serve_requests_total" in metrics  # the app's own metrics, next to ours


def test_requests_with_an_image_id_go_to_the_replica_holding_it(cluster):
    wait_for(lambda: running_replicas() == 2, "two running replicas")
    data = png(1000, side=80)
    header = {MULTIPLEX_HEADER: image_id(data)}
    with httpx.Client(timeout=120) as client:
        upload = client.post(
            cluster["url"] + "/v1/embeddings",
            json={"image": base64.b64encode(data).decode()},
            headers=header,
        )
        assert upload.status_code == 200 and upload.json()["image_id"] == image_id(data)
        holder = upload.headers[REPLICA_HEADER]
        time.sleep(2)  # the replica reports the id to Ray's routers every 0.1 s
        clicks = [
            client.post(
                cluster["url"] + "/v1/segment",
                json={"image_id": image_id(data), "objects": [{"points": [{"x": 10, "y": 9}]}]},
                headers=header,
            )
            for _ in range(8)
        ]
    assert [c.status_code for c in clicks] == [200] * 8
    assert {c.headers[REPLICA_HEADER] for c in clicks} == {holder}
    assert all(c.json()["cached"] for c in clicks)


def test_a_video_session_stays_on_the_replica_that_holds_it(cluster):
    """Sessions live in one replica's memory: the session id, sent as the multiplexing
    header, routes every request on it to that replica (the one that created it)."""
    wait_for(lambda: running_replicas() == 2, "two running replicas")
    frames = [("frame", (f"{i}.png", png(3000 + i, side=64), "image/png")) for i in range(2)]
    with httpx.Client(timeout=120) as client:
        created = client.post(cluster["url"] + "/v1/videos", files=frames)
        assert created.status_code == 201, created.text
        session_id = created.json()["session_id"]
        assert created.headers[SESSION_HEADER] == session_id
        holder = created.headers[REPLICA_HEADER]
        time.sleep(2)  # the replica reports the id to Ray's routers every 0.1 s
        header = {MULTIPLEX_HEADER: session_id}
        answers = [
            client.post(
                cluster["url"] + f"/v1/videos/{session_id}/prompts",
                json={"frame_idx": i % 2, "obj_id": 1, "points": [{"x": 20 + i, "y": 30}]},
                headers=header,
            )
            for i in range(4)
        ]
        answers.append(client.get(cluster["url"] + f"/v1/videos/{session_id}", headers=header))
        closed = client.delete(cluster["url"] + f"/v1/videos/{session_id}", headers=header)
    assert [a.status_code for a in answers] == [200] * 5, [a.text for a in answers]
    assert {a.headers[REPLICA_HEADER] for a in answers} == {holder}
    assert answers[-1].json()["obj_ids"] == [1]
    assert closed.status_code == 200 and closed.headers[REPLICA_HEADER] == holder


def test_a_full_queue_answers_503_with_retry_after(cluster):
    wait_for(lambda: running_replicas() == 2, "two running replicas")

    async def burst() -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=120) as client:
            return list(
                await asyncio.gather(
                    *(
                        client.post(
                            cluster["url"] + "/v1/embeddings",
                            json={"image": base64.b64encode(png(2000 + i)).decode()},
                        )
                        for i in range(14)  # more than 2 replicas x 2 ongoing + 4 queued
                    )
                )
            )

    answers = asyncio.run(burst())
    statuses = [a.status_code for a in answers]
    assert set(statuses) <= {200, 503}, statuses
    rejected = [a for a in answers if a.status_code == 503]
    # The proxy admits at least its queue (max_queued_requests: 4) and rejects the rest
    # of the burst at once; how many replicas take first varies with timing.
    assert rejected and statuses.count(200) >= 4, statuses
    assert all(a.headers.get("retry-after") == str(RETRY_AFTER_S) for a in rejected)
