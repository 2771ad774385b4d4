"""Tests for sha256_file / verify_sha256."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from pyflink_aisp.checksums import sha256_file, verify_sha256
from pyflink_aisp.errors import ChecksumError, ConfigError, ModelError


def test_sha256_file_matches_hashlib(tmp_path: Path) -> None:
    path = tmp_path / "f.bin"
    data = bytes(range(256)) * 10_000  # > 1 MiB chunk
    path.write_bytes(data)
    assert sha256_file(path) == hashlib.sha256(data).hexdigest()
    assert verify_sha256(path, hashlib.sha256(data).hexdigest()) == hashlib.sha256(data).hexdigest()


def test_verify_mismatch_raises_with_context(tmp_path: Path) -> None:
    path = tmp_path / "f.bin"
    path.write_bytes(b"abc")
    wrong = "0" * 64
    with pytest.raises(ChecksumError, match="delete it") as info:
        verify_sha256(path, wrong, hint="delete it")
    assert info.value.expected == wrong
    assert info.value.actual == hashlib.sha256(b"abc").hexdigest()
    assert info.value.path == str(path)


def test_verify_rejects_malformed_digest_and_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError):
        verify_sha256(tmp_path, "ABC")
    with pytest.raises(ModelError):
        sha256_file(tmp_path / "missing")
