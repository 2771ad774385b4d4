"""Text columns in: pyarrow arrays, chunked arrays, pandas Series, Python sequences.

Everything becomes a :class:`TextColumn`: the valid rows' texts as a Python
``list[str]`` (what the Rust tokenizer's ``encode_batch`` takes) and their row
positions. Nulls are kept as positions, never passed to the tokenizer. Binary
rows are decoded as UTF-8; a row that is not UTF-8 raises an error naming it,
or becomes null under :attr:`InvalidTextPolicy.NULL`.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from pyflink_aisp.errors import TokenizeError
from pyflink_aisp.tokenize._config import InvalidTextPolicy

__all__ = ["TextColumn", "TextInput", "to_text_column"]

#: What :meth:`ArrowTokenizer.encode` accepts: ``pa.Array | pa.ChunkedArray | pandas.Series |
#: Sequence[str | bytes | None]`` (spelled ``Any``: pyarrow and pandas ship no complete stubs).
TextInput: TypeAlias = Any

_STRING_TYPES = (pa.string(), pa.large_string())
_BINARY_TYPES = (pa.binary(), pa.large_binary())


@dataclass(frozen=True, kw_only=True, eq=False)
class TextColumn:
    """The valid texts of a column and where they sit.

    Attributes:
        texts: Texts of the valid rows, in row order.
        rows: ``(len(texts),)`` int64 row position of each text.
        num_rows: Rows in the input, nulls included.
        invalid_rows: ``(k,)`` int64 rows dropped as invalid UTF-8 (only with
            :attr:`InvalidTextPolicy.NULL`).
    """

    texts: list[str]
    rows: npt.NDArray[np.int64]
    num_rows: int
    invalid_rows: npt.NDArray[np.int64]


def to_text_column(values: TextInput, policy: InvalidTextPolicy) -> TextColumn:
    """Normalise any supported text input.

    Args:
        values: A ``string``/``large_string``/``binary``/``large_binary``
            (or dictionary of those, or all-null) pyarrow array or chunked
            array; a pandas Series of ``str``/``bytes``/None (object, string or
            Arrow dtype); or a sequence of ``str``/``bytes``/None.
        policy: Invalid UTF-8 handling.

    Raises:
        TokenizeError: A non-text column or element (message names the type
            and row), or invalid UTF-8 under :attr:`InvalidTextPolicy.RAISE`.
    """
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks() if values.num_chunks != 1 else values.chunk(0)
    if isinstance(values, pa.Array):
        return _from_arrow(values, policy)
    pandas = sys.modules.get("pandas")  # a Series exists only if pandas was imported
    if pandas is not None and isinstance(values, pandas.Series):
        return _from_pandas(values, policy)
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
        raise TokenizeError(
            f"expected a text column (pyarrow array, pandas Series or sequence), got {type(values).__name__}"
        )
    return _from_objects(list(values), policy)


def _from_arrow(array: pa.Array, policy: InvalidTextPolicy) -> TextColumn:
    kind = array.type
    if pa.types.is_dictionary(kind):
        return _from_arrow(array.dictionary_decode(), policy)
    if pa.types.is_null(kind):
        return _column([], np.empty(0, np.int64), len(array))
    if hasattr(pa.types, "is_string_view") and (
        pa.types.is_string_view(kind) or pa.types.is_binary_view(kind)
    ):
        return _from_arrow(
            array.cast(pa.large_string() if pa.types.is_string_view(kind) else pa.large_binary()), policy
        )
    if kind not in _STRING_TYPES and kind not in _BINARY_TYPES:
        raise TokenizeError(
            f"text column has Arrow type {kind}; expected string, large_string, binary or large_binary"
        )
    rows = _valid_rows(array)
    valid = array if rows is None else array.drop_null()
    rows = np.arange(len(array), dtype=np.int64) if rows is None else rows
    if kind in _BINARY_TYPES:
        try:
            valid = valid.cast(pa.large_string())
        except pa.ArrowInvalid:
            return _decode_objects(valid.to_pylist(), rows, len(array), policy)
    # ``to_numpy().tolist()`` builds the str objects about 10x faster than ``to_pylist()``.
    return _column(valid.to_numpy(zero_copy_only=False).tolist(), rows, len(array))


def _valid_rows(array: pa.Array) -> npt.NDArray[np.int64] | None:
    """Row positions of the non-null rows, or None when there is no null."""
    if array.null_count == 0:
        return None
    return np.flatnonzero(array.is_valid().to_numpy(zero_copy_only=False)).astype(np.int64)


def _from_pandas(series: Any, policy: InvalidTextPolicy) -> TextColumn:
    dtype_name = str(series.dtype)
    if dtype_name.startswith("string") or dtype_name.endswith("[pyarrow]"):
        return _from_arrow(pa.array(series.array), policy)
    if dtype_name != "object":
        raise TokenizeError(f"text column has pandas dtype {dtype_name}; expected str or bytes objects")
    return _from_objects(series.tolist(), policy)


def _from_objects(items: list[Any], policy: InvalidTextPolicy) -> TextColumn:
    """Validate a list of ``str``/``bytes``/None (NaN counts as null, as in pandas)."""
    texts: list[str] = []
    rows: list[int] = []
    binary: list[bytes] = []
    binary_rows: list[int] = []
    for row, item in enumerate(items):
        if type(item) is str:
            texts.append(item)
            rows.append(row)
        elif item is None or (isinstance(item, float) and item != item):
            continue
        elif isinstance(item, (bytes, bytearray, memoryview)):
            binary.append(bytes(item))
            binary_rows.append(row)
        elif isinstance(item, str):
            texts.append(str(item))
            rows.append(row)
        else:
            raise TokenizeError(f"row {row} is {type(item).__name__}, expected str, bytes or None")
    if not binary:
        return _column(texts, np.asarray(rows, dtype=np.int64), len(items))
    decoded = _decode_objects(binary, np.asarray(binary_rows, dtype=np.int64), len(items), policy)
    order = np.argsort(np.concatenate([rows, decoded.rows]), kind="stable")
    merged = texts + decoded.texts
    all_rows = np.concatenate([np.asarray(rows, np.int64), decoded.rows])
    return TextColumn(
        texts=[merged[i] for i in order],
        rows=all_rows[order],
        num_rows=len(items),
        invalid_rows=decoded.invalid_rows,
    )


def _decode_objects(
    items: list[bytes], rows: npt.NDArray[np.int64], num_rows: int, policy: InvalidTextPolicy
) -> TextColumn:
    """UTF-8-decode binary rows, naming (or dropping) the invalid ones."""
    texts: list[str] = []
    kept: list[int] = []
    invalid: list[int] = []
    for item, row in zip(items, rows.tolist(), strict=True):
        try:
            texts.append(item.decode("utf-8"))
            kept.append(row)
        except UnicodeDecodeError as exc:
            if policy is InvalidTextPolicy.RAISE:
                raise TokenizeError(
                    f"row {row} is not valid UTF-8 ({exc.reason} at byte {exc.start}: {item[:32]!r})"
                ) from exc
            invalid.append(row)
    return TextColumn(
        texts=texts,
        rows=np.asarray(kept, dtype=np.int64),
        num_rows=num_rows,
        invalid_rows=np.asarray(invalid, dtype=np.int64),
    )


def _column(texts: list[str], rows: npt.NDArray[np.int64], num_rows: int) -> TextColumn:
    return TextColumn(texts=texts, rows=rows, num_rows=num_rows, invalid_rows=np.empty(0, np.int64))
