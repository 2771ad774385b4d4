"""ArrowTokenizer: HF ``tokenizers`` ids straight into Arrow arrays and pooled padded batches.

One Rust ``encode_batch_fast`` call (no character offsets: they are not
needed for ids) tokenizes all valid rows of a column on all cores; the ids of
the resulting encodings are streamed into one flat int32 numpy buffer
(``np.fromiter``, no per-row numpy arrays or Python lists kept), which becomes
the values of an Arrow ``list<int32>`` column without a copy. Offsets come
from the encodings' lengths. Attention masks are ones and type ids are a
constant for all single-sequence post-processors but custom templates, so
neither is copied out of Rust per token unless the ``tokenizer.json`` needs it.

Ids equal those of ``transformers.AutoTokenizer`` for the same file with
``truncation=True, max_length=..., stride=..., return_overflowing_tokens=...,
add_special_tokens=...`` (checked on all 12,808 Rotten Tomatoes reviews for a
WordPiece and a byte-level BPE tokenizer in the tests).
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pyarrow as pa
from tokenizers import Encoding as HFEncoding
from tokenizers import Tokenizer

from pyflink_aisp.errors import ConfigError, ModelError, TokenizeError
from pyflink_aisp.tokenize._batch import PaddedBatch, TokenizedBatch, iter_buckets, pad_batch
from pyflink_aisp.tokenize._config import PaddingConfig, PadStrategy, TokenizerConfig
from pyflink_aisp.tokenize._input import TextColumn, TextInput, to_text_column
from pyflink_aisp.tokenize._pool import BufferPool
from pyflink_aisp.tokenize._spec import TokenizerSpec, inspect_tokenizer

__all__ = ["ArrowTokenizer"]

#: Characters of a long text tokenized before truncation, per token of
#: ``max_length`` (English averages 4-5 characters per WordPiece/BPE token);
#: when a prefix this long yields too few tokens the whole text is tokenized.
PRECUT_CHARS_PER_TOKEN = 32

_IDS = operator.attrgetter("ids")
_TYPE_IDS = operator.attrgetter("type_ids")


class ArrowTokenizer:
    """A ``tokenizer.json`` (WordPiece, BPE, Unigram, WordLevel) with Arrow in and out.

    Thread-safety: :meth:`encode`, :meth:`pad`, :meth:`encode_padded` and
    :meth:`iter_buckets` may be called from several threads (the Rust
    tokenizer is not changed after construction; the pool is locked).

    Args:
        tokenizer: A loaded HF tokenizer; it is copied, not changed.
        config: Truncation, overflow and special tokens.
        padding: Layout of padded batches.
        pool: Buffers of padded batches; default a new :class:`BufferPool`.
        source: Where the tokenizer came from (for messages).

    Raises:
        ConfigError: ``padding`` buckets cannot hold ``max_length`` tokens.
    """

    def __init__(
        self,
        tokenizer: Tokenizer,
        config: TokenizerConfig | None = None,
        *,
        padding: PaddingConfig | None = None,
        pool: BufferPool | None = None,
        source: str = "<tokenizer>",
    ) -> None:
        self.config = config or TokenizerConfig()
        self.padding = padding or PaddingConfig()
        self.pool = pool if pool is not None else BufferPool()
        self.source = source
        self._tokenizer = _configured_copy(tokenizer, self.config)
        self.spec: TokenizerSpec = inspect_tokenizer(tokenizer)
        self._pad_id = self.padding.pad_id if self.padding.pad_id is not None else self.spec.pad_id
        pad_type = self.padding.pad_type_id
        self._pad_type_id = pad_type if pad_type is not None else self.spec.pad_type_id
        limit = self.config.max_length
        if (
            self.padding.strategy is PadStrategy.BUCKETS
            and limit is not None
            and limit > self.padding.buckets[-1]
        ):
            raise ConfigError(
                f"max_length {limit} exceeds the largest padding bucket {self.padding.buckets[-1]}"
            )
        self._check_lengths()
        self._encode_batch = getattr(self._tokenizer, "encode_batch_fast", self._tokenizer.encode_batch)

    def _check_lengths(self) -> None:
        """HF's own limits, checked here rather than on the first batch.

        Raises:
            ConfigError: ``max_length`` leaves no room after the special
                tokens, or ``stride`` is not below that room.
        """
        limit = self.config.max_length
        if limit is None:
            return
        specials = self._tokenizer.num_special_tokens_to_add(False) if self.config.add_special_tokens else 0
        room = limit - specials
        if room < 1:
            raise ConfigError(f"max_length {limit} leaves no room after {specials} special tokens")
        if self.config.return_overflowing and self.config.stride >= room:
            raise ConfigError(
                f"stride {self.config.stride} must be < max_length - special tokens = {room} (HF tokenizers)"
            )

    @classmethod
    def from_file(
        cls,
        path: Path | str,
        config: TokenizerConfig | None = None,
        *,
        padding: PaddingConfig | None = None,
        pool: BufferPool | None = None,
    ) -> ArrowTokenizer:
        """Load a ``tokenizer.json``, or the one inside a directory.

        Raises:
            ModelError: The file is missing or is not a HF tokenizer.
            ConfigError: As the constructor.
        """
        file = Path(path)
        if file.is_dir():
            file = file / "tokenizer.json"
        try:
            tokenizer = Tokenizer.from_file(str(file))
        except Exception as exc:  # tokenizers raises plain Exception subclasses
            raise ModelError(f"cannot load tokenizer {file}: {exc}") from exc
        return cls(tokenizer, config, padding=padding, pool=pool, source=str(file))

    @property
    def pad_id(self) -> int:
        """Id written at pad positions."""
        return self._pad_id

    @property
    def pad_type_id(self) -> int:
        """Type id written at pad positions."""
        return self._pad_type_id

    @property
    def vocab_size(self) -> int:
        """Vocabulary size, added tokens included."""
        return int(self._tokenizer.get_vocab_size(with_added_tokens=True))

    def count_tokens(self, text: str) -> int:
        """Token count of one text after truncation, special tokens included (for batching).

        Raises:
            TokenizeError: ``text`` is not a ``str``.
        """
        if not isinstance(text, str):
            raise TokenizeError(f"expected str, got {type(text).__name__}")
        return len(self._tokenizer.encode(text, add_special_tokens=self.config.add_special_tokens).ids)

    def encode(self, texts: TextInput) -> TokenizedBatch:
        """Tokenize a column into ragged Arrow ``list<int32>`` columns.

        Args:
            texts: pyarrow ``string``/``large_string``/``binary``/
                ``large_binary`` array or chunked array, pandas Series, or a
                sequence of ``str``/``bytes``/None. Nulls give null rows.

        Returns:
            The :class:`TokenizedBatch`; an empty string gives only the special
            tokens.

        Raises:
            TokenizeError: A non-text column or element, invalid UTF-8 (with
                :attr:`InvalidTextPolicy.RAISE`; the message names the row),
                or a failure inside the tokenizer.
        """
        column = to_text_column(texts, self.config.invalid_text)
        encodings = self._run(column.texts)
        windows, counts = self._windows(encodings)
        return self._assemble(column, windows, counts)

    def pad(self, batch: TokenizedBatch, rows: npt.NDArray[np.integer] | None = None) -> PaddedBatch:
        """Padded ``(batch, seq_len)`` arrays from this tokenizer's pool.

        Args:
            batch: From :meth:`encode`.
            rows: Subset and order of rows; None: all rows.

        Returns:
            A :class:`PaddedBatch`; call ``release()`` (or use ``with``) when done.

        Raises:
            TokenizeError: The longest row exceeds the largest bucket.
        """
        return pad_batch(
            batch, self.padding, pad_id=self._pad_id, pad_type_id=self._pad_type_id, pool=self.pool, rows=rows
        )

    def encode_padded(self, texts: TextInput) -> PaddedBatch:
        """:meth:`encode` then :meth:`pad` (``rows`` index output rows)."""
        return self.pad(self.encode(texts))

    def iter_buckets(self, batch: TokenizedBatch, batch_size: int) -> Iterator[PaddedBatch]:
        """Pooled padded batches of ``batch_size`` rows, shortest rows first.

        Release each batch before asking for the next to keep the pool small.

        Raises:
            ConfigError: ``batch_size`` < 1.
        """
        return iter_buckets(
            batch,
            batch_size,
            self.padding,
            pad_id=self._pad_id,
            pad_type_id=self._pad_type_id,
            pool=self.pool,
        )

    def _run(self, texts: list[str]) -> list[HFEncoding]:
        """Encode, tokenizing only a prefix of very long texts when that is exact."""
        cut = self._precut(texts)
        try:
            encodings = list(
                self._encode_batch(
                    texts if cut is None else cut, add_special_tokens=self.config.add_special_tokens
                )
            )
            if cut is not None:
                self._redo_short_cuts(texts, cut, encodings)
        except Exception as exc:  # tokenizers raises plain Exception subclasses
            raise TokenizeError(f"tokenizer {self.source} failed: {exc}") from exc
        return encodings

    def _precut(self, texts: list[str]) -> list[str] | None:
        """Texts with very long ones cut before a space (None when nothing is cut).

        Exact for whitespace-splitting pre-tokenizers: no token spans the cut,
        so the prefix's tokens are the whole text's first tokens.
        """
        limit = self.config.max_length
        if limit is None or self.config.return_overflowing or not self.spec.splits_on_whitespace:
            return None
        budget = limit * PRECUT_CHARS_PER_TOKEN + 256
        long_rows = [i for i, t in enumerate(texts) if len(t) > budget]
        if not long_rows:
            return None
        cut = list(texts)
        for i in long_rows:
            point = _cut_point(texts[i], budget)
            if point is not None:
                cut[i] = texts[i][:point]
        return cut

    def _redo_short_cuts(self, texts: list[str], cut: list[str], encodings: list[HFEncoding]) -> None:
        """Tokenize whole texts whose prefix did not reach ``max_length`` tokens."""
        pairs = enumerate(zip(texts, cut, strict=True))
        redo = [i for i, (whole, part) in pairs if whole is not part and not encodings[i].overflowing]
        if redo:
            full = self._encode_batch(
                [texts[i] for i in redo], add_special_tokens=self.config.add_special_tokens
            )
            for i, encoding in zip(redo, full, strict=True):
                encodings[i] = encoding

    def _windows(self, encodings: list[HFEncoding]) -> tuple[list[HFEncoding], npt.NDArray[np.int64]]:
        """Output encodings and the number of windows per valid row."""
        if not self.config.return_overflowing:
            return encodings, np.ones(len(encodings), dtype=np.int64)
        windows: list[HFEncoding] = []
        counts = np.empty(len(encodings), dtype=np.int64)
        for i, encoding in enumerate(encodings):
            overflow = encoding.overflowing
            windows.append(encoding)
            windows.extend(overflow)
            counts[i] = 1 + len(overflow)
        return windows, counts

    def _truncated(
        self,
        column: TextColumn,
        windows: list[HFEncoding],
        counts: npt.NDArray[np.int64],
        lengths: npt.NDArray[np.int64],
    ) -> npt.NDArray[np.bool_]:
        """Per input row: had more than ``max_length`` tokens."""
        flags = np.zeros(column.num_rows, dtype=np.bool_)
        limit = self.config.max_length
        if limit is None:
            return flags
        if self.config.return_overflowing:
            flags[column.rows] = counts > 1
            return flags
        for i in np.flatnonzero(lengths >= limit).tolist():  # only full rows can be truncated
            flags[column.rows[i]] = bool(windows[i].overflowing)
        return flags

    def _assemble(
        self, column: TextColumn, windows: list[HFEncoding], counts: npt.NDArray[np.int64]
    ) -> TokenizedBatch:
        lengths = np.fromiter(map(len, windows), dtype=np.int64, count=len(windows))
        total = int(lengths.sum())
        flat_ids = np.fromiter(itertools.chain.from_iterable(map(_IDS, windows)), np.int32, count=total)
        constant = self.spec.type_id_constant
        if constant is None:
            flat_types = np.fromiter(
                itertools.chain.from_iterable(map(_TYPE_IDS, windows)), np.int32, count=total
            )
        else:
            flat_types = np.full(total, constant, dtype=np.int32)
        source_rows, offsets, mask = _layout(column, counts, lengths)
        offsets_arr = pa.array(offsets)

        def column_of(values: npt.NDArray[np.int32]) -> pa.ListArray:
            return pa.ListArray.from_arrays(offsets_arr, pa.array(values), mask=mask)

        return TokenizedBatch(
            input_ids=column_of(flat_ids),
            attention_mask=column_of(np.ones(total, dtype=np.int32)),
            token_type_ids=column_of(flat_types),
            source_rows=source_rows,
            truncated=self._truncated(column, windows, counts, lengths),
            invalid_rows=column.invalid_rows,
            type_id_constant=constant,
        )


def _configured_copy(tokenizer: Tokenizer, config: TokenizerConfig) -> Tokenizer:
    """A copy with padding off and the configured truncation (HF ``longest_first``, right side)."""
    try:
        copy = Tokenizer.from_str(tokenizer.to_str())
        copy.no_padding()
        if config.max_length is None:
            copy.no_truncation()
        else:
            copy.enable_truncation(config.max_length, stride=config.stride, strategy="longest_first")
    except Exception as exc:  # tokenizers raises plain Exception subclasses
        raise ConfigError(f"cannot configure the tokenizer with {config}: {exc}") from exc
    return copy


def _cut_point(text: str, budget: int) -> int | None:
    """The start of the last space run before ``budget`` that follows a non-space character."""
    point = text.rfind(" ", 0, budget)
    while point > 0:
        if not text[point - 1].isspace():
            return point
        point = text.rfind(" ", 0, point)
    return None


def _layout(
    column: TextColumn, counts: npt.NDArray[np.int64], lengths: npt.NDArray[np.int64]
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int32], pa.Array | None]:
    """Source row of each output row, int32 offsets, and the null mask (None: no null).

    A null or invalid input row gives one (null, empty) output row; valid row
    ``k`` gives ``counts[k]`` output rows, its windows in order, whose token
    counts are ``lengths``.
    """
    offsets = np.zeros(len(lengths) + 1, dtype=np.int32)
    if len(column.texts) == column.num_rows == len(lengths):  # no null, one window per row
        np.cumsum(lengths, out=offsets[1:])
        return np.arange(column.num_rows, dtype=np.int64), offsets, None
    per_input = np.ones(column.num_rows, dtype=np.int64)
    per_input[column.rows] = counts
    source_rows = np.repeat(np.arange(column.num_rows, dtype=np.int64), per_input)
    first_out = np.cumsum(per_input) - per_input
    window_first = np.cumsum(counts) - counts
    within = np.arange(int(counts.sum()), dtype=np.int64) - np.repeat(window_first, counts)
    out_rows = np.repeat(first_out[column.rows], counts) + within
    out_lengths = np.zeros(len(source_rows), dtype=np.int32)
    out_lengths[out_rows] = lengths
    offsets = np.zeros(len(source_rows) + 1, dtype=np.int32)
    np.cumsum(out_lengths, out=offsets[1:])
    valid = np.zeros(len(source_rows), dtype=np.bool_)
    valid[out_rows] = True
    return source_rows, offsets, None if valid.all() else pa.array(~valid)
