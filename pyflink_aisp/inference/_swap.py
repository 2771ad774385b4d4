"""Model hot swap: a pointer file names the model version a job should serve.

The pointer is a small JSON file ``{"path": "<model file>", "sha256": "<hex>"}``
(a relative ``path`` is resolved against the pointer's directory). Publishing
a version (:func:`publish_model`, or ``aisp model publish``) hashes the model
file and replaces the pointer atomically (write a temporary sibling, then
``os.replace``), so a reader never sees half a pointer. Every worker of a job
polls the pointer (:class:`ModelSwapConfig`); a changed pointer is loaded in
the background with :meth:`ModelHandler.load_version`, which verifies the
sha256 and checks the model runs, then swapped in between two batches. A
pointer that fails is reported and skipped until it changes again; the old
model keeps serving. The pointer must be readable from every TaskManager
(a shared file system or the same host).

Permissions: the publisher needs write and search permission on the pointer's
directory; every TaskManager user needs read permission on the pointer and on
the model files it names, and search (``x``) permission on their directories.
:func:`publish_model` therefore writes the pointer with mode 0644 whatever the
publisher's umask (``mkstemp`` alone gives 0600, which a TaskManager running as
another user cannot read): a pointer holds only a path and a hash, nothing secret.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from pyflink_aisp.checksums import is_sha256_hex, sha256_file
from pyflink_aisp.errors import ConfigError, ModelError

__all__ = ["ModelPointer", "ModelSwapConfig", "publish_model", "read_pointer"]

_POINTER_MODE = 0o644
"""File mode of a published pointer: world-readable, so TaskManagers of any user read it."""
_DIR_MODE = 0o755
"""Mode of the directories :func:`publish_model` creates: searchable by every user."""


@dataclass(frozen=True, kw_only=True)
class ModelSwapConfig:
    """Where and how often a job looks for a new model version.

    Attributes:
        pointer_path: The pointer JSON file (see the module docstring).
        poll_interval_s: Seconds between two reads of the pointer (> 0).
    """

    pointer_path: Path
    poll_interval_s: float = 2.0

    def __post_init__(self) -> None:
        if not 0 < self.poll_interval_s <= 86_400:
            raise ConfigError(f"poll_interval_s must be in (0, 86400] seconds, got {self.poll_interval_s}")


@dataclass(frozen=True)
class ModelPointer:
    """A model version: file path and its expected sha256 (64 lower-case hex digits)."""

    path: Path
    sha256: str


def read_pointer(pointer_path: Path) -> ModelPointer | None:
    """Read a pointer file; None when it does not exist.

    Raises:
        ModelError: the file cannot be read (a permission problem names the user and
            the path), or is not a JSON object with a string ``path`` and a
            64-hex-digit ``sha256``.
    """
    try:
        text = pointer_path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except PermissionError as exc:
        raise ModelError(
            f"permission denied: user {_user()} cannot read model pointer {pointer_path} ({exc}); "
            "every TaskManager user needs read permission on the pointer and search (x) permission "
            "on its directories"
        ) from exc
    except OSError as exc:
        raise ModelError(f"cannot read model pointer {pointer_path}: {exc}") from exc
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise ModelError(f"model pointer {pointer_path} is not JSON: {exc}") from exc
    valid = isinstance(doc, dict) and isinstance(doc.get("path"), str) and is_sha256_hex(doc.get("sha256"))
    if not valid:
        raise ModelError(f'model pointer {pointer_path} must be {{"path": str, "sha256": 64 hex digits}}')
    path = Path(doc["path"])
    return ModelPointer(path if path.is_absolute() else pointer_path.parent / path, doc["sha256"])


def _user() -> str:
    """``name (uid N)`` of this process's effective user, for permission messages."""
    uid = os.geteuid()
    try:
        import pwd

        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except (ImportError, KeyError):  # no passwd entry (e.g. an arbitrary container uid)
        return f"uid {uid}"


def _make_searchable_dirs(directory: Path) -> None:
    """Create ``directory`` and missing parents with mode 0755 whatever the umask, so
    that TaskManagers running as other users can reach the pointer (existing
    directories are left as they are)."""
    missing = []
    for parent in (directory, *directory.parents):
        if parent.exists():
            break
        missing.append(parent)
    for created in reversed(missing):
        created.mkdir(exist_ok=True)
        os.chmod(created, _DIR_MODE)


def publish_model(pointer_path: Path, model_path: Path) -> ModelPointer:
    """Point ``pointer_path`` at ``model_path`` (hashed now), atomically.

    The pointer gets mode 0644 regardless of the umask, so
    TaskManagers running as other users can read it (see the module docstring).

    Returns:
        The pointer written (absolute model path).

    Raises:
        ModelError: ``model_path`` is not a readable file.
    """
    model_path = model_path.resolve()
    if not model_path.exists():
        raise ModelError(f"model file {model_path} does not exist")
    if not model_path.is_file():
        raise ModelError(f"model path {model_path} is not a file")
    if pointer_path.resolve() == model_path:
        raise ModelError(f"the pointer {pointer_path} would overwrite the model (order: POINTER MODEL)")
    if pointer_path.is_dir():
        raise ModelError(f"the pointer {pointer_path} is a directory; give a file name such as model.json")
    pointer = ModelPointer(model_path, sha256_file(model_path))
    try:
        _make_searchable_dirs(pointer_path.parent)
        fd, tmp = tempfile.mkstemp(prefix=".pointer-", dir=pointer_path.parent)
    except OSError as exc:
        raise ModelError(f"cannot write the pointer {pointer_path}: {exc}") from exc
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            os.fchmod(fh.fileno(), _POINTER_MODE)
            json.dump({"path": str(pointer.path), "sha256": pointer.sha256}, fh)
        os.replace(tmp, pointer_path)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise ModelError(f"cannot write the pointer {pointer_path}: {exc}") from exc
    return pointer
