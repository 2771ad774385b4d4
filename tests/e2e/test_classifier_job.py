"""Issue 21: a third-party classifier with 157 labels (rag-intent-classifier's logistic regression on
all-MiniLM-L6-v2, written as a HF classifier directory by `aisp model intent-classifier`) scores a Kafka
topic of nested records by options alone, through `flink run` on the standalone cluster."""

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest

from pyflink_aisp.datasets import load_rotten_tomatoes
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
