"""Tokenizer output: ragged Arrow ``list<int32>`` columns and padded numpy batches.

A :class:`TokenizedBatch` holds one flat int32 buffer of token ids and one
int32 offsets buffer shared by its three Arrow columns; numpy views of both
are zero-copy. :func:`pad_batch` scatters the flat ids into ``(batch,
seq_len)`` arrays that come from a :class:`BufferPool`; a
:class:`PaddedBatch` gives them back on :meth:`PaddedBatch.release`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, cast

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from pyflink_aisp.errors import ConfigError, TokenizeError
from pyflink_aisp.tokenize._config import PaddingConfig, PaddingSide
from pyflink_aisp.tokenize._pool import BufferPool

__all__ = ["PaddedBatch", "TokenizedBatch", "iter_buckets", "pad_batch"]

IntArray = npt.NDArray[np.signedinteger]


@dataclass(frozen=True, kw_only=True, eq=False)
class TokenizedBatch:
    """Ragged token ids of a column of texts, one output row per window.

    Without overflow, output row ``i`` is input row ``i``; with
    ``return_overflowing`` an input row yields one or more windows, in order,
    and :attr:`source_rows` maps each back. A null (or invalid, under
    :attr:`InvalidTextPolicy.NULL`) input row yields one null output row.

    Attributes:
        input_ids: ``list<int32>`` token ids, no padding.
        attention_mask: ``list<int32>`` all ones (same offsets as ``input_ids``).
        token_type_ids: ``list<int32>`` segment ids from the post-processor.
        source_rows: ``(rows,)`` int64 input row of each output row.
        truncated: ``(num_inputs,)`` bool, True where an input row had more than
            ``max_length`` tokens (its tail was dropped, or went to overflow windows),
            or its text was cut at the tokenizer's hard character bound
            (``MAX_CHARS_PER_TOKEN`` x ``max_length``).
        invalid_rows: ``(k,)`` int64 input rows that were not valid UTF-8 (nulled).
        type_id_constant: The type id of every token when the post-processor
            gives one value, else None (then ``token_type_ids`` is read per token).

    Raises:
        ConfigError: The columns disagree in length or offsets.
    """

    input_ids: pa.ListArray
    attention_mask: pa.ListArray
    token_type_ids: pa.ListArray
    source_rows: npt.NDArray[np.int64]
    truncated: npt.NDArray[np.bool_]
    invalid_rows: npt.NDArray[np.int64]
    type_id_constant: int | None = None

    def __post_init__(self) -> None:
        n = len(self.input_ids)
        if len(self.attention_mask) != n or len(self.token_type_ids) != n or self.source_rows.shape != (n,):
            raise ConfigError("input_ids, attention_mask, token_type_ids and source_rows differ in length")

    def __len__(self) -> int:
        return len(self.input_ids)

    @property
    def num_inputs(self) -> int:
        """Rows of the input column."""
        return int(self.truncated.shape[0])

    @property
    def offsets(self) -> npt.NDArray[np.int32]:
        """``(rows + 1,)`` int32 token offsets, a zero-copy view of the Arrow offsets."""
        return self.input_ids.offsets.to_numpy(zero_copy_only=True)

    @property
    def flat_ids(self) -> npt.NDArray[np.int32]:
        """``(tokens,)`` int32 ids of all rows back to back, a zero-copy view of the Arrow values."""
        return _flat(self.input_ids)

    @property
    def flat_type_ids(self) -> npt.NDArray[np.int32]:
        """``(tokens,)`` int32 type ids, a zero-copy view of the Arrow values."""
        return _flat(self.token_type_ids)

    @property
    def lengths(self) -> npt.NDArray[np.int64]:
        """``(rows,)`` int64 token count per row (0 for a null row)."""
        return np.diff(self.offsets).astype(np.int64)

    def to_record_batch(self) -> pa.RecordBatch:
        """The three columns plus ``source_row`` (int64) as one Arrow record batch."""
        return pa.RecordBatch.from_arrays(
            [self.input_ids, self.attention_mask, self.token_type_ids, pa.array(self.source_rows)],
            names=["input_ids", "attention_mask", "token_type_ids", "source_row"],
        )


def _flat(column: pa.ListArray) -> npt.NDArray[np.int32]:
    offsets = column.offsets.to_numpy(zero_copy_only=True)
    values = column.values.to_numpy(zero_copy_only=True)
    return values[offsets[0] : offsets[-1]] if len(offsets) else values[:0]


@dataclass(eq=False)
class PaddedBatch:
    """Padded model inputs whose arrays may belong to a :class:`BufferPool`.

    Use as a context manager, or call :meth:`release` when the arrays are no
    longer read: pooled arrays are then reused for a later batch.

    Attributes:
        input_ids: ``(batch, seq_len)`` int64 (or int32) ids, pad id at padding.
        attention_mask: ``(batch, seq_len)`` same dtype, 1 for tokens, 0 for padding.
        token_type_ids: ``(batch, seq_len)`` same dtype, pad type id at padding.
        lengths: ``(batch,)`` int64 tokens per row.
        rows: ``(batch,)`` int64 row of the :class:`TokenizedBatch` of each padded row.
    """

    input_ids: IntArray
    attention_mask: IntArray
    token_type_ids: IntArray
    lengths: npt.NDArray[np.int64]
    rows: npt.NDArray[np.int64]
    _pool: BufferPool | None = field(default=None, repr=False)

    @property
    def batch_size(self) -> int:
        """Rows."""
        return int(self.input_ids.shape[0])

    @property
    def seq_len(self) -> int:
        """Padded length."""
        return int(self.input_ids.shape[1])

    def model_inputs(self) -> dict[str, IntArray]:
        """``{"input_ids", "attention_mask", "token_type_ids"}`` for ``InferenceSession.run``."""
        return {
            "input_ids": self.input_ids,
            "attention_mask": self.attention_mask,
            "token_type_ids": self.token_type_ids,
        }

    def release(self) -> None:
        """Give pooled arrays back (idempotent); the arrays must not be used afterwards."""
        pool, self._pool = self._pool, None
        if pool is not None:
            for array in (self.input_ids, self.attention_mask, self.token_type_ids):
                pool.release(array)

    def __enter__(self) -> PaddedBatch:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()


def pad_batch(
    batch: TokenizedBatch,
    padding: PaddingConfig,
    *,
    pad_id: int,
    pad_type_id: int,
    pool: BufferPool | None = None,
    rows: npt.NDArray[np.integer] | None = None,
) -> PaddedBatch:
    """Scatter ragged ids into padded ``(batch, seq_len)`` arrays.

    Args:
        batch: Tokenizer output.
        padding: Length strategy, side and dtype.
        pad_id: Id written at pad positions.
        pad_type_id: Type id written at pad positions.
        pool: Where the three arrays come from; None: freshly allocated.
        rows: Subset (and order) of ``batch`` rows; None: all rows.

    Raises:
        TokenizeError: The longest row exceeds the largest bucket.
    """
    offsets = batch.offsets.astype(np.int64)
    if rows is None:
        selected = np.arange(len(batch), dtype=np.int64)
        lengths = np.diff(offsets)
    else:
        selected = np.asarray(rows, dtype=np.int64)
        lengths = offsets[selected + 1] - offsets[selected]
    longest = int(lengths.max()) if len(lengths) else 0
    seq_len = padding.seq_len(longest)
    if seq_len is None:
        raise TokenizeError(f"a row has {longest} tokens, more than the largest bucket {padding.buckets[-1]}")
    shape = (len(selected), seq_len)
    dtype = padding.dtype.numpy

    def acquire(kind: npt.DTypeLike) -> IntArray:
        return cast(IntArray, pool.acquire(shape, kind) if pool is not None else np.empty(shape, dtype=kind))

    ids, mask, types, keep = acquire(dtype), acquire(dtype), acquire(dtype), acquire(np.bool_)
    positions = np.arange(seq_len, dtype=np.int64)[None, :]
    if padding.side is PaddingSide.RIGHT:
        np.less(positions, lengths[:, None], out=keep)
    else:
        np.greater_equal(positions, (seq_len - lengths)[:, None], out=keep)
    np.copyto(mask, keep, casting="unsafe")
    ids.fill(pad_id)
    ids[keep] = _gather(batch.flat_ids, offsets, selected, lengths, rows is None)
    _fill_types(
        types, keep, batch, pad_type_id, lambda flat: _gather(flat, offsets, selected, lengths, rows is None)
    )
    if pool is not None:
        pool.release(keep)
    return PaddedBatch(
        input_ids=ids, attention_mask=mask, token_type_ids=types, lengths=lengths, rows=selected, _pool=pool
    )


def _fill_types(
    types: IntArray,
    keep: npt.NDArray[Any],
    batch: TokenizedBatch,
    pad_type_id: int,
    gather: Callable[[npt.NDArray[np.int32]], npt.NDArray[np.int32]],
) -> None:
    """Type ids: the pad type id, then the post-processor's constant or the per-token values."""
    types.fill(pad_type_id)
    if batch.type_id_constant == pad_type_id:
        return  # the usual case (BERT, RoBERTa, GPT-2: all 0): nothing to scatter
    if batch.type_id_constant is not None:
        types[keep] = batch.type_id_constant
    else:
        types[keep] = gather(batch.flat_type_ids)


def _gather(
    flat: npt.NDArray[np.int32],
    offsets: npt.NDArray[np.int64],
    selected: npt.NDArray[np.int64],
    lengths: npt.NDArray[np.int64],
    all_rows: bool,
) -> npt.NDArray[np.int32]:
    """The tokens of ``selected`` rows back to back (all rows: ``flat`` itself)."""
    if all_rows:
        return flat
    total = int(lengths.sum())
    starts = offsets[selected] - offsets[0]
    row_first = np.cumsum(lengths) - lengths
    index = np.repeat(starts - row_first, lengths) + np.arange(total, dtype=np.int64)
    return flat[index]


def iter_buckets(
    batch: TokenizedBatch,
    batch_size: int,
    padding: PaddingConfig,
    *,
    pad_id: int,
    pad_type_id: int,
    pool: BufferPool | None = None,
) -> Iterator[PaddedBatch]:
    """Padded batches of ``batch_size`` rows sorted by token count (stable).

    Rows of similar length share a batch, so little padding is computed. Each
    :class:`PaddedBatch` says in ``rows`` which rows it holds.

    Raises:
        ConfigError: ``batch_size`` < 1.
        TokenizeError: As :func:`pad_batch`.
    """
    if batch_size < 1:
        raise ConfigError(f"batch_size must be >= 1, got {batch_size}")
    order = np.argsort(batch.lengths, kind="stable")
    for start in range(0, len(order), batch_size):
        yield pad_batch(
            batch,
            padding,
            pad_id=pad_id,
            pad_type_id=pad_type_id,
            pool=pool,
            rows=order[start : start + batch_size],
        )
