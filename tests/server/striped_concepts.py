"""A server subprocess whose SAM 3 finds striped masks: answers of megabytes, at once.

The subject of the tests that use it is what the service does with a detection's masks
(formatting, building and serialising the answer, and whether the event loop stays free
meanwhile), not the detector. The tiny random SAM 3 finds blobs (a few thousand runs per
mask); here every phrase finds ``queries`` instances whose masks are vertical stripes of
``STRIPE`` pixels, each shifted, so one mask on a 1000 x 1000 image is tens of thousands
of runs (uncompressed RLE) or hundreds of polygons, and the detection itself costs
milliseconds. Everything else is the real server: ``create_app`` with the tiny SAM 2.1
(random weights, real encoder) and the tiny SAM 3 (random weights) for encoding, served
by ``server_support.start_app`` in a process of its own (``hostile.py``'s pattern).

Run as ``python striped_concepts.py SETTINGS_JSON``: prints the URL, serves until stdin
closes.
"""

from __future__ import annotations

import gc
import json
import signal
import sys
from typing import Any

from hostile import HERE, START_TIMEOUT_S, SpawnedServer, _wait_for_url, spawn_script

STRIPE = 12  # pixels per stripe: a 1000-pixel column has ~80 runs


def striped_masks(count: int, height: int, width: int):
    """``count`` bool (height, width) masks of horizontal bands, each offset by one pixel:
    every column of mask i has its runs at rows shifted by i."""
    import numpy as np

    rows = np.arange(height)[:, None]
    return [
        np.broadcast_to(((rows + i) // STRIPE) % 2 == 0, (height, width)).copy()
        for i in range(count)
    ]


def spawn_striped_server(settings: dict[str, Any]) -> SpawnedServer:
    """Start the striped-concepts server (``settings``: ServerSettings' flat fields)."""
    proc, log_path = spawn_script(HERE / "striped_concepts.py", json.dumps(settings), "striped")
    return SpawnedServer(_wait_for_url(proc, log_path, START_TIMEOUT_S), proc, log_path)


def _serve(settings: dict[str, Any]) -> None:
    from server_support import start_app, wait_ready

    from sam2serve.checkpoint import load_model
    from sam2serve.concepts.engine import Instance
    from sam2serve.concepts.runtime import Concepts, ConceptsSpec, load_concepts
    from sam2serve.engine.predictor import Predictor
    from sam2serve.server.app import create_app
    from sam2serve.server.memory import release_free_memory
    from sam2serve.server.settings import ServerSettings

    class StripedConcepts(Concepts):
        def detect(self, encoding, phrases, boxes=(), score_thresh=0.5, text=None, **kw):
            count = min(self.size.queries, kw.get("max_instances") or self.size.queries)
            masks = striped_masks(count, encoding.height, encoding.width)
            box = (0.0, 0.0, float(encoding.width), float(encoding.height))
            return {
                phrase: [Instance(m, box, 0.9 - 0.01 * i) for i, m in enumerate(masks)]
                for phrase in phrases
            }

    real = load_concepts(ConceptsSpec(random_weights=True, size="tiny", seed=0))
    concepts = StripedConcepts(real.model, real.tokenize, real.size, real.spec)
    server_settings = ServerSettings.from_flat(**{"warmup": False, "concepts": True, **settings})
    predictor = Predictor(load_model("tiny", random_weights=True, seed=0))
    live = start_app(create_app(server_settings, predictor, concepts=concepts), server_settings)

    def collect(*_: object) -> None:  # SpawnedServer.collect_garbage, as hostile.py's
        gc.collect()
        release_free_memory()

    signal.signal(signal.SIGUSR1, collect)
    wait_ready(live)
    print(live.url, flush=True)
    sys.stdin.read()  # until the test closes the pipe (or dies)
    live.stop()


if __name__ == "__main__":
    _serve(json.loads(sys.argv[1]))
