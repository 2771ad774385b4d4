"""The bearer token of the affinity service: from a file or the environment."""

from __future__ import annotations

import os
from pathlib import Path

from pyflink_aisp.errors import ConfigError

__all__ = ["TOKEN_ENV", "TOKEN_FILE_ENV", "resolve_token"]

#: Environment variable holding the token itself.
TOKEN_ENV = "AISP_AFFINITY_TOKEN"
#: Environment variable naming a file whose first line is the token.
TOKEN_FILE_ENV = "AISP_AFFINITY_TOKEN_FILE"


def resolve_token(token_file: Path | None = None) -> str | None:
    """The token: ``token_file``, else ``$AISP_AFFINITY_TOKEN_FILE``, else
    ``$AISP_AFFINITY_TOKEN``, else None.

    Raises:
        ConfigError: The file cannot be read or is empty.
    """
    path = token_file or (Path(os.environ[TOKEN_FILE_ENV]) if os.environ.get(TOKEN_FILE_ENV) else None)
    if path is not None:
        try:
            token = path.read_text(encoding="utf-8").strip().splitlines()
        except OSError as exc:
            raise ConfigError(f"cannot read the affinity token file {path}: {exc.strerror}") from exc
        if not token or not token[0].strip():
            raise ConfigError(f"the affinity token file {path} is empty")
        return token[0].strip()
    return os.environ.get(TOKEN_ENV) or None
