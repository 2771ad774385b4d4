"""Tokenization: HF ``tokenizers`` ids as padded int64 batches for the model.

Public API: :class:`BatchEncoder`, :class:`Encoding`.
"""

from __future__ import annotations

from pyflink_aisp.tokenize._encode import BatchEncoder, Encoding

__all__ = ["BatchEncoder", "Encoding"]
