"""``sam2serve labelstudio``: the service, plus the endpoints of a Label Studio ML backend.

It takes every flag of ``sam2serve serve`` (model, limits, caches: the same
ServerSettings, checked the same way) and the Label Studio ones: where Label Studio's
files are, the token that reads them, the local folders a task may name, and what
pre-annotation does. Flags are checked, and the port tried, before the model loads.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from sam2serve.commands import model as model_flags
from sam2serve.commands import serve
from sam2serve.commands.common import (
    EXIT_OK,
    EXIT_STATUS_HELP,
    PROG,
    CommandParser,
    StartError,
    UsageError,
    add_command,
    described,
    flag_of,
    info_line,
    warning_line,
)
from sam2serve.labelstudio.options import (
    DEFAULT_KEY_ENV,
    DEFAULT_PREANNOTATE,
    DEFAULT_URL_ENV,
    PREANNOTATE_MODES,
    LabelStudioOptions,
)

DEFAULT_PORT = 9090  # Label Studio's ML backends' usual port

DESCRIPTION = f"""\
A Label Studio ML backend: Label Studio sends the annotator's clicks (KeyPointLabels,
Alt-click for a negative one) and boxes (RectangleLabels) and gets the mask back as a
BrushLabels region with the model's score; "Retrieve predictions" pre-annotates tasks.

endpoints Label Studio calls (the service's own, /v1/* and the annotation page at /, are
served too):
  GET  /health     up, with the model version;  GET /versions
  POST /setup      a project connects: its labelling config, address and token
  POST /predict    tasks (+ the annotator's clicks and box) -> brush masks
  POST /webhook    acknowledged (training is not supported)

connect it in Label Studio: project Settings > Model > Connect Model, URL
http://HOST:PORT, "Interactive preannotations" on. The labelling config needs an Image, a
BrushLabels on it, and KeyPointLabels / RectangleLabels with smart="true"
(docs/labelling.md, "Label Studio").

pre-annotation (--preannotate), for tasks Label Studio asks about without a click:
{described(PREANNOTATE_MODES)}

{EXIT_STATUS_HELP} (3: e.g. the port is in use)
"""

EPILOG = f"""\
examples:
  {PROG} labelstudio --random-weights                    # smoke run on 127.0.0.1:{DEFAULT_PORT}
  {DEFAULT_URL_ENV}=http://localhost:8080 {DEFAULT_KEY_ENV}=TOKEN \\
    {PROG} labelstudio --model large --checkpoint sam2.1_hiera_large.pt
  {PROG} labelstudio --local-root /srv/photos --preannotate none
  {PROG} labelstudio --allow-fetch-host images.lan:8081 --allow-fetch-host 10.0.0.0/8

task images are fetched from --label-studio-url's host, --allow-fetch-host hosts, and
(unless --no-public-fetch) public addresses on ports 80 and 443; loopback, private and
link-local addresses only when allowed (docs/labelling.md, "Where task images may be
fetched from"). /setup cannot change where the token goes.
"""


def register(subcommands: argparse._SubParsersAction) -> None:
    add_command(
        subcommands,
        "labelstudio",
        help="Label Studio ML backend: clicks and boxes -> brush masks",
        description=DESCRIPTION,
        epilog=EPILOG,
        handler=labelstudio_command,
        add_arguments=add_arguments,
    )


def add_arguments(parser: CommandParser) -> None:
    serve.add_arguments(parser)
    parser.set_defaults(port=DEFAULT_PORT)
    group = parser.add_argument_group("Label Studio")
    group.add_argument(
        "--label-studio-url",
        default=None,
        metavar="URL",
        help=f"Label Studio's address, for the images of tasks given as its paths "
        f"(/data/upload/...); images may be fetched from its host (default: "
        f"${DEFAULT_URL_ENV}, else the address Label Studio sends when it connects, if "
        "--allow-fetch-host allows it)",
    )
    group.add_argument(
        "--label-studio-key-env",
        default=DEFAULT_KEY_ENV,
        metavar="VAR",
        help="environment variable holding a Label Studio token (legacy API token or "
        "personal access token) that reads those images, sent to --label-studio-url only "
        "(default: %(default)s; unset: the project owner's token Label Studio sends when it "
        "connects, sent to its own address only)",
    )
    group.add_argument(
        "--allow-fetch-host",
        dest="allow_fetch_hosts",
        action="append",
        default=[],
        metavar="HOST",
        help="a host task images may be fetched from whatever it resolves to (HOST or "
        "HOST:PORT), or an address or network (IP, [IPv6]:PORT, CIDR such as 10.0.0.0/8): "
        "how loopback, private and link-local addresses and other ports than 80 and 443 are "
        "allowed (repeatable; default: none)",
    )
    group.add_argument(
        "--no-public-fetch",
        dest="public_fetch",
        action="store_false",
        help="fetch task images only from --label-studio-url and --allow-fetch-host hosts "
        "(default: also from hosts whose addresses are all public, on ports 80 and 443)",
    )
    group.add_argument(
        "--local-root",
        dest="local_roots",
        action="append",
        default=[],
        metavar="DIR",
        help="a folder whose files tasks may name by local path (repeatable; default: none, "
        "local paths are refused)",
    )
    group.add_argument(
        "--preannotate",
        choices=tuple(PREANNOTATE_MODES),
        default=DEFAULT_PREANNOTATE,
        help="what a task gets when Label Studio asks without a click (see above; default: "
        "%(default)s)",
    )
    group.add_argument(
        "--fetch-timeout",
        dest="fetch_timeout_s",
        type=float,
        default=LabelStudioOptions().fetch_timeout_s,
        metavar="S",
        help="seconds one image download may take in all, redirects and a slow server "
        "included (default: %(default)g)",
    )
    parser.set_defaults(flags=flag_of(parser))


def options_from(args: argparse.Namespace) -> LabelStudioOptions:
    """LabelStudioOptions from the flags and environment; a bad value names its source."""
    url_flag = "--label-studio-url" if args.label_studio_url else f"${DEFAULT_URL_ENV}"
    values: dict[str, Any] = {
        "url": args.label_studio_url or os.environ.get(DEFAULT_URL_ENV) or None,
        "api_key": os.environ.get(args.label_studio_key_env) or None,
        "local_roots": tuple(args.local_roots),
        "allow_fetch_hosts": tuple(args.allow_fetch_hosts),
        "public_fetch": args.public_fetch,
        "preannotate": args.preannotate,
        "fetch_timeout_s": args.fetch_timeout_s,
    }
    sources = {
        "url": url_flag,
        "api_key": f"${args.label_studio_key_env}",
        "local_roots": "--local-root",
        "allow_fetch_hosts": "--allow-fetch-host",
        "public_fetch": "--no-public-fetch",
        "preannotate": "--preannotate",
        "fetch_timeout_s": "--fetch-timeout",
    }
    for name, value in values.items():
        try:
            LabelStudioOptions(**{name: value})
        except ValueError as exc:
            raise UsageError(f"{sources[name]}: {exc}") from None
    return LabelStudioOptions(**values)


def labelstudio_command(args: argparse.Namespace) -> int:
    spec = model_flags.runtime_spec(args)
    settings = serve.settings_from(args)
    options = options_from(args)
    serve.check_store(settings)
    serve.check_address(args.host, args.port)
    if args.host not in serve.LOOPBACK_HOSTS and settings.api_key is None:
        warning_line(
            f"listening on {args.host} without an API key: anyone who can reach it can use it "
            f"(set ${args.api_key_env} to require one; Label Studio sends it as the password "
            "of Basic Authentication)"
        )
    if options.api_key is not None and options.url is None:
        warning_line(
            f"${args.label_studio_key_env} is set but Label Studio's address is not "
            f"(--label-studio-url or ${DEFAULT_URL_ENV}): the token is sent nowhere; "
            "set the address to read Label Studio's files with it"
        )
    model_flags.check_device(spec.device)

    import uvicorn

    from sam2serve.labelstudio.app import create_labelstudio_app
    from sam2serve.runtime.process import configure_process
    from sam2serve.server.http_server import uvicorn_config

    configure_process(spec)  # once, before the app builds its predictor
    loading = model_flags.load_errors_as_usage(settings.checkpoint, settings.model)
    with loading, serve.store_errors_as_usage():
        app = create_labelstudio_app(settings, options)
    info = app.state.service.predictor.model.weights_info
    if info.is_random:
        warning_line(f"serving {info.describe()}")
    address = f"http://{args.host}:{args.port}"
    info_line(
        f"Label Studio ML backend: {spec.model} ({spec.label}, {spec.device}) on {address} - "
        f"connect it in Label Studio (project Settings > Model > Connect Model, URL {address})"
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
