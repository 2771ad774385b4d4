"""Configuration of :class:`~pyflink_aisp.tokenize.ArrowTokenizer`: truncation, overflow, padding.

The names and semantics follow HF ``tokenizers`` / ``transformers``
(``max_length``, ``stride``, ``return_overflowing_tokens``,
``add_special_tokens``, ``pad_to_multiple_of``, ``padding_side``), so a
config here gives the same ids as the same call of
``transformers.AutoTokenizer`` on the same ``tokenizer.json``.
"""

from __future__ import annotations

import enum
import itertools
from dataclasses import dataclass

import numpy as np

from pyflink_aisp.errors import ConfigError

__all__ = [
    "IdDtype",
    "InvalidTextPolicy",
    "PadStrategy",
    "PaddingConfig",
    "PaddingSide",
    "TokenizerConfig",
]


class InvalidTextPolicy(enum.StrEnum):
    """What to do with a binary row that is not valid UTF-8."""

    #: Raise :class:`~pyflink_aisp.errors.TokenizeError` naming the first bad row.
    RAISE = "raise"
    #: Null outputs for the row; its index is in ``TokenizedBatch.invalid_rows`` (for a DLQ).
    NULL = "null"


class PadStrategy(enum.StrEnum):
    """How ``seq_len`` of a padded batch is chosen."""

    #: The longest row of the batch (``transformers`` ``padding="longest"``).
    LONGEST = "longest"
    #: The longest row rounded up to a multiple of ``PaddingConfig.multiple_of``.
    MULTIPLE_OF = "multiple_of"
    #: The smallest of ``PaddingConfig.buckets`` that fits the longest row
    #: (one bucket = fixed length, ``padding="max_length"``).
    BUCKETS = "buckets"


class PaddingSide(enum.StrEnum):
    """Where pad tokens go (``transformers`` ``padding_side``)."""

    RIGHT = "right"
    LEFT = "left"


class IdDtype(enum.StrEnum):
    """Integer type of padded model inputs."""

    INT64 = "int64"
    INT32 = "int32"

    @property
    def numpy(self) -> np.dtype[np.signedinteger]:
        """The numpy dtype."""
        return np.dtype(self.value)


@dataclass(frozen=True, kw_only=True)
class TokenizerConfig:
    """Truncation, overflow and special-token options of one tokenizer.

    Attributes:
        max_length: Keep at most this many tokens per row, special tokens
            included (HF ``truncation=True, max_length=...``, strategy
            ``longest_first``); None: no truncation.
        stride: Tokens shared by consecutive overflow windows (HF ``stride``);
            only with ``return_overflowing``.
        return_overflowing: Emit the truncated rest of a long row as further
            windows of ``max_length`` tokens, each mapped back to its source row
            (HF ``return_overflowing_tokens=True``).
        add_special_tokens: Add the post-processor's special tokens
            (``[CLS]``/``[SEP]``, ``<s>``/``</s>``); lowercasing and other
            normalisation always follow the ``tokenizer.json``.
        invalid_text: Binary rows that are not UTF-8: raise or null (DLQ).

    Raises:
        ConfigError: ``max_length`` < 1, ``stride`` < 0, ``stride`` without
            ``return_overflowing`` or overflow without ``max_length``.
    """

    max_length: int | None = 512
    stride: int = 0
    return_overflowing: bool = False
    add_special_tokens: bool = True
    invalid_text: InvalidTextPolicy = InvalidTextPolicy.RAISE

    def __post_init__(self) -> None:
        if self.max_length is not None and self.max_length < 1:
            raise ConfigError(f"max_length must be >= 1 or None, got {self.max_length}")
        if self.stride < 0:
            raise ConfigError(f"stride must be >= 0, got {self.stride}")
        if self.stride and not self.return_overflowing:
            raise ConfigError("stride only applies with return_overflowing=True")
        if self.return_overflowing and self.max_length is None:
            raise ConfigError("return_overflowing needs max_length")
        if self.max_length is not None and self.stride >= self.max_length:
            raise ConfigError(f"stride {self.stride} must be < max_length {self.max_length}")


@dataclass(frozen=True, kw_only=True)
class PaddingConfig:
    """How padded ``(batch, seq_len)`` model inputs are laid out.

    Attributes:
        strategy: How ``seq_len`` is chosen.
        multiple_of: For :attr:`PadStrategy.MULTIPLE_OF` (e.g. 8 for tensor cores).
        buckets: For :attr:`PadStrategy.BUCKETS`: allowed lengths, ascending.
        side: Pad on the right (default, BERT) or the left.
        dtype: ``int64`` (ONNX Runtime BERT graphs, torch) or ``int32``.
        pad_id: Id of pad positions; None: the ``tokenizer.json``'s
            ``padding.pad_id``, else the id of ``[PAD]``/``<pad>``, else 0.
        pad_type_id: Type id of pad positions; None: ``padding.pad_type_id`` or 0.

    Raises:
        ConfigError: ``multiple_of`` < 1, empty/unsorted/non-positive buckets
            for :attr:`PadStrategy.BUCKETS`, or a negative pad id.
    """

    strategy: PadStrategy = PadStrategy.LONGEST
    multiple_of: int = 8
    buckets: tuple[int, ...] = ()
    side: PaddingSide = PaddingSide.RIGHT
    dtype: IdDtype = IdDtype.INT64
    pad_id: int | None = None
    pad_type_id: int | None = None

    def __post_init__(self) -> None:
        if self.multiple_of < 1:
            raise ConfigError(f"multiple_of must be >= 1, got {self.multiple_of}")
        if self.strategy is PadStrategy.BUCKETS:
            b = self.buckets
            if not b or min(b) < 1 or any(x >= y for x, y in itertools.pairwise(b)):
                raise ConfigError(f"buckets must be positive and strictly ascending, got {b}")
        for name in ("pad_id", "pad_type_id"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ConfigError(f"{name} must be >= 0, got {value}")

    def seq_len(self, longest: int) -> int | None:
        """``seq_len`` for a batch whose longest row has ``longest`` tokens.

        Returns:
            The padded length, or None when ``longest`` exceeds the largest bucket.
        """
        if self.strategy is PadStrategy.MULTIPLE_OF:
            return -(-longest // self.multiple_of) * self.multiple_of
        if self.strategy is PadStrategy.BUCKETS:
            return next((b for b in self.buckets if b >= longest), None)
        return longest
