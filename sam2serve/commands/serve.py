"""``sam2serve serve``: the HTTP service (FastAPI + uvicorn), one model loaded at start.

Every flag sets the :class:`~sam2serve.server.settings.ServerSettings` setting of its
``dest`` (a flat name, routed to its group by ``ServerSettings.from_flat``); the flags of
the settings' groups are derived from their fields (sam2serve.options), so the settings
check every value and the error names the flag. The model flags are the shared ones of
every command (sam2serve.commands.common). The address is
tried before the model loads: a port in use costs no start-up time.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import os
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from sam2serve.commands import model as model_flags
from sam2serve.commands.common import (
    EXIT_OK,
    EXIT_STATUS_HELP,
    PROG,
    CommandParser,
    StartError,
    UsageError,
    add_backend_flag,
    add_command,
    add_device_flag,
    add_mode_flag,
    add_model_flag,
    add_threads_flag,
    add_weights_flags,
    flag_of,
    info_line,
    warning_line,
)
from sam2serve.commands.concepts_flags import add_concepts_flags, concepts_spec
from sam2serve.options import (
    OptionError,
    add_option_groups,
    argument_group,
    check_options,
    option,
)
from sam2serve.server.settings import (
    ACCESS,
    CONCEPTS,
    DEFAULT_API_KEY_ENV,
    RUNTIME,
    ServerSettings,
    flat_keys,
)
from sam2serve.store.location import StoreError, check_location

DEFAULTS = ServerSettings()
# Every setting's flat name (the flags' destinations), routed to its group by from_flat.
SETTINGS_FIELDS = tuple(flat_keys())
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")
LOG_LEVELS = ("critical", "error", "warning", "info", "debug")


@dataclass(frozen=True)
class Listen:
    """Where the process listens and how it logs: the command's, not the app's."""

    host: str = option(
        "127.0.0.1", help="address to listen on (127.0.0.1: this machine only)", group=ACCESS
    )
    port: int = option(8000, help="port", metavar="PORT", low=1, high=65535, group=ACCESS)
    api_key_env: str = option(
        DEFAULT_API_KEY_ENV,
        help="environment variable holding the API key; when it is set, /v1/* and /metrics "
        "need 'Authorization: Bearer KEY' or 'X-API-Key: KEY' (unset: no key needed)",
        metavar="VAR",
        group=ACCESS,
    )
    log_level: str = option("info", help="uvicorn log level", choices=LOG_LEVELS, group=ACCESS)

    def __post_init__(self) -> None:
        check_options(self)


DESCRIPTION = f"""\
Serve SAM 2.1 over HTTP (FastAPI + uvicorn): one model, loaded at start.

endpoints (API docs at /docs and /redoc, served offline; images as JSON base64 or a
multipart file part 'image'):
  POST /v1/embeddings  image -> {{image_id, width, height, model, cached}}; the embedding is
                       cached, so later prompts on the image skip the encoder
  POST /v1/segment     image or image_id + objects (points [{{x, y, label}}], box
                       [x0, y0, x1, y1], mask_id of a previous mask) -> masks with score,
                       bbox, area, as coco_rle | uncompressed_rle | png_base64 | polygon
  POST /v1/amg         image + AMG parameters -> every mask (the library's AMG records)
  POST /v1/concepts    image or image_id + noun phrases / exemplar boxes -> every instance
                       of each phrase (SAM 3; with --concepts)
  GET  /healthz        alive;  GET /readyz: model loaded and warm;  GET /metrics: Prometheus
  GET  /               the annotation page (click to segment, AMG, COCO / PNG export);
                       GET /v1/images lists the --images folder, /v1/images/file?name= reads one

concurrent encodes are batched (--max-batch-size, --max-wait-ms) on one model thread; when
--max-queue jobs are waiting, new requests get 503 with Retry-After. Client errors are 4xx
JSON {{"error": {{"code", "message"}}}}.

{EXIT_STATUS_HELP} (3: e.g. the port is in use)
"""

EPILOG = f"""\
examples:
  {PROG} serve --random-weights                       # smoke run on 127.0.0.1:8000
  {PROG} serve --model base_plus --checkpoint sam2.1_hiera_base_plus.pt --port 9000
  {DEFAULT_API_KEY_ENV}=secret {PROG} serve --host 0.0.0.0   # clients send the key
  {PROG} serve --random-weights --images photos/      # label photos/ at http://127.0.0.1:8000/
  {PROG} embed photos/ --store emb/ && {PROG} serve --images photos/ --store emb/

  curl -s -F image=@photo.jpg http://127.0.0.1:8000/v1/embeddings
"""


def register(subcommands: argparse._SubParsersAction) -> None:
    add_command(
        subcommands,
        "serve",
        help="HTTP service: embeddings, segment, AMG, metrics",
        description=DESCRIPTION,
        epilog=EPILOG,
        handler=serve_command,
        environment=True,
        add_arguments=add_serve_arguments,
    )


def add_serve_arguments(parser: CommandParser) -> None:
    """``serve``'s flags: the shared ones (:func:`add_arguments`, which ``labelstudio``
    reuses) and SAM 3's (--sam3-weights, --sam3-size) beside --concepts."""
    add_arguments(parser)
    add_concepts_flags(argument_group(parser, CONCEPTS))


def add_arguments(parser: CommandParser) -> None:
    """The shared model flags (sam2serve.commands.common, as every command's), then the
    fields of Listen and of ServerSettings' groups, each under its group's help title."""
    runtime = DEFAULTS.runtime
    model = argument_group(parser, RUNTIME)
    add_model_flag(model, runtime.model)
    add_mode_flag(model, runtime.mode, concepts=True)
    add_backend_flag(model)
    add_device_flag(model)
    add_threads_flag(model)
    add_weights_flags(model)
    add_option_groups(parser, Listen)
    add_option_groups(parser, ServerSettings)
    parser.set_defaults(flags=flag_of(parser))


def settings_from(args: argparse.Namespace) -> ServerSettings:
    """ServerSettings from the flags; a bad value is a usage error naming its flag."""
    values: dict[str, Any] = {
        name: getattr(args, name)
        for name in SETTINGS_FIELDS
        if hasattr(args, name) and getattr(args, name) is not None
    }
    values["api_key"] = os.environ.get(args.api_key_env) or None
    values["cors_origins"] = tuple(args.cors_origins)
    values["checkpoint"] = None if args.checkpoint is None else str(args.checkpoint)
    try:
        return ServerSettings.from_flat(**values)
    except ValueError as exc:
        raise UsageError(_named(exc, values, args)) from None


def listen_from(args: argparse.Namespace) -> Listen:
    """Listen from the flags; a bad value is a usage error naming its flag or variable."""
    try:
        return Listen(
            host=args.host, port=args.port, api_key_env=args.api_key_env, log_level=args.log_level
        )
    except OptionError as exc:
        raise UsageError(exc.for_flag(sources(args))) from None


def sources(args: argparse.Namespace) -> dict[str, tuple[str, str]]:
    """The values the environment gave, {dest: (variable, text)} (sam2serve.options)."""
    return getattr(args, "env_sources", {})


def _named(exc: ValueError, values: dict[str, Any], args: argparse.Namespace) -> str:
    """The message, prefixed with the flag (or variable) of the one value that fails on
    its own (a limit's own check names its flag already)."""
    if isinstance(exc, OptionError):
        return exc.for_flag(sources(args))
    flags = {**args.flags, "api_key": f"${args.api_key_env}"}
    flags.update(
        {dest: f"${variable}={text!r}" for dest, (variable, text) in sources(args).items()}
    )
    for name, value in values.items():
        try:
            ServerSettings.from_flat(**{name: value})
        except ValueError:
            return f"{flags.get(name, name)}: {exc}"
    return str(exc)


def check_address(host: str, port: int) -> None:
    """Bind the address once, before the model loads: a port in use is found in ms."""
    if not 0 < port < 65536:
        raise UsageError(f"--port must be in 1..65535, got {port}")
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
    except socket.gaierror as exc:
        raise UsageError(
            f"--host {host!r} is not an address of this machine: {exc.strerror}"
        ) from None
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn does
        try:
            probe.bind(address)
        except OSError as exc:
            raise StartError(_bind_message(host, port, exc)) from None


def _bind_message(host: str, port: int, exc: OSError) -> str:
    where = f"{host}:{port}"
    if exc.errno == errno.EADDRINUSE:
        return f"cannot listen on {where}: the port is in use (another server?); choose another with --port"
    if exc.errno == errno.EACCES:
        return f"cannot listen on {where}: permission denied (ports below 1024 need privileges)"
    if exc.errno == errno.EADDRNOTAVAIL:
        return f"cannot listen on {where}: --host {host!r} is not an address of this machine"
    return f"cannot listen on {where}: {exc.strerror or exc}"


def source_of(args: argparse.Namespace, dest: str) -> str:
    """Where a value came from, as errors name it: its flag (``--store``), or the variable
    that gave it (``$SAM2SERVE_STORE``)."""
    source = sources(args).get(dest)
    if source is not None:
        return f"${source[0]}"
    return getattr(args, "flags", {}).get(dest) or "--" + dest.replace("_", "-")


def store_source(args: argparse.Namespace) -> str:
    return source_of(args, "store")


@contextlib.contextmanager
def store_errors_as_usage(source: str = "--store") -> Iterator[None]:
    """A store that cannot be opened or used is a usage error naming its source."""
    try:
        yield
    except StoreError as exc:
        raise UsageError(f"{source}: {exc}") from None


def check_store(settings: ServerSettings, source: str = "--store") -> None:
    """The store location opens (before the model loads); an error names ``source``."""
    if settings.store.location is not None:
        with store_errors_as_usage(source):
            check_location(settings.store.location)


def check_concepts_flags(args: argparse.Namespace, settings: ServerSettings) -> None:
    """SAM 3's flags mean something only with --concepts."""
    if not settings.concepts.enabled and getattr(args, "sam3_weights", None):
        raise UsageError(
            f"{source_of(args, 'sam3_weights')} needs --concepts (SAM 3 is loaded only with it)"
        )


def load_concepts_flags(args: argparse.Namespace, settings: ServerSettings, device: str, mode: str):
    """SAM 3 as --sam3-weights / --sam3-size / --random-weights choose it, in ``mode`` (the
    --mode of SAM 2.1: :mod:`sam2serve.runtime.concepts`) (with --concepts; else None);
    missing or wrong weights are one usage-error line."""
    if not settings.concepts.enabled:
        return None
    import pickle

    from sam2serve.runtime.concepts import describe_concepts_mode, load_concepts_in_mode

    concepts = concepts_spec(args, device)
    try:
        loaded = load_concepts_in_mode(concepts, mode)
        info_line(describe_concepts_mode(mode, loaded))
        return loaded
    # WeightsError (missing: how to download), CheckpointMismatch (not SAM 3's keys), a
    # file torch cannot read: one line each.
    except (OSError, ValueError, RuntimeError, pickle.UnpicklingError) as exc:
        raise UsageError(f"--concepts: {exc}") from None


def serve_command(args: argparse.Namespace) -> int:
    spec = model_flags.runtime_spec(args)
    settings = settings_from(args)
    listen_from(args)
    check_concepts_flags(args, settings)
    check_store(settings, store_source(args))
    check_address(args.host, args.port)
    if args.host not in LOOPBACK_HOSTS and settings.access.api_key is None:
        warning_line(
            f"listening on {args.host} without an API key: anyone who can reach it can use it "
            f"(set ${args.api_key_env} to require one)"
        )
    model_flags.check_device(spec.device)
    # 'device' where it cannot run is exit 2 before the model loads (the service makes and
    # tests its decoder when it starts).
    model_flags.check_image_decode(settings.runtime.image_decode, spec.device, decode=False)

    import uvicorn

    from sam2serve.runtime.process import configure_process
    from sam2serve.server.app import create_app
    from sam2serve.server.http_server import uvicorn_config, where_to_connect

    configure_process(spec)  # once, before the app builds its predictors
    concepts = load_concepts_flags(args, settings, spec.device, spec.mode)
    loading = model_flags.load_errors_as_usage(settings.runtime.checkpoint, settings.runtime.model)
    with loading, store_errors_as_usage(store_source(args)):
        app = create_app(settings, concepts=concepts)
    info = app.state.service.predictor.model.weights_info
    if info.is_random:
        warning_line(f"serving {info.describe()}")
    if concepts is not None and concepts.spec.random_weights:
        warning_line(
            "SAM 3 has random weights (scores about 0.25): a concept request without "
            "score_thresh keeps every instance (0, not Meta's 0.5)"
        )
    video = " and video sessions at /v1/videos" if settings.video.enabled else ""
    video += " and concept prompts at /v1/concepts" if concepts is not None else ""
    info_line(
        f"serving {spec.model} ({spec.label}, {spec.device}) on "
        f"{where_to_connect(args.host, args.port, settings.access.allowed_hosts)} - annotation page at /, API docs at "
        f"/docs{video}"
    )
    config = uvicorn_config(app, settings, args.host, args.port, log_level=args.log_level)
    server = uvicorn.Server(config)
    try:
        server.run()
    except KeyboardInterrupt:  # uvicorn re-raises the SIGINT it drained for (as uvicorn.run)
        pass
    except SystemExit:  # uvicorn exits when it cannot bind (it has logged why)
        pass
    if not server.started:
        raise StartError(f"the server did not start on {args.host}:{args.port} (see above)")
    return EXIT_OK
