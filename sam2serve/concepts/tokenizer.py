"""SAM 3's tokenizer: Meta's text cleaning, then CLIP's byte-level BPE.

The ids are the ones Meta's ``SimpleTokenizer`` (``sam3.model.tokenizer_ve``) gives SAM 3's
text encoder. Cleaning, in Meta's order: ``ftfy.fix_text`` (mojibake, curly quotes,
full-width letters, ligatures, NFC), HTML entities unescaped twice, whitespace runs made one
space, trimmed, lower-cased. The cleaned text is cut into words by CLIP's pattern (Meta's
two special words first, then English contractions, letter runs, single digits, runs of
anything else); each word's UTF-8 bytes are spelled in CLIP's byte alphabet and merged by
rank. A phrase becomes ``[start] + ids + [end]``.

Two sources of the same vocabulary:

- the files beside SAM 3's weights (``vocab.json`` + ``merges.txt``, from the gated
  ``facebook/sam3`` repository), used whenever a folder holds them;
- CLIP's public BPE file ``bpe_simple_vocab_16e6.txt.gz`` (the first 48,894 merges build the
  49,408-token vocabulary, as Meta's tokenizer builds it), as ``open-clip-torch`` ships it
  (installed ``--no-deps``: only the file is read, the package is never imported), for
  random weights and tests. Its SHA-256 is checked.
"""

from __future__ import annotations

import gzip
import hashlib
import html
import importlib.util
import itertools
import json
from collections import OrderedDict
from functools import cache
from pathlib import Path
from typing import Any

from sam2serve.concepts.weights import WeightsError

CLIP_BPE_FILE = "bpe_simple_vocab_16e6.txt.gz"
CLIP_BPE_SHA256 = "924691ac288e54409236115652ad4aa250f48203de50a9e4722a6ecd48d6804a"
CLIP_BPE_PACKAGE = "open_clip"  # the import name of open-clip-torch
CLIP_BPE_INSTALL = "pip install --no-deps open-clip-torch==3.3.0"
VOCAB_FILES = ("vocab.json", "merges.txt")
VOCAB_SIZE = 49408
# Meta's special words: in a phrase they are the start/end ids, as in Meta's tokenizer
SPECIAL_WORDS = ("<start_of_text>", "<end_of_text>")
HF_SPECIALS = ("<|startoftext|>", "<|endoftext|>")  # their names in vocab.json
WORD_END = "</w>"
WORD_CACHE = 65536  # BPE results kept per tokenizer (bounded: phrases come from users)


class VocabularyError(WeightsError):
    """CLIP's BPE vocabulary is missing or not the expected file (one line)."""


@cache
def byte_alphabet() -> dict[int, str]:
    """CLIP's (GPT-2's) reversible byte -> printable character table: printable Latin-1
    bytes stand for themselves, the other 68 bytes for characters from U+0100 on. The
    order (printable bytes first) is the order of the vocabulary's first 256 ids."""
    kept = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1)]
    kept += range(ord("®"), ord("ÿ") + 1)
    table = {byte: chr(byte) for byte in kept}
    shifted = (byte for byte in range(256) if byte not in table)
    for offset, byte in enumerate(shifted):
        table[byte] = chr(256 + offset)
    return table


@cache
def _patterns() -> tuple[Any, Any]:  # two compiled `regex` patterns (regex is untyped)
    import regex

    specials = "|".join(regex.escape(w) for w in SPECIAL_WORDS)
    words = regex.compile(
        specials + r"|'s|'t|'re|'ve|'m|'ll|'d|[\p{L}]+|[\p{N}]|[^\s\p{L}\p{N}]+",
        regex.IGNORECASE,
    )
    return words, regex.compile(r"\s+")


def clean(text: str) -> str:
    """Meta's cleaning ("lower"): ftfy, HTML unescaped twice, whitespace, lower case."""
    import ftfy

    text = html.unescape(html.unescape(ftfy.fix_text(text))).strip()
    spaced: str = _patterns()[1].sub(" ", text)
    return spaced.strip().lower()


class ClipTokenizer:
    """Phrase -> ``[start] + BPE ids + [end]`` (the engine cuts to the context length)."""

    def __init__(self, encoder: dict[str, int], merges: list[tuple[str, str]]) -> None:
        self.encoder = encoder
        self.ranks = {pair: rank for rank, pair in enumerate(merges)}
        self.start_id = encoder[HF_SPECIALS[0]]
        self.end_id = encoder[HF_SPECIALS[1]]
        self._special = dict(zip(SPECIAL_WORDS, (self.start_id, self.end_id), strict=True))
        self._words: OrderedDict[str, list[int]] = OrderedDict()

    def __call__(self, phrase: str) -> list[int]:
        return [self.start_id, *self.encode(phrase), self.end_id]

    def encode(self, phrase: str) -> list[int]:
        ids: list[int] = []
        for word in _patterns()[0].findall(clean(phrase)):
            ids.extend(self._word_ids(word))
        return ids

    def _word_ids(self, word: str) -> list[int]:
        if word in self._special:
            return [self._special[word]]
        cached = self._words.get(word)
        if cached is not None:
            self._words.move_to_end(word)
            return cached
        alphabet = byte_alphabet()
        spelled = "".join(alphabet[b] for b in word.encode("utf-8"))
        ids = [self.encoder[symbol] for symbol in self._merge(spelled)]
        self._words[word] = ids
        if len(self._words) > WORD_CACHE:
            self._words.popitem(last=False)
        return ids

    def _merge(self, spelled: str) -> list[str]:
        """Merge the word's symbols pair by pair, the lowest-ranked pair first (all its
        occurrences, left to right), until no adjacent pair is a merge."""
        symbols = [*spelled[:-1], spelled[-1] + WORD_END]
        while len(symbols) > 1:
            pairs = itertools.pairwise(symbols)
            rank, best = min((self.ranks.get(p, len(self.ranks)), p) for p in pairs)
            if rank == len(self.ranks):
                break
            merged: list[str] = []
            i = 0
            while i < len(symbols):
                if i + 1 < len(symbols) and (symbols[i], symbols[i + 1]) == best:
                    merged.append(symbols[i] + symbols[i + 1])
                    i += 2
                else:
                    merged.append(symbols[i])
                    i += 1
            symbols = merged
        return symbols

    @classmethod
    def from_clip_bpe(cls, path: Path) -> ClipTokenizer:
        """From CLIP's gzipped merges file, the vocabulary built as Meta builds it: the 256
        byte symbols, the same with the word end, one token per merge, the two specials."""
        try:
            lines = gzip.decompress(path.read_bytes()).decode("utf-8").split("\n")
        except (OSError, UnicodeDecodeError, EOFError) as exc:
            raise VocabularyError(f"{path}: not a gzipped BPE file ({exc})") from None
        count = VOCAB_SIZE - 2 * 256 - 2
        merges = [_pair(line, path) for line in lines[1 : 1 + count]]
        alphabet = list(byte_alphabet().values())
        tokens = [*alphabet, *(c + WORD_END for c in alphabet), *("".join(m) for m in merges)]
        tokens += HF_SPECIALS
        return cls({t: i for i, t in enumerate(tokens)}, merges)

    @classmethod
    def from_vocab_files(cls, directory: Path) -> ClipTokenizer:
        """From ``vocab.json`` (token -> id) and ``merges.txt`` (a ``#version`` header, one
        merge a line), the files of the weights' repository."""
        encoder = json.loads((directory / "vocab.json").read_text(encoding="utf-8"))
        lines = (directory / "merges.txt").read_text(encoding="utf-8").splitlines()
        merges = [_pair(line, directory / "merges.txt") for line in lines if _is_merge(line)]
        missing = [name for name in HF_SPECIALS if name not in encoder]
        if missing:
            raise VocabularyError(f"{directory / 'vocab.json'} has no {missing[0]} token")
        return cls(encoder, merges)


def _is_merge(line: str) -> bool:
    return bool(line.strip()) and not line.startswith("#version")


def _pair(line: str, source: Path) -> tuple[str, str]:
    parts = line.split()
    if len(parts) != 2:
        raise VocabularyError(f"{source}: {line[:40]!r} is not a merge (two symbols)")
    return parts[0], parts[1]


def clip_bpe_path() -> Path:
    """CLIP's public BPE file as open-clip-torch ships it, checked by hash; else one line
    saying how to install it."""
    spec = importlib.util.find_spec(CLIP_BPE_PACKAGE)  # finds the package, imports nothing
    folders = list(spec.submodule_search_locations or []) if spec else []
    for folder in folders:
        path = Path(folder) / CLIP_BPE_FILE
        if path.is_file():
            digest = hashlib.sha256(path.read_bytes()).hexdigest()
            if digest != CLIP_BPE_SHA256:
                raise VocabularyError(f"{path}: not CLIP's BPE file (SHA-256 {digest[:12]}...)")
            return path
    raise VocabularyError(
        f"CLIP's BPE vocabulary ({CLIP_BPE_FILE}) not found: {CLIP_BPE_INSTALL}, "
        "or use SAM 3's weights folder (vocab.json + merges.txt)"
    )


def load_tokenizer(directory: Path | None = None) -> ClipTokenizer:
    """SAM 3's tokenizer: from ``directory``'s ``vocab.json`` + ``merges.txt`` when it holds
    both, else from CLIP's public BPE file (:func:`clip_bpe_path`)."""
    if directory is not None and all((Path(directory) / n).is_file() for n in VOCAB_FILES):
        return ClipTokenizer.from_vocab_files(Path(directory))
    return ClipTokenizer.from_clip_bpe(clip_bpe_path())
