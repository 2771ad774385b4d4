"""Issue 11 end to end on the standalone cluster: a stream submitted with `flink run` writes a
manifest per completed checkpoint; `aisp backfill` re-scores up to its last completed checkpoint in
BATCH mode; `aisp verify` proves the two equal from the manifests; a stream started where the
backfill ended continues it with no gap and no overlap."""

import itertools
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pyflink_aisp.alignment import RunManifest
from pyflink_aisp.datasets import load_rotten_tomatoes
from pyflink_aisp.kafka import create_topics, ingest_records, read_topic

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
FIRST, MORE = 1200, 300
AISP = [sys.executable, "-m", "pyflink_aisp.cli"]


def _wait_for_manifest(directory: Path, inputs: int, proc: subprocess.Popen, log: Path,
                       timeout_s: float = 300):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, log.read_text()[-5000:]
        manifests = [RunManifest.read(p) for p in sorted(directory.glob("*-chk-*.json"))]
        done = [m for m in manifests if m.summary.input_count == inputs]
        if done:
            return max(done, key=lambda m: m.checkpoint_id), manifests
        time.sleep(1)
    raise AssertionError(f"no checkpoint manifest with {inputs} inputs in {directory} within {timeout_s} s: "
                         + log.read_text()[-5000:])


def _cancel(stack, name):
    from pyflink_aisp.pipeline._identity import live_jobs_named

    for job_id, _ in live_jobs_named(stack.status().rest_url, name):
        subprocess.run([*stack.flink_run_command("x")[:1], "cancel", job_id], env=stack.flink_env(),
                       capture_output=True, timeout=120)


def test_stream_manifests_backfill_verify_and_continuation(stack, model_assets, tmp_path):
    bootstrap, rest = str(stack.status().bootstrap_servers), str(stack.status().rest_url)
    t_in, t_stream, t_backfill = "align-reviews", "align-stream", "align-backfill"
    create_topics(bootstrap, [t_in], partitions=2)
    reviews = load_rotten_tomatoes()[:FIRST + MORE]
    records = [{"id": r.id, "text": r.text} for r in reviews]
    assert ingest_records(bootstrap, t_in, records[:FIRST], progress=False).delivered == FIRST
    common = ["--bootstrap-servers", bootstrap, "--input-topic", t_in,
              "--model-dir", str(model_assets.directory)]
    stream_dir, backfill_dir = tmp_path / "stream", tmp_path / "backfill"
    cmd = stack.flink_run_command(str(ROOT / "jobs" / "review_sentiment.py"), *common, "--output-topic",
                                  t_stream, "--job-name", "align-stream", "--checkpoint-interval-ms", "2000",
                                  "--manifest-dir", str(stream_dir))
    log = tmp_path / "stream.log"
    with log.open("w") as out:
        stream = subprocess.Popen(cmd, env=stack.flink_env(), stdout=out, stderr=subprocess.STDOUT, text=True)
    try:
        stream_manifest, manifests = _wait_for_manifest(stream_dir, FIRST, stream, log)
        assert all(m.summary.duplicates == 0 and m.summary.missing == 0 for m in manifests)
        ids = [m.checkpoint_id for m in manifests]
        assert len(set(ids)) == len(ids) and len(ids) >= 2
        by_id = sorted(manifests, key=lambda m: m.checkpoint_id)
        for earlier, later in itertools.pairwise(by_id):  # the range only grows
            assert all(later.range.ends[p] >= end for p, end in earlier.range.ends.items())
        assert stream_manifest.mode == "streaming" and stream_manifest.summary.output_count == FIRST
        assert stream_manifest.model_files["model.onnx"] == model_assets.sha256
        assert stream_manifest.summary.model_versions == (model_assets.sha256,)

        env = {**os.environ, "AISP_FLINK_REST_PORT": rest.rsplit(":", 1)[1]}
        backfill = subprocess.run([*AISP, "backfill", "--stream-job", "align-stream", *common,
                                   "--output-topic", t_backfill, "--manifest-dir", str(backfill_dir)],
                                  env=env, capture_output=True, text=True, timeout=600)
        assert backfill.returncode == 0, backfill.stdout[-3000:] + backfill.stderr[-3000:]
        (backfill_path,) = backfill_dir.glob("align-stream-backfill-batch-*.json")
        backfilled = RunManifest.read(backfill_path)
        assert backfilled.range == stream_manifest.range and backfilled.mode == "batch"
        assert backfilled.range.starts == {0: 0, 1: 0} and sum(backfilled.range.ends.values()) == FIRST
        assert backfilled.summary.output_count == FIRST and backfilled.summary.duplicates == 0

        stream_path = stream_dir / stream_manifest.file_name()
        verify = subprocess.run([*AISP, "verify", "--manifest", str(stream_path), "--manifest",
                                 str(backfill_path), "--bootstrap-servers", bootstrap],
                                capture_output=True, text=True, timeout=300)
        assert verify.returncode == 0, verify.stdout + verify.stderr
        assert verify.stdout.rstrip().endswith("SAME")

        # the stream's open transactions are not aborted while it runs
        abort = subprocess.run([*AISP, "transactions", "abort", "--job-name", "align-stream",
                                "--bootstrap-servers", bootstrap, "--flink-rest-url", rest],
                               capture_output=True, text=True, timeout=120)
        assert abort.returncode == 1 and "job 'align-stream' is RUNNING" in abort.stderr, abort.stderr

        # the stream goes on over new records; a second stream continues the backfill from where it ended
        assert ingest_records(bootstrap, t_in, records[FIRST:], progress=False).delivered == MORE
        cont = stack.flink_run_command(str(ROOT / "jobs" / "review_sentiment.py"), *common, "--output-topic",
                                       t_backfill, "--job-name", "align-continued", "--range-start",
                                       f"manifest:{backfill_path}", "--checkpoint-interval-ms", "2000")
        cont.insert(cont.index("run") + 1, "-d")
        proc = subprocess.run(cont, env=stack.flink_env(), capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        union = read_topic(bootstrap, t_backfill, min_count=FIRST + MORE, timeout_s=300, quiet_s=5)
        union_ids = [json.loads(m.value())["id"] for m in union]
        assert len(union_ids) == FIRST + MORE and set(union_ids) == {r.id for r in reviews}
        streamed = read_topic(bootstrap, t_stream, min_count=FIRST + MORE, timeout_s=300, quiet_s=5)
        assert len(streamed) == FIRST + MORE
        full = subprocess.run([*AISP, "verify", t_stream, t_backfill, "--bootstrap-servers", bootstrap],
                              capture_output=True, text=True, timeout=300)
        assert full.returncode == 0 and full.stdout.rstrip().endswith("SAME"), full.stdout + full.stderr
    finally:
        _cancel(stack, "align-continued")
        _cancel(stack, "align-stream")
        stream.wait(timeout=120)
