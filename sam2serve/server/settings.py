"""The service's settings: which model to load and every limit, as one frozen dataclass.

The ``serve`` command fills it from flags; tests build it directly. Every value is
checked on construction, so a bad limit fails at start with a message that names it.
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass

from sam2serve.runtime.backend_choice import choose_backend
from sam2serve.runtime.spec import RuntimeSpec, WeightsSource
from sam2serve.store.identity import DEFAULT_STORE_DTYPE, STORE_DTYPES

MiB = 1024 * 1024

# One fp32 embedding of any model size is 16 MiB (image_embed 4 + high-res features 12).
DEFAULT_CACHE_BYTES = 512 * MiB
# One mask's low-res logits are 256 x 256 fp32 = 256 KiB: 64 MiB keeps the last 256 masks.
DEFAULT_MASK_CACHE_BYTES = 64 * MiB
DEFAULT_API_KEY_ENV = "SAM2SERVE_API_KEY"
# The API schema's own bounds (schemas.py); max_objects and max_points_per_object may only
# lower them.
MAX_OBJECTS = 1024
MAX_POINTS_PER_OBJECT = 1024


@dataclass(frozen=True)
class ServerSettings:
    """What the app loads and the limits it enforces (all sizes in bytes, times in s/ms)."""

    # ---- the model (ignored when create_app is handed a ready predictor)
    model: str = "tiny"
    mode: str = "fast"
    # What executes the mode (sam2serve.runtime.backends); artifacts imply the backend
    # that runs them (onnxruntime for an ONNX export, else "artifacts");
    # None: the mode's default (eager; openvino for int8).
    backend: str | None = None
    checkpoint: str | None = None
    random_weights: bool = False
    artifacts: str | None = None  # a 'sam2serve export' directory (weights included)
    seed: int = 0
    device: str = "cpu"
    # Intra-op CPU threads; None: the CPUs this process may use (affinity, cgroup quota).
    threads: int | None = None

    # ---- limits on one request
    # Largest encoded image (the file's bytes, after base64 decoding): larger -> 413.
    max_upload_bytes: int = 16 * MiB
    # Largest decoded image, width * height, read from the header before decoding: -> 413.
    max_pixels: int = 40_000_000
    # Prompt groups (objects) in one /v1/segment request.
    max_objects: int = 64
    # Points in one object (a box counts as two more).
    max_points_per_object: int = 32
    # Clicks one /v1/amg request may decode over all crops (points_per_side**2 on the image).
    max_amg_points: int = 4096
    # Wall time a request may take, queueing included: then 503 "timeout" with Retry-After.
    request_timeout_s: float = 120.0
    # Crops one /v1/amg request may encode (1 + 4 + 16 + ... over its crop layers).
    max_amg_crops: int = 21
    # JSON structure in one body (or the multipart 'request' part): '{', '[' and ',' count
    # one item each (strings, the base64 image included, count nothing). Counted before the
    # JSON is parsed, so a huge list is refused (413) before it costs parse time or memory.
    max_json_items: int = 100_000
    # Nesting of JSON arrays and objects (the API needs 6): deeper -> 400.
    max_json_depth: int = 32
    # Decoded bytes of every upload in flight together (images being decoded and waiting for
    # their encode, videos and frames being decoded, masks and COCO runs being read), decided
    # from headers and stream metadata before decoding: a request waits for room (then 503),
    # and one that alone needs more is refused (413). N concurrent uploads cannot multiply
    # memory past it.
    max_decoded_bytes_in_flight: int = 2048 * MiB

    # ---- connections and slow clients
    # The request line and headers must arrive within this, or the connection is closed.
    header_timeout_s: float = 10.0
    # The whole body must arrive within this after the headers: then 408 "body_timeout".
    body_timeout_s: float = 60.0
    # Open connections at once; more are answered 503 at once.
    max_connections: int = 256

    # ---- batching and the model queue
    # Images encoded together in one encoder call.
    max_batch_size: int = 4
    # How long the first encode job of a batch waits for others to join it.
    max_wait_ms: float = 10.0
    # Interactive model jobs (encodes, clicks) waiting before new ones get 503 "overloaded".
    max_queue: int = 32
    # Bulk jobs (AMG) waiting; they run only when no interactive job waits, and pause
    # between decoder batches for the clicks that arrive meanwhile.
    max_bulk_queue: int = 8
    # AMG jobs one client (API key, else address) may have queued or running: then 429.
    max_bulk_jobs_per_client: int = 2

    # ---- caches
    # Byte budget of the embedding cache (Embedding.nbytes), least recently used evicted.
    cache_bytes: int = DEFAULT_CACHE_BYTES
    # Byte budget of the store of returned masks' low-res logits (for mask_id refinement).
    mask_cache_bytes: int = DEFAULT_MASK_CACHE_BYTES
    # The persistent embedding store behind the memory cache (a directory or an fsspec URI,
    # shared by replicas and filled ahead of time by 'sam2serve embed'): memory -> store ->
    # encode, every encode written through. None: no store.
    store: str | None = None
    # The precision entries are kept in: float32 (exact) or float16 (half the bytes).
    store_dtype: str = DEFAULT_STORE_DTYPE

    # ---- access
    # When set, /v1/* and /metrics need "Authorization: Bearer KEY" or "X-API-Key: KEY".
    api_key: str | None = None
    # Origins allowed by CORS; empty: no CORS headers at all (browsers refuse cross-origin).
    cors_origins: tuple[str, ...] = ()

    # ---- the annotation page
    # A folder of images the page may browse (GET /v1/images): its image files, not its
    # subfolders; None: no folder (those endpoints answer 404 "no_image_folder").
    images_dir: str | None = None

    # ---- video tracking sessions (/v1/videos; serve --video)
    # Load SAM 2's video model too (same size and weights as the image model) and serve
    # tracking sessions; off: the /v1/videos endpoints answer 404 "video_disabled".
    video: bool = False
    # Sessions held at once (each holds its frames and its objects' memories): then 429.
    max_video_sessions: int = 4
    # Sessions one client (API key, else address) may hold at once: then 429, so one client
    # cannot take every session.
    max_video_sessions_per_client: int = 2
    # Frames in one session's video: more -> 413.
    max_video_frames: int = 300
    # Largest upload that creates a session (a video file, or all frame files together).
    max_video_upload_bytes: int = 256 * MiB
    # Bytes one session may hold: its decoded frames (uint8 RGB) plus what tracking every
    # object through every frame would keep (about 0.75 MiB per object and frame at
    # 1024): a video or an object that would pass it -> 413.
    max_video_session_bytes: int = 2048 * MiB
    # Objects tracked in one session.
    max_video_objects: int = 16
    # A session no request has touched for this long is closed (its memory freed).
    video_idle_s: float = 600.0

    # ---- start-up
    # Run one encode and one decode before /readyz reports ready.
    warmup: bool = True

    def __post_init__(self) -> None:
        positive_ints = (
            "max_upload_bytes",
            "max_pixels",
            "max_objects",
            "max_points_per_object",
            "max_amg_points",
            "max_amg_crops",
            "max_json_items",
            "max_json_depth",
            "max_decoded_bytes_in_flight",
            "max_connections",
            "max_batch_size",
            "max_queue",
            "max_bulk_queue",
            "max_bulk_jobs_per_client",
            "max_video_sessions",
            "max_video_sessions_per_client",
            "max_video_frames",
            "max_video_upload_bytes",
            "max_video_session_bytes",
            "max_video_objects",
        )
        for name in positive_ints:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        for name, cap in (
            ("max_objects", MAX_OBJECTS),
            ("max_points_per_object", MAX_POINTS_PER_OBJECT),
        ):
            if getattr(self, name) > cap:
                raise ValueError(f"{name} must be at most {cap}, got {getattr(self, name)}")
        for name in ("cache_bytes", "mask_cache_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be an integer >= 0 (0 disables), got {value!r}")
        for name in ("request_timeout_s", "header_timeout_s", "body_timeout_s", "video_idle_s"):
            value = getattr(self, name)
            if not (
                isinstance(value, (int, float))
                and not isinstance(value, bool)
                and math.isfinite(value)
                and value > 0
            ):
                raise ValueError(f"{name} must be a number > 0, got {value!r}")
        if not (
            isinstance(self.max_wait_ms, (int, float))
            and math.isfinite(self.max_wait_ms)
            and self.max_wait_ms >= 0
        ):
            raise ValueError(f"max_wait_ms must be a number >= 0, got {self.max_wait_ms!r}")
        if self.api_key is not None and not self.api_key.strip():
            raise ValueError("api_key must not be empty (leave it unset to disable it)")
        if self.images_dir is not None and not (
            isinstance(self.images_dir, str) and self.images_dir and os.path.isdir(self.images_dir)
        ):
            raise ValueError(f"images_dir must be an existing directory, got {self.images_dir!r}")
        if self.store is not None and not (isinstance(self.store, str) and self.store.strip()):
            raise ValueError(
                f"store must be a directory or an fsspec URI (leave it unset for none), got "
                f"{self.store!r}"
            )
        if self.store_dtype not in STORE_DTYPES:
            raise ValueError(
                f"store_dtype must be one of {', '.join(STORE_DTYPES)}, got {self.store_dtype!r}"
            )
        object.__setattr__(self, "cors_origins", tuple(self.cors_origins))

    def runtime_spec(self) -> RuntimeSpec:
        """How the model runs; ValueError naming a bad model, mode, backend or device."""
        backend = choose_backend(self.backend, self.mode, self.device, self.artifacts)
        return RuntimeSpec(
            model=self.model,
            mode=self.mode,
            backend=backend,
            device=self.device,
            threads=self.threads,
        )

    def weights_source(self) -> WeightsSource:
        return WeightsSource(self.checkpoint, self.random_weights, self.seed, self.artifacts)

    @property
    def max_body_bytes(self) -> int:
        """Largest request body: a base64 image (4/3 of its bytes) plus 1 MiB of JSON."""
        return math.ceil(self.max_upload_bytes * 4 / 3) + MiB

    @property
    def max_video_body_bytes(self) -> int:
        """Largest body that creates a video session: the upload plus 1 MiB of multipart
        framing (boundaries and part headers of up to max_video_frames frame parts)."""
        return self.max_video_upload_bytes + MiB

    def replace(self, **changes: object) -> ServerSettings:
        return dataclasses.replace(self, **changes)
