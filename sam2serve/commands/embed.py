"""``sam2serve embed``: encode a dataset ahead of time into a persistent embedding store.

It checks the flags, the images and the store location before the model loads, then for
each image reads its bytes (their SHA-256 is the image's id, as the server issues it),
skips it if the store already holds a complete entry for this runtime, decodes it and
encodes the images in batches, writing each entry write-then-rename. An image that cannot
be read or decoded is reported and skipped (exit 1 at the end); a run stopped at any
point leaves only complete entries, and running it again encodes only what is missing.
"""

from __future__ import annotations

import argparse
import io
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from sam2serve.commands import model as model_flags
from sam2serve.commands.common import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_STATUS_HELP,
    PROG,
    SAMPLES_ARG,
    CommandParser,
    ItemFailure,
    UsageError,
    add_backend_flag,
    add_command,
    add_device_flag,
    add_mode_flag,
    add_model_flag,
    add_threads_flag,
    add_weights_flags,
    error_line,
    info_line,
    positive_int,
)
from sam2serve.commands.inputs import (
    IMAGE_EXTENSIONS,
    ImageInput,
    add_images_argument,
    expand_images,
)
from sam2serve.store.identity import DEFAULT_STORE_DTYPE, STORE_DTYPES
from sam2serve.store.location import StoreError, check_location

DEFAULT_BATCH_SIZE = 4

DESCRIPTION = f"""\
Encode images ahead of time into a persistent embedding store, so that 'serve --store'
answers their clicks without running the image encoder.

An entry is one image's embedding (safetensors), kept under the SHA-256 of the image
file's bytes (the image_id the server issues for the same file) and under the runtime
that made it: model, mode, dtype and the weights (the checkpoint file's SHA-256, or the
random seed). Another checkpoint or mode never reads these entries.

The run is resumable: images with a complete entry are skipped, and entries are written
to a staging file and renamed, so a run killed at any point leaves no damaged entry.

images:
  files, directories (their {" ".join(e.lstrip(".") for e in IMAGE_EXTENSIONS)} files,
  sorted; not recursive) and the word '{SAMPLES_ARG}' (the bundled sample photos, stored
  under the id of their PNG encoding)

store (--store): a directory (created if missing) or an fsspec URI (file://..., memory://
  for tests, s3://... with s3fs installed); '{PROG} serve --store' with the same model
  flags and --store-dtype reads it. Layout: <runtime digest>/identity.json and
  <runtime digest>/<id[:2]>/<id>.safetensors

stderr: a progress bar with ETA, then how many images were encoded, skipped and failed,
  and images/s (reading, decoding, encoding and writing, wall time)

{EXIT_STATUS_HELP}
"""

EPILOG = f"""\
examples:
  {PROG} embed photos/ --store emb/ --checkpoint sam2.1_hiera_tiny.pt
  {PROG} serve --images photos/ --store emb/ --checkpoint sam2.1_hiera_tiny.pt
  {PROG} embed {SAMPLES_ARG} --store /tmp/emb --random-weights --store-dtype float16
"""


def register(subcommands: argparse._SubParsersAction) -> None:
    add_command(
        subcommands,
        "embed",
        help="encode images ahead of time into a persistent embedding store",
        description=DESCRIPTION,
        epilog=EPILOG,
        handler=embed_command,
        add_arguments=add_arguments,
    )


def add_arguments(parser: CommandParser) -> None:
    add_images_argument(parser)
    parser.add_argument(
        "--store",
        required=True,
        metavar="DIR",
        help="the store: a directory (created if missing) or an fsspec URI",
    )
    parser.add_argument(
        "--store-dtype",
        choices=STORE_DTYPES,
        default=DEFAULT_STORE_DTYPE,
        help="precision of the entries: float32 is exact, float16 half the bytes (its "
        "effect on masks: docs/labelling.md) (default: %(default)s)",
    )
    parser.add_argument(
        "--batch-size",
        type=positive_int,
        default=DEFAULT_BATCH_SIZE,
        metavar="N",
        help="images per encoder call (default: %(default)s)",
    )
    model = parser.add_argument_group("model (serve needs the same to read the entries)")
    add_model_flag(model)
    add_mode_flag(model)
    add_backend_flag(model)
    add_device_flag(model)
    add_threads_flag(model)
    add_weights_flags(model)


def embed_command(args: argparse.Namespace) -> int:
    spec = model_flags.runtime_spec(args)
    images = _expand(args.images)
    try:
        check_location(args.store)
    except StoreError as exc:
        raise UsageError(f"--store: {exc}") from None

    from sam2serve.store.embedding_store import EmbeddingStore
    from sam2serve.store.identity import StoreIdentity, embedding_dtype, weights_identity

    predictor = model_flags.build(args, spec)
    try:
        weights = weights_identity(predictor.model.weights_info, args.artifacts)
    except (OSError, ValueError) as exc:
        raise UsageError(f"--store: {exc}") from None
    identity = StoreIdentity(
        spec.model, spec.mode, embedding_dtype(predictor), weights, args.store_dtype
    )
    store = EmbeddingStore(args.store, identity)
    removed = store.remove_stale_staging()
    if removed:
        info_line(f"removed {removed} staging file(s) left by an interrupted run")
    info_line(f"store {args.store!r}: entries in {store.root!r} ({identity.weights})")
    run = EmbedRun(predictor, store, args.batch_size)
    run.embed(images)
    run.print_summary(args.store)
    return EXIT_FAILED if run.failed else EXIT_OK


def _expand(arguments: list[str]) -> list[ImageInput]:
    """Every image of the arguments, each file once. (Argument by argument: two files of
    one name in different directories are different images here, unlike for 'run',
    whose outputs are named after them.)"""
    items: list[ImageInput] = []
    seen: set[str] = set()
    for argument in arguments:
        for item in expand_images([argument]):
            identity = item.sample or str(item.path.resolve() if item.path else item.name)
            if identity not in seen:
                seen.add(identity)
                items.append(item)
    return items


def image_bytes(item: ImageInput) -> bytes:
    """The bytes an image's id is computed from: the file's, or a sample's PNG encoding."""
    source = item.read()
    if isinstance(source, bytes):
        return source
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(source).save(buffer, format="PNG")
    return buffer.getvalue()


@dataclass
class _Pending:
    item: ImageInput
    image_id: str
    pixels: Any


@dataclass
class EmbedRun:
    """One pass over the images: skip the stored, batch the rest through the encoder."""

    predictor: Any
    store: Any  # sam2serve.store.embedding_store.EmbeddingStore
    batch_size: int
    encoded: int = 0
    skipped: int = 0
    failed: list[str] = field(default_factory=list)
    bytes_written: int = 0
    wall_s: float = 0.0

    def embed(self, images: list[ImageInput]) -> None:
        from tqdm import tqdm

        from sam2serve.store.identity import image_id_of

        started = time.perf_counter()
        batch: list[_Pending] = []
        progress = tqdm(
            total=len(images),
            desc=f"{PROG} embed",
            unit="image",
            file=sys.stderr,
            dynamic_ncols=True,
        )
        for item in images:
            try:
                data = image_bytes(item)
                image_id = image_id_of(data)
                if any(p.image_id == image_id for p in batch) or self.store.has(image_id):
                    self.skipped += 1
                    progress.update(1)
                    continue
                batch.append(_Pending(item, image_id, item.decode(data)))
            except ItemFailure as exc:  # unreadable or not an image: it names the file
                self.failed.append(item.name)
                error_line(f"{exc}; skipped")
                progress.update(1)
                continue
            if len(batch) == self.batch_size:
                self._flush(batch, progress)
                batch = []
        if batch:
            self._flush(batch, progress)
        progress.close()
        self.wall_s = time.perf_counter() - started

    def _flush(self, batch: list[_Pending], progress: Any) -> None:
        """One encoder call for the batch, then one entry per image."""
        try:
            embedding = self.predictor.encode([pending.pixels for pending in batch])
        except Exception as exc:  # noqa: BLE001 - one batch must not lose the others
            self._fail([p.item for p in batch], f"encoding failed ({type(exc).__name__}: {exc})")
            progress.update(len(batch))
            return
        for index, pending in enumerate(batch):
            try:
                self.bytes_written += self.store.put(pending.image_id, embedding[index])
            except OSError as exc:
                self._fail([pending.item], f"cannot write its entry ({exc.strerror or exc})")
            else:
                self.encoded += 1
            progress.update(1)
        progress.set_postfix(stored=self.encoded, skipped=self.skipped, refresh=False)

    def _fail(self, items: list[ImageInput], reason: str) -> None:
        for item in items:
            self.failed.append(item.name)
            error_line(f"{item.describe()}: {reason}; skipped")

    def print_summary(self, location: str) -> None:
        shown = ", ".join(self.failed[:10]) + (", ..." if len(self.failed) > 10 else "")
        lines = [
            f"{PROG}: embed: {self.encoded} image(s) encoded into {location!r}, "
            f"{self.skipped} already stored, {len(self.failed)} failed"
            + (f" ({shown})" if self.failed else "")
        ]
        if self.encoded:
            per_second = self.encoded / self.wall_s if self.wall_s > 0 else float("inf")
            lines.append(
                f"{PROG}: {per_second:.2f} images/s (read + decode + encode + write, wall "
                f"{self.wall_s:.1f} s); {self.bytes_written / self.encoded / 2**20:.1f} MiB "
                "per entry"
            )
        print("\n".join(lines), file=sys.stderr)
