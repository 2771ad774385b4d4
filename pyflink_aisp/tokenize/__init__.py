"""Tokenization: HF ``tokenizers`` ids into Arrow ``list<int32>`` and pooled padded batches.

Public API: :class:`ArrowTokenizer` (``encode`` → :class:`TokenizedBatch`,
``pad``/``encode_padded``/``iter_buckets`` → :class:`PaddedBatch`),
:class:`TokenizerConfig`, :class:`PaddingConfig` (:class:`PadStrategy`,
:class:`PaddingSide`, :class:`IdDtype`), :class:`InvalidTextPolicy`,
:class:`BufferPool`, :class:`PoolStats`, the tokenizer-path resolution
(:func:`resolve_tokenizer_path` and its parameter names) and the older
:class:`BatchEncoder` / :class:`Encoding` (fresh arrays, model building).

The Flink SQL function lives in :mod:`pyflink_aisp.tokenize.sql` (needs PyFlink).
"""

from __future__ import annotations

from pyflink_aisp.tokenize._batch import PaddedBatch, TokenizedBatch
from pyflink_aisp.tokenize._config import (
    IdDtype,
    InvalidTextPolicy,
    PaddingConfig,
    PaddingSide,
    PadStrategy,
    TokenizerConfig,
)
from pyflink_aisp.tokenize._encode import BatchEncoder, Encoding
from pyflink_aisp.tokenize._path import (
    INVALID_TEXT_PARAM,
    MAX_LENGTH_PARAM,
    TOKENIZER_PATH_ENV,
    TOKENIZER_PATH_PARAM,
    default_tokenizer_path,
    resolve_tokenizer_path,
)
from pyflink_aisp.tokenize._pool import BufferPool, PoolStats
from pyflink_aisp.tokenize._tokenizer import ArrowTokenizer

__all__ = [
    "INVALID_TEXT_PARAM",
    "MAX_LENGTH_PARAM",
    "TOKENIZER_PATH_ENV",
    "TOKENIZER_PATH_PARAM",
    "ArrowTokenizer",
    "BatchEncoder",
    "BufferPool",
    "Encoding",
    "IdDtype",
    "InvalidTextPolicy",
    "PadStrategy",
    "PaddedBatch",
    "PaddingConfig",
    "PaddingSide",
    "PoolStats",
    "TokenizedBatch",
    "TokenizerConfig",
    "default_tokenizer_path",
    "resolve_tokenizer_path",
]
