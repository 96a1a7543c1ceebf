"""``sam2serve labelstudio``: the service, plus the endpoints of a Label Studio ML backend.

It takes every flag of ``sam2serve serve`` (model, limits, caches: the same
ServerSettings, checked the same way) and the Label Studio ones: where Label Studio's
files are, the token that reads them, the local folders a task may name, and what
pre-annotation does. Flags are checked, and the port tried, before the model loads.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from dataclasses import dataclass
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
from sam2serve.commands.concepts_flags import add_concepts_flags, concepts_spec
from sam2serve.labelstudio.options import (
    DEFAULT_KEY_ENV,
    DEFAULT_URL_ENV,
    GROUP,
    PREANNOTATE_MODES,
    LabelStudioOptions,
)
from sam2serve.options import OPTION, add_option_groups, option, option_values

DEFAULT_PORT = 9090  # Label Studio's ML backends' usual port
# LabelStudioOptions' flags (url first; api_key is read from --label-studio-key-env's variable).
FLAGS = tuple(f.name for f in dataclasses.fields(LabelStudioOptions) if OPTION in f.metadata)


@dataclass(frozen=True)
class TokenSource:
    """Where the Label Studio token is read from: the command's, never a flag's value."""

    label_studio_key_env: str = option(
        DEFAULT_KEY_ENV,
        help="environment variable holding a Label Studio token (legacy API token or "
        "personal access token) that reads those images, sent to --label-studio-url only "
        "(unset: the project owner's token Label Studio sends when it connects, sent to its "
        "own address only)",
        metavar="VAR",
        group=GROUP,
    )


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

video (with --video): the annotator's VideoRectangle keyframes on a Video, several objects
at once, are tracked through the clip and come back as VideoRectangles (at most
--video-max-frames frames per request; docs/labelling.md, "Video"). With --concepts too, a
phrase typed in a TextArea on the Video is followed by SAM 3's own video predictor: every
instance found and tracked from the first frame, new ones picked up, lost ones ended, each
a VideoRectangle (docs/labelling.md, "Text prompts on a video").

connect it in Label Studio: project Settings > Model > Connect Model, URL
http://HOST:PORT, "Interactive preannotations" on. The labelling config needs an Image, a
BrushLabels on it, and KeyPointLabels / RectangleLabels with smart="true"
(docs/labelling.md, "Label Studio").

pre-annotation (--preannotate), for tasks Label Studio asks about without a click:
{described(PREANNOTATE_MODES)}

concept prompts (--concepts, SAM 3; --sam3-weights DIR, or --random-weights --sam3-size):
pre-annotation segments every label name of the config's BrushLabels or PolygonLabels tag
on each task's image (one encoding per image, all labels in one batch) and answers every
instance as a brush mask or polygon with its label and score; a TextArea on the image
(<TextArea name="concept" toName="image"/>) is an interactive text prompt: the phrase
typed gets its instances. Clicks and boxes stay SAM 2's (docs/labelling.md, "Concept
prompts").

{EXIT_STATUS_HELP} (3: e.g. the port is in use)
"""

EPILOG = f"""\
examples:
  {PROG} labelstudio --random-weights                    # smoke run on 127.0.0.1:{DEFAULT_PORT}
  {DEFAULT_URL_ENV}=http://localhost:8080 {DEFAULT_KEY_ENV}=TOKEN \\
    {PROG} labelstudio --model large --checkpoint sam2.1_hiera_large.pt
  {PROG} labelstudio --local-root /srv/photos --preannotate none
  {PROG} labelstudio --concepts --sam3-weights ~/sam3      # label names -> SAM 3 prompts
  {PROG} labelstudio --random-weights --concepts --sam3-size tiny --concept-score-thresh 0
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
        environment=True,
        add_arguments=add_arguments,
    )


def add_arguments(parser: CommandParser) -> None:
    serve.add_arguments(parser)
    parser.set_defaults(port=DEFAULT_PORT)
    add_option_groups(parser, LabelStudioOptions, ("url",))
    add_option_groups(parser, TokenSource)
    add_option_groups(parser, LabelStudioOptions, FLAGS[1:])
    _add_concepts_flags(parser)
    parser.set_defaults(flags=flag_of(parser))


def _add_concepts_flags(parser: CommandParser) -> None:
    """--concepts, --sam3-weights and --sam3-size, unless the service's flags (which this
    command takes) already have them."""
    known = parser._option_string_actions  # the flags added so far
    group = parser.add_argument_group("Concept prompts (SAM 3)")
    if "--concepts" not in known:
        group.add_argument(
            "--concepts",
            action="store_true",
            help="the labelling config's label names (BrushLabels / PolygonLabels) are SAM 3 "
            "concept prompts for pre-annotation, and a TextArea's text one for an "
            "interaction (with --random-weights SAM 3 is random too)",
        )
    if "--sam3-weights" not in known:
        add_concepts_flags(group)


def options_from(args: argparse.Namespace) -> LabelStudioOptions:
    """LabelStudioOptions from the flags and environment; a bad value names its source
    (the flag, or the variable that gave it)."""
    values: dict[str, Any] = option_values(args, LabelStudioOptions, FLAGS)
    sources = {name: args.flags[name] for name in FLAGS}
    sources.update({dest: f"${variable}" for dest, (variable, _) in serve.sources(args).items()})
    if values["url"] is None:
        values["url"] = os.environ.get(DEFAULT_URL_ENV) or None
        sources["url"] = f"${DEFAULT_URL_ENV}"
    values["api_key"] = os.environ.get(args.label_studio_key_env) or None
    values["concepts"] = bool(args.concepts)
    sources["api_key"] = f"${args.label_studio_key_env}"
    for name in ("local_roots", "allow_fetch_hosts"):
        values[name] = tuple(values[name])
    for name, value in values.items():
        try:
            LabelStudioOptions(**{name: value})
        except ValueError as exc:
            raise UsageError(f"{sources[name]}: {exc}") from None
    return LabelStudioOptions(**values)


def labelstudio_command(args: argparse.Namespace) -> int:
    spec = model_flags.runtime_spec(args)
    settings = serve.settings_from(args)
    serve.listen_from(args)
    options = options_from(args)
    concepts = concepts_spec(args, spec.device) if options.concepts else None
    serve.check_store(settings, serve.store_source(args))
    serve.check_address(args.host, args.port)
    if args.host not in serve.LOOPBACK_HOSTS and settings.access.api_key is None:
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
    # 'device' where it cannot run is exit 2 before the model loads (the service makes and
    # tests its decoder when it starts).
    model_flags.check_image_decode(settings.runtime.image_decode, spec.device, decode=False)

    import uvicorn

    from sam2serve.labelstudio.app import create_labelstudio_app
    from sam2serve.runtime.process import configure_process
    from sam2serve.server.http_server import urls_to_open, uvicorn_config, where_to_connect

    configure_process(spec)  # once, before the app builds its predictor
    loading = model_flags.load_errors_as_usage(settings.runtime.checkpoint, settings.runtime.model)
    concept_model = _load_concepts(concepts, spec.mode)  # first: missing weights told at once
    with loading, serve.store_errors_as_usage(serve.store_source(args)):
        app = create_labelstudio_app(settings, options, concepts=concept_model)
    info = app.state.service.predictor.model.weights_info
    if info.is_random:
        warning_line(f"serving {info.describe()}")
    if concepts is not None and concepts.random_weights:
        warning_line(
            f"SAM 3 concept prompts from random weights ({concepts.size}, seed {concepts.seed})"
        )
    urls = urls_to_open(args.host, args.port, settings.access.allowed_hosts)
    which = f"URL {urls[0]}" if len(urls) == 1 else "whichever URL Label Studio can reach"
    info_line(
        f"Label Studio ML backend: {spec.model} ({spec.label}, {spec.device}) on "
        f"{where_to_connect(args.host, args.port, settings.access.allowed_hosts)} - connect it in Label Studio (project "
        f"Settings > Model > Connect Model, {which})"
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


def _load_concepts(spec: Any, mode: str) -> Any:
    """SAM 3 of ``spec`` (None: none) in ``mode`` (SAM 2.1's --mode); missing or gated
    weights are one usage line."""
    if spec is None:
        return None
    from sam2serve.concepts.weights import WeightsError
    from sam2serve.runtime.concepts import describe_concepts_mode, load_concepts_in_mode

    try:
        loaded = load_concepts_in_mode(spec, mode)
        info_line(describe_concepts_mode(mode, loaded))
        return loaded
    except WeightsError as exc:
        raise UsageError(f"--concepts: {exc}") from None
