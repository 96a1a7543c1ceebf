"""The model worker's idle hook gives memory back after growth, not after every job."""

from __future__ import annotations

import pytest

from sam2serve.server import memory

MiB = 1024 * 1024


@pytest.fixture
def process(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """A fake process: its resident size, and the releases made (each drops it to 100 MiB)."""
    state = {"resident": 300 * MiB, "releases": 0}

    def release() -> bool:
        state["releases"] += 1
        state["resident"] = 100 * MiB
        return True

    monkeypatch.setattr(memory, "resident_bytes", lambda: state["resident"])
    monkeypatch.setattr(memory, "release_free_memory", release)
    return state


def test_releases_first_then_only_after_growing_by_the_margin(process: dict[str, int]) -> None:
    hook = memory.IdleRelease(growth=64 * MiB)
    assert hook() and process["releases"] == 1  # never released: release
    process["resident"] = 150 * MiB  # a click's working memory came back: 50 MiB
    assert not hook() and process["releases"] == 1
    process["resident"] = 163 * MiB
    assert not hook() and process["releases"] == 1
    process["resident"] = 164 * MiB  # 64 MiB over the size after the last release
    assert hook() and process["releases"] == 2
    assert not hook()  # back at 100 MiB


def test_releases_for_real_here() -> None:
    """On glibc (the hosts the service runs on) the first idle moment releases."""
    assert memory.IdleRelease()() == memory.release_free_memory()
