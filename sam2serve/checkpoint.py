"""Find, fetch and load SAM2 checkpoints — or build a seeded random model.

Resolution order for ``load_model(size, checkpoint=...)``:

1. an explicit path (a missing file is an error, never a silent fallback);
2. the cache's ``checkpoints`` directory (:mod:`sam2serve.cache`:
   ``$SAM2SERVE_CACHE/checkpoints``, by default ``~/.cache/sam2serve/checkpoints``) holding
   Meta's file names (``sam2.1_hiera_tiny.pt``, then SAM2.0's ``sam2_hiera_tiny.pt``);
3. a download of the SAM2.1 file from Meta's published URL into that directory, with a
   progress bar, its sha256 printed (set ``SAM2SERVE_OFFLINE=1`` to skip the attempt);
4. otherwise a :class:`CheckpointError` that says where to put the file.

``load_model`` builds the image path and skips the video keys by name;
``load_video_model`` builds :class:`SAM2Video` and loads every key of the file, strictly.
"""

from __future__ import annotations

import hashlib
import os
import sys
import tempfile
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import torch

from sam2serve.cache import CACHE_ENV, cache_path
from sam2serve.config import ModelConfig, get_config
from sam2serve.modeling.sam2 import SAM2Image
from sam2serve.modeling.sam2_video import SAM2Video

OFFLINE_ENV = "SAM2SERVE_OFFLINE"
SAM21_URL = "https://dl.fbaipublicfiles.com/segment_anything_2/092824/{name}"
DOWNLOAD_TIMEOUT_S = 20.0

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


@dataclass(frozen=True)
class WeightsInfo:
    """Where a model's weights came from; printed and written with every result."""

    source: str  # "checkpoint" or "random"
    path: str | None = None
    seed: int | None = None

    @property
    def is_random(self) -> bool:
        return self.source == "random"

    def describe(self) -> str:
        if self.is_random:
            return f"RANDOM WEIGHTS (seed {self.seed}) - not a trained model, masks are meaningless"
        return f"checkpoint {self.path}"

    def as_dict(self) -> dict[str, object]:
        return {"source": self.source, "path": self.path, "seed": self.seed}


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
    directory = cache_dir()
    for name in cfg.checkpoint_names:
        if (directory / name).is_file():
            return directory / name
    primary = cfg.checkpoint_names[0]
    if os.environ.get(OFFLINE_ENV) != "1":
        try:
            return download(SAM21_URL.format(name=primary), directory / primary)
        except (OSError, urllib.error.URLError) as exc:
            reason = f"download failed ({exc})"
    else:
        reason = f"downloads disabled by {OFFLINE_ENV}=1"
    raise CheckpointError(
        f"no checkpoint for model {cfg.name!r}: {reason}. Put {primary} (or "
        f"{', '.join(cfg.checkpoint_names[1:])}) in {directory} (set ${CACHE_ENV} to use "
        f"another cache root), pass --checkpoint PATH, or use --random-weights for a smoke run"
    )


def download(url: str, dest: Path) -> Path:
    """Download ``url`` to ``dest`` atomically, with a progress bar; its sha256 is printed."""
    from tqdm import tqdm

    dest.parent.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    tmp = Path(tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".part")[1])
    try:
        with (
            urllib.request.urlopen(url, timeout=DOWNLOAD_TIMEOUT_S) as response,
            tmp.open("wb") as out,
        ):
            total = int(response.headers.get("Content-Length") or 0) or None
            with tqdm(total=total, unit="B", unit_scale=True, desc=f"download {dest.name}") as bar:
                while chunk := response.read(1 << 20):
                    out.write(chunk)
                    digest.update(chunk)
                    bar.update(len(chunk))
        # Meta publishes no checksums for these files: the digest is printed so a user
        # can compare it with a copy they trust; the file is then checked by loading it
        # (every expected key, every shape).
        print(f"sam2serve: sha256 of {dest.name}: {digest.hexdigest()}", file=sys.stderr)
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)  # a failed or partial download leaves nothing behind
    return dest


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
        problems.append(f"missing keys: {', '.join(missing)}")
    if unexpected:
        problems.append(f"unexpected keys: {', '.join(unexpected)}")
    if wrong_shape:
        problems.append(f"wrong shapes: {', '.join(wrong_shape)}")
    if problems:
        raise CheckpointError(
            f"checkpoint {str(path)!r} does not fit model {model.config.name!r} "
            f"(is it another size?): " + "; ".join(problems)
        )


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
