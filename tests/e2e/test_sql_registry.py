"""Issue 21, one model registry for SQL: jobs/sql/intent_registry.sql run with `aisp sql --models
jobs/sql/models.yaml` on the standalone cluster. Three named models (classify, embed, predict), each
a function registered by name without Python, in one SQL job: the 157-intent classifier on the text,
and its logistic regression alone on the encoder's ARRAY<FLOAT>, which must agree with it."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from pyflink_aisp.datasets import load_rotten_tomatoes
from pyflink_aisp.inference.handlers import OnnxClassifierHandler, OnnxPredictorHandler
from pyflink_aisp.kafka import create_topics, ingest_records, read_topic
from pyflink_aisp.models import build_intent_classifier, build_intent_head, build_minilm_encoder

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
N = 120


def _script(tmp_path: Path, bootstrap: str) -> Path:
    text = (ROOT / "jobs" / "sql" / "intent_registry.sql").read_text()
    for old, new in [
        ("'execution.runtime-mode' = 'streaming'", "'execution.runtime-mode' = 'batch'"),
        ("'scan.startup.mode' = 'group-offsets',", "'scan.startup.mode' = 'earliest-offset', "
                                                   "'scan.bounded.mode' = 'latest-offset',"),
        ("127.0.0.1:9092", bootstrap),
        # topics of this test alone (test_classifier_job.py writes other records to `tickets`)
        ("'topic' = 'tickets'", "'topic' = 'sql-tickets'"),
        ("'topic' = 'tickets-intent;tickets-intent.dlq'",
         "'topic' = 'sql-tickets-intent;sql-tickets-intent.dlq'"),
        ("'tickets-intent' ELSE 'tickets-intent.dlq'", "'sql-tickets-intent' ELSE 'sql-tickets-intent.dlq'"),
    ]:
        assert old in text, old
        text = text.replace(old, new)
    path = tmp_path / "intent_registry.sql"
    path.write_text(text)
    return path


def test_three_named_models_in_one_sql_job_from_the_registry(stack, tmp_path):
    shutil.copy(ROOT / "jobs" / "sql" / "models.yaml", tmp_path / "models.yaml")
    build_intent_classifier(tmp_path / "models" / "intent")
    build_intent_head(tmp_path / "models" / "intent-head.onnx")
    build_minilm_encoder(tmp_path / "models" / "minilm")
    texts = [r.text for r in load_rotten_tomatoes()[:N]]
    bootstrap = str(stack.status().bootstrap_servers)
    create_topics(bootstrap, ["sql-tickets", "sql-tickets-intent", "sql-tickets-intent.dlq"])
    records = [{"id": f"t{i}", "text": t} for i, t in enumerate(texts)] + [{"id": "no-text"}]
    assert ingest_records(bootstrap, "sql-tickets", records, progress=False).delivered == N + 1
    env = dict(os.environ, AISP_LOCAL_DIR=str(stack.state_dir))
    argv = [sys.executable, "-m", "pyflink_aisp.cli", "sql", "--models", str(tmp_path / "models.yaml"),
            str(_script(tmp_path, bootstrap))]
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert len(re.findall(r"^aisp sql: submitted job ([0-9a-f]{32}) ", proc.stdout, re.M)) == 1
    docs = {json.loads(m.value())["id"]: json.loads(m.value())
            for m in read_topic(bootstrap, "sql-tickets-intent", min_count=N, timeout_s=300, quiet_s=3)}
    assert sorted(docs) == sorted(f"t{i}" for i in range(N))
    classifier = OnnxClassifierHandler(model_dir=tmp_path / "models" / "intent", top_k=3)
    probabilities = classifier.run_inference(texts, classifier.load_model())
    head_version = OnnxPredictorHandler(model_path=tmp_path / "models" / "intent-head.onnx").model_version()
    for i, p in enumerate(probabilities):
        doc = docs[f"t{i}"]
        order = np.argsort(-p, kind="stable")[:3]
        assert doc["top_labels"] == [classifier.labels[j] for j in order]
        assert doc["label"] == doc["top_labels"][0]
        assert doc["score"] == pytest.approx(float(p[order[0]]), abs=1e-5)
        # the cascade (encoder, then the logistic regression alone) agrees with the fused classifier
        assert doc["head_label"] == doc["label"]
        np.testing.assert_allclose(doc["head_probabilities"], p, atol=1e-4)
        assert (doc["model_sha256"], doc["head_model_sha256"]) == (classifier.model_version(), head_version)
    assert len({d["label"] for d in docs.values()}) > 10
    letters = [json.loads(m.value()) for m in read_topic(bootstrap, "sql-tickets-intent.dlq", min_count=1,
                                                          timeout_s=30, quiet_s=2)]
    assert [(d["id"], d["reason"]) for d in letters] == [("no-text", "missing_text")]
