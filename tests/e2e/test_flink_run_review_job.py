"""The packaged job submitted with `flink run -py` to the local standalone cluster."""

import json
import re
import subprocess
from pathlib import Path

import pytest

from pyflink_aisp.datasets import load_rotten_tomatoes
from pyflink_aisp.inference.handlers import OnnxSentimentModel
from pyflink_aisp.kafka import create_topics, ingest_records, read_topic

pytestmark = pytest.mark.e2e

N = 200
ROOT = Path(__file__).resolve().parents[2]


def _job_errors(proc: subprocess.CompletedProcess[str]) -> list[str]:
    """The job's own one-line errors in a `flink run`'s output (Flink's trace follows them)."""
    return [line for line in (proc.stdout + proc.stderr).splitlines()
            if line.startswith("review_sentiment: error:")]


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


def test_detached_streaming_job_stops_with_a_savepoint_and_commits(stack, model_assets):
    bootstrap = str(stack.status().bootstrap_servers)
    t_in, t_out = "e2e-stream-reviews", "e2e-stream-scores"
    create_topics(bootstrap, [t_in, t_out])
    reviews = load_rotten_tomatoes()[:N]
    records = [{"id": r.id, "text": r.text} for r in reviews]
    assert ingest_records(bootstrap, t_in, records, progress=False).delivered == N
    cmd = stack.flink_run_command(
        str(ROOT / "jobs" / "review_sentiment.py"), "--bootstrap-servers", bootstrap,
        "--input-topic", t_in, "--output-topic", t_out, "--model-dir", str(model_assets.directory),
        "--checkpoint-interval-ms", "1000",
    )
    cmd.insert(cmd.index("run") + 1, "-d")
    proc = subprocess.run(cmd, env=stack.flink_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    job_id = re.search(r"JobID ([0-9a-f]{32})", proc.stdout).group(1)

    assert len(read_topic(bootstrap, t_out, min_count=N, timeout_s=180, quiet_s=3)) == N
    stop = subprocess.run([cmd[0], "stop", job_id], env=stack.flink_env(), capture_output=True, text=True,
                          timeout=120)
    assert stop.returncode == 0 and "Savepoint completed" in stop.stdout, stop.stdout + stop.stderr
    # Stopped with a savepoint, no transaction stays open: read_committed reads to the end at once.
    out = read_topic(bootstrap, t_out, timeout_s=30)
    assert sorted(json.loads(m.value())["id"] for m in out) == sorted(r.id for r in reviews)


def test_flink_run_of_the_readmes_handler_example_defined_in_the_job_script(stack):
    """Issue 9.2: the example's handler class lives in the job script (``__main__``) and reaches the
    cluster's Python worker by value (cloudpickle); the worker must still share and run it."""
    cmd = stack.flink_run_command(str(ROOT / "jobs" / "examples" / "lexicon_handler.py"), "--limit", "100")
    proc = subprocess.run(cmd, env=stack.flink_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    match = re.search(r"lexicon [0-9a-f]{12}: scored (\d+) of (\d+) held-out reviews in PyFlink, "
                      r"accuracy (0\.\d{3})", proc.stdout)
    assert match is not None, proc.stdout[-3000:]
    assert (match.group(1), match.group(2)) == ("100", "100")
    assert float(match.group(3)) > 0.6  # the lexicon scores 0.787 on the whole held-out split


def test_a_missing_connector_jar_is_one_line_before_any_flink_trace(stack, model_assets):
    """Issue 9.4: pre-flight through `flink run`: one line naming the jar and the fix, exit 1."""
    cmd = stack.flink_run_command(
        str(ROOT / "jobs" / "review_sentiment.py"), "--input-topic", "i", "--output-topic", "o",
        "--jars", "file:///nonexistent/kafka.jar", "--model-dir", str(model_assets.directory))
    proc = subprocess.run(cmd, env=stack.flink_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    lines = _job_errors(proc)
    assert lines == ["review_sentiment: error: connector jar /nonexistent/kafka.jar does not exist: pass "
                     "--jars file:///path/flink-sql-connector-kafka-5.0.0-2.2.jar (Maven Central: "
                     "org.apache.flink:flink-sql-connector-kafka:5.0.0-2.2) or fill the dev cache with "
                     "`aisp local jars`"]
    assert "ValidationException" not in proc.stdout + proc.stderr


def test_flink_run_pyexec_names_the_workers_python_and_a_missing_one_is_one_line(stack, model_assets):
    """`-pyexec` is honoured (not replaced by the client's Python) and pre-flight checks it."""
    cmd = stack.flink_run_command(
        str(ROOT / "jobs" / "review_sentiment.py"), "--input-topic", "i", "--output-topic", "o",
        "--model-dir", str(model_assets.directory))
    cmd[cmd.index("-pyexec") + 1] = "/nonexistent/python"
    proc = subprocess.run(cmd, env=stack.flink_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    lines = _job_errors(proc)
    assert lines == ["review_sentiment: error: the workers' Python executable /nonexistent/python does not "
                     "exist: run the job with the project's Python (e.g. .venv/bin/python, or `flink run "
                     "-pyexec /abs/python`)"]


def test_a_second_live_job_of_the_same_name_is_refused_by_flink_run(stack, model_assets):
    """Issue 11.1: one live job per --job-name on the cluster (same group, same transactional ids)."""
    bootstrap = str(stack.status().bootstrap_servers)
    t_in, t_out = "e2e-name-reviews", "e2e-name-scores"
    create_topics(bootstrap, [t_in, t_out])
    args = ["--bootstrap-servers", bootstrap, "--input-topic", t_in, "--output-topic", t_out,
            "--model-dir", str(model_assets.directory), "--job-name", "e2e-nightly"]
    cmd = stack.flink_run_command(str(ROOT / "jobs" / "review_sentiment.py"), *args)
    cmd.insert(cmd.index("run") + 1, "-d")
    first = subprocess.run(cmd, env=stack.flink_env(), capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    job_id = re.search(r"JobID ([0-9a-f]{32})", first.stdout).group(1)
    try:
        second = subprocess.run(cmd, env=stack.flink_env(), capture_output=True, text=True, timeout=300)
        assert second.returncode != 0
        lines = _job_errors(second)
        assert len(lines) == 1
        assert lines[0].startswith("review_sentiment: error: a job named 'e2e-nightly' is already ")
        assert f"(job {job_id}): stop it (`flink stop {job_id}`) or pass another --job-name" in lines[0]
    finally:
        subprocess.run([cmd[0], "cancel", job_id], env=stack.flink_env(), capture_output=True, timeout=120)


def test_flink_run_torch_job_pipelines_device_batches_in_few_shapes(stack, model_assets):
    """Issue 23 through `flink run`: the torch runtime with the GPU path's launch / collect (two
    model batches in flight, lengths padded to 16, batch buckets; the CPU's host ops stand in
    for CUDA streams) scores every review once, as the ONNX model does. Arrow batches of 64 over
    model batches of 16 are submitted as slices of 32 without waiting (ModelRuntime.infer_batch)."""
    from pyflink_aisp.inference.handlers import TorchSentimentHandler

    bootstrap = str(stack.status().bootstrap_servers)
    t_in, t_out, t_dlq = "e2e-torch-reviews", "e2e-torch-scores", "e2e-torch-dlq"
    create_topics(bootstrap, [t_in, t_out, t_dlq])
    reviews = load_rotten_tomatoes()[1000:1000 + 120]
    records = [{"id": r.id, "text": r.text} for r in reviews]
    assert ingest_records(bootstrap, t_in, records, progress=False).delivered == len(reviews)
    cmd = stack.flink_run_command(
        "pyflink_aisp.jobs.review_sentiment", "--bootstrap-servers", bootstrap,
        "--input-topic", t_in, "--output-topic", t_out, "--dlq-topic", t_dlq, "--mode", "batch",
        "--model-dir", str(model_assets.directory), "--runtime", "torch", "--device", "cpu",
        "--pipeline-depth", "2", "--pad-to-multiple-of", "16", "--batch-size-buckets", "4,8,16",
        "--max-batch-size", "16", "--arrow-batch-size", "64", module=True,
    )
    proc = subprocess.run(cmd, env=stack.flink_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

    docs = [json.loads(m.value()) for m in read_topic(bootstrap, t_out, min_count=len(reviews), timeout_s=60)]
    scores, _ = OnnxSentimentModel(model_assets).predict([r.text for r in reviews])
    expected = {r.id: float(s) for r, s in zip(reviews, scores, strict=True)}
    assert sorted(d["id"] for d in docs) == sorted(expected)  # each once
    version = TorchSentimentHandler(model_assets).model_version()
    for d in docs:
        assert d["score"] == pytest.approx(expected[d["id"]], abs=1e-5)
        assert d["model_sha256"] == version
    assert read_topic(bootstrap, t_dlq, timeout_s=5) == []
