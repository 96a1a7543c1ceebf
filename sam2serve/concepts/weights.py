"""SAM 3's weights: Meta's ``sam3.pt`` and its CLIP tokenizer files from the gated
Hugging Face repository ``facebook/sam3``, into ``<cache>/sam3/``, checked before they land.

The weights are under the SAM License and gated: the user accepts the licence on
https://huggingface.co/facebook/sam3 and brings a token in ``HF_TOKEN`` (or
``HUGGING_FACE_HUB_TOKEN``). The token is sent to the download URL's origin only.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import torch

from sam2serve.cache import cache_path
from sam2serve.checkpoint import CheckpointError, check_records
from sam2serve.concepts.checkpoint import CheckpointMismatch, check_state, meta_to_transformers
from sam2serve.concepts.model import Sam3Size, build_model
from sam2serve.concepts.tracker_heads import check_tracker_keys, split_tracker_state
from sam2serve.download import (
    DigestMismatch,
    DownloadError,
    fetch,
    recorded_sha256,
    sha256_of,
    shown_url,
)

REPO = "facebook/sam3"
LICENCE = "SAM License (gated: accept it on https://huggingface.co/facebook/sam3)"
HF_URL_BASE = f"https://huggingface.co/{REPO}/resolve/main"
CHECKPOINT = "sam3.pt"
TOKENIZER_FILES = ("vocab.json", "merges.txt")
TOKEN_ENVS = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")
# The configuration a downloaded file must match (tests set a reduced one).
EXPECTED_SIZE = Sam3Size.full()
# The most bytes a tokenizer file may have (CLIP's vocab.json is ~1 MB): an endless answer
# stops here.
MAX_TEXT_BYTES = 64 << 20


class WeightsError(OSError):
    """SAM 3's weights are missing, gated, or not what they should be (one line)."""


def weights_dir() -> Path:
    return cache_path("sam3")


def hf_token() -> str | None:
    for name in TOKEN_ENVS:
        if os.environ.get(name, "").strip():
            return os.environ[name].strip()
    return None


def check_keys(state: dict[str, torch.Tensor], size: Sam3Size) -> None:
    """Meta-format ``state`` must give every parameter of ``size``'s model with its shape,
    the tracker heads' too (:mod:`sam2serve.concepts.tracker_heads`; the video tracker's
    keys are named, not checked here), and nothing else
    (:func:`~sam2serve.concepts.checkpoint.check_state`, the check ``load_strict`` makes;
    the models are built on the meta device: no memory, no time)."""
    with torch.device("meta"):
        expected = build_model(size).state_dict()
    check_state(expected, meta_to_transformers(state))
    check_tracker_keys(split_tracker_state(state)[0], size)


def max_checkpoint_bytes(size: Sam3Size | None = None) -> int:
    """The most bytes ``sam3.pt`` can have: Meta's file holds the detector (the model
    checked here, in fp32) and a tracker smaller than it, so twice the detector's bytes
    and some archive overhead bound it (built on the meta device: nothing allocated)."""
    with torch.device("meta"):
        state = build_model(size or EXPECTED_SIZE).state_dict()
    parameters: int = sum(v.numel() for v in state.values())
    return 2 * parameters * 4 + (16 << 20)


def verify_checkpoint(path: Path, size: Sam3Size | None = None) -> None:
    """Every record's CRC-32, then every parameter of the model with its shape."""
    try:
        check_records(path)
    except CheckpointError as exc:
        raise CheckpointMismatch(f"{path.name.removesuffix('.part')} is damaged: {exc}") from None
    try:
        loaded = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as exc:  # noqa: BLE001 - any unreadable file is the same answer
        raise CheckpointMismatch(f"{path.name} does not load as a torch file: {exc}") from None
    state = loaded.get("model", loaded) if isinstance(loaded, dict) else None
    if not isinstance(state, dict):
        raise CheckpointMismatch(f"{path.name} holds no state dict")
    check_keys(state, size or EXPECTED_SIZE)


def _verify_text(path: Path) -> None:
    """vocab.json must be a JSON object; merges.txt non-empty UTF-8 (``path`` may be the
    ``.part`` being checked)."""
    import json

    name = path.name.removesuffix(".part")
    try:
        text = path.read_text(encoding="utf-8")
        if name.endswith(".json") and not isinstance(json.loads(text), dict):
            raise ValueError("not an object")
    except (ValueError, UnicodeDecodeError) as exc:
        raise WeightsError(f"{name} is not valid JSON: {exc}") from None
    if not text.strip():
        raise WeightsError(f"{name} is empty")


def gated_message(status: str) -> str:
    return (
        f"SAM 3 weights are gated ({status}): accept the SAM License on "
        f"https://huggingface.co/{REPO} and set HF_TOKEN to a token of that account"
    )


def download(
    url_base: str | None = None,
    deadline_s: float = 3600.0,
    force: bool = False,
    sha256: str | None = None,
) -> Path:
    """Fetch the checkpoint and tokenizer files into :func:`weights_dir`; returns it.
    ``sha256`` pins ``sam3.pt``'s digest (else the one Hugging Face publishes is checked).
    Raises :class:`WeightsError` (one line) when they are gated, missing or wrong, and
    :class:`~sam2serve.download.DigestMismatch` when a digest does not match; a file
    already there is never replaced by one that fails."""
    base = (url_base or HF_URL_BASE).rstrip("/")
    token = hf_token()
    directory = weights_dir()
    for name in (*TOKENIZER_FILES, CHECKPOINT):
        dest = directory / name
        is_checkpoint = name == CHECKPOINT
        verify = verify_checkpoint if is_checkpoint else _verify_text
        pinned = sha256 if is_checkpoint else None
        if dest.is_file() and not force and _still_good(dest, verify, pinned):
            continue
        try:
            fetch(
                f"{base}/{name}",
                dest,
                deadline_s=deadline_s,
                max_size=max_checkpoint_bytes() if is_checkpoint else MAX_TEXT_BYTES,
                sha256=pinned,
                verify=verify,
                replace=True,
                token=token,
            )
        except DigestMismatch:
            raise
        except DownloadError as exc:
            text = str(exc)
            if "HTTP 401" in text or "HTTP 403" in text:
                status = "HTTP 401" if "HTTP 401" in text else "HTTP 403"
                raise WeightsError(gated_message(status)) from None
            if "HTTP 404" in text:
                raise WeightsError(f"{shown_url(f'{base}/{name}')}: not found (HTTP 404)") from None
            raise WeightsError(text) from None
        except (CheckpointMismatch, WeightsError) as exc:
            kept = f", {str(dest)!r} was not touched" if dest.exists() else ""
            raise WeightsError(
                f"{shown_url(f'{base}/{name}')}: {exc}; the file was deleted{kept}"
            ) from None
    return directory


def _still_good(dest: Path, verify: Callable[[Path], None], pinned: str | None) -> bool:
    """Whether the file already there passes its check, matches the digest recorded when
    it was downloaded, and the pinned one."""
    try:
        verify(dest)
    except (CheckpointMismatch, WeightsError):
        return False
    recorded = recorded_sha256(dest)
    if recorded is None and pinned is None:
        return True
    actual = sha256_of(dest)
    return (recorded is None or actual == recorded) and (pinned is None or actual == pinned)


def require(directory: Path | None = None) -> Path:
    """The weights folder, or a one-line :class:`WeightsError` saying how to get it."""
    directory = directory or weights_dir()
    missing = [n for n in (CHECKPOINT, *TOKENIZER_FILES) if not (directory / n).is_file()]
    if missing:
        raise WeightsError(
            f"SAM 3 weights not found in {str(directory)!r} (missing {', '.join(missing)}): "
            "run 'sam2serve download --model sam3' (needs HF_TOKEN; " + LICENCE + ")"
        )
    return directory
