"""The inputs of ``sam2serve run``, checked before the model loads: image arguments
(files, directories, ``samples``), the prompts file of the point tasks, the mask filters
and the ``--coco`` file's directory.

What the command line gets wrong is a usage error (exit 2) before any work: an image
file that does not exist, a directory without images, two images that would write the
same outputs, a prompts file that is unreadable, malformed (a label other than 0 or 1, an
empty box, ...), names an image not given, or holds a point or box outside its image (read
from the image's header); a filter out of range, a --coco directory that takes no file.
What can only be found by decoding an image (a corrupt file) fails that image alone (exit
1 at the end).
"""

from __future__ import annotations

import json
import os
import re
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from sam2serve.commands.common import SAMPLES_ARG, ItemFailure, UsageError
from sam2serve.engine.prompts import Prompt, PromptError, prompts_from_json
from sam2serve.samples import SAMPLE_NAMES, load_sample

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".webp", ".bmp", ".tif", ".tiff")
MASKS_SUFFIX = "_masks.json"
DEFAULT_PROMPTS_NAME = "prompts.json"
Points = list[list[float]]  # what annotate writes: [x, y] clicks
# EXIF orientations that rotate the image by 90 degrees (load_image applies them).
_TRANSPOSING_ORIENTATIONS = (5, 6, 7, 8)
# Python's repr of a stream, which Pillow puts in some messages: "<_io.BytesIO object at
# 0x7f...>", "<_io.BufferedReader name='x.jpg'>". The message names the file already.
_STREAM_REPR = re.compile(r"\s*<_io\.\w+[^>]*>")


@dataclass(frozen=True)
class ImageInput:
    """One image to process: a file or a bundled sample."""

    name: str  # the image's file name (or sample name): the JSON "image" and prompts key
    stem: str  # prefix of the output files
    path: Path | None = None
    sample: str | None = None

    def describe(self) -> str:
        return f"sample {self.sample!r}" if self.sample else repr(str(self.path))

    def read(self) -> bytes | np.ndarray:
        """Encoded bytes of a file, or a sample's array; reading is not timed."""
        if self.sample is not None:
            return load_sample(self.sample)
        assert self.path is not None
        try:
            return self.path.read_bytes()
        except FileNotFoundError:
            raise ItemFailure(f"image file not found: {str(self.path)!r}") from None
        except OSError as exc:
            raise ItemFailure(
                f"cannot read image file {str(self.path)!r}: {exc.strerror}"
            ) from None

    def decode(self, source: bytes | np.ndarray, decoder: Any = None) -> Any:
        """uint8 RGB pixels (a tensor on the device where ``decoder``, an
        engine.decode_choice.ImageDecoder, decoded a file there); the error names the file
        (decoding bytes cannot)."""
        from sam2serve.engine.image import DEFAULT_MAX_PIXELS, ImageError, load_image

        try:
            if decoder is not None and isinstance(source, bytes):
                return decoder.decode(source, DEFAULT_MAX_PIXELS)
            return load_image(source)
        except ImageError as exc:
            message = str(exc)
        if self.path is not None:
            try:
                load_image(self.path)  # only to get the message with the file's name
            except ImageError as exc:
                message = str(exc)
        raise ItemFailure(clean_image_message(message))

    def size(self) -> tuple[int, int] | None:
        """(height, width) as decoding will give it, from the header only; None if the
        header cannot be read (decoding will say why)."""
        if self.sample is not None:
            return load_sample(self.sample).shape[:2]
        from PIL import Image

        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # large images: the decoder checks them
                assert self.path is not None  # an input is a sample or a file
                with Image.open(self.path) as image:
                    width, height = image.size
                    orientation = image.getexif().get(0x0112)
        except (OSError, SyntaxError, ValueError, Image.DecompressionBombError):
            return None
        if orientation in _TRANSPOSING_ORIENTATIONS:
            width, height = height, width
        return height, width


def clean_image_message(message: str) -> str:
    """An image error without Python reprs of streams."""
    message = _STREAM_REPR.sub("", message)
    return message.replace("cannot identify image file", "not a format Pillow can open")


def add_images_argument(parser: Any) -> None:
    """The IMAGES_OR_DIRS positional of the commands that read images (see expand_images)."""
    parser.add_argument(
        "images",
        nargs="+",
        metavar="IMAGES_OR_DIRS",
        help=f"image files, directories of images, or '{SAMPLES_ARG}'",
    )


def expand_images(arguments: Sequence[str]) -> list[ImageInput]:
    """Files, directories (their image files, sorted) and 'samples', in argument order; an
    argument that yields no image is a usage error."""
    items: list[ImageInput] = []
    for argument in arguments:
        if argument == SAMPLES_ARG:
            items += [ImageInput(name, name, sample=name) for name in SAMPLE_NAMES]
            continue
        path = Path(argument)
        if path.is_dir():
            files = sorted(
                p for p in path.iterdir() if p.is_file() and p.suffix.lower() in IMAGE_EXTENSIONS
            )
            if not files:
                raise UsageError(
                    f"no image files ({' '.join(IMAGE_EXTENSIONS)}) in directory {str(path)!r}"
                )
            items += [ImageInput(p.name, p.stem, path=p) for p in files]
        elif path.is_file():
            items.append(ImageInput(path.name, path.stem, path=path))
        elif path.exists():
            raise UsageError(f"image argument {argument!r} is neither a file nor a directory")
        else:
            hint = (
                f" ('{SAMPLES_ARG}' is the bundled photos)" if argument.lower() == "sample" else ""
            )
            raise UsageError(f"image file not found: {argument!r}{hint}")
    return _deduplicate(items)


def _deduplicate(items: list[ImageInput]) -> list[ImageInput]:
    """Drop repeats of one file; refuse two images that would write the same outputs."""
    seen: set[str] = set()
    by_stem: dict[str, ImageInput] = {}
    unique = []
    for item in items:
        identity = item.sample or str(item.path.resolve() if item.path else item.name)
        if identity in seen:
            continue
        seen.add(identity)
        other = by_stem.get(item.stem)
        if other is not None:
            raise UsageError(
                f"images {other.describe()} and {item.describe()} would both write "
                f"{item.stem}{MASKS_SUFFIX}; rename one or run them separately"
            )
        by_stem[item.stem] = item
        unique.append(item)
    return unique


# --------------------------------------------------------------------------- outputs


def check_filters(min_score: float | None, max_masks: int | None) -> None:
    """--min-score and --max-masks, the mask filters of every output."""
    if min_score is not None and not 0.0 <= min_score <= 1.0:  # NaN fails too
        raise UsageError(
            f"--min-score must be a number in [0, 1] (a predicted IoU), got {min_score}"
        )
    if max_masks is not None and max_masks < 1:
        raise UsageError(f"--max-masks must be an integer >= 1, got {max_masks}")


def check_coco_file(path: Path) -> None:
    """The --coco file's directory exists (or is made) and takes a new file: found now,
    not after the whole run."""
    if path.is_dir():
        raise UsageError(f"--coco {str(path)!r} is a directory; give a file name")
    directory = path.parent
    try:
        directory.mkdir(parents=True, exist_ok=True)
        probe = directory / f".{path.name}.{os.getpid()}.probe"
        probe.touch(exist_ok=False)
        probe.unlink()
    except OSError as exc:
        raise UsageError(
            f"--coco {str(path)!r}: cannot write in directory {str(directory)!r} "
            f"({exc.strerror or exc})"
        ) from None


# --------------------------------------------------------------------------- prompts

# The prompts of an image: engine.prompts reads each (a point [x, y], or an object
# {"points": [[x, y], ...], "labels": [1, 0, ...], "box": [x0, y0, x1, y1]}) and checks it.
Prompts = list[Prompt]
T = TypeVar("T")


def load_prompts(path: Path) -> dict[str, Prompts]:
    """A prompts file: a JSON object mapping image name (or stem) to a list of prompts,
    each a point [x, y] or an object with points, labels (1 foreground, 0 background)
    and a box."""
    data = read_prompts_json(path, 'a JSON object like {"photo.jpg": [[x, y], ...], ...}')
    prompts: dict[str, Prompts] = {}
    for key, entry in data.items():
        try:
            prompts[key] = prompts_from_json(entry)
        except PromptError as exc:
            raise UsageError(exc.at(f"--prompts file {str(path)!r}, image {key!r}")) from None
    return prompts


def read_prompts_json(path: Path, expected: str) -> dict[str, Any]:
    """The --prompts file's JSON object (``expected`` says what it should hold)."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UsageError(f"--prompts file not found: {str(path)!r}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read --prompts file {str(path)!r}: {exc}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"--prompts file {str(path)!r} is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise UsageError(
            f"--prompts file {str(path)!r} must hold {expected}, got a {type(data).__name__}"
        )
    return data


def match_prompts(
    prompts: dict[str, Prompts], images: list[ImageInput], path: Path
) -> dict[str, Prompts]:
    """Prompts by image name; every key must name a given image (by file name or stem),
    and every point and box must lie inside its image."""
    matched = match_images(prompts, images, path)
    for name, entry in matched.items():
        _check_inside(entry, next(item for item in images if item.name == name), path)
    return matched


def match_images(entries: dict[str, T], images: list[ImageInput], path: Path) -> dict[str, T]:
    """A --prompts file's entries by image name: every key must name a given image (by
    file name or stem), and no image may have two entries."""
    by_name = {item.name: item for item in images}
    by_stem = {item.stem: item for item in images}
    matched: dict[str, T] = {}
    unknown = []
    for key, entry in entries.items():
        item = by_name.get(key) or by_stem.get(key)
        if item is None:
            unknown.append(key)
            continue
        if item.name in matched:
            raise UsageError(
                f"--prompts file {str(path)!r} has two entries for image {item.name!r}"
            )
        matched[item.name] = entry
    if unknown:
        shown = ", ".join(repr(k) for k in unknown[:5]) + (" ..." if len(unknown) > 5 else "")
        raise UsageError(
            f"--prompts file {str(path)!r} names {len(unknown)} image(s) not given on the "
            f"command line: {shown}; give those images too, or remove them from the file"
        )
    return matched


def _check_inside(entry: Prompts, item: ImageInput, path: Path) -> None:
    size = item.size() if entry else None
    if size is None:
        return
    height, width = size
    for index, prompt in enumerate(entry):
        try:
            prompt.check_inside(width, height)
        except PromptError as exc:
            where = f"--prompts file {str(path)!r}: image {item.name!r}"
            # A bare click is one point: its entry names it, "points[0]" would not help.
            message = (
                f"{where}, point {index}: {exc.problem}"
                if prompt.bare_click
                else exc.at(f"{where}, object {index}")
            )
            raise UsageError(f"{message} (are the prompts for another image?)") from None
