"""Freshly allocated padded ``(batch, seq_len)`` int64 model inputs (model building).

:class:`BatchEncoder` wraps :class:`~pyflink_aisp.tokenize.ArrowTokenizer`:
it truncates to ``max_length`` tokens and pads each batch to its longest row
(``[PAD]`` id and type id from the file), which is what sentence-transformers
does. :meth:`BatchEncoder.encode_buckets` sorts texts by token count first, so
rows in one batch have similar lengths and little padding is computed. Its
arrays are not pooled: callers may keep them.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from pyflink_aisp.errors import ConfigError, TokenizeError
from pyflink_aisp.tokenize._batch import PaddedBatch, TokenizedBatch, iter_buckets, pad_batch
from pyflink_aisp.tokenize._config import PaddingConfig, TokenizerConfig
from pyflink_aisp.tokenize._tokenizer import ArrowTokenizer

__all__ = ["BatchEncoder", "Encoding"]

Int64Array = npt.NDArray[np.int64]


@dataclass(frozen=True, kw_only=True, eq=False)
class Encoding:
    """One padded batch of model inputs.

    Attributes:
        input_ids: ``(batch, seq_len)`` int64 token ids, ``[PAD]`` after each row's end.
        attention_mask: ``(batch, seq_len)`` int64, 1 for real tokens, 0 for padding.
        token_type_ids: ``(batch, seq_len)`` int64 segment ids (0 for single texts).
        lengths: ``(batch,)`` int64 real token count per row (special tokens included).

    Raises:
        ConfigError: The arrays' shapes or dtypes disagree.
    """

    input_ids: Int64Array
    attention_mask: Int64Array
    token_type_ids: Int64Array
    lengths: Int64Array

    def __post_init__(self) -> None:
        arrays = (self.input_ids, self.attention_mask, self.token_type_ids)
        if any(a.ndim != 2 or a.shape != self.input_ids.shape for a in arrays):
            raise ConfigError("input_ids, attention_mask and token_type_ids need one (batch, seq_len) shape")
        if any(a.dtype != np.int64 for a in (*arrays, self.lengths)):
            raise ConfigError("Encoding arrays must be int64")
        if self.lengths.shape != (self.input_ids.shape[0],):
            raise ConfigError(f"lengths must have shape (batch,), got {self.lengths.shape}")

    @property
    def batch_size(self) -> int:
        """Number of rows."""
        return int(self.input_ids.shape[0])

    def model_inputs(self) -> dict[str, Int64Array]:
        """The three named ONNX inputs (``input_ids``, ``attention_mask``, ``token_type_ids``)."""
        return {
            "input_ids": self.input_ids,
            "attention_mask": self.attention_mask,
            "token_type_ids": self.token_type_ids,
        }


class BatchEncoder:
    """Tokenize texts into freshly allocated padded int64 batches.

    A thin layer over :class:`~pyflink_aisp.tokenize.ArrowTokenizer` (same ids)
    for callers that keep the arrays (model building); streaming inference
    uses the tokenizer's pooled batches directly.

    Thread-safety: ``encode*`` may be called from several threads.

    Args:
        tokenizer_path: A HF ``tokenizer.json``.
        max_length: Truncate each text to this many tokens, special tokens included.

    Raises:
        ConfigError: ``max_length`` < 2.
        ModelError: The tokenizer file is missing or cannot be parsed.
    """

    def __init__(self, tokenizer_path: Path | str, max_length: int = 128) -> None:
        if max_length < 2:
            raise ConfigError(f"max_length must be >= 2 (room for [CLS] and [SEP]), got {max_length}")
        self.tokenizer = ArrowTokenizer.from_file(tokenizer_path, TokenizerConfig(max_length=max_length))
        self.tokenizer_path = Path(tokenizer_path)
        self.max_length = max_length

    def encode(self, texts: Sequence[str]) -> Encoding:
        """Tokenize and pad to the longest text.

        Args:
            texts: Input strings.

        Returns:
            An :class:`Encoding` with ``batch = len(texts)``; ``seq_len`` is the
            longest row (0 for an empty input).

        Raises:
            TokenizeError: An input is not a ``str``.
        """
        batch = self._tokenize(texts)
        return _to_encoding(
            pad_batch(batch, _PADDING, pad_id=self.tokenizer.pad_id, pad_type_id=self.tokenizer.pad_type_id)
        )

    def encode_buckets(
        self, texts: Sequence[str], batch_size: int = 64
    ) -> Iterator[tuple[npt.NDArray[np.intp], Encoding]]:
        """Tokenize all texts once, then yield length-sorted padded batches.

        Args:
            texts: Input strings.
            batch_size: Rows per batch (the last one may be smaller).

        Yields:
            ``(indices, encoding)``: ``indices`` ``(rows,)`` are positions in
            ``texts`` (ascending token length, ties in input order).

        Raises:
            ConfigError: ``batch_size`` < 1.
            TokenizeError: An input is not a ``str``.
        """
        if batch_size < 1:
            raise ConfigError(f"batch_size must be >= 1, got {batch_size}")
        batch = self._tokenize(texts)
        padded = iter_buckets(
            batch, batch_size, _PADDING, pad_id=self.tokenizer.pad_id, pad_type_id=self.tokenizer.pad_type_id
        )
        for encoding in padded:
            yield encoding.rows, _to_encoding(encoding)

    def _tokenize(self, texts: Sequence[str]) -> TokenizedBatch:
        texts = list(texts)
        for position, text in enumerate(texts):
            if not isinstance(text, str):
                raise TokenizeError(f"input {position} is {type(text).__name__}, expected str")
        return self.tokenizer.encode(texts)


_PADDING = PaddingConfig()


def _to_encoding(padded: PaddedBatch) -> Encoding:
    return Encoding(
        input_ids=padded.input_ids,
        attention_mask=padded.attention_mask,
        token_type_ids=padded.token_type_ids,
        lengths=padded.lengths,
    )
