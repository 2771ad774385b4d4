"""Padded batches: length strategies, sides, dtypes, the buffer pool, length buckets."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pyflink_aisp.errors import ConfigError, TokenizeError
from pyflink_aisp.tokenize import (
    ArrowTokenizer,
    BufferPool,
    IdDtype,
    PaddingConfig,
    PaddingSide,
    PadStrategy,
    TokenizerConfig,
)

TEXTS = ["A three-hour cinema master class.", None, "", "Hello, world!"]  # 10, null, 2, 6 tokens


def _tok(path: Path, **padding) -> ArrowTokenizer:
    return ArrowTokenizer.from_file(path, TokenizerConfig(max_length=128), padding=PaddingConfig(**padding))


def _address(array: np.ndarray) -> int:
    return array.__array_interface__["data"][0]


@pytest.mark.parametrize(
    ("padding", "seq_len"),
    [
        ({}, 10),
        ({"strategy": PadStrategy.MULTIPLE_OF, "multiple_of": 8}, 16),
        ({"strategy": PadStrategy.BUCKETS, "buckets": (8, 32, 128)}, 32),
        ({"strategy": PadStrategy.BUCKETS, "buckets": (128,)}, 128),
    ],
)
def test_seq_len_strategies(minilm_path: Path, padding, seq_len) -> None:
    with _tok(minilm_path, **padding).encode_padded(TEXTS) as batch:
        assert (
            batch.input_ids.shape == batch.attention_mask.shape == batch.token_type_ids.shape == (4, seq_len)
        )
        assert batch.lengths.tolist() == [10, 0, 2, 6]
        assert batch.attention_mask.sum(axis=1).tolist() == [10, 0, 2, 6]
        assert batch.input_ids[1].tolist() == [0] * seq_len  # null row: all [PAD], mask 0
        assert batch.input_ids[2, :3].tolist() == [101, 102, 0]


def test_left_padding_int32_and_explicit_pad_ids(minilm_path: Path) -> None:
    tok = _tok(minilm_path, side=PaddingSide.LEFT, dtype=IdDtype.INT32, pad_id=7, pad_type_id=3)
    with tok.encode_padded(["Hello, world!", ""]) as batch:
        assert batch.input_ids.dtype == np.int32 and batch.attention_mask.dtype == np.int32
        assert batch.input_ids[1].tolist() == [7, 7, 7, 7, 101, 102]
        assert batch.attention_mask[1].tolist() == [0, 0, 0, 0, 1, 1]
        assert batch.token_type_ids[1].tolist() == [3, 3, 3, 3, 0, 0]
        assert batch.input_ids[0, 0] == 101


def test_pool_reuses_buffers_in_steady_state(minilm_path: Path, review_texts: list[str]) -> None:
    pool = BufferPool()
    tok = ArrowTokenizer.from_file(
        minilm_path,
        TokenizerConfig(max_length=128),
        padding=PaddingConfig(strategy=PadStrategy.BUCKETS, buckets=(32, 64, 128)),
        pool=pool,
    )
    chunks = [review_texts[i : i + 64] for i in range(0, 64 * 12, 64)]
    addresses: list[set[int]] = []
    for chunk in chunks:
        with tok.encode_padded(chunk) as batch:
            addresses.append(
                {_address(a) for a in (batch.input_ids, batch.attention_mask, batch.token_type_ids)}
            )
    warm = pool.stats()
    for chunk in chunks:  # the same stream again: nothing new is allocated
        with tok.encode_padded(chunk) as batch:
            assert {_address(a) for a in batch.model_inputs().values()} <= set().union(*addresses)
    after = pool.stats()
    assert after.allocations == warm.allocations and after.reuses > warm.reuses
    assert after.lent == 0 and after.cached_bytes > 0


def test_pool_acquire_release_rules() -> None:
    pool = BufferPool()
    first = pool.acquire((4, 10), np.int64)
    assert first.shape == (4, 10) and first.flags.c_contiguous
    pool.release(first)
    second = pool.acquire((2, 16), np.int64)  # fits in the freed buffer
    assert _address(second) == _address(first)
    with pytest.raises(ConfigError, match="not acquired"):
        pool.release(np.zeros(3))
    pool.release(second)
    with pytest.raises(ConfigError, match="already released"):
        pool.release(second)
    assert pool.stats().allocations == 1 and pool.stats().reuses == 1
    small, large = pool.acquire((10,), np.int64), pool.acquire((100_000,), np.int64)
    pool.release(large)
    pool.release(small)
    assert _address(pool.acquire((5_000,), np.int64)) == _address(large)  # only the large one fits
    assert _address(pool.acquire((3,), np.int64)) == _address(small)
    tiny = BufferPool(max_cached_bytes=0)
    tiny.release(tiny.acquire((8,), np.int32))
    assert tiny.stats().cached_bytes == 0
    with pytest.raises(ConfigError):
        BufferPool(max_cached_bytes=-1)


def test_padded_batch_release_is_idempotent(minilm_path: Path) -> None:
    tok = _tok(minilm_path)
    batch = tok.encode_padded(TEXTS)
    assert tok.pool.stats().lent == 3
    batch.release()
    batch.release()
    assert tok.pool.stats().lent == 0


def test_pad_a_subset_of_rows_in_any_order(minilm_path: Path) -> None:
    tok = _tok(minilm_path)
    tokens = tok.encode(TEXTS)
    with tok.pad(tokens) as whole, tok.pad(tokens, rows=np.array([3, 0])) as part:
        assert part.input_ids.shape == (2, 10) and part.rows.tolist() == [3, 0]
        np.testing.assert_array_equal(part.input_ids[1], whole.input_ids[0])
        np.testing.assert_array_equal(part.input_ids[0, :6], whole.input_ids[3, :6])


def test_iter_buckets_sorts_by_length_and_covers_every_row(
    minilm_path: Path, review_texts: list[str]
) -> None:
    tok = _tok(minilm_path)
    tokens = tok.encode(review_texts[:500])
    full = tok.pad(tokens)
    seen: list[int] = []
    longest = 0
    for batch in tok.iter_buckets(tokens, 64):
        with batch:
            assert batch.seq_len == batch.lengths.max() >= longest
            longest = batch.seq_len
            np.testing.assert_array_equal(batch.input_ids, full.input_ids[batch.rows, : batch.seq_len])
            seen.extend(batch.rows.tolist())
    full.release()
    assert sorted(seen) == list(range(500))
    with pytest.raises(ConfigError):
        next(tok.iter_buckets(tokens, 0))


def test_bucket_config_errors(minilm_path: Path) -> None:
    with pytest.raises(ConfigError, match="buckets"):
        PaddingConfig(strategy=PadStrategy.BUCKETS, buckets=(64, 32))
    with pytest.raises(ConfigError, match="largest padding bucket"):
        _tok(minilm_path, strategy=PadStrategy.BUCKETS, buckets=(16, 32))
    unbounded = ArrowTokenizer.from_file(
        minilm_path,
        TokenizerConfig(max_length=None),
        padding=PaddingConfig(strategy=PadStrategy.BUCKETS, buckets=(4,)),
    )
    with pytest.raises(TokenizeError, match="largest bucket 4"):
        unbounded.encode_padded(["a b c d e f g"])
    with pytest.raises(ConfigError):
        PaddingConfig(multiple_of=0)
    with pytest.raises(ConfigError):
        PaddingConfig(pad_id=-1)
