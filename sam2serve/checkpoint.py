"""Find, fetch and load SAM2 checkpoints — or build a seeded random model.

Resolution order for ``load_model(size, checkpoint=...)``:

1. an explicit path (a missing file is an error, never a silent fallback);
2. the cache's ``checkpoints`` directory (:mod:`sam2serve.cache`:
   ``$SAM2SERVE_CACHE/checkpoints``, by default ``~/.cache/sam2serve/checkpoints``) holding
   Meta's file names (``sam2.1_hiera_tiny.pt``, then SAM2.0's ``sam2_hiera_tiny.pt``);
3. a download of the SAM2.1 file from Meta's published URL (or the mirror
   ``$SAM2SERVE_CHECKPOINT_URL_BASE``) into that directory by :func:`fetch_checkpoint`, as
   ``sam2serve download`` does it (set ``SAM2SERVE_OFFLINE=1`` to skip the attempt);
4. otherwise a :class:`CheckpointError`, one line with the URL, the ``sam2serve download``
   command and where to put the file.

``$SAM2SERVE_CHECKPOINT_SHA256`` pins the sha256 of the file of steps 2 and 3: a cached
file is hashed and must match, a download must match before it lands.

``fetch_checkpoint`` resumes, retries under a deadline, bounds the size, checks the digest
the server publishes (:mod:`sam2serve.download`), and renames the file into the cache only
once :func:`verify_checkpoint` accepted it: every record's CRC-32, every official key with
its shape, strictly.

``load_model`` builds the image path and skips the video keys by name;
``load_video_model`` builds :class:`SAM2Video` and loads every key of the file, strictly.
"""

from __future__ import annotations

import os
import sys
import zipfile
from pathlib import Path

import torch

from sam2serve.cache import CACHE_ENV, cache_path

# WeightsInfo lives in config (the models below checkpoint carry one); imported from here too.
from sam2serve.config import ModelConfig, WeightsInfo, get_config
from sam2serve.config_text import parse_sha256
from sam2serve.download import Fetched, fetch, sha256_of, shown_url
from sam2serve.modeling.sam2 import SAM2Image
from sam2serve.modeling.sam2_video import SAM2Video

OFFLINE_ENV = "SAM2SERVE_OFFLINE"
URL_BASE_ENV = "SAM2SERVE_CHECKPOINT_URL_BASE"
SHA256_ENV = "SAM2SERVE_CHECKPOINT_SHA256"
DOWNLOAD_COMMAND = "sam2serve download"
# Where Meta publishes the files (the URLs of Meta's README and download_ckpts.sh).
SAM21_URL_BASE = "https://dl.fbaipublicfiles.com/segment_anything_2/092824"
SAM20_URL_BASE = "https://dl.fbaipublicfiles.com/segment_anything_2/072824"
# A download gives up after this long in all (retries included); a stall (no byte) is
# retried after READ_TIMEOUT_S.
DOWNLOAD_DEADLINE_S = 3600.0
READ_TIMEOUT_S = 20.0
# A checkpoint file is its fp32 tensors plus the archive around them (names, pickled
# structure, 64-byte alignment: well under a MiB for ~500 keys); what exceeds this bound
# is not the file (an endless body).
SIZE_SLACK_BYTES = 16 << 20

# Video/memory parameters of Meta's SAM2Base that the image path never uses.
VIDEO_KEY_PREFIXES = (
    "memory_attention.",
    "memory_encoder.",
    "obj_ptr_proj.",
    "obj_ptr_tpos_proj.",
    "mask_downsample.",
)
VIDEO_KEYS = ("maskmem_tpos_enc", "no_mem_pos_enc", "no_obj_ptr", "no_obj_embed_spatial")


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be found, fetched or loaded; the message says what to do."""


class CheckpointDamaged(CheckpointError):
    """A checkpoint whose bytes are not those its archive was written with (a CRC-32)."""


def cache_dir() -> Path:
    """Where checkpoints are looked for and downloaded to."""
    return cache_path("checkpoints")


def is_video_key(key: str) -> bool:
    return key in VIDEO_KEYS or key.startswith(VIDEO_KEY_PREFIXES)


def resolve_checkpoint(cfg: ModelConfig, checkpoint: str | Path | None) -> Path:
    """The checkpoint file to load for ``cfg``, following the documented order."""
    if checkpoint is not None:
        path = Path(checkpoint).expanduser()
        if not path.is_file():
            raise CheckpointError(f"checkpoint file not found: {str(path)!r}")
        return path
    pinned = pinned_sha256()
    directory = cache_dir()
    for name in cfg.checkpoint_names:
        if (directory / name).is_file():
            return _matching(directory / name, pinned)
    primary = cfg.checkpoint_names[0]
    url = checkpoint_url(primary)
    if os.environ.get(OFFLINE_ENV) == "1":
        reason = f"downloads are disabled by {OFFLINE_ENV}=1"
    else:
        try:
            return fetch_checkpoint(
                cfg.name, retry_unreached=False, sha256=pinned, sha256_source=f"${SHA256_ENV}"
            )
        except OSError as exc:  # a DownloadError, or a cache folder that cannot be written
            reason = f"the download failed ({exc})"
    raise CheckpointError(
        f"no checkpoint for model {cfg.name!r} in {str(directory)!r} and {reason}: fetch "
        f"{url} with '{DOWNLOAD_COMMAND} --model {cfg.name}' (or put {primary} there; "
        f"${CACHE_ENV} sets another cache root), pass --checkpoint PATH, or use "
        "--random-weights for a smoke run"
    )


def pinned_sha256() -> str | None:
    """``$SAM2SERVE_CHECKPOINT_SHA256`` (lowercase), or None; a CheckpointError naming the
    variable unless it is 64 hex digits."""
    value = os.environ.get(SHA256_ENV, "").strip()
    if not value:
        return None
    try:
        return parse_sha256(value)
    except ValueError as exc:
        raise CheckpointError(f"${SHA256_ENV}: {exc}") from None


def _matching(path: Path, pinned: str | None) -> Path:
    """``path``, once its sha256 is the pinned one (if any)."""
    if pinned is None:
        return path
    actual = sha256_of(path)
    if actual != pinned:
        raise CheckpointError(
            f"{str(path)!r} has sha256 {actual}, but ${SHA256_ENV} is {pinned}: fetch the "
            f"pinned file with '{DOWNLOAD_COMMAND} --force --sha256 {pinned}' (with its "
            "--model), or unset the variable"
        )
    return path


def checkpoint_url(name: str, url_base: str | None = None) -> str:
    """Where file ``name`` is fetched from: ``url_base`` (else ``$SAM2SERVE_CHECKPOINT_URL_BASE``,
    else Meta's URL for its version) + ``/`` + ``name``."""
    base = url_base or os.environ.get(URL_BASE_ENV)
    if not base:
        base = SAM20_URL_BASE if name.startswith("sam2_") else SAM21_URL_BASE
    return f"{base.rstrip('/')}/{name}"


def checkpoint_file(size: str, sam21: bool = True) -> str:
    """Meta's file name of a model size: SAM 2.1's, or SAM 2.0's."""
    names = get_config(size).checkpoint_names
    return names[0] if sam21 else names[1]


def fetch_checkpoint(
    size: str,
    *,
    sam21: bool = True,
    url_base: str | None = None,
    deadline_s: float | None = None,
    progress: bool = True,
    retry_unreached: bool = True,
    replace: bool = False,
    sha256: str | None = None,
    sha256_source: str = "--sha256",
) -> Path:
    """Download Meta's file of ``size`` (SAM 2.1's, or SAM 2.0's) into the cache's
    checkpoints folder: resumed, retried until ``deadline_s``, never more bytes than the
    server declared or than :func:`max_checkpoint_bytes`, its digest checked against the
    one the server publishes or ``sha256`` (pinned), and renamed into place only if
    :func:`verify_checkpoint` accepts it; its sha256 is recorded beside it.
    DownloadError (network, size; DigestMismatch: the digest) or CheckpointError (not the
    model's checkpoint); either way nothing is kept and a file already there is not
    touched. A file that another process put in place meanwhile is kept, unless
    ``replace``."""
    name = checkpoint_file(size, sam21)
    url = checkpoint_url(name, url_base)
    dest = cache_dir() / name

    def verify(path: Path) -> None:
        try:
            verify_checkpoint(size, path, video=sam21)
        except CheckpointError as exc:
            cause = exc.__cause__
            why = str(exc) if cause is None else f"cannot read it: {type(cause).__name__}"
            what = (
                "is damaged"
                if isinstance(exc, CheckpointDamaged)
                else f"is not the {size} model's checkpoint"
            )
            kept = f"{str(dest)!r} was not touched" if dest.exists() else "nothing was kept"
            raise CheckpointError(
                f"the file downloaded from {shown_url(url)} {what} ({why}); {kept}"
            ) from None

    fetched = fetch(
        url,
        dest,
        deadline_s=DOWNLOAD_DEADLINE_S if deadline_s is None else deadline_s,
        read_timeout_s=READ_TIMEOUT_S,
        max_size=max_checkpoint_bytes(size, sam21),
        sha256=sha256,
        sha256_source=sha256_source,
        verify=verify,
        progress=progress,
        retry_unreached=retry_unreached,
        replace=replace,
    )
    print(f"sam2serve: {name}: {describe_fetched(fetched)}", file=sys.stderr)
    return fetched.path


def describe_fetched(fetched: Fetched) -> str:
    """Size, sha256 and what vouched for it, for the log."""
    size = fetched.path.stat().st_size
    if fetched.checked_against:
        how = "matches " + " and ".join(fetched.checked_against)
    else:  # Meta's server publishes no digest of these files (a multipart ETag is none)
        how = "the server publishes no digest: compare it with a copy you trust"
    return f"{size} bytes, sha256 {fetched.sha256} ({how})"


def max_checkpoint_bytes(size: str, sam21: bool = True) -> int:
    """The most bytes ``size``'s checkpoint file can have: its model's fp32 tensors (the
    video model's, a superset of what either version's file holds) and the archive's
    overhead. Built on the meta device: nothing allocated."""
    with torch.device("meta"):
        state = SAM2Video(get_config(size)).state_dict()
    tensors = sum(v.numel() * 4 for v in state.values())
    return tensors + tensors // 16 + SIZE_SLACK_BYTES


def verify_checkpoint(size: str, path: Path, video: bool = True) -> None:
    """A CheckpointError unless every record of ``path`` matches its CRC-32
    (:func:`check_records`) and it holds every key of the ``size`` model with its shape
    and no other: SAM 2.1's video model's keys (an official SAM 2.1 file), or with
    ``video=False`` the image path's (video keys skipped by name: SAM 2.0's files). The
    model is built on the meta device: nothing is allocated, nothing copied."""
    cfg = get_config(size)
    check_records(path)
    state = read_state_dict(path, include_video=video)
    with torch.device("meta"):
        model = SAM2Video(cfg) if video else SAM2Image(cfg)
    check_keys(model, state, path)


def check_records(path: Path) -> None:
    """A CheckpointError unless every record of a torch (zip) checkpoint has the CRC-32
    that its archive stores: the load check's keys and shapes do not see a flipped bit in
    a tensor's bytes, this does. (Records written without a CRC, 0, and the legacy
    non-zip format have none to check.)"""
    if not zipfile.is_zipfile(path):
        return
    try:
        with zipfile.ZipFile(path) as archive:
            for info in archive.infolist():
                if info.CRC == 0 and info.file_size:
                    continue
                with archive.open(info) as record:
                    while record.read(1 << 22):
                        pass
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, EOFError, ValueError) as exc:
        raise CheckpointDamaged(f"checkpoint {str(path)!r} is damaged: {exc}") from None


def read_state_dict(path: Path, include_video: bool = False) -> dict[str, torch.Tensor]:
    """The ``"model"`` state dict of an official checkpoint file: image keys only, or every
    key with ``include_video`` (for SAM2Video)."""
    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # unpickling errors come in many types
        raise CheckpointError(f"cannot read checkpoint {str(path)!r}: {exc}") from exc
    if not isinstance(data, dict) or not isinstance(data.get("model"), dict):
        raise CheckpointError(
            f"{str(path)!r} is not a SAM2 checkpoint: expected a dict with a 'model' state dict"
        )
    if include_video:
        return dict(data["model"])
    return {k: v for k, v in data["model"].items() if not is_video_key(k)}


def check_keys(model: SAM2Image, state: dict[str, torch.Tensor], path: Path) -> None:
    expected = model.state_dict()
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    wrong_shape = sorted(
        f"{k} {tuple(state[k].shape)} != {tuple(v.shape)}"
        for k, v in expected.items()
        if k in state and state[k].shape != v.shape
    )
    problems = []
    if missing:
        problems.append(f"missing keys: {_some(missing)}")
    if unexpected:
        problems.append(f"unexpected keys: {_some(unexpected)}")
    if wrong_shape:
        problems.append(f"wrong shapes: {_some(wrong_shape)}")
    if problems:
        raise CheckpointError(
            f"checkpoint {str(path)!r} does not fit model {model.config.name!r} "
            f"(is it another size?): " + "; ".join(problems)
        )


def _some(names: list[str], shown: int = 8) -> str:
    """The first names, and how many more (a file of another model misses hundreds)."""
    more = len(names) - shown
    return ", ".join(names[:shown]) + (f" and {more} more" if more > 0 else "")


def random_state_dict(cfg: ModelConfig, seed: int, video: bool = False) -> dict[str, torch.Tensor]:
    """A seeded random state dict in which every tensor matters (of SAM2Video's keys with
    ``video``; the image keys' values do not depend on it).

    PyTorch's default init leaves LayerNorm at one/zero and positional embeddings at
    zero; a small perturbation of every tensor makes each parameter influence outputs.
    """
    generator = torch.Generator().manual_seed(seed)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = SAM2Image(cfg)
    if video:
        return _random_video_state_dict(cfg, seed, model.state_dict(), generator)
    state = {}
    for key, value in model.state_dict().items():
        noise = torch.randn(value.shape, generator=generator, dtype=value.dtype)
        state[key] = value + 0.02 * noise
    return state


def _random_video_state_dict(
    cfg: ModelConfig,
    seed: int,
    image_state: dict[str, torch.Tensor],
    generator: torch.Generator,
) -> dict[str, torch.Tensor]:
    """The image keys exactly as the image-only random_state_dict, then the video keys
    drawn after them (sorted, from the same generator)."""
    state = {}
    for key, value in image_state.items():
        noise = torch.randn(value.shape, generator=generator, dtype=value.dtype)
        state[key] = value + 0.02 * noise
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed + 1)
        video_state = SAM2Video(cfg).state_dict()
    for key in sorted(set(video_state) - set(state)):
        value = video_state[key]
        noise = torch.randn(value.shape, generator=generator, dtype=value.dtype)
        state[key] = value + 0.02 * noise
    return state


def load_model(
    size: str = "tiny",
    checkpoint: str | Path | None = None,
    *,
    random_weights: bool = False,
    seed: int = 0,
    device: str | torch.device = "cpu",
) -> SAM2Image:
    """Build the SAM2.1 image model of ``size`` with official or seeded random weights.

    The returned model is in eval mode and carries ``weights_info`` (a WeightsInfo).
    """
    cfg = get_config(size)
    if random_weights and checkpoint is not None:
        raise CheckpointError("pass either a checkpoint or random_weights, not both")
    model = SAM2Image(cfg)
    if random_weights:
        state = random_state_dict(cfg, seed)
        info = WeightsInfo("random", seed=seed)
    else:
        path = resolve_checkpoint(cfg, checkpoint)
        state = read_state_dict(path)
        check_keys(model, state, path)
        info = WeightsInfo("checkpoint", path=str(path))
    model.load_state_dict(state, strict=True)
    model.weights_info = info
    return model.to(device).eval()


def load_video_model(
    size: str = "tiny",
    checkpoint: str | Path | None = None,
    *,
    random_weights: bool = False,
    seed: int = 0,
    device: str | torch.device = "cpu",
) -> SAM2Video:
    """Build the SAM 2.1 video model of ``size``: every key of the official file is loaded
    (strictly: a missing, unexpected or misshapen key is a CheckpointError), or seeded
    random weights. Eval mode, with ``weights_info`` as load_model's."""
    cfg = get_config(size)
    if random_weights and checkpoint is not None:
        raise CheckpointError("pass either a checkpoint or random_weights, not both")
    model = SAM2Video(cfg)
    if random_weights:
        state = random_state_dict(cfg, seed, video=True)
        info = WeightsInfo("random", seed=seed)
    else:
        path = resolve_checkpoint(cfg, checkpoint)
        state = read_state_dict(path, include_video=True)
        check_keys(model, state, path)
        info = WeightsInfo("checkpoint", path=str(path))
    model.load_state_dict(state, strict=True)
    model.weights_info = info
    return model.to(device).eval()
