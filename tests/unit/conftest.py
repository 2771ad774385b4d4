"""Quick real-encoder assets for the inference tests (no head training: ~2 s)."""

from __future__ import annotations

import gc
import shutil
from collections.abc import Iterator

import numpy as np
import onnx
import pytest

from pyflink_aisp.checksums import sha256_file
from pyflink_aisp.models import ModelAssets, append_sentiment_head, build_encoder_model, locate_source_model


@pytest.fixture(scope="session")
def quick_assets(tmp_path_factory: pytest.TempPathFactory) -> ModelAssets:
    """The real MiniLM encoder with a fixed random head, as :class:`ModelAssets`."""
    source = locate_source_model()
    cfg = source.bert_config()
    coef = np.random.default_rng(0).normal(scale=5.0, size=cfg.hidden_size)
    model = append_sentiment_head(build_encoder_model(source.weights_path, cfg), coef, 0.0)
    directory = tmp_path_factory.mktemp("quick-assets")
    onnx.save_model(model, str(directory / "model.onnx"))
    shutil.copyfile(source.tokenizer_path, directory / "tokenizer.json")
    return ModelAssets(
        directory=directory,
        onnx_path=directory / "model.onnx",
        sha256=sha256_file(directory / "model.onnx"),
        tokenizer_path=directory / "tokenizer.json",
        tokenizer_sha256=sha256_file(directory / "tokenizer.json"),
        heldout_accuracy=0.0,
        train_size=0,
        heldout_size=0,
        source_distribution=source.distribution,
        source_version=source.version,
        build_seconds=0.0,
    )


@pytest.fixture(autouse=True)
def _no_frozen_heap_after_a_test() -> Iterator[None]:
    """An operator's ``open()`` freezes the heap (``gc.freeze``) as a worker's would; a test's frozen
    objects go back to the collector after it, so that they are collected before the interpreter exits."""
    yield
    gc.unfreeze()
