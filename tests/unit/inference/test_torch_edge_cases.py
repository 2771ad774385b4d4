"""Edge case found by breaking: the torch handler does not checksum config.json (needs the torch extra)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np

from pyflink_aisp.errors import AispError
from pyflink_aisp.inference.handlers import TorchSentimentHandler
from pyflink_aisp.models import ensure_model_assets
from pyflink_aisp.models._source import locate_source_model


def test_tampered_config_json_is_refused_or_changes_the_version(tmp_path: Path) -> None:
    """num_attention_heads 12 -> 6 keeps every tensor shape, so the verified weights
    load strict=True; outputs change but model_version() stays the same, so every
    output is tagged with a version that did not produce it."""
    assets = ensure_model_assets()
    source = locate_source_model().directory
    tampered = tmp_path / "weights"
    shutil.copytree(source, tampered)
    config = json.loads((tampered / "config.json").read_text())
    config["num_attention_heads"] = 6
    (tampered / "config.json").write_text(json.dumps(config))

    honest = TorchSentimentHandler(assets, weights_dir=source)
    forged = TorchSentimentHandler(assets, weights_dir=tampered)
    texts = ["A gripping, beautifully acted film.", "Dull and far too long."]
    try:
        forged_model = forged.load_model()
    except AispError:
        return  # refused: fine
    a = honest.run_inference(texts, honest.load_model())
    b = forged.run_inference(texts, forged_model)
    differs = any(not np.allclose(x[1], y[1], atol=1e-4) for x, y in zip(a, b, strict=True))
    assert not differs or forged.model_version() != honest.model_version(), (
        "different outputs under the same model_version")
