"""Edge cases found by breaking: model hot swap and `aisp model publish` (no services)."""

from __future__ import annotations

import hashlib
import logging
import math
import os
import pwd
import stat
import time
from pathlib import Path

import pytest

from pyflink_aisp.errors import ConfigError, ModelError
from pyflink_aisp.inference import BatchingConfig, ModelHandler, ModelRuntime, ModelSwapConfig, publish_model
from pyflink_aisp.inference._swap import ModelPointer, read_pointer


class VersionedHandler(ModelHandler[str, str, str]):
    """The 'model' is the file's sha256; a prediction is that sha."""

    def __init__(self, default: Path) -> None:
        self._default = default

    def load_model(self) -> str:
        return hashlib.sha256(self._default.read_bytes()).hexdigest()

    def model_version(self) -> str:
        return hashlib.sha256(self._default.read_bytes()).hexdigest()

    def load_version(self, path: Path, sha256: str) -> str:
        assert hashlib.sha256(Path(path).read_bytes()).hexdigest() == sha256
        return sha256

    def run_inference(self, batch, model):  # type: ignore[no-untyped-def]
        return [model for _ in batch]


def test_pointer_reverted_before_next_batch_keeps_old_version(tmp_path: Path) -> None:
    """Publish B, then (no record in between, e.g. an idle stream) publish A back:
    the pointer says A, but B (left in `ready`) is swapped in at the next batch."""
    a, b = tmp_path / "a.onnx", tmp_path / "b.onnx"
    a.write_bytes(b"model A")
    b.write_bytes(b"model B")
    pointer = tmp_path / "model.json"
    runtime = ModelRuntime.acquire(VersionedHandler(a), BatchingConfig(max_batch_size=4, max_wait_ms=1),
                                   swap=ModelSwapConfig(pointer_path=pointer, poll_interval_s=0.05))
    try:
        version_a = runtime.model_version
        publish_model(pointer, b)
        time.sleep(0.4)  # watcher loads B; no batch runs, so B is not swapped in yet
        publish_model(pointer, a)  # operator rolls back
        time.sleep(0.4)
        result = runtime.submit("x").result(timeout=5)
        assert result.model_version == version_a, "served B although the pointer names A"
    finally:
        runtime.release()


def test_publish_pointer_onto_the_model_file_is_refused(tmp_path: Path) -> None:
    """`aisp model publish m.onnx m.onnx` (arguments swapped/typo) overwrites the
    model with the pointer JSON and exits 0."""
    model = tmp_path / "m.onnx"
    model.write_bytes(b"\x08\x07onnx bytes")
    with pytest.raises(ModelError):
        publish_model(model, model)
    assert model.read_bytes() == b"\x08\x07onnx bytes"


@pytest.mark.parametrize("kind", ["directory", "missing_parent_under_proc"])
def test_cli_publish_bad_pointer_path_is_one_line_error(tmp_path: Path, kind: str, capsys) -> None:  # type: ignore[no-untyped-def]
    """A pointer path that is a directory (IsADirectoryError) or cannot be created
    (FileNotFoundError/PermissionError) gives a Python traceback instead of
    `aisp: error: ...` / exit 1; the directory case also leaves a .pointer-* temp file."""
    from pyflink_aisp.cli import main

    model = tmp_path / "m.onnx"
    model.write_bytes(b"x")
    pointer = tmp_path / "ptr" if kind == "directory" else Path("/proc/aisp-nope/p.json")
    if kind == "directory":
        pointer.mkdir()
    assert main(["model", "publish", str(pointer), str(model)]) == 1
    assert "aisp: error:" in capsys.readouterr().err
    assert not list(tmp_path.glob(".pointer-*")), "temporary pointer file left behind"


def test_poll_interval_inf_is_refused() -> None:
    """poll_interval_s=inf (aisp.model.poll-interval-s=inf) passes validation; the
    watcher thread then dies with OverflowError in Event.wait and hot swap stops silently."""
    with pytest.raises(ConfigError):
        ModelSwapConfig(pointer_path=Path("/tmp/p.json"), poll_interval_s=math.inf)


def test_published_pointer_is_world_readable_under_a_strict_umask(tmp_path: Path) -> None:
    """mkstemp made the pointer 0600: a TaskManager running as another user never saw a new
    model. It is 0644 whatever the publisher's umask (it holds only a path and a hash);
    republishing keeps the mode and the atomic replace leaves no temporary file."""
    model = tmp_path / "m.onnx"
    model.write_bytes(b"model")
    pointer = tmp_path / "model.json"
    old = os.umask(0o077)
    try:
        publish_model(pointer, model)
        assert stat.S_IMODE(pointer.stat().st_mode) == 0o644
        publish_model(pointer, model)
        assert stat.S_IMODE(pointer.stat().st_mode) == 0o644
    finally:
        os.umask(old)
    assert read_pointer(pointer) == ModelPointer(model.resolve(), hashlib.sha256(b"model").hexdigest())
    assert not list(tmp_path.glob(".pointer-*"))


def _deny_pointer(monkeypatch: pytest.MonkeyPatch, pointer: Path) -> None:
    """Reading ``pointer`` raises PermissionError (the suite may run as root, where chmod 000 reads)."""
    real = Path.read_text

    def read_text(self: Path, *args, **kwargs):  # type: ignore[no-untyped-def]
        if self == pointer:
            raise PermissionError(13, "Permission denied", str(self))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Path, "read_text", read_text)


def test_unreadable_pointer_says_permission_user_and_path(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    pointer = tmp_path / "model.json"
    _deny_pointer(monkeypatch, pointer)
    with pytest.raises(ModelError) as err:
        read_pointer(pointer)
    message = str(err.value)
    assert message.startswith(f"permission denied: user {pwd.getpwuid(os.geteuid()).pw_name} "
                              f"(uid {os.geteuid()}) cannot read model pointer {pointer} ")
    assert "read permission on the pointer" in message and "\n" not in message


def test_watcher_logs_the_permission_problem(tmp_path: Path, monkeypatch, caplog) -> None:  # type: ignore[no-untyped-def]
    """The runtime's watcher reports read_pointer's message: a permission problem, user, path."""
    a = tmp_path / "a.onnx"
    a.write_bytes(b"model A")
    pointer = tmp_path / "model.json"
    publish_model(pointer, a)
    _deny_pointer(monkeypatch, pointer)
    with caplog.at_level(logging.ERROR):
        runtime = ModelRuntime.acquire(VersionedHandler(a), BatchingConfig(max_batch_size=4, max_wait_ms=1),
                                       swap=ModelSwapConfig(pointer_path=pointer, poll_interval_s=0.05))
        try:
            assert runtime.submit("x").result(timeout=5).model_version == runtime.model_version
        finally:
            runtime.release()
    assert f"permission denied: user {pwd.getpwuid(os.geteuid()).pw_name}" in caplog.text
    assert f"cannot read model pointer {pointer}" in caplog.text


def test_directories_publish_creates_are_searchable_under_a_strict_umask(tmp_path: Path) -> None:
    """With umask 077 the pointer's new parent directories were 0700: the 0644 pointer in them was
    unreachable for a TaskManager of another user. New ones are 0755; existing ones are not touched."""
    model = tmp_path / "m.onnx"
    model.write_bytes(b"model")
    existing = tmp_path / "existing"
    existing.mkdir(mode=0o700)
    os.chmod(existing, 0o700)
    old = os.umask(0o077)
    try:
        publish_model(existing / "new" / "sub" / "model.json", model)
    finally:
        os.umask(old)
    assert stat.S_IMODE(existing.stat().st_mode) == 0o700
    assert stat.S_IMODE((existing / "new").stat().st_mode) == 0o755
    assert stat.S_IMODE((existing / "new" / "sub").stat().st_mode) == 0o755
    assert stat.S_IMODE((existing / "new" / "sub" / "model.json").stat().st_mode) == 0o644
