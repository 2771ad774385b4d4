"""Issue 21: a third-party classifier with 157 labels (rag-intent-classifier's logistic regression on
all-MiniLM-L6-v2, written as a HF classifier directory by `aisp model intent-classifier`) scores a Kafka
topic of nested records by options alone, through `flink run` on the standalone cluster."""

import json
import re
import shutil
import subprocess
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from pyflink_aisp.checksums import sha256_file
from pyflink_aisp.datasets import load_rotten_tomatoes
from pyflink_aisp.inference import publish_model
from pyflink_aisp.inference.handlers import OnnxClassifierHandler
from pyflink_aisp.kafka import create_topics, ingest_records, read_topic

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
#: rag-intent-classifier 1.0.7 docs/LABELS.md: text -> the label it documents.
DOCUMENTED = {
    "I'm not satisfied with your last answer": "follow_up",
    "please assist immediately, my card is showing unauthorized activity": "urgent_attention_required",
    "i want a real person to help me from here": "connect_to_human",
}


@pytest.fixture(scope="module")
def intent_dir(tmp_path_factory) -> Path:
    """The classifier directory, written by the CLI a user runs."""
    model_dir = tmp_path_factory.mktemp("intent") / "intent"
    out = subprocess.run([str(ROOT / ".venv" / "bin" / "aisp"), "model", "intent-classifier", "--out",
                          str(model_dir)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return model_dir


def _run_batch_job(stack, topic: str, records: list[dict], *options: str
                   ) -> tuple[str, subprocess.CompletedProcess[str]]:
    """Write ``records`` to a new ``topic`` and score it in BATCH mode with ``options`` through `flink
    run`; the bootstrap servers and the finished run."""
    bootstrap = str(stack.status().bootstrap_servers)
    create_topics(bootstrap, [topic, f"{topic}-out", f"{topic}-out.dlq"])
    assert ingest_records(bootstrap, topic, records, progress=False).delivered == len(records)
    cmd = stack.flink_run_command(
        str(ROOT / "jobs" / "review_sentiment.py"), "--bootstrap-servers", bootstrap, "--input-topic", topic,
        "--output-topic", f"{topic}-out", "--mode", "batch", *options)
    proc = subprocess.run(cmd, env=stack.flink_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return bootstrap, proc


def test_a_157_label_classifier_scores_a_nested_topic_by_options_alone(stack, intent_dir):
    model_dir = intent_dir
    texts = [*DOCUMENTED, *(r.text for r in load_rotten_tomatoes()[:197])]
    records = [{"ticket": {"id": f"t{i}", "text": text}, "channel": "chat" if i % 2 else "mail"}
               for i, text in enumerate(texts)]
    topic = "tickets"
    bootstrap, proc = _run_batch_job(stack, topic, records, "--classifier", str(model_dir), "--top-k", "3",
                                     "--text-field", "/ticket/text", "--id-field", "/ticket/id",
                                     "--keep-fields", "/channel")
    assert f": {len(texts)} in, {len(texts)} out, 0 dead letters" in proc.stdout
    docs = {json.loads(m.value())["id"]: json.loads(m.value())
            for m in read_topic(bootstrap, f"{topic}-out", min_count=len(texts), timeout_s=60)}
    assert sorted(docs) == sorted(f"t{i}" for i in range(len(texts)))
    handler = OnnxClassifierHandler(model_dir=model_dir, top_k=3)
    probabilities = handler.run_inference(texts, handler.load_model())
    version = handler.model_version()
    for i, p in enumerate(probabilities):
        doc = docs[f"t{i}"]
        assert list(doc) == ["id", "channel", "label", "score", "top_labels", "top_scores", "model_sha256"]
        assert doc["channel"] == ("chat" if i % 2 else "mail") and doc["model_sha256"] == version
        order = np.argsort(-p, kind="stable")[:3]
        assert doc["top_labels"] == [handler.labels[j] for j in order]
        assert doc["label"] == doc["top_labels"][0]
        assert doc["top_scores"] == pytest.approx(p[order].tolist(), abs=1e-5)
    assert [docs[f"t{i}"]["label"] for i in range(3)] == list(DOCUMENTED.values())
    assert len({d["label"] for d in docs.values()}) > 10, "a 157-way classifier, not two labels"


def test_text_pairs_reach_the_classifier_through_flink_run(stack, intent_dir):
    """--text-pair-field: each record's (question, passage) pair is scored as HF encodes a pair (type
    ids 1 on the passage). The intent classifier was not trained on pairs (no cross-encoder ships in a
    package reachable here): this proves the plumbing, the scores equal the handler's own on the pairs
    and differ from the question's alone."""
    reviews = [r.text for r in load_rotten_tomatoes()[200:260]]
    pairs = [(question, review) for question, review in zip([*DOCUMENTED] * 20, reviews, strict=False)]
    records = [{"qid": f"q{i}", "question": q, "doc": {"passage": p}} for i, (q, p) in enumerate(pairs)]
    records.append({"qid": "lost", "question": "no passage here", "doc": {}})
    topic = "pairs"
    bootstrap, proc = _run_batch_job(stack, topic, records, "--classifier", str(intent_dir), "--text-field",
                                     "/question", "--text-pair-field", "/doc/passage", "--id-field", "/qid")
    assert f": {len(records)} in, {len(pairs)} out, 1 dead letters" in proc.stdout
    docs = {json.loads(m.value())["id"]: json.loads(m.value())
            for m in read_topic(bootstrap, f"{topic}-out", min_count=len(pairs), timeout_s=60)}
    (letter,) = [json.loads(m.value()) for m in read_topic(bootstrap, f"{topic}-out.dlq", min_count=1)]
    assert (letter["reason"], letter["detail"]) == ("missing_text", "no value at /doc/passage; the "
                                                    "object's fields: 'doc', 'qid', 'question'")
    handler = OnnxClassifierHandler(model_dir=intent_dir)
    model = handler.load_model()
    on_pairs = handler.run_inference(pairs, model)
    alone = handler.run_inference([q for q, _ in pairs], model)
    for i, p in enumerate(on_pairs):
        assert docs[f"q{i}"]["score"] == pytest.approx(float(p.max()), abs=1e-5)
        assert docs[f"q{i}"]["label"] == handler.labels[int(np.argmax(p))]
    assert max(float(np.abs(a - p).max()) for a, p in zip(alone, on_pairs, strict=True)) > 0.01


def _recalibrated(model_dir: Path, out: Path, factor: float) -> Path:
    """The classifier's ``model.onnx`` with its logits times ``factor`` (a recalibrated version, as a
    temperature fit gives): the same labels and tokenizer, other probabilities."""
    model = onnx.load(str(model_dir / "model.onnx"))
    graph = model.graph
    for node in graph.node:
        node.output[:] = ["logits_raw" if name == "logits" else name for name in node.output]
    graph.initializer.append(numpy_helper.from_array(np.array(factor, np.float32), "logit_scale"))
    graph.node.append(helper.make_node("Mul", ["logits_raw", "logit_scale"], ["logits"]))
    onnx.save(model, str(out))
    return out


def test_the_classifier_hot_swaps_under_a_streaming_job_through_flink_run(stack, intent_dir, tmp_path):
    """--model-pointer with --classifier: a version published under a running job is probed, swapped in
    between batches, and scores every later record; each record is scored once, by one version, and the
    versions follow each other in the output (never back)."""
    bootstrap = str(stack.status().bootstrap_servers)
    topic, out = "swap-tickets", "swap-tickets-out"
    create_topics(bootstrap, [topic, out, f"{out}.dlq"])
    reviews = [r.text for r in load_rotten_tomatoes()[300:600]]

    def send(lo: int, hi: int) -> None:
        records = [{"id": f"r{i}", "text": reviews[i]} for i in range(lo, hi)]
        assert ingest_records(bootstrap, topic, records, progress=False).delivered == hi - lo

    pointer = tmp_path / "pointer" / "intent.json"
    pointer.parent.mkdir()
    v2 = _recalibrated(intent_dir, tmp_path / "intent-v2.onnx", 0.5)
    send(0, 100)
    cmd = stack.flink_run_command(
        str(ROOT / "jobs" / "review_sentiment.py"), "--mode", "streaming", "--bootstrap-servers", bootstrap,
        "--input-topic", topic, "--output-topic", out, "--classifier", str(intent_dir),
        "--model-pointer", str(pointer), "--model-poll-interval-s", "0.5", "--checkpoint-interval-ms", "2000")
    cmd.insert(cmd.index("run") + 1, "-d")
    proc = subprocess.run(cmd, env=stack.flink_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    job_id = re.search(r"JobID ([0-9a-f]{32})", proc.stdout).group(1)
    try:
        assert len(read_topic(bootstrap, out, min_count=100, timeout_s=180, quiet_s=2)) == 100
        publish_model(pointer, v2)
        for lo in range(100, 300, 50):
            time.sleep(3)
            send(lo, lo + 50)
        messages = read_topic(bootstrap, out, min_count=300, timeout_s=180, quiet_s=3)
    finally:
        subprocess.run([stack.flink_run_command("x")[0], "cancel", job_id], env=stack.flink_env(),
                       capture_output=True, timeout=120)
    docs = [json.loads(m.value()) for m in messages]
    assert sorted(d["id"] for d in docs) == sorted(f"r{i}" for i in range(300)), "each record once"
    served = OnnxClassifierHandler(model_dir=intent_dir)
    swapped_dir = tmp_path / "v2-dir"
    shutil.copytree(intent_dir, swapped_dir)
    shutil.copyfile(v2, swapped_dir / "model.onnx")
    versions = {served.model_version(): served, sha256_file(v2): OnnxClassifierHandler(model_dir=swapped_dir)}
    order = [d["model_sha256"] for d in docs]
    assert set(order) == set(versions) and order.index(sha256_file(v2)) >= 100, "v1 first, then v2"
    assert order == sorted(order, key=lambda v: v == sha256_file(v2)), "no record scored by v1 after v2"
    assert all(d["model_sha256"] == sha256_file(v2) for d in docs if int(d["id"][1:]) >= 250)
    for version, handler in versions.items():
        mine = [d for d in docs if d["model_sha256"] == version]
        probabilities = handler.run_inference([reviews[int(d["id"][1:])] for d in mine], handler.load_model())
        for d, p in zip(mine, probabilities, strict=True):
            assert (d["label"], d["score"]) == (handler.labels[int(np.argmax(p))],
                                                pytest.approx(float(p.max()), abs=1e-5))
    v1_scores = [d["score"] for d in docs if d["model_sha256"] != sha256_file(v2)]
    v2_scores = [d["score"] for d in docs if d["model_sha256"] == sha256_file(v2)]
    assert np.mean(v2_scores) < np.mean(v1_scores), "halved logits: flatter probabilities"
