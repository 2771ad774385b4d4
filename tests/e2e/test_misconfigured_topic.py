"""Issue 25: a topic of another shape ({"review_id", "body", "lang"}) through `flink run`: the batch run
says it dead-lettered everything and why; with --max-dead-letter-rate the job fails with that line."""

import json
import subprocess
from pathlib import Path

import pytest

from pyflink_aisp.datasets import load_rotten_tomatoes
from pyflink_aisp.kafka import create_topics, ingest_records, read_topic

pytestmark = pytest.mark.e2e

N = 150
ROOT = Path(__file__).resolve().parents[2]
FIELDS = "no 'text' field; the object's fields: 'body', 'lang', 'review_id'"


def _foreign_topic(stack, name: str, n: int = N) -> str:
    bootstrap = str(stack.status().bootstrap_servers)
    create_topics(bootstrap, [name, f"{name}-out", f"{name}-out.dlq"])
    records = [{"review_id": r.id, "body": r.text, "lang": "en"} for r in load_rotten_tomatoes()[:n]]
    assert ingest_records(bootstrap, name, records, progress=False).delivered == n
    return bootstrap


def _run(stack, model_assets, bootstrap: str, topic: str, *flags: str) -> subprocess.CompletedProcess[str]:
    cmd = stack.flink_run_command(
        str(ROOT / "jobs" / "review_sentiment.py"), "--bootstrap-servers", bootstrap, "--input-topic", topic,
        "--output-topic", f"{topic}-out", "--mode", "batch", "--model-dir", str(model_assets.directory),
        *flags)
    return subprocess.run(cmd, env=stack.flink_env(), capture_output=True, text=True, timeout=600)


def test_a_batch_run_over_a_topic_of_another_shape_says_what_it_dead_lettered_and_why(stack, model_assets):
    bootstrap = _foreign_topic(stack, "foreign-batch")
    proc = _run(stack, model_assets, bootstrap, "foreign-batch")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = [line for line in proc.stdout.splitlines() if line.startswith("review_sentiment: ")]
    (summary,) = [line for line in lines if " finished in " in line]
    assert summary.endswith(f": {N} in, 0 out, {N} dead letters (missing_text {N})"), summary
    (warning,) = [line for line in lines if "warning:" in line]
    assert warning == ("review_sentiment: warning: 100 % of the range was dead-lettered, most as "
                       "missing_text: the job reads the text from the field 'text' of each JSON object: "
                       'produce records {"id", "text"}, or check --input-topic')
    letters = [json.loads(m.value()) for m in read_topic(bootstrap, "foreign-batch-out.dlq", min_count=N,
                                                          timeout_s=60)]
    assert len(letters) == N and {(d["reason"], d["detail"]) for d in letters} == {("missing_text", FIELDS)}


def test_with_max_dead_letter_rate_the_job_fails_at_once_with_the_line(stack, model_assets):
    bootstrap = _foreign_topic(stack, "foreign-strict", 600)  # > 0.5 x the watch's 1,000-record window
    proc = _run(stack, model_assets, bootstrap, "foreign-strict", "--max-dead-letter-rate", "0.5")
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-3000:]
    errors = [line for line in out.splitlines() if line.startswith("review_sentiment: error: ")]
    assert len(errors) == 1, out[-3000:]
    assert " cancelled: 100 % of the last " in errors[0]
    assert " records were dead-lettered, " in errors[0] and f"as missing_text ({FIELDS}): " in errors[0]
    assert errors[0].endswith("(above --max-dead-letter-rate 0.5 of 1000 records)")
    # nothing of the range was committed: the run failed before its one commit at the end
    assert read_topic(bootstrap, "foreign-strict-out.dlq", timeout_s=5) == []
