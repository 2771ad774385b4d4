"""The job's Python environment as one relocatable archive for ``flink run -pyarch``.

A TaskManager without the project venv gets its Python from the archive: Flink
extracts ``-pyarch FILE#aisp-env`` into each Python worker's working directory
and starts ``-pyexec aisp-env/venv/bin/python`` there (the client does the same
for ``-pyclientexec``). The venv is made by uv (``uv venv --relocatable``: its
scripts and activation find the venv from their own location) and holds this
project as a regular (non-editable) install with its runtime dependencies only
(``[project.dependencies]``: no dev extras, no torch), at the versions installed
beside this package (:func:`installed_pins` as uv constraints).

What it does not hold: CPython itself. ``venv/bin/python`` links to the base
interpreter the venv was made from (its path is in ``venv/pyvenv.cfg``), so every
TaskManager needs that CPython 3.11 at the same path, as Flink's own
"virtualenv + ``-pyarch``" recipe assumes; the ``docker/`` image has it.

Cached under ``<aisp_home>/packages/envs/`` by a key over what goes in
(``pyproject.toml``, every file of the ``pyflink_aisp`` package, the base
interpreter, uv's version, the pinned versions; the two newest are kept): a second ``aisp package``
with nothing changed reuses the archive (about 1 GB unpacked, 0.6 GB packed; building it takes
~1.5 min here, most of it gzip).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

from pyflink_aisp.errors import EnvironmentSetupError
from pyflink_aisp.home import aisp_home, project_root

__all__ = [
    "ENV_ARCHIVE_TARGET",
    "EnvArchive",
    "base_python",
    "ensure_env_archive",
    "env_key",
    "installed_pins",
]

#: Folder name the archive is extracted to on the workers (``-pyarch FILE#aisp-env``).
ENV_ARCHIVE_TARGET = "aisp-env"
_VENV = "venv"
_BUILD_TIMEOUT_S = 1800.0
_KEEP_ARCHIVES = 2  # newest archives kept in the cache (each ~0.5 GB); packages hold hard links


@dataclass(frozen=True, kw_only=True)
class EnvArchive:
    """A built environment archive.

    Attributes:
        path: The ``.tar.gz`` (top folder ``venv/``).
        key: sha256 over its inputs (see :func:`env_key`).
        built: Whether this call built it (False: taken from the cache).
        size_bytes: Size of the archive file, bytes.
    """

    path: Path
    key: str
    built: bool
    size_bytes: int

    @property
    def python(self) -> str:
        """``-pyexec`` / ``-pyclientexec``: the venv's Python inside the extracted archive."""
        return f"{ENV_ARCHIVE_TARGET}/{_VENV}/bin/python"


def base_python() -> Path:
    """The CPython this venv was made from (the archive's venv links to it)."""
    base = getattr(sys, "_base_executable", None) or sys.executable
    return Path(base).resolve()


def _uv() -> str:
    found = shutil.which("uv") or shutil.which("uv", path=str(Path(sys.executable).parent))
    if found is None:
        raise EnvironmentSetupError("uv not found: `pip install -e '.[package]'` (aisp package builds the "
                                    "job's relocatable venv with uv)")  # fmt: skip
    return found


def _uv_version(uv: str) -> str:
    return subprocess.run([uv, "--version"], capture_output=True, text=True, check=False).stdout.strip()


def env_key(root: Path, python: Path, uv_version: str) -> str:
    """sha256 (hex) over what goes into the archive.

    Args:
        root: The source checkout (``pyproject.toml``, ``pyflink_aisp/``).
        python: The base interpreter.
        uv_version: ``uv --version``.
    """
    digest = hashlib.sha256()
    digest.update(f"{python}\n{sys.version}\n{uv_version}\n".encode())
    files = [root / "pyproject.toml", *sorted((root / "pyflink_aisp").rglob("*"))]
    for path in files:
        if path.is_file() and "__pycache__" not in path.parts:
            digest.update(f"{path.relative_to(root)}\n".encode())
            digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def ensure_env_archive(cache_dir: Path | None = None) -> EnvArchive:
    """The environment archive of this checkout, built on first use.

    Args:
        cache_dir: Where archives are kept; default ``<aisp_home>/packages/envs``.

    Raises:
        EnvironmentSetupError: Not a source checkout, no uv, or the venv could not
            be built (the message carries uv's output).
    """
    root = project_root()
    if root is None:
        raise EnvironmentSetupError("aisp package builds from a source checkout of pyflink-aisp "
                                    "(`pip install -e .`)")  # fmt: skip
    uv = _uv()
    python = base_python()
    pins = installed_pins()
    key = env_key(root, python, f"{_uv_version(uv)}\n{pins}")
    folder = cache_dir or aisp_home() / "packages" / "envs"
    target = folder / f"aisp-env-{key[:16]}.tar.gz"
    if target.is_file():
        return EnvArchive(path=target, key=key, built=False, size_bytes=target.stat().st_size)
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".aisp-env-", dir=folder) as tmp:
        venv = Path(tmp) / _VENV
        constraints = Path(tmp) / "constraints.txt"
        constraints.write_text(pins, encoding="utf-8")
        _run([uv, "venv", "--relocatable", "--python", str(python), str(venv)])
        _run([uv, "pip", "install", "--python", str(venv / "bin" / "python"), "--link-mode", "copy",
              "--compile-bytecode", "--constraint", str(constraints), str(root)])  # fmt: skip
        partial = Path(tmp) / target.name
        with tarfile.open(partial, "w:gz", compresslevel=1) as tar:
            tar.add(venv, arcname=_VENV, filter=_without_flink_distribution)
        os.replace(partial, target)  # atomic: a reader never sees half an archive
    _prune(folder, keep=_KEEP_ARCHIVES)
    return EnvArchive(path=target, key=key, built=True, size_bytes=target.stat().st_size)


def installed_pins() -> str:
    """``name==version`` of every distribution installed beside this package, one a line, sorted.

    Passed to uv as constraints, so the archive holds the versions the project was
    tested with here (not whatever PyPI has newest within ``pyproject.toml``'s ranges);
    part of the cache key.
    """
    pins = set()
    for dist in importlib.metadata.distributions():
        name = dist.metadata["Name"]
        if name and name.lower().replace("_", "-") != "pyflink-aisp":
            pins.add(f"{name}=={dist.version}")
    return "".join(f"{pin}\n" for pin in sorted(pins, key=str.lower))


def _prune(folder: Path, keep: int) -> None:
    """Remove all but the ``keep`` newest archives (by mtime) from the cache folder."""
    archives = sorted(folder.glob("aisp-env-*.tar.gz"), key=lambda p: p.stat().st_mtime, reverse=True)
    for old in archives[keep:]:
        old.unlink(missing_ok=True)


#: Parts of the apache-flink wheel that only a JVM started from Python reads: the Flink
#: distribution's jars (``lib/``, ``opt/``) and examples. The workers and the ``flink run``
#: client's Python talk to the JVM that started them (``PYFLINK_GATEWAY_PORT``) and never
#: read these; leaving them out takes ~330 MB off what every Python worker extracts.
_SITE = f"{_VENV}/lib/python{sys.version_info.major}.{sys.version_info.minor}/site-packages"
_FLINK_DISTRIBUTION = tuple(f"{_SITE}/pyflink/{part}" for part in ("lib", "opt", "examples"))


def _without_flink_distribution(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
    name = info.name
    return None if any(name == p or name.startswith(p + "/") for p in _FLINK_DISTRIBUTION) else info


def _run(cmd: list[str]) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")}
    # hash-checked .pyc files (PEP 552): valid after extraction whatever the files' mtimes,
    # so each Python worker imports pyflink, pandas and pyarrow without compiling them again
    env["SOURCE_DATE_EPOCH"] = "315532800"
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=_BUILD_TIMEOUT_S,
                              check=False)  # fmt: skip
    except subprocess.TimeoutExpired as exc:
        raise EnvironmentSetupError(f"`{' '.join(cmd)}` did not finish in {_BUILD_TIMEOUT_S:.0f} s") from exc
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-20:])
        raise EnvironmentSetupError(f"`{' '.join(cmd)}` failed (exit {proc.returncode}); PyPI must be "
                                    f"reachable (or uv's cache filled):\n{tail}")  # fmt: skip
