"""``sam2serve loadtest``: concurrent clients against a running server on this machine."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path

from sam2serve.commands.common import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_STATUS_HELP,
    PROG,
    SAMPLES_ARG,
    CommandParser,
    UsageError,
    add_command,
    command_line,
    info_line,
    positive_int,
)
from sam2serve.config_text import http_url
from sam2serve.options import add_options, option_values
from sam2serve.server.settings import DEFAULT_API_KEY_ENV

DESCRIPTION = f"""\
Load-test a running server on this machine (loopback addresses only).

Uploads every image once to /v1/embeddings (concurrently, so the server can batch them),
then CONCURRENCY clients send /v1/segment requests by image_id (random clicks and boxes)
mixed with re-uploads to /v1/embeddings, until REQUESTS requests are sent or DURATION
seconds have passed. Prints per endpoint: counts by status class, client latency
p50/p90/p99 and the server's queue time p50/p90/p99 (from each answer's queue_ms).

{EXIT_STATUS_HELP} (1: a request got a 5xx or no answer)
"""


def register(subcommands: argparse._SubParsersAction) -> None:
    add_command(
        subcommands,
        "loadtest",
        help="concurrent clients against a running server (loopback only)",
        description=DESCRIPTION,
        handler=loadtest_command,
        add_arguments=add_arguments,
    )


def add_arguments(parser: CommandParser) -> None:
    from sam2serve.server import loadtest as lt

    parser.add_argument(
        "--url",
        required=True,
        type=http_url,
        help="the server, e.g. http://127.0.0.1:8000 (loopback addresses only)",
    )
    parser.add_argument(
        "--images",
        nargs="+",
        default=[SAMPLES_ARG],
        metavar="IMAGE",
        help=f"image files, or '{SAMPLES_ARG}' for the bundled photos (default: {SAMPLES_ARG})",
    )
    parser.add_argument(
        "--max-side",
        type=positive_int,
        default=512,
        metavar="PX",
        help="downscale the bundled samples to this longer side (default: "
        "%(default)s; files are sent as they are)",
    )
    add_options(parser, lt.LoadtestConfig)
    parser.add_argument(
        "--api-key-env",
        default=DEFAULT_API_KEY_ENV,
        metavar="VAR",
        help="environment variable holding the server's API key, if it has "
        "one (default: %(default)s)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        metavar="FILE.md",
        help="also write the result as Markdown (command, machine, date, table)",
    )
    parser.add_argument(
        "--csv", type=Path, metavar="FILE.csv", help="also write the per-endpoint summary as CSV"
    )


def loadtest_command(args: argparse.Namespace) -> int:
    from sam2serve.server import loadtest as lt

    try:
        images = lt.load_test_images(args.images, args.max_side)
        config = lt.LoadtestConfig(
            url=lt.check_loopback_url(args.url),
            images=images,
            api_key=os.environ.get(args.api_key_env) or None,
            **option_values(args, lt.LoadtestConfig),
        )
        info_line(
            f"loadtest: {config.requests} requests, {config.concurrency} clients, "
            f"{len(images)} images against {config.url}"
        )
        result = asyncio.run(lt.run_loadtest(config))
    except lt.LoadtestError as exc:
        raise UsageError(str(exc)) from None
    print(lt.format_table(result))
    if result.stopped_by_time:
        info_line(f"loadtest: stopped after --duration {config.duration_s:g} s")
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(lt.format_markdown(result, command_line(args)), encoding="utf-8")
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
