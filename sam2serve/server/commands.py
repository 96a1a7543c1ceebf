"""``sam2serve serve`` and ``sam2serve loadtest``: argparse subcommands and their handlers.

``add_commands(subparsers)`` registers both on the main CLI's subparsers; each sets
``handler`` to a function taking the parsed arguments and returning the exit status.
Nothing heavy (torch, FastAPI) is imported until a handler runs, so ``sam2serve --help``
stays fast. ``python -m sam2serve.server.commands serve ...`` runs them on their own.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

from sam2serve.config import MODEL_SIZES
from sam2serve.server.settings import DEFAULT_API_KEY_ENV, MiB, ServerSettings

PROG = "sam2serve"
EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
DEFAULTS = ServerSettings()
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")


class _HelpFormatter(argparse.RawDescriptionHelpFormatter):
    def __init__(self, prog: str) -> None:
        super().__init__(prog, max_help_position=36, width=100)


SERVE_DESCRIPTION = """\
Serve SAM 2.1 over HTTP (FastAPI + uvicorn): one model, loaded at start.

endpoints (OpenAPI at /docs; images as JSON base64 or a multipart file part 'image'):
  POST /v1/embeddings  image -> {image_id, width, height, model, cached}; the embedding is
                       cached, so later prompts on the image skip the encoder
  POST /v1/segment     image or image_id + objects (points [{x, y, label}], box
                       [x0, y0, x1, y1], mask_id of a previous mask) -> masks with score,
                       bbox, area, as coco_rle | uncompressed_rle | png_base64 | polygon
  POST /v1/amg         image + AMG parameters -> every mask (the library's AMG records)
  GET  /healthz        alive;  GET /readyz: model loaded and warm;  GET /metrics: Prometheus

concurrent encodes are batched (--max-batch-size, --max-wait-ms) on one model thread; when
--max-queue jobs are waiting, new requests get 503 with Retry-After. Client errors are 4xx
JSON {"error": {"code", "message"}}.
"""

SERVE_EPILOG = f"""\
examples:
  {PROG} serve --random-weights                       # smoke run on 127.0.0.1:8000
  {PROG} serve --model base_plus --checkpoint sam2.1_hiera_base_plus.pt --port 9000
  {DEFAULT_API_KEY_ENV}=secret {PROG} serve --host 0.0.0.0   # clients send the key

  curl -s -F image=@photo.jpg http://127.0.0.1:8000/v1/embeddings
"""

LOADTEST_DESCRIPTION = """\
Load-test a running server on this machine (loopback addresses only).

Uploads every image once to /v1/embeddings (concurrently, so the server can batch them),
then CONCURRENCY clients send /v1/segment requests by image_id (random clicks and boxes)
mixed with re-uploads to /v1/embeddings, until REQUESTS requests are sent or DURATION
seconds have passed. Prints per endpoint: counts by status class, client latency
p50/p90/p99 and the server's queue time p50/p90/p99 (from each answer's queue_ms).
Exit status 1 if any request got a 5xx or no answer.
"""


def _mib(value: str) -> int:
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of MiB, got {value!r}") from None
    if number < 0:
        raise argparse.ArgumentTypeError(f"expected a number of MiB >= 0, got {value!r}")
    return int(number * MiB)


def add_commands(subparsers: argparse._SubParsersAction) -> None:
    """Register ``serve`` and ``loadtest`` on the main parser's subcommands."""
    _add_serve(subparsers)
    _add_loadtest(subparsers)


def _add_serve(subparsers: argparse._SubParsersAction) -> None:
    from sam2serve.accel.modes import MODES

    d = DEFAULTS
    serve = subparsers.add_parser(
        "serve",
        help="HTTP service: embeddings, segment, AMG, metrics",
        description=SERVE_DESCRIPTION,
        epilog=SERVE_EPILOG,
        formatter_class=_HelpFormatter,
    )
    serve.set_defaults(handler=serve_command)
    model = serve.add_argument_group("model")
    model.add_argument(
        "--model", choices=MODEL_SIZES, default=d.model, help="model size (default: %(default)s)"
    )
    model.add_argument(
        "--mode",
        choices=tuple(MODES),
        default=d.mode,
        help="execution mode from sam2serve.accel.modes (default: %(default)s)",
    )
    weights = model.add_mutually_exclusive_group()
    weights.add_argument(
        "--checkpoint",
        metavar="PATH",
        help="official checkpoint file (.pt) for --model (default: Meta's "
        "file name in $SAM2SERVE_CACHE or ~/.cache/sam2serve/checkpoints)",
    )
    weights.add_argument(
        "--random-weights",
        action="store_true",
        help="seeded random weights instead of a checkpoint: for smoke and "
        "load tests only, masks are meaningless",
    )
    weights.add_argument(
        "--artifacts",
        metavar="DIR",
        help="start from 'sam2serve export' artifacts (weights included, no compilation); "
        "--model and --mode must match their manifest",
    )
    model.add_argument(
        "--seed",
        type=int,
        default=d.seed,
        metavar="N",
        help="seed of --random-weights (default: %(default)s)",
    )
    model.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        default=d.device,
        help="where the model runs (default: %(default)s)",
    )
    model.add_argument(
        "--no-warmup",
        dest="warmup",
        action="store_false",
        help="report ready at once instead of after one warm-up encode + decode",
    )

    net = serve.add_argument_group("network and access")
    net.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to listen on (default: %(default)s, this machine only)",
    )
    net.add_argument("--port", type=int, default=8000, help="port (default: %(default)s)")
    net.add_argument(
        "--api-key-env",
        default=DEFAULT_API_KEY_ENV,
        metavar="VAR",
        help="environment variable holding the API key; when it is set, /v1/* "
        "and /metrics need 'Authorization: Bearer KEY' or 'X-API-Key: KEY' "
        "(default: %(default)s; unset: no key needed)",
    )
    net.add_argument(
        "--cors-origin",
        action="append",
        default=[],
        metavar="ORIGIN",
        help="allow browser requests from ORIGIN (repeatable; default: none, CORS off)",
    )
    net.add_argument(
        "--log-level",
        default="info",
        choices=("critical", "error", "warning", "info", "debug"),
        help="uvicorn log level (default: %(default)s)",
    )

    limits = serve.add_argument_group("limits")
    limits.add_argument(
        "--max-upload-mib",
        type=_mib,
        default=d.max_upload_bytes,
        metavar="MIB",
        help=f"largest image file (413 above; default: {d.max_upload_bytes / MiB:g})",
    )
    limits.add_argument(
        "--max-pixels",
        type=int,
        default=d.max_pixels,
        metavar="N",
        help="largest image in width*height, checked before decoding (413 "
        "above; default: %(default)s)",
    )
    limits.add_argument(
        "--max-objects",
        type=int,
        default=d.max_objects,
        metavar="N",
        help="objects (prompt groups) per /v1/segment request (default: %(default)s)",
    )
    limits.add_argument(
        "--max-points-per-object",
        type=int,
        default=d.max_points_per_object,
        metavar="N",
        help="clicks per object (default: %(default)s)",
    )
    limits.add_argument(
        "--max-amg-points",
        type=int,
        default=d.max_amg_points,
        metavar="N",
        help="clicks one /v1/amg request may decode over all crops "
        "(default: %(default)s, e.g. points_per_side 64)",
    )
    limits.add_argument(
        "--request-timeout",
        type=float,
        default=d.request_timeout_s,
        metavar="S",
        help="seconds a request may take, queueing included; "
        "then 503 with Retry-After (default: %(default)s)",
    )

    limits.add_argument(
        "--max-amg-crops",
        type=int,
        default=d.max_amg_crops,
        metavar="N",
        help="crops one /v1/amg request may encode (default: %(default)s, crop_n_layers 2)",
    )
    limits.add_argument(
        "--max-json-items",
        type=int,
        default=d.max_json_items,
        metavar="N",
        help="JSON arrays, objects and separators in one body, counted before parsing "
        "(413 above; default: %(default)s)",
    )
    connections = serve.add_argument_group("connections and slow clients")
    connections.add_argument(
        "--header-timeout",
        type=float,
        default=d.header_timeout_s,
        metavar="S",
        help="seconds for a request's line and headers; then the connection is closed "
        "(default: %(default)s)",
    )
    connections.add_argument(
        "--body-timeout",
        type=float,
        default=d.body_timeout_s,
        metavar="S",
        help="seconds for the whole request body; then 408 (default: %(default)s)",
    )
    connections.add_argument(
        "--max-connections",
        type=int,
        default=d.max_connections,
        metavar="N",
        help="open connections at once; more get 503 (default: %(default)s)",
    )

    batching = serve.add_argument_group("batching and queue")
    batching.add_argument(
        "--max-batch-size",
        type=int,
        default=d.max_batch_size,
        metavar="N",
        help="images encoded together in one encoder call (default: %(default)s)",
    )
    batching.add_argument(
        "--max-wait-ms",
        type=float,
        default=d.max_wait_ms,
        metavar="MS",
        help="how long an encode waits for others to batch with (default: %(default)s)",
    )
    batching.add_argument(
        "--max-queue",
        type=int,
        default=d.max_queue,
        metavar="N",
        help="interactive model jobs (encodes, clicks) waiting before new ones get 503 "
        "(default: %(default)s)",
    )
    batching.add_argument(
        "--max-bulk-queue",
        type=int,
        default=d.max_bulk_queue,
        metavar="N",
        help="AMG jobs waiting before new ones get 503; they yield to clicks between "
        "decoder batches (default: %(default)s)",
    )
    batching.add_argument(
        "--max-bulk-per-client",
        type=int,
        default=d.max_bulk_jobs_per_client,
        metavar="N",
        help="AMG requests one client address may have queued or running; more get 429 "
        "(default: %(default)s)",
    )

    caches = serve.add_argument_group("caches")
    caches.add_argument(
        "--cache-mib",
        type=_mib,
        default=d.cache_bytes,
        metavar="MIB",
        help=f"embedding cache budget; one fp32 image is 16 MiB (default: {d.cache_bytes / MiB:g})",
    )
    caches.add_argument(
        "--mask-cache-mib",
        type=_mib,
        default=d.mask_cache_bytes,
        metavar="MIB",
        help="budget for returned masks' low-res logits, "
        f"256 KiB each, for mask_id refinement (default: "
        f"{d.mask_cache_bytes / MiB:g})",
    )


def _add_loadtest(subparsers: argparse._SubParsersAction) -> None:
    from sam2serve.server import loadtest as lt

    test = subparsers.add_parser(
        "loadtest",
        help="concurrent clients against a running server (loopback only)",
        description=LOADTEST_DESCRIPTION,
        formatter_class=_HelpFormatter,
    )
    test.set_defaults(handler=loadtest_command)
    test.add_argument(
        "--url",
        required=True,
        help="the server, e.g. http://127.0.0.1:8000 (loopback addresses only)",
    )
    test.add_argument(
        "--images",
        nargs="+",
        default=["samples"],
        metavar="IMAGE",
        help="image files, or 'samples' for the bundled photos (default: samples)",
    )
    test.add_argument(
        "--max-side",
        type=int,
        default=512,
        metavar="PX",
        help="downscale the bundled samples to this longer side (default: "
        "%(default)s; files are sent as they are)",
    )
    test.add_argument(
        "--requests",
        type=int,
        default=300,
        metavar="N",
        help=f"requests in all, uploads included (default: %(default)s, at most {lt.MAX_REQUESTS})",
    )
    test.add_argument(
        "--concurrency",
        type=int,
        default=4,
        metavar="C",
        help="concurrent clients (default: %(default)s)",
    )
    test.add_argument(
        "--duration",
        type=float,
        default=600.0,
        metavar="S",
        help=f"stop sending after this many seconds (default: %(default)s, at "
        f"most {lt.MAX_DURATION_S:g})",
    )
    test.add_argument(
        "--embeddings-fraction",
        type=float,
        default=0.1,
        metavar="F",
        help="share of requests that re-upload an image to /v1/embeddings (default: %(default)s)",
    )
    test.add_argument(
        "--max-objects",
        type=int,
        default=3,
        metavar="N",
        help="objects per /v1/segment request, 1 to N (default: %(default)s)",
    )
    test.add_argument(
        "--max-points",
        type=int,
        default=3,
        metavar="N",
        help="clicks per object, 1 to N (default: %(default)s)",
    )
    test.add_argument(
        "--mask-format",
        default="coco_rle",
        choices=("coco_rle", "uncompressed_rle", "png_base64", "polygon"),
        help="mask_format of the segment requests (default: %(default)s)",
    )
    test.add_argument("--seed", type=int, default=0, help="seed of the workload (default: 0)")
    test.add_argument(
        "--timeout",
        type=float,
        default=300.0,
        metavar="S",
        help="client timeout per request (default: %(default)s)",
    )
    test.add_argument(
        "--api-key-env",
        default=DEFAULT_API_KEY_ENV,
        metavar="VAR",
        help="environment variable holding the server's API key, if it has "
        "one (default: %(default)s)",
    )
    test.add_argument(
        "--out",
        type=Path,
        metavar="FILE.md",
        help="also write the result as Markdown (command, machine, date, table)",
    )
    test.add_argument(
        "--csv", type=Path, metavar="FILE.csv", help="also write the per-endpoint summary as CSV"
    )


def _error(message: str) -> int:
    print(f"{PROG}: error: {message}", file=sys.stderr)
    return EXIT_USAGE


def settings_from(args: argparse.Namespace) -> ServerSettings:
    api_key = os.environ.get(args.api_key_env) or None
    return ServerSettings(
        model=args.model,
        mode=args.mode,
        checkpoint=args.checkpoint,
        random_weights=args.random_weights,
        artifacts=args.artifacts,
        seed=args.seed,
        device=args.device,
        max_upload_bytes=args.max_upload_mib,
        max_pixels=args.max_pixels,
        max_objects=args.max_objects,
        max_points_per_object=args.max_points_per_object,
        max_amg_points=args.max_amg_points,
        max_amg_crops=args.max_amg_crops,
        max_json_items=args.max_json_items,
        header_timeout_s=args.header_timeout,
        body_timeout_s=args.body_timeout,
        max_connections=args.max_connections,
        max_bulk_queue=args.max_bulk_queue,
        max_bulk_jobs_per_client=args.max_bulk_per_client,
        request_timeout_s=args.request_timeout,
        max_batch_size=args.max_batch_size,
        max_wait_ms=args.max_wait_ms,
        max_queue=args.max_queue,
        cache_bytes=args.cache_mib,
        mask_cache_bytes=args.mask_cache_mib,
        api_key=api_key,
        cors_origins=tuple(args.cors_origin),
        warmup=args.warmup,
    )


# The flag that sets each ServerSettings field, to name it in errors.
FLAG_OF_SETTING = {
    "max_upload_bytes": "--max-upload-mib",
    "max_pixels": "--max-pixels",
    "max_objects": "--max-objects",
    "max_points_per_object": "--max-points-per-object",
    "max_amg_points": "--max-amg-points",
    "max_amg_crops": "--max-amg-crops",
    "max_json_items": "--max-json-items",
    "header_timeout_s": "--header-timeout",
    "body_timeout_s": "--body-timeout",
    "max_connections": "--max-connections",
    "max_bulk_queue": "--max-bulk-queue",
    "max_bulk_jobs_per_client": "--max-bulk-per-client",
    "request_timeout_s": "--request-timeout",
    "max_batch_size": "--max-batch-size",
    "max_wait_ms": "--max-wait-ms",
    "max_queue": "--max-queue",
    "cache_bytes": "--cache-mib",
    "mask_cache_bytes": "--mask-cache-mib",
    "api_key": "the API key variable",
}


def serve_command(args: argparse.Namespace) -> int:
    try:
        settings = settings_from(args)
    except ValueError as exc:
        message = str(exc)
        flag = FLAG_OF_SETTING.get(message.split(" ", 1)[0])
        return _error(f"{flag}: {message}" if flag else message)
    if not 0 < args.port < 65536:
        return _error(f"--port must be in 1..65535, got {args.port}")
    if args.host not in LOOPBACK_HOSTS and settings.api_key is None:
        print(
            f"{PROG}: warning: listening on {args.host} without an API key: anyone who can "
            f"reach it can use it (set ${args.api_key_env} to require one)",
            file=sys.stderr,
        )

    import uvicorn

    from sam2serve.accel.export import ArtifactError
    from sam2serve.checkpoint import CheckpointError
    from sam2serve.server.app import create_app
    from sam2serve.server.http_server import uvicorn_config

    try:
        app = create_app(settings)
    except (CheckpointError, ArtifactError) as exc:
        return _error(str(exc))
    info = app.state.service.predictor.model.weights_info
    if info.is_random:
        print(f"{PROG}: warning: serving {info.describe()}", file=sys.stderr)
    print(
        f"{PROG}: serving {settings.model} ({settings.mode}, {settings.device}) on "
        f"http://{args.host}:{args.port} - API docs at /docs",
        file=sys.stderr,
    )
    config = uvicorn_config(app, settings, args.host, args.port, log_level=args.log_level)
    server = uvicorn.Server(config)
    try:
        server.run()
    except KeyboardInterrupt:  # uvicorn re-raises the SIGINT it drained for (as uvicorn.run)
        pass
    if not server.started:  # e.g. the port is in use; uvicorn has said why
        return EXIT_FAILED
    return EXIT_OK


def loadtest_command(args: argparse.Namespace) -> int:
    from sam2serve.server import loadtest as lt

    try:
        images = lt.load_test_images(args.images, args.max_side)
        config = lt.LoadtestConfig(
            url=lt.check_loopback_url(args.url),
            images=images,
            requests=args.requests,
            concurrency=args.concurrency,
            duration_s=args.duration,
            seed=args.seed,
            embeddings_fraction=args.embeddings_fraction,
            max_objects=args.max_objects,
            max_points=args.max_points,
            mask_format=args.mask_format,
            request_timeout_s=args.timeout,
            api_key=os.environ.get(args.api_key_env) or None,
        )
        print(
            f"{PROG}: loadtest: {config.requests} requests, {config.concurrency} clients, "
            f"{len(images)} images against {config.url}",
            file=sys.stderr,
        )
        result = asyncio.run(lt.run_loadtest(config))
    except lt.LoadtestError as exc:
        return _error(str(exc))
    print(lt.format_table(result))
    if result.stopped_by_time:
        print(f"{PROG}: loadtest: stopped after --duration {args.duration:g} s", file=sys.stderr)
    argv = getattr(args, "argv", None) or sys.argv[1:]
    command = " ".join([PROG, *map(shlex.quote, argv)])
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(lt.format_markdown(result, command), encoding="utf-8")
    if args.csv is not None:
        args.csv.parent.mkdir(parents=True, exist_ok=True)
        lt.write_csv(result, args.csv)
    if result.server_errors:
        print(
            f"{PROG}: loadtest: {result.server_errors} request(s) got a 5xx or no answer",
            file=sys.stderr,
        )
        return EXIT_FAILED
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m sam2serve.server.commands serve|loadtest ...`` (before cli.py wires it)."""
    parser = argparse.ArgumentParser(prog=PROG, formatter_class=_HelpFormatter)
    add_commands(parser.add_subparsers(dest="command", metavar="COMMAND", required=True))
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    args.argv = argv
    return args.handler(args)


if __name__ == "__main__":
    sys.exit(main())
