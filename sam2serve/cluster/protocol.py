"""What clients and replicas agree on beyond the HTTP API of ``sam2serve serve``.

- ``serve_multiplexed_model_id: <image_id>`` (or ``serve-multiplexed-model-id``): Ray
  Serve's model-multiplexing header. Sent with the image's id, it routes the request to a
  replica that holds that image's embedding. The id is the SHA-256 of the image's bytes,
  so a client can compute it before its first upload and send the header every time.
- The same header with a video session's id (``vs-`` and 32 hex digits, from the
  ``x-sam2serve-session`` header or the body of ``POST /v1/videos``) routes to the replica
  that holds the session: sessions live in one replica's memory, so every request on a
  session must carry it. Ray's routing by this header is a preference, not a guarantee:
  a request it places elsewhere (the holder is gone, or saturated past Ray's matching
  timeout) is answered 404 ``session_not_found``, and the client creates a new session.
- Every answer carries ``x-sam2serve-replica`` (which replica answered),
  ``x-sam2serve-replica-ms`` (time spent in the replica: the execution time of the burst
  benchmark) and ``x-sam2serve-replica-ready-s`` (that replica's cold start).
- ``GET /cluster/replica`` describes the replica that answers it (JSON).
"""

from __future__ import annotations

import hashlib
import re

from sam2serve.server.session_ids import SESSION_HEADER, is_session_id

MULTIPLEX_HEADER = "serve_multiplexed_model_id"
REPLICA_HEADER = "x-sam2serve-replica"
REPLICA_MS_HEADER = "x-sam2serve-replica-ms"
READY_S_HEADER = "x-sam2serve-replica-ready-s"
REPLICA_PATH = "/cluster/replica"
_IMAGE_ID = re.compile(r"[0-9a-f]{64}")


def image_id(data: bytes) -> str:
    """The image id the service issues for these bytes (SHA-256, hex)."""
    return hashlib.sha256(data).hexdigest()


def is_image_id(value: str) -> bool:
    return bool(_IMAGE_ID.fullmatch(value))


__all__ = [
    "MULTIPLEX_HEADER",
    "READY_S_HEADER",
    "REPLICA_HEADER",
    "REPLICA_MS_HEADER",
    "REPLICA_PATH",
    "SESSION_HEADER",
    "image_id",
    "is_image_id",
    "is_session_id",
]
