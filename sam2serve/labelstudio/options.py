"""What the Label Studio backend needs beyond the service's settings, checked once.

Torch-free, so ``sam2serve labelstudio`` checks its flags before anything heavy loads.
The service's own settings (model, limits, caches) stay in
:class:`~sam2serve.server.settings.ServerSettings`; these are only what is particular to
answering Label Studio: where its files are and with which token, which hosts task images
may be fetched from, and what a task without a click gets. All of it is the operator's:
nothing a caller sends (``/setup`` included) changes where the token goes.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from urllib.parse import urlsplit

from sam2serve.config_text import parse_http_url
from sam2serve.labelstudio.fetch_policy import AllowedHost, FetchPolicy
from sam2serve.options import check_options, option

# What a task gets when Label Studio asks for predictions without an interaction (the
# "retrieve predictions" action, or a task opened with pre-labelling on).
PREANNOTATE_MODES = {
    "center": "one mask from a positive click at the image centre (one encode and one "
    "decode per task: cheap, and it leaves the task's embedding cached for the clicks that "
    "follow)",
    "amg": "automatic mask generation: every object, one brush region each (one encode and "
    "a 32x32 grid of clicks per task: slow on a CPU)",
    "none": "no regions: an empty prediction (the image is still fetched and encoded, so "
    "the embedding is cached for the clicks that follow)",
}
DEFAULT_PREANNOTATE = "center"
CLICK_MODELS = ("sam3", "sam2")  # --concept-clicks
DEFAULT_VIDEO_MAX_FRAMES = 100
DEFAULT_URL_ENV = "LABEL_STUDIO_URL"
DEFAULT_KEY_ENV = "LABEL_STUDIO_API_KEY"
GROUP = "Label Studio"  # the help group of 'labelstudio --help' these flags are listed in


@dataclass(frozen=True)
class LabelStudioOptions:
    """How the backend reaches Label Studio's files and what pre-annotation does."""

    # Label Studio's address, for the task URLs it gives relative to itself
    # (/data/upload/..., /data/local-files/?d=...); its host is allowed to be fetched from.
    # None: the hostname Label Studio sent in /setup for the project, if the operator
    # allowed that host (allow_fetch_hosts).
    url: str | None = option(
        None,
        help="Label Studio's address, for the images of tasks given as its paths "
        "(/data/upload/...); images may be fetched from its host",
        flag="--label-studio-url",
        metavar="URL",
        default_text=f"${DEFAULT_URL_ENV}, else the address Label Studio sends when it "
        "connects, if --allow-fetch-host allows it",
        group=GROUP,
    )
    # A Label Studio access token (legacy token or personal access token) to read those
    # files, sent to ``url`` only (never used without it). None: the token /setup sent,
    # sent to /setup's own (allowed) hostname only. Read from the variable that
    # --label-studio-key-env names, never a flag.
    api_key: str | None = None
    # Hosts task images may be fetched from whatever they resolve to (HOST, HOST:PORT), and
    # addresses or networks (IP, [IPv6]:PORT, CIDR): how loopback, private and link-local
    # addresses, and ports other than 80 and 443, are allowed.
    allow_fetch_hosts: tuple[str, ...] = option(
        (),
        help="a host task images may be fetched from whatever it resolves to (HOST or "
        "HOST:PORT), or an address or network (IP, [IPv6]:PORT, CIDR such as 10.0.0.0/8): "
        "how loopback, private and link-local addresses and other ports than 80 and 443 are "
        "allowed (repeatable)",
        flag="--allow-fetch-host",
        metavar="HOST",
        repeatable=True,
        default_text="none",
        group=GROUP,
    )
    # Fetch from any other host whose addresses are all public, on ports 80 and 443.
    # False: only from ``url`` and ``allow_fetch_hosts``.
    public_fetch: bool = option(
        True,
        help="also fetch task images from hosts whose addresses are all public, on ports 80 "
        "and 443 (--no-public-fetch: only from --label-studio-url and --allow-fetch-host "
        "hosts)",
        group=GROUP,
    )
    # Folders whose files a task may name by local path (absolute, or file://); none: a
    # local path is refused (a remote caller must not read this machine's files).
    local_roots: tuple[str, ...] = option(
        (),
        help="a folder whose files tasks may name by local path (repeatable)",
        flag="--local-root",
        metavar="DIR",
        repeatable=True,
        default_text="none, local paths are refused",
        group=GROUP,
    )
    preannotate: str = option(
        DEFAULT_PREANNOTATE,
        help="what a task gets when Label Studio asks without a click (see above)",
        choices=tuple(PREANNOTATE_MODES),
        group=GROUP,
    )
    # Seconds one image download may take, all of it (redirects and a slow server's last
    # byte included).
    fetch_timeout_s: float = option(
        30.0,
        help="seconds one image download may take in all, redirects and a slow server included",
        flag="--fetch-timeout",
        metavar="S",
        low=0,
        low_open=True,
        group=GROUP,
    )
    # Tasks of one /predict request worked on at once (fetch, encode, decode); the model
    # worker batches their encodes.
    max_concurrent_tasks: int = option(
        4,
        help="tasks of one /predict request worked on at once (fetch, encode, decode); "
        "their encodes are batched",
        metavar="N",
        low=1,
        group=GROUP,
    )
    # Video tasks: the frames one request tracks, from the first keyframe on (also at most
    # the service's max_video_frames; its byte limits apply too).
    video_max_frames: int = option(
        DEFAULT_VIDEO_MAX_FRAMES,
        help="video tasks (with --video): frames one request tracks from the first keyframe "
        "on, at most --max-video-frames",
        metavar="N",
        low=1,
        group=GROUP,
    )

    # Concept prompts (--concepts, SAM 3): the label names of the config's BrushLabels or
    # PolygonLabels tag are the prompts of pre-annotation, a TextArea's text the prompt of
    # an interaction. Set by the command from --concepts (not a field flag: the service's
    # own concept flags are shared with it).
    concepts: bool = False
    concept_score_thresh: float = option(
        0.5,
        help="with --concepts: the score an instance needs to be answered (SAM 3's rule; "
        "Meta's default 0.5; random weights score about 0.25)",
        metavar="P",
        low=0.0,
        high=1.0,
        group=GROUP,
    )
    concept_max_labels: int = option(
        32,
        help="with --concepts: the most label names of a config used as prompts, and "
        "phrases of one TextArea interaction (a config with more is refused, 422)",
        metavar="N",
        low=1,
        high=1000,
        group=GROUP,
    )
    concept_max_instances: int = option(
        100,
        help="with --concepts: the most instances answered per label or phrase of a task, "
        "highest scores first, chosen before masks are upsampled (at most the service's "
        "--max-concept-instances)",
        metavar="N",
        low=1,
        high=10_000,
        group=GROUP,
    )
    # Which model answers a click or a box prompt under --concepts: SAM 3's tracker heads on
    # the image's SAM 3 encoding (the model that found the regions being refined), or the
    # service's SAM 2.1.
    concept_clicks: str = option(
        "sam3",
        help="with --concepts: the model that answers clicks and box prompts: sam3 (SAM 3's "
        "tracker heads on the image's SAM 3 encoding, the model that found the regions) or "
        "sam2 (the service's SAM 2.1)",
        choices=CLICK_MODELS,
        group=GROUP,
    )

    def __post_init__(self) -> None:
        if self.url is not None:
            try:
                parse_http_url(self.url)  # a scheme, a host, a port in 1..65535, no password
            except ValueError as exc:
                raise ValueError(f"url: {exc}") from None
            object.__setattr__(self, "url", self.url.rstrip("/"))
        if self.api_key is not None and not self.api_key.strip():
            raise ValueError("api_key must not be empty (leave it unset to use /setup's token)")
        object.__setattr__(self, "allow_fetch_hosts", tuple(self.allow_fetch_hosts))
        for entry in self.allow_fetch_hosts:
            AllowedHost.parse(entry)  # ValueError naming the entry and what is accepted
        roots = tuple(os.path.realpath(root) for root in self.local_roots)
        for given, root in zip(self.local_roots, roots, strict=True):
            if not os.path.isdir(root):
                raise ValueError(f"local_roots: {given!r} is not an existing directory")
        object.__setattr__(self, "local_roots", roots)
        if self.preannotate not in PREANNOTATE_MODES:
            raise ValueError(
                f"preannotate: expected one of {', '.join(PREANNOTATE_MODES)}, got "
                f"{self.preannotate!r}"
            )
        check_options(self)

    def fetch_policy(self) -> FetchPolicy:
        """The hosts images may be fetched from: the allow-list and Label Studio's own."""
        entries = list(self.allow_fetch_hosts)
        if self.url is not None:
            parts = urlsplit(self.url)
            port = parts.port or (443 if parts.scheme == "https" else 80)
            host = parts.hostname or ""
            entries.append(f"[{host}]:{port}" if ":" in host else f"{host}:{port}")
        return FetchPolicy.of(tuple(entries), self.public_fetch)


__all__ = [
    "DEFAULT_KEY_ENV",
    "DEFAULT_PREANNOTATE",
    "DEFAULT_URL_ENV",
    "DEFAULT_VIDEO_MAX_FRAMES",
    "PREANNOTATE_MODES",
    "LabelStudioOptions",
]
