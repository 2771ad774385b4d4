"""ArrowTokenizer ids, masks and type ids equal transformers.AutoTokenizer's on all 12,808 reviews.

Three real tokenizer files (WordPiece, byte-level BPE, Unigram; see conftest),
each with truncation, without special tokens or truncation, with overflow
windows (stride), and padded. Arrays are compared flat plus per-row lengths,
which is exact and fast.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from pyflink_aisp.tokenize import (
    ArrowTokenizer,
    PaddingConfig,
    PaddingSide,
    PadStrategy,
    TokenizedBatch,
    TokenizerConfig,
)

CASES = {
    "truncate128": (TokenizerConfig(max_length=128), {"truncation": True, "max_length": 128}),
    "plain": (TokenizerConfig(max_length=None, add_special_tokens=False), {"add_special_tokens": False}),
    "overflow": (
        TokenizerConfig(max_length=24, stride=6, return_overflowing=True),
        {"truncation": True, "max_length": 24, "stride": 6, "return_overflowing_tokens": True},
    ),
}
#: Reviews paired in the text-pair tests (tokenizing pairs goes through HF's slower
#: ``encode_batch``, and transformers is the reference twice).
PAIRS = 3000
PAD_TOKENS = {"minilm": "[PAD]", "bpe": "<EOT>", "unigram": "<pad>"}


@pytest.fixture(scope="module")
def paths(minilm_path: Path, bpe_path: Path, unigram_path: Path) -> dict[str, Path]:
    return {"minilm": minilm_path, "bpe": bpe_path, "unigram": unigram_path}


def _reference(path: Path, pad_token: str):
    import transformers

    reference = transformers.AutoTokenizer.from_pretrained(str(path.parent))
    reference.pad_token = pad_token
    return reference


def _flat(rows: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    lengths = np.fromiter(map(len, rows), dtype=np.int64, count=len(rows))
    return np.fromiter(itertools.chain.from_iterable(rows), dtype=np.int64, count=int(lengths.sum())), lengths


def _assert_same(batch: TokenizedBatch, out) -> None:
    for name in ("input_ids", "attention_mask", "token_type_ids"):
        expected, lengths = _flat(out[name])
        column = getattr(batch, name)
        np.testing.assert_array_equal(np.diff(column.offsets.to_numpy()), lengths, err_msg=name)
        np.testing.assert_array_equal(column.values.to_numpy(), expected, err_msg=name)


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("name", ["minilm", "bpe", "unigram"])
def test_ragged_ids_equal_transformers(name, case, paths, review_texts) -> None:
    config, kwargs = CASES[case]
    batch = ArrowTokenizer.from_file(paths[name], config).encode(pa.array(review_texts))
    out = _reference(paths[name], PAD_TOKENS[name])(review_texts, return_token_type_ids=True, **kwargs)
    assert len(batch) == len(out["input_ids"])
    _assert_same(batch, out)
    if case == "overflow":
        np.testing.assert_array_equal(batch.source_rows, out["overflow_to_sample_mapping"])
        assert len(batch) > len(review_texts)
    else:
        np.testing.assert_array_equal(batch.source_rows, np.arange(len(review_texts)))


@pytest.mark.parametrize(
    ("name", "side", "multiple"),
    [("minilm", PaddingSide.RIGHT, 8), ("bpe", PaddingSide.LEFT, None), ("unigram", PaddingSide.RIGHT, None)],
)
def test_padded_arrays_equal_transformers(name, side, multiple, paths, review_texts) -> None:
    strategy = PadStrategy.MULTIPLE_OF if multiple else PadStrategy.LONGEST
    padding = PaddingConfig(strategy=strategy, multiple_of=multiple or 8, side=side)
    tokenizer = ArrowTokenizer.from_file(paths[name], TokenizerConfig(max_length=64), padding=padding)
    reference = _reference(paths[name], PAD_TOKENS[name])
    reference.padding_side = side.value
    out = reference(
        review_texts,
        truncation=True,
        max_length=64,
        padding=True,
        pad_to_multiple_of=multiple,
        return_token_type_ids=True,
        return_tensors="np",
    )
    with tokenizer.encode_padded(review_texts) as padded:
        for key in ("input_ids", "attention_mask", "token_type_ids"):
            assert getattr(padded, key).dtype == np.int64
            np.testing.assert_array_equal(getattr(padded, key), out[key], err_msg=key)
        np.testing.assert_array_equal(padded.lengths, out["attention_mask"].sum(axis=1))


@pytest.mark.parametrize("max_length", [128, 32])
@pytest.mark.parametrize("name", ["minilm", "bpe", "unigram"])
def test_text_pairs_equal_transformers(name, max_length, paths, review_texts) -> None:
    """Pairs (review i, review n-1-i) of the first 3,000 reviews: the pair template, type ids of
    the second sequence and ``longest_first`` truncation as ``tokenizer(text, text_pair)``;
    truncated flags as HF's untruncated length says."""
    review_texts = review_texts[:PAIRS]
    seconds = review_texts[::-1]
    tokenizer = ArrowTokenizer.from_file(paths[name], TokenizerConfig(max_length=max_length))
    batch = tokenizer.encode(pa.array(review_texts), pairs=pa.array(seconds))
    reference = _reference(paths[name], PAD_TOKENS[name])
    out = reference(review_texts, seconds, truncation=True, max_length=max_length, return_token_type_ids=True)
    assert len(batch) == len(review_texts)
    _assert_same(batch, out)
    whole = reference(review_texts, seconds)["input_ids"]
    np.testing.assert_array_equal(batch.truncated, [len(ids) > max_length for ids in whole])
    if max_length == 32:  # truncation bites on some pairs, not all
        assert 0 < batch.truncated.sum() < len(review_texts)
    first = tokenizer.count_pair_tokens(review_texts[0], seconds[0])
    assert first == len(out["input_ids"][0])


def test_padded_text_pairs_equal_transformers(paths, review_texts) -> None:
    review_texts = review_texts[:PAIRS]
    tokenizer = ArrowTokenizer.from_file(paths["minilm"], TokenizerConfig(max_length=64))
    seconds = review_texts[1:] + review_texts[:1]
    out = _reference(paths["minilm"], "[PAD]")(review_texts, seconds, truncation=True, max_length=64,
                                               padding=True, return_token_type_ids=True, return_tensors="np")
    with tokenizer.pad(tokenizer.encode(review_texts, pairs=seconds)) as padded:
        for key in ("input_ids", "attention_mask", "token_type_ids"):
            np.testing.assert_array_equal(getattr(padded, key), out[key], err_msg=key)
    assert out["token_type_ids"].max() == 1


def test_text_pairs_nulls_and_refusals(paths) -> None:
    tokenizer = ArrowTokenizer.from_file(paths["minilm"], TokenizerConfig(max_length=32))
    batch = tokenizer.encode(["a", None, "c", "d"], pairs=["w", "x", None, "z"])
    assert batch.input_ids.is_null().to_pylist() == [False, True, True, False]
    assert batch.input_ids[3].as_py() == tokenizer.encode(["d"], pairs=["z"]).input_ids[0].as_py()
    from pyflink_aisp.errors import TokenizeError

    with pytest.raises(TokenizeError, match="two columns of one length, got 2 texts and 1"):
        tokenizer.encode(["a", "b"], pairs=["x"])
    overflow = ArrowTokenizer.from_file(paths["minilm"], TokenizerConfig(max_length=24, stride=4,
                                                                         return_overflowing=True))
    with pytest.raises(TokenizeError, match="not built for text pairs"):
        overflow.encode(["a"], pairs=["b"])
