"""sha256 of files, and checks against an expected digest."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

from pyflink_aisp.errors import ChecksumError, ConfigError, ModelError

__all__ = ["is_sha256_hex", "sha256_file", "verify_sha256"]

_CHUNK_BYTES = 1 << 20
_SHA256_RE = re.compile(r"[0-9a-f]{64}")


def is_sha256_hex(value: object) -> bool:
    """Whether ``value`` is a lower-case 64-digit hex string."""
    return isinstance(value, str) and _SHA256_RE.fullmatch(value) is not None


def sha256_file(path: Path | str) -> str:
    """Hex sha256 of a file, read in 1 MiB chunks.

    Raises:
        ModelError: The file cannot be read.
    """
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as handle:
            for chunk in iter(lambda: handle.read(_CHUNK_BYTES), b""):
                digest.update(chunk)
    except OSError as exc:
        raise ModelError(f"cannot read {path} to checksum it: {exc}") from exc
    return digest.hexdigest()


def verify_sha256(path: Path | str, expected: str, *, hint: str | None = None) -> str:
    """Check a file's sha256.

    Args:
        path: File to hash.
        expected: Expected lower-case hex sha256.
        hint: What to do about a mismatch, appended to the error message.

    Returns:
        The digest (equal to ``expected``).

    Raises:
        ConfigError: ``expected`` is not a 64-digit lower-case hex string.
        ChecksumError: The digest differs (``path``, ``expected``, ``actual`` set).
        ModelError: The file cannot be read.
    """
    if not is_sha256_hex(expected):
        raise ConfigError(f"expected sha256 must be 64 lower-case hex digits, got {expected!r}")
    actual = sha256_file(path)
    if actual != expected:
        error = ChecksumError(str(path), expected, actual)
        if hint:
            error.args = (f"{error.args[0]}; {hint}",)
        raise error
    return actual
