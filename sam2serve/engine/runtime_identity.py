"""What a predictor knows of the runtime it was built for.

A :class:`~sam2serve.engine.predictor.Predictor` or a video predictor carries the
``sam2serve.runtime`` RuntimeSpec it was built with (``predictor.runtime``) for the surfaces
that report it (the service's /readyz and metrics, the CLI's records, the bench). The engine
sits below the runtime package, so it names what it carries by this protocol, which
RuntimeSpec satisfies structurally (mypy checks that where a spec is handed in)."""

from __future__ import annotations

from typing import Any, Protocol


class RuntimeIdentity(Protocol):
    """The read-only identity of a runtime: model size, mode, backend, device, dtype."""

    @property
    def model(self) -> str: ...

    @property
    def mode(self) -> str: ...

    @property
    def backend(self) -> str | None: ...

    @property
    def device(self) -> str: ...

    @property
    def dtype(self) -> str | None: ...

    def as_dict(self) -> dict[str, Any]: ...
