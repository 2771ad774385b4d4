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
