"""The sequence-classification handler and task on a small classifier directory built here.

The graph is a fake (a bag of token embeddings, attention-mask mean, one row of 3 logits per
text) fed by the real all-MiniLM-L6-v2 ``tokenizer.json``; its probabilities are computed again
in numpy from the tokenizer's own ids (HF ``tokenizers``), so every value here is checked
against an independent computation. The real third-party classifier runs in the e2e tests.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from tokenizers import Tokenizer

from pyflink_aisp.checksums import sha256_file
from pyflink_aisp.datasets import load_rotten_tomatoes
from pyflink_aisp.errors import ChecksumError, ConfigError, InferenceError, ModelError, TokenizeError
from pyflink_aisp.inference.handlers import OnnxClassifierHandler, read_classifier_config
from pyflink_aisp.inference.tasks import ClassificationTask, SqlType, render_prediction
from pyflink_aisp.inference.testing import check_model_handler
from pyflink_aisp.models import locate_source_model

LABELS = ("anger", "joy", "surprise")


def _bag_graph(table: np.ndarray, output: str = "logits", batch: int | str = "batch") -> onnx.ModelProto:
    """logits = sum(table[input_ids] * mask) / sum(mask): ``(batch, len(LABELS))`` float32."""
    nodes = [
        helper.make_node("Gather", ["table", "input_ids"], ["emb"]),
        helper.make_node("Cast", ["attention_mask"], ["maskf"], to=TensorProto.FLOAT),
        helper.make_node("Unsqueeze", ["maskf", "two"], ["mask3"]),
        helper.make_node("Mul", ["emb", "mask3"], ["masked"]),
        helper.make_node("ReduceSum", ["masked", "one"], ["total"], keepdims=0),
        helper.make_node("ReduceSum", ["maskf", "one"], ["count"], keepdims=1),
        helper.make_node("Div", ["total", "count"], [output]),
    ]
    ints = [helper.make_tensor_value_info(n, TensorProto.INT64, [batch, "seq"])
            for n in ("input_ids", "attention_mask", "token_type_ids")]
    graph = helper.make_graph(
        nodes, "bag", ints,
        [helper.make_tensor_value_info(output, TensorProto.FLOAT, ["batch", table.shape[1]])],
        initializer=[numpy_helper.from_array(table, "table"),
                     numpy_helper.from_array(np.array([1], np.int64), "one"),
                     numpy_helper.from_array(np.array([2], np.int64), "two")])
    # token_type_ids is declared (as BERT exports do) but unused: keep it a graph input
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 9
    return model


@pytest.fixture(scope="module")
def table() -> np.ndarray:
    source = locate_source_model()
    vocab = Tokenizer.from_file(str(source.tokenizer_path)).get_vocab_size()
    return np.random.default_rng(7).normal(scale=3.0, size=(vocab, len(LABELS))).astype(np.float32)


def make_dir(root: Path, table: np.ndarray, *, config: dict | None = None, output: str = "logits",
             batch: int | str = "batch") -> Path:
    root.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(locate_source_model().tokenizer_path, root / "tokenizer.json")
    onnx.save_model(_bag_graph(table, output, batch), str(root / "model.onnx"))
    cfg = config if config is not None else {"id2label": {str(i): n for i, n in enumerate(LABELS)}}
    (root / "config.json").write_text(json.dumps(cfg))
    return root


@pytest.fixture(scope="module")
def texts() -> list[str]:
    return [review.text for review in load_rotten_tomatoes()[:40]]


def expected_probabilities(table: np.ndarray, texts: list[str], *, multi_label: bool) -> np.ndarray:
    tokenizer = Tokenizer.from_file(str(locate_source_model().tokenizer_path))
    tokenizer.no_padding()
    tokenizer.enable_truncation(128)
    encodings = tokenizer.encode_batch(texts)
    logits = np.stack([table[enc.ids].astype(np.float64).mean(axis=0) for enc in encodings])
    if multi_label:
        return 1 / (1 + np.exp(-logits))
    e = np.exp(logits - logits.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


@pytest.mark.parametrize("multi_label", [False, True])
def test_probabilities_are_softmax_or_sigmoid_of_the_logits_per_the_config(tmp_path, table, texts,
                                                                           multi_label):
    config: dict = {"id2label": {str(i): n for i, n in enumerate(LABELS)}}
    if multi_label:
        config["problem_type"] = "multi_label_classification"
    handler = OnnxClassifierHandler(model_dir=make_dir(tmp_path, table, config=config), top_k=2)
    model = handler.load_model()
    got = np.stack(handler.run_inference(texts, model))
    want = expected_probabilities(table, texts, multi_label=multi_label)
    np.testing.assert_allclose(got, want, atol=2e-6)
    if not multi_label:
        np.testing.assert_allclose(got.sum(axis=1), 1.0, atol=1e-6)
    # the rendered fields: the argmax label, its probability, the two best in order
    rendered = handler.task().render(got[0])
    order = np.argsort(-want[0])
    assert rendered == {"label": LABELS[order[0]], "score": pytest.approx(want[0][order[0]], abs=2e-6),
                        "top_labels": [LABELS[i] for i in order[:2]],
                        "top_scores": pytest.approx(want[0][order[:2]].tolist(), abs=2e-6)}
    assert {LABELS[int(np.argmax(row))] for row in want} == set(LABELS), "texts that take every label"


def test_the_handler_keeps_the_model_handler_contract(tmp_path, table, texts):
    report = check_model_handler(OnnxClassifierHandler(model_dir=make_dir(tmp_path, table)), texts[:12])
    assert report.device == "cpu" and len(report.model_version) == 64


def test_the_version_covers_config_json(tmp_path, table):
    directory = make_dir(tmp_path, table)
    before = OnnxClassifierHandler(model_dir=directory).model_version()
    (directory / "config.json").write_text(json.dumps({"id2label": {"0": "a", "1": "b", "2": "c"}}))
    assert OnnxClassifierHandler(model_dir=directory).model_version() != before


def test_task_fields_and_sql_types(tmp_path, table):
    handler = OnnxClassifierHandler(model_dir=make_dir(tmp_path, table))
    assert [(f.name, f.sql_type) for f in handler.task().fields] == [("label", SqlType.STRING),
                                                                    ("score", SqlType.DOUBLE)]
    assert handler.labels == LABELS
    task = ClassificationTask(labels=LABELS, top_k=5)
    assert [(f.name, f.sql_type) for f in task.fields][2:] == [("top_labels", SqlType.ARRAY_STRING),
                                                              ("top_scores", SqlType.ARRAY_DOUBLE)]
    # top_k above the number of labels: every label, most probable first; ties keep label order
    assert task.render(np.array([0.25, 0.5, 0.25], np.float32))["top_labels"] == ["joy", "anger", "surprise"]
    value = json.loads(render_prediction(task, "r1", np.array([0.1, 0.2, 0.7], np.float32), "v" * 64,
                                         max_record_bytes=10_000, kept={"lang": "en"}))
    assert list(value) == ["id", "lang", "label", "score", "top_labels", "top_scores", "model_sha256"]
    assert value["label"] == "surprise" and value["top_labels"] == ["surprise", "joy", "anger"]
    # a kept field named like a task field (every field kept, --keep-fields '*') yields to the task's
    value = json.loads(render_prediction(task, "r1", np.array([0.1, 0.2, 0.7], np.float32), "v" * 64,
                                         max_record_bytes=10_000, kept={"label": "spoof", "lang": "en"}))
    assert value["label"] == "surprise" and list(value)[:3] == ["id", "lang", "label"]


def test_a_prediction_of_another_width_is_an_inference_error():
    with pytest.raises(InferenceError, match="expected 3 label scores"):
        ClassificationTask(labels=LABELS).render(np.zeros(4))


@pytest.mark.parametrize(("config", "message"), [
    ({}, "no id2label"),
    ({"id2label": {"0": "a", "2": "b"}}, "indices 0..1"),
    ({"id2label": {"zero": "a"}}, "must be label indices"),
    ({"id2label": {"0": "a", "1": "a"}}, "empty or repeated"),
    ({"id2label": {"0": "a", "1": "b"}, "problem_type": "regression"}, "regression"),
])
def test_bad_configs_are_refused_in_one_line(tmp_path, table, config, message):
    with pytest.raises(ModelError, match=message):
        OnnxClassifierHandler(model_dir=make_dir(tmp_path, table, config=config))
    with pytest.raises(ModelError, match=message):
        read_classifier_config(tmp_path / "config.json")


def test_a_directory_without_its_files_and_a_wrong_output_are_refused(tmp_path, table):
    with pytest.raises(ModelError, match=r"no \['config.json', 'tokenizer.json', 'model.onnx'\]"):
        OnnxClassifierHandler(model_dir=tmp_path)
    handler = OnnxClassifierHandler(model_dir=make_dir(tmp_path / "other", table, output="scores"))
    with pytest.raises(ModelError, match="has no output 'logits'"):
        handler.load_model()
    # more labels in config.json than the graph's logits
    wide = {"id2label": {str(i): f"l{i}" for i in range(5)}}
    handler = OnnxClassifierHandler(model_dir=make_dir(tmp_path / "wide", table, config=wide))
    with pytest.raises(ModelError, match=r"3 values per text but config\.json names 5 labels"):
        handler.load_model()


def test_a_graph_with_a_static_batch_size_is_refused_at_load(tmp_path, table):
    handler = OnnxClassifierHandler(model_dir=make_dir(tmp_path, table, batch=4))
    with pytest.raises(ModelError, match=r"have a static batch size \[4\]: the job sends batches"):
        handler.load_model()


def test_aisp_model_check_shows_the_classifier_and_refuses_a_bad_one_in_one_line(tmp_path, table, capsys):
    from pyflink_aisp.cli import main

    assert main(["model", "check", str(make_dir(tmp_path / "ok", table))]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"{tmp_path}/ok: classifier, 3 labels (anger, joy, surprise)"
    assert out[2] == "output:  logits tensor(float) ['batch', 3]"
    assert out[3] == "fields:  label STRING, score DOUBLE, top_labels ARRAY<STRING>, top_scores ARRAY<DOUBLE>"
    assert [line.split(" -> ")[1].split()[0] in LABELS for line in out[5:]] == [True, True]
    assert main(["model", "check", str(make_dir(tmp_path / "static", table, batch=1))]) == 1
    (err,) = capsys.readouterr().err.splitlines()
    assert err.startswith("aisp: error: graph input(s) ['attention_mask', 'input_ids', 'token_type_ids'] of ")


def test_bad_task_arguments():
    with pytest.raises(ConfigError, match="top_k"):
        ClassificationTask(labels=LABELS, top_k=-1)
    with pytest.raises(ConfigError, match="unique"):
        ClassificationTask(labels=())


def _pair_graph(table: np.ndarray, types: np.ndarray) -> onnx.ModelProto:
    """logits = masked mean of ``table[input_ids] + types[token_type_ids]``: the type ids count."""
    model = _bag_graph(table)
    graph = model.graph
    graph.initializer.append(numpy_helper.from_array(types, "types"))
    emb = next(n for n in graph.node if n.op_type == "Gather")
    emb.output[0] = "tok_emb"
    graph.node.insert(1, helper.make_node("Gather", ["types", "token_type_ids"], ["type_emb"]))
    graph.node.insert(2, helper.make_node("Add", ["tok_emb", "type_emb"], ["emb"]))
    return model


def test_text_pairs_are_classified_with_the_pair_encoding_and_its_type_ids(tmp_path, table, texts):
    """(review i, review i+1) pairs: probabilities from HF tokenizers' own pair encoding
    (template, type ids, longest_first at 32 tokens), computed again in numpy."""
    root = make_dir(tmp_path, table)
    types = np.random.default_rng(8).normal(scale=3.0, size=(2, len(LABELS))).astype(np.float32)
    onnx.save_model(_pair_graph(table, types), str(root / "model.onnx"))
    handler = OnnxClassifierHandler(model_dir=root, max_length=32)
    assert handler.accepts_text_pairs
    model = handler.load_model()
    pairs = list(zip(texts, texts[1:] + texts[:1], strict=True))
    got = np.stack(handler.run_inference(pairs, model))
    reference = Tokenizer.from_file(str(locate_source_model().tokenizer_path))
    reference.no_padding()
    reference.enable_truncation(32)
    encodings = reference.encode_batch(pairs)
    assert all(1 in enc.type_ids for enc in encodings)
    logits = np.stack([(table[enc.ids] + types[enc.type_ids]).astype(np.float64).mean(axis=0)
                       for enc in encodings])
    e = np.exp(logits - logits.max(axis=1, keepdims=True))
    np.testing.assert_allclose(got, e / e.sum(axis=1, keepdims=True), atol=2e-6)
    alone = np.stack(handler.run_inference([a for a, _ in pairs], model))
    assert np.abs(alone - got).max() > 0.05  # the second text is read
    assert handler.example_tokens(pairs[0], model) == len(encodings[0].ids)
    with pytest.raises(TokenizeError, match="expected a \\(text, text_pair\\) tuple"):
        handler.run_inference([pairs[0], "a text"], model)
    with pytest.raises(TokenizeError, match="a text pair in a batch of texts"):
        handler.run_inference(["a text", pairs[0]], model)


def _publish(directory: Path, name: str, graph: onnx.ModelProto) -> tuple[Path, str]:
    path = directory / name
    onnx.save_model(graph, str(path))
    return path, sha256_file(path)


def test_hot_swap_takes_a_retrained_graph_for_the_same_labels(tmp_path, table, texts):
    """A second graph (other weights, same labels and tokenizer) is probed and then scores as the
    numpy reference of its own weights; the serving handler is unchanged."""
    handler = OnnxClassifierHandler(model_dir=make_dir(tmp_path / "m", table))
    served = handler.load_model()
    retrained = np.random.default_rng(11).normal(scale=3.0, size=table.shape).astype(np.float32)
    path, digest = _publish(tmp_path, "v2.onnx", _bag_graph(retrained))
    swapped = handler.load_version(path, digest)
    got = np.stack(handler.run_inference(texts, swapped))
    np.testing.assert_allclose(got, expected_probabilities(retrained, texts, multi_label=False), atol=2e-6)
    np.testing.assert_allclose(np.stack(handler.run_inference(texts, served)),
                               expected_probabilities(table, texts, multi_label=False), atol=2e-6)
    assert handler.task().fields[0].name == "label"


@pytest.mark.parametrize(("make", "check"), [
    (lambda t: _bag_graph(np.concatenate([t, t[:, :1]], axis=1)), "4 values per text but config"),
    (lambda t: _bag_graph(np.zeros_like(t)), "identical outputs"),
    (lambda t: _bag_graph(np.where(np.arange(t.shape[0])[:, None] % 2 == 0, np.nan, t).astype(np.float32)),
     "non-finite output"),
    (lambda t: _bag_graph(t, output="scores"), "no output 'logits'"),
    (lambda t: _bag_graph(t, batch=16), "static batch"),
])
def test_hot_swap_refuses_a_graph_that_does_not_fit_or_is_broken(tmp_path, table, make, check):
    handler = OnnxClassifierHandler(model_dir=make_dir(tmp_path / "m", table))
    handler.load_model()
    path, digest = _publish(tmp_path, "bad.onnx", make(table))
    with pytest.raises(ModelError, match=check):
        handler.load_version(path, digest)


def test_hot_swap_checks_the_pointers_sha256(tmp_path, table):
    handler = OnnxClassifierHandler(model_dir=make_dir(tmp_path / "m", table))
    handler.load_model()
    path, _ = _publish(tmp_path, "v2.onnx", _bag_graph(table * 0.5))
    with pytest.raises(ChecksumError):
        handler.load_version(path, "0" * 64)
