"""``sam2serve track``'s prompts: the --prompts file ({frame: {object id: prompt}}) read and
checked against the video, and the sample clip's prompts."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sam2serve.commands.common import UsageError
from sam2serve.engine.prompts import Prompt, PromptError


@dataclass(frozen=True)
class FramePrompt:
    """An object's prompt on one frame."""

    frame: int
    obj_id: int
    prompt: Prompt


def load_video_prompts(path: Path) -> list[FramePrompt]:
    """The --prompts file: {frame: {object id: {points, labels, box}}}, every value checked
    (the message names the frame, the object and the bad value)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UsageError(f"--prompts file not found: {str(path)!r}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read --prompts file {str(path)!r}: {exc}") from None
    except json.JSONDecodeError as exc:
        raise UsageError(f"--prompts file {str(path)!r} is not valid JSON: {exc}") from None
    expected = 'a JSON object like {"0": {"1": {"points": [[x, y]], "labels": [1]}}}'
    if not isinstance(data, dict) or not data:
        raise UsageError(f"--prompts file {str(path)!r} must hold {expected}")
    prompts = []
    for frame_key, objects in data.items():
        frame = _index(frame_key, "frame", f"--prompts file {str(path)!r}")
        where = f"--prompts file {str(path)!r}, frame {frame_key!r}"
        if not isinstance(objects, dict) or not objects:
            raise UsageError(f"{where}: expected object id -> prompt, got {objects!r:.80}")
        for obj_key, entry in objects.items():
            obj_id = _index(obj_key, "object id", where)
            if not isinstance(entry, dict):
                raise UsageError(
                    f"{where}, object {obj_key!r}: expected "
                    f'{{"points": [[x, y], ...], "labels": [...], "box": [...]}}, got {entry!r:.80}'
                )
            try:
                prompt = Prompt.from_json(entry)
            except PromptError as exc:
                raise UsageError(exc.at(f"{where}, object {obj_key!r}")) from None
            prompts.append(FramePrompt(frame, obj_id, prompt))
    return prompts


def _index(key: str, what: str, where: str) -> int:
    if not key.isdigit():
        raise UsageError(f"{where}: {what} {key!r} is not a non-negative integer")
    return int(key)


def check_prompts(
    prompts: list[FramePrompt], num_frames: int, size: tuple[int, int], path: Path | None
) -> None:
    """Every prompt on a frame of the video and inside it."""
    height, width = size
    where = "the prompts" if path is None else f"--prompts file {str(path)!r}"
    for prompt in prompts:
        if prompt.frame >= num_frames:
            raise UsageError(
                f"{where}: frame {prompt.frame} is past the video's last frame "
                f"({num_frames} frames: 0 to {num_frames - 1})"
            )
        try:
            prompt.prompt.check_inside(width, height, "frame")
        except PromptError as exc:
            raise UsageError(
                exc.at(f"{where}, frame {prompt.frame}, object {prompt.obj_id}")
            ) from None


def sample_prompts(frames: list[Any]) -> list[FramePrompt]:
    """The sample clip's prompts: a click at the centre of the disc and a box around the
    square, on frame 0, from the clip's true masks."""
    from sam2serve.samples import sample_clip, sample_clip_prompts

    height, width = frames[0].shape[:2]
    _, truth = sample_clip(len(frames), (height, width))
    return [
        FramePrompt(0, obj_id, Prompt.from_json(prompt))
        for obj_id, prompt in sample_clip_prompts(truth).items()
    ]
