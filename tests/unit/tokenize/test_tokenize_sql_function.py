"""The SQL function's Python side without a job: open() with job parameters, eval() on pandas."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from pyflink_aisp.tokenize import INVALID_TEXT_PARAM, MAX_LENGTH_PARAM, TOKENIZER_PATH_PARAM, ArrowTokenizer
from pyflink_aisp.tokenize.sql import TokenizeFunction, tokenize, tokenize_udf


class _Context:
    """The part of Flink's FunctionContext that open() uses."""

    def __init__(self, **params: str) -> None:
        self.params = params

    def get_job_parameter(self, key: str, default: str) -> str:
        return self.params.get(key, default)


def test_eval_returns_int32_arrays_and_nulls(minilm_path: Path) -> None:
    function = TokenizeFunction(minilm_path)
    function.open(_Context())
    out = function.eval(pd.Series(["Hello, world!", None, ""], dtype=object))
    assert isinstance(out, pd.Series) and len(out) == 3
    assert (
        out[0].dtype.name == "int32"
        and out[0].tolist()
        == ArrowTokenizer.from_file(minilm_path).encode(["Hello, world!"]).input_ids.to_pylist()[0]
    )
    assert out[1] is None and out[2].tolist() == [101, 102]


def test_job_parameters_choose_file_length_and_invalid_policy(bpe_path: Path) -> None:
    function = TokenizeFunction()
    function.open(_Context(**{TOKENIZER_PATH_PARAM: str(bpe_path), MAX_LENGTH_PARAM: "3"}))
    out = function.eval(pd.Series(["Hello world, this is long", b"\xff"], dtype=object))
    assert len(out[0]) == 3 and out[1] is None  # BPE file, truncated to 3; invalid UTF-8 -> null
    strict = TokenizeFunction(bpe_path)
    strict.open(_Context(**{INVALID_TEXT_PARAM: "raise"}))
    with pytest.raises(Exception, match="row 0 is not valid UTF-8"):
        strict.eval(pd.Series([b"\xff"], dtype=object))


def test_udf_objects_are_pandas_scalar_functions(minilm_path: Path) -> None:
    for function in (tokenize, tokenize_udf(minilm_path, max_length=None)):
        assert function._func_type == "pandas"
    with pytest.raises(RuntimeError, match="before open"):
        TokenizeFunction().eval(pd.Series(["x"]))
