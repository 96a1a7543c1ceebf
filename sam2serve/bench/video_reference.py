"""Row ``reference`` of the video task: Meta's own ``SAM2VideoPredictor`` on the same
weights, run as its users run it.

Only the reference worker process imports this module: :func:`~sam2serve.bench.reference.activate`
puts the torchvision stand-in on ``sys.path`` when the real one is missing, as for the
image reference rows. The predictor is built by Meta's ``build_sam2_video_predictor``
(Hydra config, strict checkpoint loading), reads the clip's JPEG folder itself
(``init_state``), takes the prompts with ``add_new_points_or_box`` and tracks with
``propagate_in_video``; Meta's code is not modified.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from sam2serve.bench.reference import activate, meta_config_name

__all__ = ["MetaVideoTracker", "tensor_bytes"]


class MetaVideoTracker:
    """The bench worker's tracker interface over Meta's video predictor."""

    dtype = "float32"  # Meta's predictor as built: no autocast
    objects_per_call = 1  # its propagation runs each object's frame step on its own

    def __init__(self, size: str, checkpoint: Path, device: str) -> None:
        activate()
        warnings.filterwarnings("ignore", module="hydra")
        warnings.filterwarnings("ignore", category=UserWarning, message=".*register_new_resolver.*")
        warnings.filterwarnings("ignore", message=".*cannot import name '_C'.*")
        from sam2.build_sam import build_sam2_video_predictor

        config = meta_config_name(size, checkpoint)
        self.predictor = build_sam2_video_predictor(config, str(checkpoint), device=device)

    def start(self, frames_dir: str) -> dict[str, Any]:
        return self.predictor.init_state(frames_dir)

    def prompt(self, state: dict[str, Any], obj_id: int, prompt: dict[str, Any]) -> None:
        self.predictor.add_new_points_or_box(
            state,
            0,
            obj_id,
            points=prompt["points"] or None,
            labels=prompt["labels"] or None,
            box=prompt["box"],
        )

    def propagate(self, state: dict[str, Any]) -> Iterator[tuple[int, list[int], torch.Tensor]]:
        yield from self.predictor.propagate_in_video(state)

    def held_bytes(self, state: dict[str, Any]) -> tuple[int, int]:
        """(the objects' memories, masks, pointers and mask prompts, as ours counts them;
        the frames: Meta keeps every frame resized to 1024x1024 float32)."""
        objects = tensor_bytes(
            [
                state["output_dict_per_obj"],
                state["temp_output_dict_per_obj"],
                state["mask_inputs_per_obj"],
            ]
        )
        return objects, tensor_bytes(state["images"])


def tensor_bytes(value: Any) -> int:
    """Bytes of the distinct tensor storages in nested dicts / lists / tuples (Meta's
    outputs share one ``maskmem_pos_enc``, expanded per object: counted once)."""
    seen: set[int] = set()
    total = 0
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, torch.Tensor):
            storage = item.untyped_storage()
            if storage.data_ptr() not in seen:
                seen.add(storage.data_ptr())
                total += storage.nbytes()
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
    return total
