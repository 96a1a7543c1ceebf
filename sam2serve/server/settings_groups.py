"""The service's settings, one small frozen dataclass per concern (torch-free).

:class:`sam2serve.server.settings.ServerSettings` composes them (``settings.runtime``,
``settings.limits``, ``settings.video``, ...). Every setting is declared once, here, with
its help, bounds and default (:func:`sam2serve.options.option`): ``serve``'s and
``labelstudio``'s flags and their ``SAM2SERVE_*`` variables are derived from these fields,
each listed under its group's help title. A field's *key* (its name, or its Option's
``key``) is its flat name: the flag's destination, the cluster config file's key, the name
errors use. Each group checks its own values on construction, so a bad value fails at
start with a message that names it.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

from sam2serve.engine.decode_choice import DEFAULT_IMAGE_DECODE, IMAGE_DECODE_HELP, IMAGE_DECODES
from sam2serve.options import check_options, option
from sam2serve.runtime.backend_choice import choose_backend
from sam2serve.runtime.spec import RuntimeSpec, WeightsSource
from sam2serve.server.allowed_hosts import check_allowed_hosts, parse_allowed_hosts
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
# The help groups of 'serve --help' the flags are listed in.
RUNTIME = "model and runtime"
ACCESS = "network and access"
PAGE = "annotation page (GET /)"
LIMITS = "limits"
CONNECTIONS = "connections and slow clients"
BATCHING = "batching and queue"
VIDEO = "video tracking sessions (--video; docs/api.md)"
LIVE = "live video sessions (--video; WebSocket, docs/video.md)"
CACHES = "caches"
STORE = "embedding store (docs/labelling.md)"
CONCEPTS = "concept prompts (--concepts; SAM 3, docs/concepts.md)"
# The API schema's own bounds on a /v1/concepts request (concept_schemas.py); the
# max_concept_* settings may only lower them.
MAX_CONCEPT_PHRASES = 64
MAX_CONCEPT_BOXES = 64
MAX_CONCEPT_INSTANCES = 200  # SAM 3's queries: no phrase can find more
MAX_CONCEPT_BATCH_SIZE = 64
# One SAM 3 image encoding (its FPN features, fp32) is ~225 MiB at 1008 px.
DEFAULT_CONCEPT_CACHE_BYTES = 1024 * MiB


@dataclass(frozen=True)
class RuntimeSettings:
    """The model a service loads (ignored when create_app is handed a ready predictor)
    and how it starts."""

    model: str = "tiny"
    mode: str = "fast"
    # What executes the mode (sam2serve.runtime.backends); None or "auto": the rule of
    # runtime.backend_choice (artifacts: the backend their manifest calls for).
    backend: str | None = None
    checkpoint: str | None = None
    random_weights: bool = False
    artifacts: str | None = None  # a 'sam2serve export' directory (weights included)
    seed: int = 0
    device: str = "cpu"
    # Intra-op CPU threads; None: the CPUs this process may use (affinity, cgroup quota).
    threads: int | None = None
    # Where uploaded images are decoded for the encoder (engine.decode_choice).
    image_decode: str = option(
        DEFAULT_IMAGE_DECODE,
        help=IMAGE_DECODE_HELP + "; for the images the encoder takes (AMG's pixels, video "
        "frames and SAM 3's images decode on the host)",
        choices=IMAGE_DECODES,
        group=RUNTIME,
    )
    # Run one encode and one decode before /readyz reports ready.
    warmup: bool = option(
        True,
        help="report ready after a warm-up encode + decode (--no-warmup: at once)",
        group=RUNTIME,
    )

    def __post_init__(self) -> None:
        check_options(self)

    def spec(self) -> RuntimeSpec:
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


@dataclass(frozen=True)
class AccessSettings:
    """Who may use the service: the API key, CORS origins, the Host names allowed."""

    # When set, /v1/* and /metrics need "Authorization: Bearer KEY" or "X-API-Key: KEY".
    api_key: str | None = None
    # Origins allowed by CORS; empty: no CORS headers at all (browsers refuse cross-origin).
    cors_origins: tuple[str, ...] = option(
        (),
        help="allow browser requests from ORIGIN (repeatable)",
        flag="--cors-origin",
        metavar="ORIGIN",
        repeatable=True,
        default_text="none, CORS off",
        group=ACCESS,
    )
    # Host names a request's Host header may name besides the listening address and the
    # loopback names (server.allowed_hosts: what stops a DNS-rebinding page); "*": any.
    allowed_hosts: tuple[str, ...] | None = option(
        None,
        help="host names clients reach this server by (a proxy's, a container network's), "
        "comma-separated; any other Host header gets 403, so a DNS-rebinding page is refused; "
        "* allows any",
        type=parse_allowed_hosts,
        metavar="HOST[,HOST...]",
        default_text="only the --host address and localhost, 127.0.0.1, [::1]; any IP "
        "address when --host is 0.0.0.0 or ::",
        group=ACCESS,
    )

    def __post_init__(self) -> None:
        check_options(self)
        if self.api_key is not None and not self.api_key.strip():
            raise ValueError("api_key must not be empty (leave it unset to disable it)")
        object.__setattr__(self, "cors_origins", tuple(self.cors_origins))
        if self.allowed_hosts is not None:
            object.__setattr__(self, "allowed_hosts", tuple(self.allowed_hosts))
            check_allowed_hosts(self.allowed_hosts)


@dataclass(frozen=True)
class PageSettings:
    """The annotation page (GET /)."""

    # A folder of images the page may browse (GET /v1/images): its image files, not its
    # subfolders; None: no folder (those endpoints answer 404 "no_image_folder").
    images_dir: str | None = option(
        None,
        help="a folder of images the page may browse and open (its jpg jpeg png webp bmp tif "
        "tiff files, not its subfolders), through GET /v1/images; a listing is kept until the "
        "folder changes and reads a capped number of entries (docs/api.md)",
        flag="--images",
        metavar="DIR",
        default_text="none",
        group=PAGE,
    )

    def __post_init__(self) -> None:
        check_options(self)
        if self.images_dir is not None and not (
            isinstance(self.images_dir, str) and self.images_dir and os.path.isdir(self.images_dir)
        ):
            raise ValueError(f"images_dir must be an existing directory, got {self.images_dir!r}")


@dataclass(frozen=True)
class LimitSettings:
    """Limits on one request (each a flag of 'serve': sam2serve.options)."""

    # Largest encoded image (the file's bytes, after base64 decoding): larger -> 413.
    max_upload_bytes: int = option(
        16 * MiB,
        help="largest image file (413 above)",
        flag="--max-upload-mib",
        metavar="MIB",
        scale=MiB,
        low=1,
        group=LIMITS,
    )
    max_pixels: int = option(
        40_000_000,
        help="largest image in width*height, checked before decoding (413 above)",
        metavar="N",
        low=1,
        group=LIMITS,
    )
    max_objects: int = option(
        64,
        help="objects (prompt groups) per /v1/segment request",
        metavar="N",
        low=1,
        high=MAX_OBJECTS,
        group=LIMITS,
    )
    max_points_per_object: int = option(
        32,
        help="clicks per object (a box counts as two more)",
        metavar="N",
        low=1,
        high=MAX_POINTS_PER_OBJECT,
        group=LIMITS,
    )
    max_amg_points: int = option(
        4096,
        help="clicks one /v1/amg request may decode over all crops (4096: points_per_side 64)",
        metavar="N",
        low=1,
        group=LIMITS,
    )
    max_amg_crops: int = option(
        21,
        help="crops one /v1/amg request may encode (21: crop_n_layers 2)",
        metavar="N",
        low=1,
        group=LIMITS,
    )
    # '{', '[' and ',' count one item each (strings, the base64 image included, count
    # nothing). Counted before the JSON is parsed, so a huge list is refused (413) before it
    # costs parse time or memory.
    max_json_items: int = option(
        100_000,
        help="JSON arrays, objects and separators in one body, counted before parsing (413 above)",
        metavar="N",
        low=1,
        group=LIMITS,
    )
    # The API needs 6 levels.
    max_json_depth: int = option(
        32,
        help="nesting of JSON arrays and objects in one body (400 above)",
        metavar="N",
        low=1,
        group=LIMITS,
    )
    # Decoded bytes of every upload in flight together (images being decoded and waiting for
    # their encode, videos and frames being decoded, masks and COCO runs being read), decided
    # from headers and stream metadata before decoding: a request waits for room (then 503),
    # and one that alone needs more is refused (413). N concurrent uploads cannot multiply
    # memory past it.
    max_decoded_bytes_in_flight: int = option(
        2048 * MiB,
        help="decoded bytes of all uploads in flight together (images, videos, "
        "masks, COCO runs), from their headers before decoding; more wait, then 503",
        flag="--max-decoded-mib",
        metavar="MIB",
        scale=MiB,
        low=1,
        group=LIMITS,
    )
    # Label Studio's /predict (sam2serve labelstudio): each task is fetched, decoded and
    # encoded, so a request's work grows with its tasks; more are refused before any.
    max_predict_tasks: int = option(
        1000,
        help="tasks in one Label Studio /predict request (413 above)",
        metavar="N",
        low=1,
        group=LIMITS,
    )
    request_timeout_s: float = option(
        120.0,
        help="seconds a request may take, queueing included; then 503 with Retry-After",
        flag="--request-timeout",
        metavar="S",
        low=0,
        low_open=True,
        group=LIMITS,
    )

    def __post_init__(self) -> None:
        check_options(self)

    @property
    def max_body_bytes(self) -> int:
        """Largest request body: a base64 image (4/3 of its bytes) plus 1 MiB of JSON."""
        return math.ceil(self.max_upload_bytes * 4 / 3) + MiB


@dataclass(frozen=True)
class ConnectionSettings:
    """Connections and slow clients."""

    header_timeout_s: float = option(
        10.0,
        help="seconds for a request's line and headers; then the connection is closed",
        flag="--header-timeout",
        metavar="S",
        low=0,
        low_open=True,
        group=CONNECTIONS,
    )
    body_timeout_s: float = option(
        60.0,
        help="seconds for the whole request body; then 408",
        flag="--body-timeout",
        metavar="S",
        low=0,
        low_open=True,
        group=CONNECTIONS,
    )
    max_connections: int = option(
        256,
        help="open connections at once; more get 503",
        metavar="N",
        low=1,
        group=CONNECTIONS,
    )

    def __post_init__(self) -> None:
        check_options(self)


@dataclass(frozen=True)
class BatchingSettings:
    """Batching and the model queue."""

    max_batch_size: int = option(
        4,
        help="images encoded together in one encoder call",
        metavar="N",
        low=1,
        group=BATCHING,
    )
    max_wait_ms: float = option(
        10.0,
        help="how long an encode waits for others to batch with",
        metavar="MS",
        low=0,
        group=BATCHING,
    )
    max_queue: int = option(
        32,
        help="interactive model jobs (encodes, clicks) waiting before new ones get 503",
        metavar="N",
        low=1,
        group=BATCHING,
    )
    # Bulk jobs (AMG, video propagations) run only when no interactive job waits, and pause
    # between decoder batches (frames) for the clicks that arrive meanwhile.
    max_bulk_queue: int = option(
        8,
        help="AMG jobs waiting before new ones get 503; they yield to clicks between "
        "decoder batches",
        metavar="N",
        low=1,
        group=BATCHING,
    )
    max_bulk_jobs_per_client: int = option(
        2,
        help="AMG requests one client may have queued or running; more get 429",
        flag="--max-bulk-per-client",
        metavar="N",
        low=1,
        group=BATCHING,
    )

    def __post_init__(self) -> None:
        check_options(self)


@dataclass(frozen=True)
class CacheSettings:
    """The memory caches: embeddings and returned masks' logits."""

    cache_bytes: int = option(
        DEFAULT_CACHE_BYTES,
        help="embedding cache budget; one fp32 image is 16 MiB (0 disables)",
        flag="--cache-mib",
        metavar="MIB",
        scale=MiB,
        low=0,
        group=CACHES,
    )
    mask_cache_bytes: int = option(
        DEFAULT_MASK_CACHE_BYTES,
        help="budget for returned masks' low-res logits, 256 KiB "
        "each, for mask_id refinement (0 disables)",
        flag="--mask-cache-mib",
        metavar="MIB",
        scale=MiB,
        low=0,
        group=CACHES,
    )
    concept_cache_bytes: int = option(
        DEFAULT_CONCEPT_CACHE_BYTES,
        help="budget for SAM 3 image encodings (--concepts), ~225 MiB each, so more phrases "
        "on an image skip its encoder (0 disables)",
        flag="--concept-cache-mib",
        metavar="MIB",
        scale=MiB,
        low=0,
        group=CACHES,
    )

    def __post_init__(self) -> None:
        check_options(self)


@dataclass(frozen=True)
class StoreSettings:
    """The persistent embedding store behind the memory cache."""

    # The persistent embedding store behind the memory cache (a directory or an fsspec URI,
    # shared by replicas and filled ahead of time by 'sam2serve embed'): memory -> store ->
    # encode, every encode written through. None: no store.
    location: str | None = option(
        None,
        key="store",
        help="a persistent embedding store (a directory or an fsspec URI, e.g. "
        "file:///data/emb, s3://bucket/emb with s3fs) behind the memory cache: embeddings "
        "come from memory, then the store, then the encoder, and every encode is written to "
        "it; fill it ahead of time with 'sam2serve embed', share it between replicas",
        metavar="DIR",
        default_text="none",
        group=STORE,
    )
    # The precision entries are kept in: float32 (exact) or float16 (half the bytes).
    dtype: str = option(
        DEFAULT_STORE_DTYPE,
        key="store_dtype",
        help="precision of the store's entries; it must match the one 'embed' wrote",
        choices=STORE_DTYPES,
        group=STORE,
    )

    def __post_init__(self) -> None:
        check_options(self)
        if self.location is not None and not (
            isinstance(self.location, str) and self.location.strip()
        ):
            raise ValueError(
                f"store must be a directory or an fsspec URI (leave it unset for none), got "
                f"{self.location!r}"
            )
        if self.dtype not in STORE_DTYPES:
            raise ValueError(
                f"store_dtype must be one of {', '.join(STORE_DTYPES)}, got {self.dtype!r}"
            )


@dataclass(frozen=True)
class VideoSettings:
    """Video tracking sessions (/v1/videos; serve --video)."""

    # Load SAM 2's video model too (same size and weights as the image model) and serve
    # tracking sessions; off: the /v1/videos endpoints answer 404 "video_disabled".
    enabled: bool = option(
        False,
        key="video",
        help="also load SAM 2's video model (same size and weights) and serve tracking "
        "sessions at /v1/videos: upload a video, prompt objects, stream the propagation "
        "(off: images only)",
        group=VIDEO,
    )
    max_video_sessions: int = option(
        4, help="sessions held at once; one more gets 429", metavar="N", low=1, group=VIDEO
    )
    max_video_sessions_per_client: int = option(
        2,
        help="sessions one client (its address) may hold, so one client cannot take every "
        "session; more get 429",
        metavar="N",
        low=1,
        group=VIDEO,
    )
    max_video_frames: int = option(
        300, help="frames in one session's video (413 above)", metavar="N", low=1, group=VIDEO
    )
    max_video_upload_bytes: int = option(
        256 * MiB,
        help="largest video upload (a file, or all frame files together)",
        flag="--max-video-upload-mib",
        metavar="MIB",
        scale=MiB,
        low=1,
        group=VIDEO,
    )
    # Its decoded frames (uint8 RGB) plus what tracking every object through every frame
    # would keep (about 0.75 MiB per object and frame at 1024).
    max_video_session_bytes: int = option(
        2048 * MiB,
        help="memory one session may hold: decoded frames plus ~0.75 MiB per "
        "object and frame tracked (413 above)",
        flag="--max-video-session-mib",
        metavar="MIB",
        scale=MiB,
        low=1,
        group=VIDEO,
    )
    # Every session's frames and tracking together (each counted as its own limit counts
    # it); with it a process holds at most this much in sessions, whatever their number.
    max_video_total_bytes: int = option(
        4096 * MiB,
        help="memory all sessions together may hold (frames plus tracking, counted as "
        "--max-video-session-mib counts them); a session that does not fit gets 429",
        flag="--max-video-total-mib",
        metavar="MIB",
        scale=MiB,
        low=1,
        group=VIDEO,
    )
    max_video_objects: int = option(
        16, help="objects tracked in one session", metavar="N", low=1, group=VIDEO
    )
    video_idle_s: float = option(
        600.0,
        help="seconds a session may go untouched (prompted, propagated or edited) "
        "before it is closed",
        flag="--video-idle",
        metavar="S",
        low=0,
        low_open=True,
        group=VIDEO,
    )

    def __post_init__(self) -> None:
        check_options(self)

    @property
    def max_video_body_bytes(self) -> int:
        """Largest body that creates a video session: the upload plus 1 MiB of multipart
        framing (boundaries and part headers of up to max_video_frames frame parts)."""
        return self.max_video_upload_bytes + MiB


@dataclass(frozen=True)
class LiveSettings:
    """Live video sessions (POST /v1/videos/live, WebSocket /v1/videos/{id}/live)."""

    max_live_frame_bytes: int = option(
        8 * MiB,
        help="largest message on a live video connection (a frame: raw RGB or an image "
        "file); a larger one closes the connection (1009)",
        flag="--max-live-frame-mib",
        metavar="MIB",
        scale=MiB,
        low=1,
        group=LIVE,
    )
    live_frames_kept: int = option(
        8,
        help="newest frames a live session holds (a prompt may name one of them)",
        metavar="N",
        low=2,
        group=LIVE,
    )
    max_live_pending: int = option(
        4,
        help="frames and prompts a live connection may have sent and not yet had answered; "
        "one more is refused ('too_fast'), the connection stays",
        metavar="N",
        low=1,
        group=LIVE,
    )
    max_live_prompted_frames: int = option(
        16,
        help="frames per object a live session keeps prompts on (each a conditioning "
        "memory held for good); a prompt on one more frame is refused",
        metavar="N",
        low=1,
        group=LIVE,
    )

    def __post_init__(self) -> None:
        check_options(self)


@dataclass(frozen=True)
class ConceptSettings:
    """Concept prompts (POST /v1/concepts; serve --concepts): SAM 3 beside SAM 2.1."""

    # Load SAM 3 (--sam3-weights / --sam3-size; random with --random-weights) and answer
    # /v1/concepts; off: that endpoint answers 404 "concepts_disabled".
    enabled: bool = option(
        False,
        key="concepts",
        help="also load SAM 3 (--sam3-weights, or random with --random-weights) and answer "
        "POST /v1/concepts: every instance of a noun phrase or exemplar box (off: no concepts)",
        group=CONCEPTS,
    )
    max_concept_phrases: int = option(
        16,
        help="noun phrases per /v1/concepts request (each one detector pass on the image)",
        metavar="N",
        low=1,
        high=MAX_CONCEPT_PHRASES,
        group=CONCEPTS,
    )
    max_concept_boxes: int = option(
        16,
        help="exemplar boxes per /v1/concepts request",
        metavar="N",
        low=1,
        high=MAX_CONCEPT_BOXES,
        group=CONCEPTS,
    )
    max_concept_instances: int = option(
        100,
        help="instances one phrase may return (a request's max_instances may only lower it)",
        metavar="N",
        low=1,
        high=MAX_CONCEPT_INSTANCES,
        group=CONCEPTS,
    )
    # SAM 3 encodes images at 1008 px whatever their size, so a batch's working memory
    # grows with its count alone (bench/results/concept_encode_memory_cpu_zen4.md); this
    # bounds it as max_batch_size bounds SAM 2's, the pixels held in the decode budget.
    max_concept_batch_size: int = option(
        2,
        help="images encoded together in one SAM 3 encoder call (concurrent /v1/concepts "
        "requests for different images wait max_wait_ms for each other); each adds SAM 3's "
        "full working memory",
        metavar="N",
        low=1,
        high=MAX_CONCEPT_BATCH_SIZE,
        group=CONCEPTS,
    )

    def __post_init__(self) -> None:
        check_options(self)
