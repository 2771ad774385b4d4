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

Long texts (``max_length`` set, ``return_overflowing`` off): no call tokenizes
more than ``max_length * MAX_CHARS_PER_TOKEN + 256`` characters of a text, so
a record costs a bounded prefix of its text however long the text is (at
``max_length=128`` a 9 MB text costs no more than a 33 KB one). A text longer
than the precut budget ``max_length * PRECUT_CHARS_PER_TOKEN + 256`` is first
cut there; if that prefix holds fewer than ``max_length`` tokens the text is
tokenized again, whole when it fits the hard bound, else cut at the hard
bound. A cut goes at the start of the last whitespace run (beginning with a
space) in the second half before the bound, else at the bound itself.

The ids are exactly HF's (the first ``max_length`` tokens of the whole text)
when the text is not cut, or is cut at a whitespace run by a
whitespace-splitting pre-tokenizer (:attr:`TokenizerSpec.splits_on_whitespace`)
and the prefix holds more than ``max_length`` tokens: no token spans such a
cut. Otherwise they are the prefix's first tokens: a cut inside a word (no
space near the bound: CJK without spaces, one huge "word"), or any cut with a
pre-tokenizer that does not split on whitespace, changes in practice only the
tokens near the cut, so they differ from HF's only if one pre-token runs from
among the kept tokens to the cut (e.g. a byte-level BPE "word" of thousands
of letters; the BERT normalizer splits CJK per character, so there CJK stays
exact). A text cut at the hard bound is flagged ``truncated`` (content was
dropped) even when its prefix gave fewer than ``max_length`` tokens; those
ids can be fewer than HF's, which read the whole text (e.g. a text that
starts with 40,000 spaces).

With ``return_overflowing`` the caller asked for every window of the whole
text: :meth:`ArrowTokenizer.encode` cuts nothing and its cost grows with the
text (:meth:`ArrowTokenizer.count_tokens` stays bounded: it needs only the
first window). Without ``max_length`` nothing is truncated and whole texts are
tokenized.

Text pairs (``encode(texts, pairs)``, for cross-encoders and NLI models) are one
``encode_batch`` call over ``(text, text_pair)`` tuples: the template's pair
form and HF's ``longest_first`` truncation, type ids copied out per token. Each
side is cut at the hard bound only, so a pair's ids are exactly HF's in the
cases above for one text.
"""

from __future__ import annotations

import itertools
import operator
import re
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

#: Characters of a long text tokenized first, per token of ``max_length``
#: (English averages 4-5 characters per WordPiece/BPE token, CJK about one):
#: the prefix almost always holds ``max_length`` tokens, for a few ms at 128.
PRECUT_CHARS_PER_TOKEN = 32

#: The hard bound: no call tokenizes more than ``max_length *
#: MAX_CHARS_PER_TOKEN + 256`` characters of a text (33,024 at 128 tokens)
#: when truncating without overflow windows. 8x the precut budget, for texts
#: whose first part is sparse in tokens: runs of whitespace or markup, words
#: WordPiece turns into one ``[UNK]`` (over 100 characters: URLs, base64).
#: Cost measured on this machine at ``max_length=128`` (one core, Rust
#: ``encode_batch_fast``): 4-6 ms for 33 KB of English or of one long word,
#: 12 ms for byte-level BPE on 33 KB of CJK, 29 ms for WordPiece on 33 KB of
#: CJK (CJK text normally stops at the precut budget: 3 ms); a higher bound
#: buys fidelity only for texts averaging over 256 characters per token.
MAX_CHARS_PER_TOKEN = 256

#: In a reversed text: a space whose left neighbour is not whitespace.
_SPACE_AFTER_WORD_REVERSED = re.compile(r" (?=\S)")
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

        The length of the row :meth:`encode` gives for ``text`` (the first
        window with ``return_overflowing``), through the same bounded path: with
        ``max_length`` set at most ``max_length * MAX_CHARS_PER_TOKEN + 256``
        characters are tokenized, with or without overflow windows (see the
        module docstring for when the count is exactly HF's). Without
        ``max_length`` the whole text is counted.

        Raises:
            TokenizeError: ``text`` is not a ``str``, or the tokenizer failed.
        """
        if not isinstance(text, str):
            raise TokenizeError(f"expected str, got {type(text).__name__}")
        encodings, _ = self._run([text], whole=False)
        return len(encodings[0].ids)

    def encode(self, texts: TextInput, pairs: TextInput | None = None) -> TokenizedBatch:
        """Tokenize a column into ragged Arrow ``list<int32>`` columns.

        Args:
            texts: pyarrow ``string``/``large_string``/``binary``/
                ``large_binary`` array or chunked array, pandas Series, or a
                sequence of ``str``/``bytes``/None. Nulls give null rows.
            pairs: The second text of each row, for pair models (cross-encoders, NLI): a
                column of the same kinds and length. Row ``i`` is then the pair
                ``(texts[i], pairs[i])`` as HF's ``tokenizer(text, text_pair)`` encodes it
                (the template's pair form, type ids 1 on the second sequence,
                ``longest_first`` truncation); a row null in either column is null.
                Each text is cut at the hard bound only (no precut), and overflow
                windows are not built for pairs.

        Returns:
            The :class:`TokenizedBatch`; an empty string gives only the special
            tokens. With ``max_length`` and no overflow windows at most
            ``max_length * MAX_CHARS_PER_TOKEN + 256`` characters of a text
            are tokenized; a text cut at that bound is flagged ``truncated``
            (module docstring: when the ids are exactly HF's).

        Raises:
            TokenizeError: A non-text column or element, invalid UTF-8 (with
                :attr:`InvalidTextPolicy.RAISE`; the message names the row),
                or a failure inside the tokenizer; with ``pairs``: columns of two lengths,
                or ``return_overflowing`` configured.
        """
        column = to_text_column(texts, self.config.invalid_text)
        if pairs is not None:
            return self._encode_pairs(column, to_text_column(pairs, self.config.invalid_text))
        encodings, hard_cut = self._run(column.texts)
        windows, counts = self._windows(encodings)
        return self._assemble(column, windows, counts, hard_cut, self.spec.type_id_constant)

    def count_pair_tokens(self, text: str, text_pair: str) -> int:
        """Token count of one text pair after ``longest_first`` truncation, special tokens
        included (the row :meth:`encode` gives for it with ``pairs``).

        Raises:
            TokenizeError: Either is not a ``str``, overflow windows are configured, or the
                tokenizer failed.
        """
        if not isinstance(text, str) or not isinstance(text_pair, str):
            raise TokenizeError(f"expected a pair of str, got ({type(text).__name__}, "
                                f"{type(text_pair).__name__})")
        encodings, _ = self._run_pairs([text], [text_pair])
        return len(encodings[0].ids)

    def _encode_pairs(self, column: TextColumn, second: TextColumn) -> TokenizedBatch:
        """:meth:`encode` of ``(column[i], second[i])`` pairs: a row null or invalid in either
        column is a null row; type ids are copied (the second sequence's differ)."""
        if second.num_rows != column.num_rows:
            raise TokenizeError(f"text pairs need two columns of one length, got {column.num_rows} "
                                f"texts and {second.num_rows} second texts")
        both = np.intersect1d(column.rows, second.rows, assume_unique=True)
        firsts = [column.texts[i] for i in np.searchsorted(column.rows, both).tolist()]
        seconds = [second.texts[i] for i in np.searchsorted(second.rows, both).tolist()]
        merged = TextColumn(texts=firsts, rows=both, num_rows=column.num_rows,
                            invalid_rows=np.union1d(column.invalid_rows, second.invalid_rows))
        encodings, hard_cut = self._run_pairs(firsts, seconds)
        return self._assemble(merged, encodings, np.ones(len(encodings), dtype=np.int64), hard_cut, None)

    def _run_pairs(self, firsts: list[str], seconds: list[str]) -> tuple[list[HFEncoding], list[int]]:
        """Encodings of text pairs (``longest_first`` truncation), and the positions of the pairs
        of which a text was cut at the hard bound (as :meth:`_encode_bounded` cuts one text:
        each side is a prefix of its text, so truncation keeps the same tokens).

        Raises:
            TokenizeError: Overflow windows are configured (not built for pairs), or the
                tokenizer failed.
        """
        if self.config.return_overflowing:
            raise TokenizeError("overflow windows (return_overflowing) are not built for text pairs")
        limit = self.config.max_length
        hard_cut: list[int] = []
        if limit is not None:
            bound = limit * MAX_CHARS_PER_TOKEN + 256
            cut_a, cut_b = _cut_long(firsts, bound), _cut_long(seconds, bound)
            hard_cut = [i for i, (a, b) in enumerate(zip(firsts, seconds, strict=True))
                        if cut_a[i] is not a or cut_b[i] is not b]
            firsts, seconds = cut_a, cut_b
        try:
            # encode_batch, not encode_batch_fast: tokenizers 0.23's fast path gives the second
            # sequence type ids 0 when the tokenizer has no post-processor (HF gives 1).
            encodings = self._tokenizer.encode_batch(list(zip(firsts, seconds, strict=True)),
                                                     add_special_tokens=self.config.add_special_tokens)
            return list(encodings), hard_cut
        except Exception as exc:  # tokenizers raises plain Exception subclasses
            raise TokenizeError(f"tokenizer {self.source} failed on text pairs: {exc}") from exc

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

    def _run(self, texts: list[str], *, whole: bool | None = None) -> tuple[list[HFEncoding], list[int]]:
        """Encodings of ``texts``, and the positions of the texts cut at the hard bound.

        Args:
            texts: Valid texts.
            whole: Tokenize whole texts; default: only with ``return_overflowing``
                (every window of the text was asked for). Ignored without
                ``max_length`` (nothing to truncate: whole texts).
        """
        limit = self.config.max_length
        try:
            if limit is None or (self.config.return_overflowing if whole is None else whole):
                return self._encode_all(texts), []
            return self._encode_bounded(texts, limit)
        except Exception as exc:  # tokenizers raises plain Exception subclasses
            raise TokenizeError(f"tokenizer {self.source} failed: {exc}") from exc

    def _encode_all(self, texts: list[str]) -> list[HFEncoding]:
        return list(self._encode_batch(texts, add_special_tokens=self.config.add_special_tokens))

    def _encode_bounded(self, texts: list[str], limit: int) -> tuple[list[HFEncoding], list[int]]:
        """Cut at the precut budget; texts whose prefix fell short again, up to the hard bound.

        Returns:
            The encodings, and the positions of the texts cut at the hard bound.
        """
        cut = _cut_long(texts, limit * PRECUT_CHARS_PER_TOKEN + 256)
        encodings = self._encode_all(cut)
        if cut is texts:
            return encodings, []
        # A prefix that overflowed holds more than ``limit`` tokens: its first ones are kept.
        short = [
            i
            for i, (whole, part) in enumerate(zip(texts, cut, strict=True))
            if whole is not part and not encodings[i].overflowing
        ]
        if not short:
            return encodings, []
        again = [texts[i] for i in short]
        bounded = _cut_long(again, limit * MAX_CHARS_PER_TOKEN + 256)
        for i, encoding in zip(short, self._encode_all(bounded), strict=True):
            encodings[i] = encoding
        if bounded is again:
            return encodings, []
        pairs = zip(short, again, bounded, strict=True)
        return encodings, [i for i, whole, part in pairs if whole is not part]

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
        hard_cut: list[int],
    ) -> npt.NDArray[np.bool_]:
        """Per input row: had more than ``max_length`` tokens, or was cut at the hard bound.

        ``hard_cut``: positions among the valid texts (one window each: no overflow).
        """
        flags = np.zeros(column.num_rows, dtype=np.bool_)
        limit = self.config.max_length
        if limit is None:
            return flags
        flags[column.rows[hard_cut]] = True
        if self.config.return_overflowing:
            flags[column.rows] = counts > 1
            return flags
        for i in np.flatnonzero(lengths >= limit).tolist():  # only full rows can be truncated
            flags[column.rows[i]] = bool(windows[i].overflowing)
        return flags

    def _assemble(
        self,
        column: TextColumn,
        windows: list[HFEncoding],
        counts: npt.NDArray[np.int64],
        hard_cut: list[int],
        type_id_constant: int | None,
    ) -> TokenizedBatch:
        """The batch's Arrow columns (``type_id_constant``: every type id, or None: copy them)."""
        lengths = np.fromiter(map(len, windows), dtype=np.int64, count=len(windows))
        total = int(lengths.sum())
        flat_ids = np.fromiter(itertools.chain.from_iterable(map(_IDS, windows)), np.int32, count=total)
        constant = type_id_constant
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
            truncated=self._truncated(column, windows, counts, lengths, hard_cut),
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


def _cut_long(texts: list[str], bound: int) -> list[str]:
    """``texts`` with those longer than ``bound`` cut (``texts`` itself when none is)."""
    long_rows = [i for i, t in enumerate(texts) if len(t) > bound]
    if not long_rows:
        return texts
    cut = list(texts)
    for i in long_rows:
        cut[i] = texts[i][: _cut_point(texts[i], bound)]
    return cut


def _cut_point(text: str, bound: int) -> int:
    """Where to cut a text longer than ``bound``: at most ``bound`` characters are kept.

    The last space in ``[bound // 2, bound)`` that follows a non-whitespace
    character (the start of a whitespace run: no token of a whitespace-splitting
    pre-tokenizer spans it), else ``bound``. Only the second half is searched,
    in one pass of ``re`` over the reversed slice (``O(bound)``, no Python loop
    over spaces): a space far before the bound would waste the budget
    (``"a "`` then 2 MB of CJK without spaces would give one token).
    """
    low = bound // 2
    found = _SPACE_AFTER_WORD_REVERSED.search(text[low - 1 : bound][::-1])
    return bound if found is None else bound - 1 - found.start()


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
