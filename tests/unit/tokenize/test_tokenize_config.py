"""Config validation, tokenizer-path resolution, the public names."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import pyflink_aisp.tokenize as tokenize_area
from pyflink_aisp.errors import ConfigError
from pyflink_aisp.tokenize import (
    MAX_LENGTH_PARAM,
    TOKENIZER_PATH_ENV,
    TOKENIZER_PATH_PARAM,
    TokenizerConfig,
    default_tokenizer_path,
    resolve_tokenizer_path,
)
from pyflink_aisp.tokenize._path import resolve_max_length


def test_public_names_exist_and_the_area_imports_without_pyflink() -> None:
    for name in tokenize_area.__all__:
        assert hasattr(tokenize_area, name), name
    code = "import sys, pyflink_aisp.tokenize; sys.exit('pyflink' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0
    import pyflink_aisp.tokenize.sql as sql

    for name in sql.__all__:
        assert hasattr(sql, name), name


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_length": 0},
        {"stride": -1},
        {"stride": 2},  # stride without overflow
        {"max_length": None, "return_overflowing": True},
        {"max_length": 8, "stride": 8, "return_overflowing": True},
    ],
)
def test_tokenizer_config_rejects(kwargs) -> None:
    with pytest.raises(ConfigError):
        TokenizerConfig(**kwargs)


def test_path_order_explicit_job_parameter_env_default(
    monkeypatch: pytest.MonkeyPatch, minilm_path: Path
) -> None:
    params = {TOKENIZER_PATH_PARAM: "/from/job"}

    def lookup(key: str, default: str) -> str:
        return params.get(key, default)

    monkeypatch.setenv(TOKENIZER_PATH_ENV, "/from/env")
    assert resolve_tokenizer_path("/explicit", lookup) == Path("/explicit")
    assert resolve_tokenizer_path(None, lookup) == Path("/from/job")
    params.clear()
    assert resolve_tokenizer_path(None, lookup) == Path("/from/env")
    monkeypatch.delenv(TOKENIZER_PATH_ENV)
    assert resolve_tokenizer_path() == default_tokenizer_path() == minilm_path


def test_max_length_parameter() -> None:
    def lookup(value: str):
        return lambda key, default: value if key == MAX_LENGTH_PARAM else default

    assert resolve_max_length(128, None) == 128
    assert resolve_max_length(128, lookup("")) == 128
    assert resolve_max_length(128, lookup("64")) == 64
    assert resolve_max_length(128, lookup("none")) is None
    with pytest.raises(ConfigError):
        resolve_max_length(128, lookup("lots"))
    with pytest.raises(ConfigError):
        resolve_max_length(128, lookup("-3"))
