"""Issue 26 in SQL: a registry's route is a function (`aisp sql --models FILE`), in BATCH and STREAMING
mode. `by_kind(text, kind)` sends short reviews to the lexicon handler (jobs/examples, shipped with
python.files) and the others to the sentiment model (MiniLM + logistic head, ONNX Runtime): each row
scored once, by its kind's model, with that model's values as it gives them alone, and `scored_by`
naming it."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from pyflink_aisp.datasets import load_rotten_tomatoes, split_reviews
from pyflink_aisp.inference.handlers import OnnxSentimentModel
from pyflink_aisp.kafka import create_topics, ingest_records, read_topic

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "jobs" / "examples"
N = 80

SCRIPT = """
SET 'execution.runtime-mode' = '{mode}';
SET 'execution.checkpointing.interval' = '2 s';
SET 'parallelism.default' = '1';
SET 'python.files' = '{handler}';
SET 'python.fn-execution.bundle.time' = '50';
SET 'python.fn-execution.arrow.batch.size' = '1024';

CREATE TEMPORARY TABLE reviews (`id` STRING, `text` STRING, `kind` STRING) WITH (
  'connector' = 'kafka', 'topic' = '{topic}', 'properties.bootstrap.servers' = '{bootstrap}',
  'properties.group.id' = 'aisp-{topic}', 'scan.startup.mode' = 'earliest-offset',{bounded}
  'format' = 'json'
);

CREATE TEMPORARY TABLE outputs (`topic` STRING METADATA, `key` STRING, `value` STRING) WITH (
  'connector' = 'kafka', 'topic' = '{topic}-out;{topic}-out.dlq',
  'properties.bootstrap.servers' = '{bootstrap}',
  'key.format' = 'raw', 'key.fields' = 'key', 'value.format' = 'raw', 'value.fields-include' = 'EXCEPT_KEY',
  'sink.delivery-guarantee' = 'exactly-once', 'sink.transactional-id-prefix' = 'aisp-{topic}',
  'properties.transaction.timeout.ms' = '600000'
);

CREATE TEMPORARY SYSTEM FUNCTION by_kind AS 'pyflink_aisp.pipeline.registry.by_kind' LANGUAGE PYTHON;

INSERT INTO outputs
SELECT
  CASE WHEN r.model_sha256 IS NOT NULL AND r.reason IS NULL THEN '{topic}-out' ELSE '{topic}-out.dlq' END,
  `id`,
  CASE
    WHEN r.model_sha256 IS NOT NULL AND r.reason IS NULL THEN JSON_OBJECT(
      KEY 'id' VALUE `id`, KEY 'kind' VALUE kind, KEY 'label' VALUE r.label, KEY 'score' VALUE r.score,
      KEY 'known_words' VALUE r.known_words, KEY 'model_sha256' VALUE r.model_sha256,
      KEY 'scored_by' VALUE r.scored_by)
    ELSE JSON_OBJECT(KEY 'id' VALUE `id`, KEY 'reason' VALUE COALESCE(r.reason, 'missing_text'))
  END
FROM (SELECT `id`, kind, by_kind(`text`, kind) AS r FROM reviews);
"""


@pytest.fixture(scope="module")
def lexicon(tmp_path_factory):
    sys.path.insert(0, str(EXAMPLES))
    try:
        import lexicon_handler
    finally:
        sys.path.pop(0)
    folder = tmp_path_factory.mktemp("sql-routes")
    train, _ = split_reviews(load_rotten_tomatoes())
    sha = lexicon_handler.train_lexicon(train).save(folder / "lexicon.json")
    return lexicon_handler.Lexicon.load(folder / "lexicon.json"), folder / "lexicon.json", sha


def _registry(folder: Path, lexicon_path: Path, lexicon_sha: str, sentiment_dir: Path) -> Path:
    args = json.dumps({"path": str(lexicon_path), "sha256": lexicon_sha})
    (folder / "models.yaml").write_text(f"""
models:
  sentiment: {{task: sentiment, path: {sentiment_dir}}}
  lexicon:
    {{task: handler, class: "lexicon_handler:LexiconSentimentHandler", args: {args}, max-batch-size: 16}}
routes:
  by_kind:
    rules:
      - {{when: {{field: /kind, equals: short}}, to: lexicon}}
    default: sentiment
""")
    return folder / "models.yaml"


@pytest.mark.parametrize("mode", ["batch", "streaming"])
def test_a_route_function_scores_each_row_once_with_its_kinds_model(stack, lexicon, model_assets, tmp_path,
                                                                     mode):
    model, lexicon_path, lexicon_sha = lexicon
    bootstrap = str(stack.status().bootstrap_servers)
    topic = f"sql-routes-{mode}"
    create_topics(bootstrap, [topic, f"{topic}-out", f"{topic}-out.dlq"])
    _, heldout = split_reviews(load_rotten_tomatoes())
    chosen = heldout[(N if mode == "streaming" else 0):][:N]
    records = [{"id": r.id, "text": r.text, "kind": "short" if len(r.text) < 90 else "long"} for r in chosen]
    assert {r["kind"] for r in records} == {"short", "long"}
    assert ingest_records(bootstrap, topic, [*records, {"id": "no-text", "kind": "short"}],
                          progress=False).delivered == N + 1
    bounded = " 'scan.bounded.mode' = 'latest-offset'," if mode == "batch" else ""
    script = tmp_path / "routes.sql"
    script.write_text(SCRIPT.format(mode=mode, handler=EXAMPLES / "lexicon_handler.py", topic=topic,
                                    bootstrap=bootstrap, bounded=bounded))
    registry = _registry(tmp_path, lexicon_path, lexicon_sha, model_assets.directory)
    env = dict(os.environ, AISP_LOCAL_DIR=str(stack.state_dir))
    argv = [sys.executable, "-m", "pyflink_aisp.cli", "sql", "--models", str(registry), str(script)]
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (job_id,) = re.findall(r"^aisp sql: submitted job ([0-9a-f]{32}) ", proc.stdout, re.M)
    try:
        docs = {json.loads(m.value())["id"]: json.loads(m.value())
                for m in read_topic(bootstrap, f"{topic}-out", min_count=N, timeout_s=300, quiet_s=3)}
        letters = [json.loads(m.value()) for m in read_topic(bootstrap, f"{topic}-out.dlq", min_count=1,
                                                              timeout_s=60, quiet_s=2)]
    finally:
        if mode == "streaming":
            subprocess.run([stack.flink_run_command("x")[0], "cancel", job_id], env=stack.flink_env(),
                           capture_output=True, timeout=120)
    assert letters == [{"id": "no-text", "reason": "missing_text"}]  # NULL text: NULL fields
    assert sorted(docs) == sorted(r["id"] for r in records)  # each row once
    scores, _ = OnnxSentimentModel(model_assets).predict([r["text"] for r in records])
    for record, score in zip(records, scores, strict=True):
        doc = docs[record["id"]]
        scored_by = json.loads(doc["scored_by"])
        if record["kind"] == "short":
            assert doc["score"] == pytest.approx(model.score(record["text"]), abs=1e-12)
            assert doc["known_words"] == model.known_words(record["text"])
            assert doc["label"] == ("fresh" if doc["score"] >= 0.5 else "rotten")
            assert doc["model_sha256"] == lexicon_sha
            assert scored_by == [{"model": "lexicon", "model_sha256": lexicon_sha}]
        else:
            assert doc["score"] == pytest.approx(float(score), abs=1e-5)
            assert doc["known_words"] is None  # the lexicon's field: NULL where the sentiment model answered
            assert doc["model_sha256"] == model_assets.sha256
            assert scored_by == [{"model": "sentiment", "model_sha256": model_assets.sha256}]
