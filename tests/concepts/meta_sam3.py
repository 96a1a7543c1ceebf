"""Meta's sam3 image model, full size or reduced, as the oracle of the concept tests.

Meta's builder (``sam3.model_builder.build_sam3_image_model``) fixes every size inside its
factory functions. A reduced model is Meta's own builder run while a few constructors it
calls (ViT, text encoder, DETR encoder/decoder, geometry encoder, sine position encoding)
get smaller keyword arguments; everything else, and all forward code, is Meta's.

It imports nothing of sam2serve: ``meta_oracle.py`` runs it in the separate environment of
Meta's real stack (``meta_venv.py``), where Meta's code finds the real torchvision and timm.
"""

from __future__ import annotations

import contextlib
import functools
import gzip
import json
import sys
import types
import warnings
from pathlib import Path
from unittest import mock

import torch

SHIM_DIR = Path(__file__).resolve().parents[1] / "shim"


def _import_transformers_without_shim() -> None:
    shim = str(SHIM_DIR)
    saved_path = list(sys.path)
    shimmed = {
        name: sys.modules.pop(name)
        for name in list(sys.modules)
        if name == "torchvision" or name.startswith("torchvision.")
    }
    sys.path[:] = [p for p in sys.path if p != shim]
    try:
        import transformers.models.sam3.modeling_sam3  # noqa: F401
    finally:
        sys.path[:] = saved_path
        sys.modules.update(shimmed)


def import_sam3(shim: bool = True):
    """Meta's sam3, with the test shims for torchvision and timm first on sys.path and its
    triton kernel module (EDT, used by the video tracker only) replaced by a stub: a
    ``triton`` shim on sys.path would mislead torch._dynamo into thinking triton exists.
    ``shim=False``: Meta's sam3 as installed (its real stack, in its own environment)."""
    if not shim:
        warnings.filterwarnings("ignore", category=FutureWarning)
        import sam3.model_builder as builder

        return builder
    # transformers decides once, at import, whether torchvision exists: settle that (no)
    # with the shim off the path (an earlier test's Meta sam2 oracle may have put it
    # there), so our model never sees the shim.
    _import_transformers_without_shim()

    if str(SHIM_DIR) not in sys.path:
        sys.path.insert(0, str(SHIM_DIR))
    if "sam3.model.edt" not in sys.modules:
        stub = types.ModuleType("sam3.model.edt")

        def edt_triton(*_args, **_kwargs):
            raise RuntimeError("sam3's triton EDT kernel is not available in these tests")

        stub.edt_triton = edt_triton
        sys.modules["sam3.model.edt"] = stub
    warnings.filterwarnings("ignore", category=FutureWarning)
    import sam3.model_builder as builder

    return builder


def _override(cls, **overrides):
    @functools.wraps(cls)
    def make(*args, **kwargs):
        kwargs.update({k: v for k, v in overrides.items() if k in kwargs or k in _ALWAYS})
        return cls(*args, **kwargs)

    return make


_ALWAYS = {"precompute_resolution", "num_layers", "resolution"}


@contextlib.contextmanager
def _reduced(builder, reduced: dict):
    r = reduced
    patches = {
        "ViT": _override(
            builder.ViT,
            img_size=r["image_size"],
            embed_dim=r["vit_dim"],
            depth=r["vit_depth"],
            num_heads=r["vit_heads"],
            global_att_blocks=tuple(r["vit_global"]),
        ),
        "VETextEncoder": _override(
            builder.VETextEncoder,
            width=r["text_dim"],
            heads=r["text_heads"],
            layers=r["text_layers"],
        ),
        "TransformerEncoderFusion": _override(
            builder.TransformerEncoderFusion, num_layers=r["detr_layers"]
        ),
        "TransformerDecoder": _override(
            builder.TransformerDecoder,
            num_layers=r["detr_layers"],
            resolution=None,
            num_queries=r["queries"],  # its cache is built on "cuda"
        ),
        "SequenceGeometryEncoder": _override(
            builder.SequenceGeometryEncoder, num_layers=r["geometry_layers"]
        ),
    }
    original_pos = builder._create_position_encoding

    def position_encoding(precompute_resolution=None):
        # Meta precomputes its cache on "cuda" (hard-coded); on the fly is the same math
        return original_pos(precompute_resolution=None)

    with contextlib.ExitStack() as stack:
        for name, value in patches.items():
            stack.enter_context(mock.patch.object(builder, name, value))
        stack.enter_context(
            mock.patch.object(builder, "_create_position_encoding", position_encoding)
        )
        yield


@contextlib.contextmanager
def _interactive(builder, image_size: int):
    """Meta's tracker (``build_tracker``) on the CPU at ``image_size``: its memory encoder's
    sine encoding precomputes on "cuda" (hard-coded; on the fly is the same math), and its
    input size is fixed at 1008 in the builder."""
    patches = {
        "PositionEmbeddingSine": _override(
            builder.PositionEmbeddingSine, precompute_resolution=None
        ),
        "Sam3TrackerPredictor": _override(builder.Sam3TrackerPredictor, image_size=image_size),
    }
    with contextlib.ExitStack() as stack:
        for name, value in patches.items():
            stack.enter_context(mock.patch.object(builder, name, value))
        yield


def build_meta_image_model(
    reduced: dict | None,
    bpe_path: Path,
    seed: int = 0,
    shim: bool = True,
    interactive: bool = False,
) -> torch.nn.Module:
    """Meta's Sam3Image (eval, CPU, random init under ``seed``), reduced when asked.
    ``interactive``: with Meta's instance interactivity (the sam2 neck and the tracker's
    heads, ``enable_inst_interactivity=True``); its predictor's feature sizes, which Meta
    fixes at 1008 px, follow the reduced size."""
    builder = import_sam3(shim)
    image_size = (reduced or {}).get("image_size", 1008)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        with contextlib.ExitStack() as stack:
            if reduced:
                stack.enter_context(_reduced(builder, reduced))
            if interactive:
                stack.enter_context(_interactive(builder, image_size))
            model = builder.build_sam3_image_model(
                bpe_path=str(bpe_path),
                device="cpu",
                load_from_HF=False,
                enable_inst_interactivity=interactive,
            )
    if interactive:
        grid = image_size // 14
        model.inst_interactive_predictor._bb_feat_sizes = [(grid * k, grid * k) for k in (4, 2, 1)]
    return model.eval()


def sam3_checkpoint(meta: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Meta's image model -> the layout of ``sam3.pt``: ``detector.`` keys, and with
    interactivity ``tracker.`` keys (Meta's loader maps ``tracker.`` to
    ``inst_interactive_predictor.model.``; here the other way)."""
    out = {}
    for key, tensor in meta.state_dict().items():
        inner = key.removeprefix("inst_interactive_predictor.model.")
        out[f"tracker.{inner}" if inner != key else f"detector.{key}"] = tensor
    return out


SYNTHETIC_MERGES = ["c a", "ca t</w>", "d o", "do g</w>", "r e", "re d</w>", "b o", "bo x</w>"]


def write_tokenizer_files(directory: Path) -> Path:
    """A small CLIP BPE (the wheel of Meta's sam3 does not ship its 16e6 vocabulary): Meta's
    gzipped merges file (``bpe_simple_vocab.txt.gz``) and the same vocabulary as
    vocab.json + merges.txt (the files the hub repo ships next to sam3.pt), built the way
    Meta's SimpleTokenizer builds it (bytes, bytes + "</w>", merges, two specials)."""
    import_sam3()
    from sam3.model.tokenizer_ve import bytes_to_unicode

    directory.mkdir(parents=True, exist_ok=True)
    header = "#version: 0.2"
    with gzip.open(directory / "bpe_simple_vocab.txt.gz", "wt", encoding="utf-8") as fh:
        fh.write("\n".join([header, *SYNTHETIC_MERGES]))  # no final newline: Meta slices lines
    pairs = [tuple(m.split()) for m in SYNTHETIC_MERGES]
    vocab = list(bytes_to_unicode().values())
    vocab = vocab + [v + "</w>" for v in vocab] + ["".join(p) for p in pairs]
    vocab += ["<|startoftext|>", "<|endoftext|>"]
    (directory / "vocab.json").write_text(json.dumps({t: i for i, t in enumerate(vocab)}))
    (directory / "merges.txt").write_text(header + "\n" + "\n".join(SYNTHETIC_MERGES) + "\n")
    return directory
