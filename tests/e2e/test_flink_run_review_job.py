"""The packaged job submitted with `flink run -py` to the local standalone cluster."""

import json
import subprocess
from pathlib import Path

import pytest

from pyflink_aisp.datasets import load_rotten_tomatoes
from pyflink_aisp.inference import OnnxSentimentModel
from pyflink_aisp.kafka import create_topics, ingest_records, read_topic
from pyflink_aisp.local import LocalStack

pytestmark = pytest.mark.e2e

N = 200
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def stack(tmp_path_factory, stack_config):
    stack = LocalStack(stack_config(tmp_path_factory.mktemp("e2e")))
    stack.up()
    yield stack
    stack.down()


def test_flink_run_batch_job_scores_all_reviews(stack, model_assets):
    bootstrap = str(stack.status().bootstrap_servers)
    t_in, t_out, t_dlq = "e2e-reviews", "e2e-scores", "e2e-dlq"
    create_topics(bootstrap, [t_in, t_out, t_dlq])
    reviews = load_rotten_tomatoes()[-N:]
    records = [{"id": r.id, "text": r.text, "label": r.label} for r in reviews]
    assert ingest_records(bootstrap, t_in, records, progress=False).delivered == N
    cmd = stack.flink_run_command(
        str(ROOT / "jobs" / "review_sentiment.py"), "--bootstrap-servers", bootstrap,
        "--input-topic", t_in, "--output-topic", t_out, "--dlq-topic", t_dlq, "--mode", "batch",
        "--model-dir", str(model_assets.directory),
    )
    proc = subprocess.run(cmd, env=stack.flink_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "Job has been submitted with JobID" in proc.stdout

    docs = [json.loads(m.value()) for m in read_topic(bootstrap, t_out, min_count=N, timeout_s=60)]
    scores, _ = OnnxSentimentModel(model_assets).predict([r.text for r in reviews])
    expected = {r.id: float(s) for r, s in zip(reviews, scores, strict=True)}
    assert sorted(d["id"] for d in docs) == sorted(expected)
    for d in docs:
        assert d["score"] == pytest.approx(expected[d["id"]], abs=1e-5)
    assert read_topic(bootstrap, t_dlq, timeout_s=5) == []
