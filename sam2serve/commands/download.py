"""``sam2serve download``: Meta's checkpoint files into the cache, checked before they land."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from sam2serve.commands.common import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_STATUS_HELP,
    EXIT_USAGE,
    PROG,
    CommandParser,
    UsageError,
    add_command,
    error_line,
    info_line,
    warning_line,
)
from sam2serve.config import HF_MODEL_IDS, MODEL_SIZES, parse_hf_id
from sam2serve.config_text import http_url, parse_number, sha256_digest, shown

ALL = "all"
SAM3 = "sam3"  # SAM 3 (concepts): Meta's sam3.pt + tokenizer from the gated facebook/sam3
DEFAULT_TIMEOUT_S = 3600.0
# Kept equal to sam2serve.checkpoint's (which imports torch; this module must not).
URL_BASE_ENV = "SAM2SERVE_CHECKPOINT_URL_BASE"
SAM20_IDS = tuple(name.replace("sam2.1-", "sam2-") for name in HF_MODEL_IDS)


def _wrapped(names: tuple[str, ...]) -> str:
    import textwrap

    return textwrap.fill(
        ", ".join(names),
        width=90,
        initial_indent="  ",
        subsequent_indent="  ",
        break_on_hyphens=False,
    )


DESCRIPTION = f"""\
Download Meta's official checkpoint files into the cache's checkpoints folder
($SAM2SERVE_CACHE/checkpoints, else ~/.cache/sam2serve/checkpoints), where every command
finds them.

Each file is fetched with a progress bar into FILE.part beside it; a download that was cut
(network, Ctrl-C) resumes from there the next time (an HTTP Range request). --timeout is
wall-clock time per file, retries included: a server that stalls or drips its bytes is cut
off there. Cut connections, stalls and 408/429/5xx answers are retried with growing waits
until then; a malformed URL, an unknown host, a refused connection (a wrong port), a
certificate that does not verify and any other 4xx fail at once, in one line.

What lands is checked: never more bytes than the server declared or than such a file can
have (the download stops at the first byte too many); the digest the server publishes, when
it publishes one (Hugging Face's X-Linked-Etag: sha256; an S3/CloudFront single-part ETag:
MD5), or the one --sha256 pins; every record's CRC-32 (a flipped bit); every key of the
official model with its shape, and no other (the SAM 2.1 video model's keys; SAM 2.0's
files: the image model's). Only then is it renamed into place, and its sha256 written
beside it (FILE.sha256); a file that fails is deleted and a file already there is not
touched. A file already in the folder that passes the checks (and matches its FILE.sha256
and --sha256) is reported and skipped.

--model takes a size, {ALL} (the four SAM 2.1 files), or a Hugging Face id:
{_wrapped(HF_MODEL_IDS)}
or SAM 2.0's (files sam2_hiera_*.pt, which commands use with --checkpoint, or from the
cache when no SAM 2.1 file of the size is there):
{_wrapped(SAM20_IDS)}

--model {SAM3}: SAM 3 for concept prompts (sam3.pt, vocab.json, merges.txt from
huggingface.co/facebook/sam3 into the cache's sam3 folder). Its weights are under the SAM
License and gated: accept it on that page, then set HF_TOKEN to a token of that account
(sent to that host only, never to a redirect elsewhere). --url-base replaces
https://huggingface.co/facebook/sam3/resolve/main.

Examples:
  {PROG} download                                   # tiny, SAM 2.1
  {PROG} download --model facebook/sam2.1-hiera-large
  {PROG} download --model {ALL} --url-base https://mirror.example/sam2
  {PROG} download --model tiny --sha256 HEX         # only this exact file

{EXIT_STATUS_HELP}
(here 2 also: a file whose digest is not the one its server publishes or --sha256 pins)
"""


def register(subcommands: argparse._SubParsersAction) -> None:
    add_command(
        subcommands,
        "download",
        help="official checkpoints into the cache: resumed, retried, checked",
        description=DESCRIPTION,
        handler=download_command,
        add_arguments=add_arguments,
    )


def targets(value: str) -> tuple[tuple[str, bool | None], ...]:
    """The files ``--model VALUE`` asks for, as (size, is SAM 2.1; None for SAM 3)."""
    if value == ALL:
        return tuple((size, True) for size in MODEL_SIZES)
    if value in MODEL_SIZES:
        return ((value, True),)
    if value == SAM3:
        return ((SAM3, None),)
    hf = parse_hf_id(value)
    if hf is None:
        accepted = ", ".join((*MODEL_SIZES, ALL, SAM3, *HF_MODEL_IDS, *SAM20_IDS))
        raise argparse.ArgumentTypeError(f"invalid choice: {value!r} (choose from {accepted})")
    return (hf,)


def url_base_value(value: str) -> str:
    """--url-base and $SAM2SERVE_CHECKPOINT_URL_BASE (sam2serve.config_text)."""
    return http_url(value)


def sha256_value(value: str) -> str:
    """--sha256 (sam2serve.config_text)."""
    return sha256_digest(value)


def seconds_value(value: str) -> float:
    """--timeout: a plain number (sam2serve.config_text), > 0."""
    try:
        return parse_number(value, low=0, low_open=True)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a number of seconds > 0, got {shown(value)}"
        ) from None


def add_arguments(parser: CommandParser) -> None:
    parser.add_argument(
        "--model",
        type=targets,
        default=targets("tiny"),
        metavar="NAME",
        help=f"tiny, small, base_plus, large, {ALL}, {SAM3}, or a Hugging Face id (see above) "
        "(default: tiny)",
    )
    parser.add_argument(
        "--url-base",
        type=url_base_value,
        default=None,
        metavar="URL",
        help=f"fetch URL/FILE from a mirror instead of Meta's servers (default: "
        f"${URL_BASE_ENV} if set, else Meta's URLs)",
    )
    parser.add_argument(
        "--timeout",
        type=seconds_value,
        default=DEFAULT_TIMEOUT_S,
        metavar="S",
        help="give up on a file after this long, retries included (default: %(default)g)",
    )
    parser.add_argument(
        "--sha256",
        type=sha256_value,
        default=None,
        metavar="HEX",
        help="the file's sha256: a download that does not match is refused, and a file "
        f"there that does not match is fetched again (one --model; {SAM3}: sam3.pt's)",
    )
    parser.add_argument(
        "--force",
        action="store_true",
        help="download again even if a valid file is there (it is replaced only once the "
        "new one is checked)",
    )


def download_command(args: argparse.Namespace) -> int:
    url_base = args.url_base
    if url_base is None and os.environ.get(URL_BASE_ENV):
        try:
            url_base = url_base_value(os.environ[URL_BASE_ENV])
        except argparse.ArgumentTypeError as exc:
            raise UsageError(f"${URL_BASE_ENV}: {exc}") from None
    if args.sha256 is not None and len(args.model) > 1:
        raise UsageError("--sha256 pins one file: name one --model, not all")
    codes = [
        download_sam3(url_base, args.timeout, args.force, args.sha256)
        if sam21 is None
        else download_one(size, sam21, url_base, args.timeout, args.force, args.sha256)
        for size, sam21 in args.model
    ]
    # a refused digest (2) outranks a failed download (1)
    return max(codes, default=EXIT_OK)


def download_one(
    size: str,
    sam21: bool,
    url_base: str | None,
    timeout: float,
    force: bool,
    sha256: str | None = None,
) -> int:
    """One file, reported on stderr; its exit status (an error line unless 0)."""
    from sam2serve.checkpoint import (
        CheckpointError,
        cache_dir,
        checkpoint_file,
        checkpoint_url,
        fetch_checkpoint,
        verify_checkpoint,
    )
    from sam2serve.download import DigestMismatch, DownloadError, part_path, shown_url

    name = checkpoint_file(size, sam21)
    dest: Path = cache_dir() / name
    if dest.is_file() and not force:
        try:
            verify_checkpoint(size, dest, video=sam21)
        except CheckpointError as exc:
            reason = str(exc) if exc.__cause__ is None else type(exc.__cause__).__name__
            warning_line(
                f"{str(dest)!r} is not a valid {size} checkpoint ({reason}); downloading it again"
            )
        else:
            mismatch = _digest_mismatch(dest, sha256)
            if mismatch is None:
                info_line(
                    f"{size}: {str(dest)!r} is there and loads ({dest.stat().st_size} bytes); "
                    "skipped (--force downloads it again)"
                )
                return EXIT_OK
            warning_line(f"{str(dest)!r} {mismatch}; downloading it again")
    if force:
        part_path(dest).unlink(missing_ok=True)  # a fresh download, not a resumed one
    url = checkpoint_url(name, url_base)
    info_line(f"{size}: {shown_url(url)} -> {str(dest)!r}")
    try:
        # replace: a file there now is one that did not pass, or --force; it is replaced
        # only by one that passes every check
        fetch_checkpoint(
            size, sam21=sam21, url_base=url_base, deadline_s=timeout, replace=True, sha256=sha256
        )
    except DigestMismatch as exc:
        error_line(str(exc))
        return EXIT_USAGE
    except (DownloadError, CheckpointError) as exc:
        error_line(str(exc))
        return EXIT_FAILED
    except OSError as exc:  # the cache folder cannot be written
        error_line(f"cannot write {str(dest)!r}: {exc.strerror or exc}")
        return EXIT_FAILED
    info_line(f"{size}: downloaded and checked: {str(dest)!r}")
    return EXIT_OK


def _digest_mismatch(dest: Path, pinned: str | None) -> str | None:
    """Why the file at ``dest`` is not the one to keep (its sha256 is not the one recorded
    when it was downloaded, or not the pinned one), or None."""
    from sam2serve.download import record_sha256, recorded_sha256, sha256_of

    recorded = recorded_sha256(dest)
    if recorded is None and pinned is None:
        return None
    actual = sha256_of(dest)
    if recorded is not None and actual != recorded:
        return f"has sha256 {actual}, not the {recorded} recorded when it was downloaded"
    if pinned is not None and actual != pinned:
        return f"has sha256 {actual}, not the pinned {pinned} (--sha256)"
    if recorded is None:
        record_sha256(dest, actual)  # it is the pinned file: say so beside it
    return None


def download_sam3(url_base: str | None, timeout: float, force: bool, sha256: str | None) -> int:
    """SAM 3's files, reported on stderr; the exit status (an error line unless 0)."""
    from sam2serve.concepts.weights import LICENCE, WeightsError, download, hf_token
    from sam2serve.download import DigestMismatch

    info_line(f"{SAM3}: weights under the {LICENCE}")
    if hf_token() is None and url_base is None:
        warning_line(f"{SAM3}: HF_TOKEN is not set; the gated repository will refuse")
    try:
        directory = download(url_base, timeout, force, sha256)
    except DigestMismatch as exc:
        error_line(str(exc))
        return EXIT_USAGE
    except WeightsError as exc:
        error_line(str(exc))
        return EXIT_FAILED
    except OSError as exc:  # the cache folder cannot be written
        error_line(f"cannot write the SAM 3 weights: {exc.strerror or exc}")
        return EXIT_FAILED
    info_line(f"{SAM3}: downloaded and checked: {str(directory)!r}")
    return EXIT_OK
