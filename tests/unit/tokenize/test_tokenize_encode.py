"""Tests for pyflink_aisp.tokenize.BatchEncoder with the real MiniLM tokenizer."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import pyflink_aisp.tokenize as tokenize_area
from pyflink_aisp.errors import ConfigError, ModelError, TokenizeError
from pyflink_aisp.models import locate_source_model
from pyflink_aisp.tokenize import BatchEncoder

TEXTS = ["A three-hour cinema master class.", "", "bad " * 300, "Hello, world!"]


@pytest.fixture(scope="module")
def encoder() -> BatchEncoder:
    return BatchEncoder(locate_source_model().tokenizer_path, max_length=128)


def test_all_names_exist() -> None:
    for name in tokenize_area.__all__:
        assert hasattr(tokenize_area, name), name


def test_encode_pads_to_longest_and_truncates(encoder: BatchEncoder) -> None:
    enc = encoder.encode(TEXTS)
    assert enc.input_ids.shape == enc.attention_mask.shape == enc.token_type_ids.shape == (4, 128)
    assert enc.input_ids.dtype == np.int64 and enc.attention_mask.dtype == np.int64
    assert enc.lengths.tolist() == [10, 2, 128, 6]
    assert enc.input_ids[1, :2].tolist() == [101, 102]  # [CLS] [SEP] for the empty text
    assert (enc.input_ids[1, 2:] == 0).all() and (enc.attention_mask[1, 2:] == 0).all()
    assert enc.input_ids[2, -1] == 102  # [SEP] kept after truncation
    assert (enc.attention_mask.sum(axis=1) == enc.lengths).all()
    assert (enc.token_type_ids == 0).all()
    short = encoder.encode(TEXTS[:2])
    assert short.input_ids.shape == (2, 10)


def test_encode_empty_batch(encoder: BatchEncoder) -> None:
    enc = encoder.encode([])
    assert enc.input_ids.shape == (0, 0) and enc.lengths.shape == (0,)


def test_buckets_sorted_and_cover_all(encoder: BatchEncoder) -> None:
    texts = [f"word {'x ' * (i * 7 % 23)}" for i in range(50)]
    batches = list(encoder.encode_buckets(texts, batch_size=8))
    indices = np.concatenate([i for i, _ in batches])
    assert sorted(indices.tolist()) == list(range(50))
    lengths = np.concatenate([e.lengths for _, e in batches])
    assert (np.diff(lengths) >= 0).all()
    full = encoder.encode(texts)
    for idx, enc in batches:
        assert enc.input_ids.shape[1] == enc.lengths.max()
        for row, i in enumerate(idx):
            n = full.lengths[i]
            assert enc.input_ids[row, :n].tolist() == full.input_ids[i, :n].tolist()


def test_same_ids_as_transformers(encoder: BatchEncoder) -> None:
    import transformers

    reference = transformers.AutoTokenizer.from_pretrained(str(locate_source_model().directory))
    out = reference(TEXTS, padding=True, truncation=True, max_length=128, return_tensors="np")
    enc = encoder.encode(TEXTS)
    np.testing.assert_array_equal(out["input_ids"], enc.input_ids)
    np.testing.assert_array_equal(out["attention_mask"], enc.attention_mask)


def test_rejects_bad_inputs(encoder: BatchEncoder, tmp_path: Path) -> None:
    with pytest.raises(TokenizeError, match="input 1"):
        encoder.encode(["ok", b"bytes"])  # type: ignore[list-item]
    with pytest.raises(ConfigError):
        list(encoder.encode_buckets(["a"], batch_size=0))
    with pytest.raises(ConfigError):
        BatchEncoder(locate_source_model().tokenizer_path, max_length=1)
    with pytest.raises(ModelError):
        BatchEncoder(tmp_path / "missing.json")
