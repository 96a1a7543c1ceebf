"""Mode ``reference``: Meta's own ``sam2`` code on the same weights, as a benchmark row.

Meta's package imports torchvision, which sam2serve does not depend on; when the real one
is not importable, :func:`activate` puts the repository's stand-in (``tests/shim``, the
tests' oracle uses the same; it is not in the wheel) on ``sys.path``. Only the reference
worker process calls it, so no other process ever sees the stand-in. The model is built with Meta's ``build_sam2`` (Hydra configs, strict
checkpoint loading), and the tasks are run the way the published experiment ran its
baseline: ``SAM2AutomaticMaskGenerator.generate`` for AMG, ``SAM2ImagePredictor.predict``
on the largest mask's point for SPS and once per point for MPS, masks to RLE with Meta's
``mask_to_rle_pytorch``.

Stage timings come from thin wrappers around Meta's objects (set_image, its transforms,
``_predict``, ``mask_to_rle_pytorch``); Meta's code itself is not modified.
"""

from __future__ import annotations

import importlib.util
import sys
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from sam2serve.engine.amg import AMGParams
from sam2serve.engine.rle import area_from_rle, rle_to_coco
from sam2serve.engine.tasks import StageTimer, decode

__all__ = [
    "MISSING_MESSAGE",
    "ReferenceRunner",
    "activate",
    "build_meta_model",
    "meta_config_name",
    "missing_requirements",
]

META_SIZES = {"tiny": "t", "small": "s", "base_plus": "b+", "large": "l"}
# The torchvision stand-in, in a checkout of the repository (editable installs).
STANDIN_DIR = Path(__file__).resolve().parents[2] / "tests" / "shim"
# Meta's package and the modules it imports that sam2serve does not install.
REQUIREMENTS = {"sam2": "sam2==1.1.0", "hydra": "hydra-core", "iopath": "iopath"}
TORCHVISION_MISSING = "torchvision (or a checkout of the sam2serve repository: its stand-in)"
MISSING_MESSAGE = (
    "mode 'reference' needs Meta's sam2 package, which is not installed here ({missing}); "
    "install it with: pip install hydra-core iopath && pip install --no-deps "
    "--no-build-isolation sam2==1.1.0 (Meta's code also imports torchvision: without it, "
    "run the benchmark from a checkout of the repository, whose tests/shim stands in)"
)


def missing_requirements() -> list[str]:
    """The packages mode ``reference`` needs that cannot be imported (without importing
    them: importing sam2 initialises Hydra)."""
    missing = [
        package
        for module, package in REQUIREMENTS.items()
        if importlib.util.find_spec(module) is None
    ]
    standin = (STANDIN_DIR / "torchvision" / "__init__.py").is_file()
    if importlib.util.find_spec("torchvision") is None and not standin:
        missing.append(TORCHVISION_MISSING)
    return missing


def _real_torchvision_importable() -> bool:
    try:
        import torchvision  # noqa: F401
    except (ImportError, OSError, RuntimeError, AttributeError):  # missing or broken build
        for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
            del sys.modules[name]
        return False
    return True


def activate() -> str:
    """Make ``import sam2`` work in this process; returns which torchvision it will use."""
    missing = missing_requirements()
    if missing:
        raise RuntimeError(MISSING_MESSAGE.format(missing=", ".join(missing)))
    if str(STANDIN_DIR) in sys.path:
        return "sam2serve stand-in"
    if _real_torchvision_importable():
        return "torchvision"
    sys.path.insert(0, str(STANDIN_DIR))
    return "sam2serve stand-in"


def meta_config_name(size: str, checkpoint: Path | None = None) -> str:
    """Meta's Hydra config for ``size``: SAM 2.0's for a ``sam2_hiera_*`` file, else 2.1's."""
    letter = META_SIZES[size]
    if checkpoint is not None and checkpoint.name.startswith("sam2_hiera"):
        return f"configs/sam2/sam2_hiera_{letter}.yaml"
    return f"configs/sam2.1/sam2.1_hiera_{letter}.yaml"


def build_meta_model(size: str, checkpoint: Path | None, device: str = "cpu") -> torch.nn.Module:
    """Meta's SAM2Base via ``build_sam2`` (its defaults, as its users call it); with no
    checkpoint, Meta's own initialisation under a fixed seed."""
    activate()
    warnings.filterwarnings("ignore", module="hydra")
    warnings.filterwarnings("ignore", category=UserWarning, message=".*register_new_resolver.*")
    from sam2.build_sam import build_sam2

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(1234)
        config = meta_config_name(size, checkpoint)
        return build_sam2(config, str(checkpoint) if checkpoint else None, device)


class _TimedTransforms:
    """Meta's SAM2Transforms with its two heavy calls timed; the rest passes through."""

    def __init__(self, transforms: Any, timer: Callable[[], StageTimer | None]) -> None:
        self._transforms = transforms
        self._timer = timer

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transforms, name)

    def __call__(self, image: Any) -> Any:
        return _timed(self._timer, "preprocess", self._transforms, image)

    def postprocess_masks(self, *args: Any, **kwargs: Any) -> Any:
        return _timed(
            self._timer, "postprocess", self._transforms.postprocess_masks, *args, **kwargs
        )


def _timed(
    timer: Callable[[], StageTimer | None],
    stage: str,
    function: Callable,
    *args: Any,
    **kwargs: Any,
) -> Any:
    current = timer()
    if current is None:
        return function(*args, **kwargs)
    with current.stage(stage):
        return function(*args, **kwargs)


class ReferenceRunner:
    """Meta's code for one task; ``runner(image_bytes, points, timer) -> records``."""

    def __init__(
        self,
        task: str,
        size: str,
        checkpoint: Path,
        device: str,
        params: AMGParams,
        autocast_bf16: bool = False,
    ) -> None:
        self.torchvision = activate()
        # Mode reference-bf16: Meta's code under torch.autocast(bfloat16), as its README
        # suggests for speed (its image predictor runs whatever autocast is active).
        self.autocast = torch.autocast(torch.device(device).type, torch.bfloat16, autocast_bf16)
        import sam2.automatic_mask_generator as meta_amg
        from sam2.sam2_image_predictor import SAM2ImagePredictor
        from sam2.utils.amg import mask_to_rle_pytorch

        self.task = task
        self.timer: StageTimer | None = None
        model = build_meta_model(size, checkpoint, device)
        if task == "amg":
            self.generator = meta_amg.SAM2AutomaticMaskGenerator(model, **_meta_amg_kwargs(params))
            predictor = self.generator.predictor
            # Meta's generator calls this module global once per batch of masks.
            meta_amg.mask_to_rle_pytorch = self._timed_function("rle", mask_to_rle_pytorch)
        else:
            predictor = SAM2ImagePredictor(model)
        self.mask_to_rle = mask_to_rle_pytorch
        predictor.set_image = self._timed_function("encode", predictor.set_image)
        predictor._predict = self._timed_function("decode_masks", predictor._predict)
        predictor._transforms = _TimedTransforms(predictor._transforms, lambda: self.timer)
        self.predictor = predictor

    def _timed_function(self, stage: str, function: Callable) -> Callable:
        def timed(*args: Any, **kwargs: Any) -> Any:
            return _timed(lambda: self.timer, stage, function, *args, **kwargs)

        return timed

    def __call__(
        self, image: bytes, points: Sequence[Sequence[float]] | None, timer: StageTimer
    ) -> list[dict[str, Any]]:
        self.timer = timer
        try:
            pixels = decode(image, timer)
            with torch.no_grad(), self.autocast:
                if self.task == "amg":
                    return self._amg(pixels, timer)
                return self._points(pixels, points or [], timer)
        finally:
            self.timer = None

    def _amg(self, pixels: np.ndarray, timer: StageTimer) -> list[dict[str, Any]]:
        with timer.stage("postprocess"):
            records = self.generator.generate(pixels)
        with timer.stage("rle"):
            return [
                {"segmentation": rle_to_coco(r["segmentation"]), "area": int(r["area"])}
                for r in records
            ]

    def _points(
        self, pixels: np.ndarray, points: Sequence[Sequence[float]], timer: StageTimer
    ) -> list[dict[str, Any]]:
        """As the published baseline: set_image, then predict() once per point (SPS: the
        one point), the best of 3 masks by score, then mask_to_rle_pytorch."""
        self.predictor.set_image(pixels)
        masks = []
        for point in points:
            with timer.stage("postprocess"):  # predict's own prompt handling and numpy copies
                candidates, scores, _ = self.predictor.predict(
                    point_coords=np.asarray([point], dtype=np.float32),
                    point_labels=np.asarray([1]),
                    multimask_output=True,
                    return_logits=False,
                )
                masks.append(torch.from_numpy(candidates[int(np.argmax(scores))]).to(torch.bool))
        if not masks:
            return []
        with timer.stage("rle"):
            rles = self.mask_to_rle(torch.stack(masks))
            return [{"segmentation": rle_to_coco(rle), "area": area_from_rle(rle)} for rle in rles]


def _meta_amg_kwargs(params: AMGParams) -> dict[str, Any]:
    """SAM2AutomaticMaskGenerator's keyword arguments for our parameters (the same names)."""
    kwargs = params.to_dict()
    kwargs["output_mode"] = "uncompressed_rle"  # COCO strings are made with ours, timed as RLE
    if kwargs["point_grids"] is not None:
        kwargs["point_grids"] = [
            np.asarray(grid, dtype=np.float64) for grid in kwargs["point_grids"]
        ]
    return kwargs
