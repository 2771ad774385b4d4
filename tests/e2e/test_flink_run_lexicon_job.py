"""A user's own handler through build_pipeline: `flink run` of jobs/examples/lexicon_job.py on the
standalone cluster writes the lexicon's own output fields (issue 20.3)."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from pyflink_aisp.datasets import load_rotten_tomatoes, split_reviews
from pyflink_aisp.kafka import create_topics, ingest_records, read_topic

pytestmark = pytest.mark.e2e

N = 300
ROOT = Path(__file__).resolve().parents[2]


def _lexicon_module():
    path = ROOT / "jobs" / "examples" / "lexicon_handler.py"
    spec = importlib.util.spec_from_file_location("lexicon_handler", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["lexicon_handler"] = module
    spec.loader.exec_module(module)
    return module


def test_flink_run_of_build_pipeline_with_the_lexicon_handler_writes_its_own_fields(stack, tmp_path):
    lexicon_handler = _lexicon_module()
    train, heldout = split_reviews(load_rotten_tomatoes())
    path = tmp_path / "lexicon.json"
    sha256 = lexicon_handler.train_lexicon(train).save(path)
    lexicon = lexicon_handler.Lexicon.load(path)
    bootstrap = str(stack.status().bootstrap_servers)
    t_in, t_out, t_dlq = "e2e-lexicon-reviews", "e2e-lexicon-scores", "e2e-lexicon-dlq"
    create_topics(bootstrap, [t_in, t_out, t_dlq])
    reviews = heldout[:N]
    records = [{"id": r.id, "text": r.text, "label": r.label} for r in reviews]
    assert ingest_records(bootstrap, t_in, records, progress=False).delivered == N
    cmd = stack.flink_run_command(
        str(ROOT / "jobs" / "examples" / "lexicon_job.py"), "--lexicon", str(path),
        "--bootstrap-servers", bootstrap, "--input-topic", t_in, "--output-topic", t_out,
        "--dlq-topic", t_dlq, "--mode", "batch", "--job-name", "e2e-lexicon")
    proc = subprocess.run(cmd, env=stack.flink_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "Job has been submitted with JobID" in proc.stdout

    out = read_topic(bootstrap, t_out, min_count=N, timeout_s=60, quiet_s=3)
    docs = [json.loads(m.value()) for m in out]
    assert sorted(d["id"] for d in docs) == sorted(r.id for r in reviews)  # exactly one output per input
    by_id = {r.id: r.text for r in reviews}
    for message, doc in zip(out, docs, strict=True):
        assert list(doc) == ["id", "label", "score", "known_words", "model_sha256"]
        text = by_id[doc["id"]]
        score = lexicon.score(text)
        assert doc["score"] == score  # the same Python float, through JSON
        assert doc["label"] == ("fresh" if score >= 0.5 else "rotten")
        assert doc["known_words"] == lexicon.known_words(text)
        assert doc["model_sha256"] == sha256
        assert message.key().decode() == doc["id"]
    assert sum(d["known_words"] == 0 for d in docs) < N // 10  # the lexicon knows most words
    assert read_topic(bootstrap, t_dlq, timeout_s=5) == []
