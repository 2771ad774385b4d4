"""Fixtures of the remote-model integration tests."""

from __future__ import annotations

import numpy as np
import pytest

from pyflink_aisp.datasets import load_rotten_tomatoes
from pyflink_aisp.inference.handlers import OnnxEncoderHandler, Pooling
from pyflink_aisp.models import build_minilm_encoder


@pytest.fixture(scope="session")
def embeddings(tmp_path_factory):
    """(600, 384) float32: MiniLM embeddings of real reviews (the intent head's input)."""
    folder = tmp_path_factory.mktemp("minilm")
    build_minilm_encoder(folder)
    encoder = OnnxEncoderHandler(model_path=folder / "model.onnx", tokenizer_path=folder / "tokenizer.json",
                                 pooling=Pooling.NONE)
    texts = [r.text for r in load_rotten_tomatoes()[:600]]
    return np.stack(encoder.run_inference(texts, encoder.load_model())).astype(np.float32)


@pytest.fixture
def run_handler():
    """``run_handler(handler, rows, batch=64)``: the handler over ``rows`` in batches of ``batch`` on
    one loaded model: ``(outputs, session)``."""
    return _run_handler


def _run_handler(handler, rows, batch=64):
    model = handler.load_model()
    try:
        out = []
        for i in range(0, len(rows), batch):
            out.extend(handler.run_inference(list(rows[i:i + batch]), model))
        return out, model.session
    finally:
        handler.release_model(model)
