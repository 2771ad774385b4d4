"""The hot-swap probe set: check_probe_outputs, and SentimentHandler.load_version on
the built model and on broken variants of it."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from pyflink_aisp.checksums import sha256_file
from pyflink_aisp.errors import ModelError
from pyflink_aisp.inference.handlers import (
    SWAP_PROBE_TEXTS,
    OnnxSentimentModel,
    SentimentHandler,
    check_probe_outputs,
)
from pyflink_aisp.models import ModelAssets

N = len(SWAP_PROBE_TEXTS)
DIM = 8


def _good() -> tuple[np.ndarray, np.ndarray]:
    scores = np.linspace(0.05, 0.95, N, dtype=np.float32)
    raw = np.random.default_rng(0).normal(size=(N, DIM)).astype(np.float32)
    return scores, raw / np.linalg.norm(raw, axis=1, keepdims=True)


def test_probe_set_shape() -> None:
    assert len(SWAP_PROBE_TEXTS) == 16 and len(set(SWAP_PROBE_TEXTS)) == 16
    assert "" in SWAP_PROBE_TEXTS
    assert all(isinstance(text, str) for text in SWAP_PROBE_TEXTS)


def test_probe_set_reaches_max_length(quick_assets: ModelAssets) -> None:
    model = OnnxSentimentModel(quick_assets, intra_op_num_threads=1)
    counts = [model.tokenizer.count_tokens(text) for text in SWAP_PROBE_TEXTS]
    assert min(counts) == 2  # the empty string: [CLS] [SEP]
    assert max(counts) == quick_assets.max_length  # the long review is truncated
    assert len(set(counts)) >= 8  # many lengths, so padding and masks vary


def test_good_outputs_pass() -> None:
    check_probe_outputs(*_good(), embedding_dim=DIM, source="m.onnx")


def _broken(kind: str) -> tuple[np.ndarray, np.ndarray]:
    scores, embeddings = _good()
    if kind == "shape":
        scores = scores[:1]
    elif kind == "embedding shape":
        embeddings = embeddings[:, :-1]
    elif kind == "non-finite score":
        scores[N - 1] = np.nan
    elif kind == "score outside [0, 1]":
        scores[3] = 1.5
    elif kind == "non-finite embedding":
        embeddings[2, 0] = np.inf
    elif kind == "embedding not L2-normalised":
        embeddings = embeddings * 2.0
    elif kind == "constant score":
        scores[:] = 0.73
    elif kind == "one label":
        scores = np.linspace(0.5, 0.99, N, dtype=np.float32)
    elif kind == "identical embeddings":
        embeddings[:] = embeddings[0]
    return scores, embeddings


@pytest.mark.parametrize(
    ("kind", "check"),
    [
        ("shape", "shape"),
        ("embedding shape", "shape"),
        ("non-finite score", "non-finite score"),
        ("score outside [0, 1]", "score outside [0, 1]"),
        ("non-finite embedding", "non-finite embedding"),
        ("embedding not L2-normalised", "embedding not L2-normalised"),
        ("constant score", "constant score"),
        ("one label", "one label"),
        ("identical embeddings", "identical embeddings"),
    ],
)
def test_broken_outputs_are_refused_naming_the_check(kind: str, check: str) -> None:
    with pytest.raises(ModelError) as caught:
        check_probe_outputs(*_broken(kind), embedding_dim=DIM, source="new.onnx")
    assert str(caught.value).startswith(f"model new.onnx failed the swap probe ({check}): ")


def test_refusal_names_the_first_bad_probe() -> None:
    scores, embeddings = _good()
    scores[N - 1] = np.nan
    with pytest.raises(ModelError) as caught:
        check_probe_outputs(scores, embeddings, embedding_dim=DIM, source="new.onnx")
    assert str(caught.value) == (
        f"model new.onnx failed the swap probe (non-finite score): 1 of {N} probes, "
        f"first probe {N - 1} (nan): {SWAP_PROBE_TEXTS[-1][:40]!r}"
    )


def test_unnormalised_embeddings_pass_when_not_required() -> None:
    scores, embeddings = _good()
    check_probe_outputs(scores, embeddings * 3.0, embedding_dim=DIM, source="m", normalized=False)


# -- SentimentHandler.load_version on the real model -----------------------------------


def _variant(assets: ModelAssets, directory: Path, name: str, intercept: float) -> tuple[Path, str]:
    """The built model with the head's intercept replaced by ``intercept``."""
    model = onnx.load(str(assets.onnx_path))
    for init in model.graph.initializer:
        if init.name == "head_intercept":
            init.CopyFrom(numpy_helper.from_array(np.array([intercept], dtype=np.float32), init.name))
    path = directory / f"{name}.onnx"
    onnx.save(model, str(path))
    return path, sha256_file(path)


def test_the_built_model_passes(model_assets: ModelAssets) -> None:
    handler = SentimentHandler(model_assets, intra_op_num_threads=2)
    model = handler.load_version(model_assets.onnx_path, model_assets.sha256)
    scores, _ = model.predict(["Wonderful!"])
    assert 0.0 <= float(scores[0]) <= 1.0


@pytest.mark.parametrize(
    ("intercept", "check"),
    [
        (float("nan"), "non-finite score"),
        (1000.0, "constant score"),  # sigmoid saturates: every probe scores exactly 1.0
        (8.0, "one label"),  # every probe positive, yet scores differ and lie in [0, 1]
    ],
)
def test_broken_variants_are_refused(
    model_assets: ModelAssets, tmp_path: Path, intercept: float, check: str
) -> None:
    path, sha = _variant(model_assets, tmp_path, "bad", intercept)
    handler = SentimentHandler(model_assets, intra_op_num_threads=2)
    with pytest.raises(ModelError, match=rf"failed the swap probe \({check}\)"):
        handler.load_version(path, sha)


def test_a_model_that_passed_the_one_sentence_check_is_refused(
    model_assets: ModelAssets, tmp_path: Path
) -> None:
    """The old check scored one sentence and wanted a probability: the biased head
    passes it, but labels every review positive."""
    path, sha = _variant(model_assets, tmp_path, "biased", 8.0)
    biased = dataclasses.replace(model_assets, onnx_path=path, sha256=sha)
    model = OnnxSentimentModel(biased, intra_op_num_threads=2)
    scores, embeddings = model.predict(["A gripping, beautifully acted film."])
    assert 0.0 <= float(scores[0]) <= 1.0 and embeddings.shape == (1, model_assets.embedding_dim)
    with pytest.raises(ModelError, match=r"\(one label\): all 16 probes"):
        SentimentHandler(model_assets, intra_op_num_threads=2).load_version(path, sha)


def test_an_embedding_size_other_than_the_serving_one_is_refused(model_assets: ModelAssets) -> None:
    """The model's own output buffer is sized from the assets, so the mismatch
    surfaces while scoring the probes, still as a ModelError naming it."""
    expecting = dataclasses.replace(model_assets, embedding_dim=model_assets.embedding_dim + 1)
    handler = SentimentHandler(expecting, intra_op_num_threads=2)
    with pytest.raises(ModelError, match=r"does not run as a sentiment model: shape mismatch"):
        handler.load_version(model_assets.onnx_path, model_assets.sha256)


def test_a_version_with_a_static_batch_dimension_is_refused(
    model_assets: ModelAssets, tmp_path: Path
) -> None:
    """A graph exported with batch dimension 16 runs the whole probe batch of 16, then fails
    every batch of another size the stream makes: the probe scores batches of 1 and 7 too."""
    model = onnx.load(str(model_assets.onnx_path))
    for graph_input in model.graph.input:
        graph_input.type.tensor_type.shape.dim[0].dim_value = 16
    path = tmp_path / "static16.onnx"
    onnx.save(model, str(path))
    handler = SentimentHandler(model_assets, intra_op_num_threads=2)
    with pytest.raises(ModelError, match=r"failed the swap probe \(batch of 1\): .*dimensions"):
        handler.load_version(path, sha256_file(path))


def test_batch_sizes_must_score_alike() -> None:
    from pyflink_aisp.inference.handlers._probe import check_probe_batch_sizes

    scores, embeddings = _good()
    check_probe_batch_sizes(lambda texts: (scores[:len(texts)] + 5e-5, embeddings[:len(texts)]), scores,
                            source="m")
    with pytest.raises(ModelError, match=r"\(batch of 1\): scores differ .* by 0\.01 "):
        check_probe_batch_sizes(lambda texts: (scores[:len(texts)] + 0.01, embeddings[:len(texts)]), scores,
                                source="m")
    with pytest.raises(ModelError, match=r"\(batch of 7\): got scores \(1,\), expected \(7,\)"):
        check_probe_batch_sizes(lambda texts: (scores[:1], embeddings[:1]), scores, source="m")
