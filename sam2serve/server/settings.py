"""The service's settings: which model to load and every limit, grouped by concern.

:class:`ServerSettings` composes one small frozen dataclass per concern
(sam2serve.server.settings_groups): ``runtime`` (the model and how it starts), ``access``
(API key, CORS, allowed hosts), ``page``, ``limits``, ``connections``, ``batching``,
``caches``, ``store``, ``video``, ``live`` and ``concepts``; code reads
``settings.limits.max_pixels``.
Each group checks its own values on construction, ServerSettings the checks that span
groups. Every setting also has a flat name (its key: ``max_pixels``, ``video``,
``store_dtype``), which the flags, their ``SAM2SERVE_*`` variables and cluster config
files use; :meth:`ServerSettings.from_flat` and :meth:`ServerSettings.replace` route flat
names to their groups.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass, field
from typing import Any

from sam2serve.options import group_class, key_of, setting_fields
from sam2serve.server.settings_groups import (
    ACCESS,
    BATCHING,
    CACHES,
    CONCEPTS,
    CONNECTIONS,
    DEFAULT_API_KEY_ENV,
    DEFAULT_CACHE_BYTES,
    DEFAULT_MASK_CACHE_BYTES,
    LIMITS,
    LIVE,
    MAX_OBJECTS,
    MAX_POINTS_PER_OBJECT,
    PAGE,
    RUNTIME,
    STORE,
    VIDEO,
    AccessSettings,
    BatchingSettings,
    CacheSettings,
    ConceptSettings,
    ConnectionSettings,
    LimitSettings,
    LiveSettings,
    MiB,
    PageSettings,
    RuntimeSettings,
    StoreSettings,
    VideoSettings,
)

__all__ = [
    "ACCESS",
    "BATCHING",
    "CACHES",
    "CONCEPTS",
    "CONNECTIONS",
    "DEFAULT_API_KEY_ENV",
    "DEFAULT_CACHE_BYTES",
    "DEFAULT_MASK_CACHE_BYTES",
    "LIMITS",
    "LIVE",
    "MAX_OBJECTS",
    "MAX_POINTS_PER_OBJECT",
    "PAGE",
    "RUNTIME",
    "STORE",
    "VIDEO",
    "AccessSettings",
    "BatchingSettings",
    "CacheSettings",
    "ConceptSettings",
    "ConnectionSettings",
    "LimitSettings",
    "LiveSettings",
    "MiB",
    "PageSettings",
    "RuntimeSettings",
    "ServerSettings",
    "StoreSettings",
    "VideoSettings",
    "flat_keys",
]


@dataclass(frozen=True)
class ServerSettings:
    """What the app loads and the limits it enforces (all sizes in bytes, times in s/ms),
    one group per concern."""

    runtime: RuntimeSettings = field(default_factory=RuntimeSettings)
    access: AccessSettings = field(default_factory=AccessSettings)
    page: PageSettings = field(default_factory=PageSettings)
    limits: LimitSettings = field(default_factory=LimitSettings)
    connections: ConnectionSettings = field(default_factory=ConnectionSettings)
    batching: BatchingSettings = field(default_factory=BatchingSettings)
    caches: CacheSettings = field(default_factory=CacheSettings)
    store: StoreSettings = field(default_factory=StoreSettings)
    video: VideoSettings = field(default_factory=VideoSettings)
    live: LiveSettings = field(default_factory=LiveSettings)
    concepts: ConceptSettings = field(default_factory=ConceptSettings)

    def __post_init__(self) -> None:
        for group in dataclasses.fields(self):
            value = getattr(self, group.name)
            expected = group_class(group)
            if expected is not None and not isinstance(value, expected):
                raise TypeError(
                    f"ServerSettings.{group.name} must be a {expected.__name__}, got "
                    f"{type(value).__name__} (flat names: ServerSettings.from_flat)"
                )
        # Each group checked its own values when it was made; a check that spans groups
        # belongs here (none today).

    @classmethod
    def from_flat(cls, **values: Any) -> ServerSettings:
        """ServerSettings from flat names (``max_pixels=...``, ``video=True``,
        ``store="emb/"``), each routed to its group; an unknown name is a TypeError naming
        it."""
        return cls().replace(**values)

    def replace(self, **values: Any) -> ServerSettings:
        """A copy with the settings of these flat names changed (see :meth:`from_flat`)."""
        routes = flat_keys()
        unknown = sorted(name for name in values if name not in routes)
        if unknown:
            raise TypeError(
                f"ServerSettings has no setting {', '.join(map(repr, unknown))} (settings: "
                f"{', '.join(routes)})"
            )
        changes: dict[str, dict[str, Any]] = {}
        for name, value in values.items():
            group, attribute = routes[name]
            changes.setdefault(group, {})[attribute] = value
        groups = {
            group: dataclasses.replace(getattr(self, group), **fields)
            for group, fields in changes.items()
        }
        return dataclasses.replace(self, **groups)

    def flat(self) -> dict[str, Any]:
        """Every setting by its flat name (the inverse of :meth:`from_flat`)."""
        return {
            name: getattr(getattr(self, group), attribute)
            for name, (group, attribute) in flat_keys().items()
        }


@functools.cache
def flat_keys() -> dict[str, tuple[str, str]]:
    """Every setting's flat name -> (its group, its field in the group), in field order."""
    return {
        key_of(inner): (group, inner.name)
        for group, inner in setting_fields(ServerSettings)
        if group is not None
    }
