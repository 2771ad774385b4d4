"""The GPU check's bundle as the device host reads it: layout, checksums, handler, texts, reference.

A bundle (built here by ``bench/gpu_check.sh bundle``, see :mod:`_gpu_bundle`) is a folder::

    manifest.json              sha256 and size of every file below, provenance, the reference's sample
    weights/model.safetensors  all-MiniLM-L6-v2 in float16 (upcast to float32 at load)
    weights/config.json        the encoder's config, unchanged
    tokenizer.json             the model assets' tokenizer
    head.onnx                  the logistic head alone (initializers head_coef, head_intercept)
    texts.jsonl.gz             the 12,808 labelled Rotten Tomatoes reviews, in file order
    reference.npz              indices (int64) into the reviews and their CPU float32 scores

Everything here runs on the GPU host: the standard library, numpy and the PyFlink-free package.

Thread-safety: a :class:`Bundle` is read-only after :func:`open_bundle`.
"""

from __future__ import annotations

import gzip
import hashlib
import inspect
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = [
    "BUNDLE_FORMAT",
    "BUNDLE_LIMIT_BYTES",
    "CONFIG",
    "HEAD",
    "MANIFEST",
    "REFERENCE",
    "TEXTS",
    "TOKENIZER",
    "WEIGHTS",
    "Bundle",
    "handler_options",
    "make_handler",
    "open_bundle",
    "sha256_of",
]

BUNDLE_FORMAT = "pyflink-aisp/gpu-bundle/1"
#: Most bytes a bundle may hold: the device run takes 64 MiB in all, the working tree included.
BUNDLE_LIMIT_BYTES = 60 * 2**20
MANIFEST = "manifest.json"
WEIGHTS = "weights/model.safetensors"
CONFIG = "weights/config.json"
TOKENIZER = "tokenizer.json"
HEAD = "head.onnx"
TEXTS = "texts.jsonl.gz"
REFERENCE = "reference.npz"


def sha256_of(path: Path) -> str:
    """Hex sha256 of a file, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(2**20), b""):
            digest.update(block)
    return digest.hexdigest()


@dataclass(frozen=True, kw_only=True)
class Bundle:
    """An opened, verified bundle.

    Attributes:
        directory: The bundle folder.
        manifest: ``manifest.json`` as a dict.
    """

    directory: Path
    manifest: dict[str, Any]

    def path(self, name: str) -> Path:
        """Path of one of the layout's files (``WEIGHTS``, ``HEAD`` ...)."""
        return self.directory / name

    def sha256(self, name: str) -> str:
        """The manifest's sha256 of one file."""
        return str(self.manifest["files"][name]["sha256"])

    @property
    def total_bytes(self) -> int:
        """Bytes of the files the manifest lists (the manifest itself excluded)."""
        return int(sum(entry["bytes"] for entry in self.manifest["files"].values()))

    def reviews(self) -> tuple[list[str], npt.NDArray[np.int8]]:
        """The reviews in file order: texts and labels (1 fresh, 0 rotten)."""
        texts, labels = [], []
        with gzip.open(self.path(TEXTS), "rt", encoding="utf-8") as handle:
            for line in handle:
                row = json.loads(line)
                texts.append(row["text"])
                labels.append(row["label"])
        return texts, np.asarray(labels, dtype=np.int8)

    def reference(self) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float32]]:
        """Indices into :meth:`reviews` and their CPU float32 reference scores."""
        with np.load(self.path(REFERENCE)) as data:
            return np.asarray(data["indices"], dtype=np.int64), np.asarray(data["scores"], dtype=np.float32)

    def head(self) -> tuple[npt.NDArray[np.float32], float]:
        """``(coef, intercept)`` from ``head.onnx``."""
        from pyflink_aisp.inference.handlers._torch import read_head

        return read_head(self.path(HEAD), int(self.manifest["model"]["embedding_dim"]))

    def assets(self) -> Any:
        """The bundle as :class:`~pyflink_aisp.models.ModelAssets` for the torch handler: the head
        file stands in for ``model.onnx`` (the handler reads only the head from it)."""
        from pyflink_aisp.models import ModelAssets

        model = self.manifest["model"]
        return ModelAssets(
            directory=self.directory,
            onnx_path=self.path(HEAD),
            sha256=self.sha256(HEAD),
            tokenizer_path=self.path(TOKENIZER),
            tokenizer_sha256=self.sha256(TOKENIZER),
            max_length=int(model["max_length"]),
            embedding_dim=int(model["embedding_dim"]),
            heldout_accuracy=float(model["heldout_accuracy"]),
            train_size=int(model["train_size"]),
            heldout_size=int(model["heldout_size"]),
            source_distribution=model["source_distribution"],
            source_version=model["source_version"],
            build_seconds=0.0,
        )


def open_bundle(directory: Path, *, verify: bool = True) -> Bundle:
    """Read ``manifest.json`` and (``verify``) check every file's size and sha256.

    Raises:
        ValueError: No manifest, another format, or a file missing or changed.
    """
    path = directory / MANIFEST
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ValueError(
            f"{path}: not a GPU check bundle ({exc}); build one with `bash bench/gpu_check.sh bundle`"
        ) from exc
    if manifest.get("format") != BUNDLE_FORMAT:
        raise ValueError(f"{path}: format {manifest.get('format')!r}, expected {BUNDLE_FORMAT!r}")
    bundle = Bundle(directory=directory, manifest=manifest)
    if verify:
        for name, entry in manifest["files"].items():
            file = directory / name
            if (
                not file.is_file()
                or file.stat().st_size != entry["bytes"]
                or sha256_of(file) != entry["sha256"]
            ):
                raise ValueError(f"{file}: missing or not the file the manifest lists; rebuild the bundle")
    return bundle


def handler_options() -> set[str]:
    """Constructor arguments of ``TorchSentimentHandler`` in this checkout."""
    from pyflink_aisp.inference.handlers._torch import TorchSentimentHandler

    return set(inspect.signature(TorchSentimentHandler.__init__).parameters) - {"self"}


def make_handler(
    bundle: Bundle, *, device: str, precision: str, batch_size: int, **options: Any
) -> tuple[Any, list[str]]:
    """A ``TorchSentimentHandler`` on the bundle's float16 weights (upcast at load) and head.

    Args:
        bundle: The opened bundle.
        device: ``"cpu"`` or ``"cuda:N"``.
        precision: ``"fp32"`` or ``"bf16"``.
        batch_size: The handler's texts per forward pass.
        **options: Further constructor arguments (``memory_limit_bytes``, ``pipeline_depth`` ...);
            those this checkout's handler lacks are left out and returned.

    Returns:
        The handler and the names of the options it does not have.
    """
    from pyflink_aisp.inference.handlers._torch import TorchSentimentHandler

    known = handler_options()
    missing = sorted(name for name in options if name not in known)
    handler = TorchSentimentHandler(
        bundle.assets(),
        device=device,
        batch_size=batch_size,
        precision=precision,
        weights_dir=bundle.path(WEIGHTS).parent,
        weights_sha256=bundle.sha256(WEIGHTS),
        verify=True,
        **{k: v for k, v in options.items() if k in known},
    )
    return handler, missing
