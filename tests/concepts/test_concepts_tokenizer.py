"""SAM 3's tokenizer equals Meta's ``SimpleTokenizer`` (sam3's ``tokenizer_ve``) on CLIP's real
BPE vocabulary, for phrases a user could type or paste: entities, curly quotes, full-width
letters, ligatures, emoji, mojibake, control whitespace, long phrases."""

from __future__ import annotations

import gzip
import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
if importlib.util.find_spec("sam3") is None:  # Meta's package: pip install --no-deps sam3
    pytest.skip("Meta's sam3 is not installed", allow_module_level=True)
from hostile_phrases import HOSTILE
from meta_sam3 import import_sam3

from sam2serve.concepts import tokenizer as ours
from sam2serve.concepts.engine import CONTEXT_LENGTH, token_batch


@pytest.fixture(scope="module")
def meta_tokenizer():
    import_sam3()
    from sam3.model.tokenizer_ve import SimpleTokenizer

    return SimpleTokenizer(bpe_path=str(ours.clip_bpe_path()))


@pytest.fixture(scope="module")
def tokenize():
    return ours.load_tokenizer()


@pytest.mark.parametrize("phrase", HOSTILE)
def test_tokens_equal_metas(meta_tokenizer, tokenize, phrase):
    expected = meta_tokenizer([phrase], context_length=CONTEXT_LENGTH)
    got, mask = token_batch(tokenize, [phrase])
    assert got.tolist() == expected.tolist()
    assert mask.tolist() == (expected != 0).long().tolist()
    # and untruncated, every id (Meta's encode is the part between start and end)
    assert tokenize(phrase)[1:-1] == meta_tokenizer.encode(phrase)


def test_long_phrases_are_cut_to_the_context_with_the_end_kept(tokenize):
    ids, mask = token_batch(tokenize, ["x" * 200, "the quick brown fox " * 10])
    assert ids.shape == (2, CONTEXT_LENGTH) and bool(mask.all())
    assert ids[:, 0].tolist() == [tokenize.start_id] * 2
    assert ids[:, -1].tolist() == [tokenize.end_id] * 2


def test_cleaning_is_metas(meta_tokenizer):
    for phrase in HOSTILE:
        assert ours.clean(phrase) == meta_tokenizer.clean_fn(phrase)
    assert ours.clean("Dog’s  &amp;amp;\tＣＡＴ ﬁsh") == "dog's & cat fish"


def hf_files(directory: Path) -> Path:
    """CLIP's public vocabulary written as the weights' repository ships it (vocab.json with
    <|startoftext|>/<|endoftext|>, merges.txt with a version header)."""
    lines = gzip.decompress(ours.clip_bpe_path().read_bytes()).decode("utf-8").split("\n")
    merges = lines[1 : 1 + ours.VOCAB_SIZE - 514]
    alphabet = list(ours.byte_alphabet().values())
    tokens = [*alphabet, *(c + "</w>" for c in alphabet), *(m.replace(" ", "") for m in merges)]
    tokens += ["<|startoftext|>", "<|endoftext|>"]
    (directory / "vocab.json").write_text(json.dumps({t: i for i, t in enumerate(tokens)}))
    (directory / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merges) + "\n")
    return directory


def test_weights_files_give_the_same_ids(tmp_path, tokenize):
    from_files = ours.load_tokenizer(hf_files(tmp_path))
    assert len(from_files.encoder) == ours.VOCAB_SIZE == len(tokenize.encoder)
    for phrase in HOSTILE:
        assert from_files(phrase) == tokenize(phrase)
    # a folder without both files falls back to the public vocabulary
    (tmp_path / "merges.txt").unlink()
    assert ours.load_tokenizer(tmp_path)("red cat") == tokenize("red cat")


def test_missing_or_wrong_vocabulary_is_one_line(monkeypatch, tmp_path):
    monkeypatch.setattr(ours, "CLIP_BPE_PACKAGE", "no_such_package_sam2serve")
    with pytest.raises(ours.VocabularyError, match="open-clip-torch==3.3.0") as missing:
        ours.load_tokenizer()
    assert "\n" not in str(missing.value)
    fake = tmp_path / "fake_clip_pkg"
    fake.mkdir()
    (fake / "__init__.py").write_text("")
    (fake / ours.CLIP_BPE_FILE).write_bytes(gzip.compress(b"#version: 0.2\na b\n"))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(ours, "CLIP_BPE_PACKAGE", "fake_clip_pkg")
    with pytest.raises(ours.VocabularyError, match="not CLIP's BPE file"):
        ours.load_tokenizer()
    (tmp_path / "vocab.json").write_text("{}")
    (tmp_path / "merges.txt").write_text("#version: 0.2\na b c\n")
    with pytest.raises(ours.VocabularyError, match="not a merge"):
        ours.load_tokenizer(tmp_path)


def test_the_word_cache_is_bounded(monkeypatch, tokenize):
    monkeypatch.setattr(ours, "WORD_CACHE", 8)
    fresh = ours.ClipTokenizer(tokenize.encoder, list(tokenize.ranks))
    words = [f"word{chr(97 + i)}{chr(97 + j)}" for i in range(5) for j in range(5)]
    for word in words:
        assert fresh(word) == tokenize(word)
    assert len(fresh._words) == 8


def test_ids_fit_the_text_encoder(tokenize):
    ids, _ = token_batch(tokenize, HOSTILE)
    assert int(ids.max()) < ours.VOCAB_SIZE and ids.dtype == torch.long
