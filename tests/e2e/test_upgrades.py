"""Issue 11.6 on the standalone cluster: a streaming job stopped with a savepoint and restarted from
it with another job version and parallelism (1 -> 2 -> 1), then cancelled and restarted without a
savepoint (from the end of what it wrote: its group's committed offsets may lag its committed
outputs): every input id is in the output exactly once."""

import json
import re
import subprocess
from collections import Counter
from pathlib import Path

import pytest

from pyflink_aisp.datasets import load_rotten_tomatoes
from pyflink_aisp.kafka import create_topics, ingest_records, read_topic

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
CHUNK = 250


def _submit(stack, common, *extra):
    cmd = stack.flink_run_command(str(ROOT / "jobs" / "review_sentiment.py"), *common)
    at = cmd.index("run") + 1
    cmd[at:at] = ["-d", *extra]
    proc = subprocess.run(cmd, env=stack.flink_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return re.search(r"JobID ([0-9a-f]{32})", proc.stdout).group(1)


def _flink(stack, *args):
    flink = stack.flink_run_command("x")[0]
    proc = subprocess.run([flink, *args], env=stack.flink_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


def test_savepoint_upgrade_rescale_and_restart_without_savepoint_lose_and_duplicate_nothing(
    stack, model_assets, tmp_path
):
    bootstrap = str(stack.status().bootstrap_servers)
    t_in, t_out = "upgrade-reviews", "upgrade-scores"
    create_topics(bootstrap, [t_in], partitions=2)
    reviews = load_rotten_tomatoes()[: 4 * CHUNK]
    records = [{"id": r.id, "text": r.text} for r in reviews]
    common = ["--bootstrap-servers", bootstrap, "--input-topic", t_in, "--output-topic", t_out,
              "--model-dir", str(model_assets.directory), "--job-name", "upgrade", "--checkpoint-interval-ms",
              "1000"]

    def phase(n, job_args, *flink_args):
        chunk = records[(n - 1) * CHUNK: n * CHUNK]
        assert ingest_records(bootstrap, t_in, chunk, progress=False).delivered == CHUNK
        job = _submit(stack, [*common, *job_args], *flink_args)
        assert len(read_topic(bootstrap, t_out, min_count=n * CHUNK, timeout_s=300, quiet_s=3)) >= n * CHUNK
        return job

    def stop_with_savepoint(job):
        out = _flink(stack, "stop", "--savepointPath", f"file://{tmp_path}/savepoints", job)
        return re.search(r"Savepoint completed\. Path: (\S+)", out).group(1)

    first = phase(1, ["--parallelism", "1"])
    savepoint = stop_with_savepoint(first)
    # a new job version (other batching) at parallelism 2, from the savepoint
    second = phase(2, ["--parallelism", "2", "--max-batch-size", "16"], "-s", savepoint)
    savepoint = stop_with_savepoint(second)
    third = phase(3, ["--parallelism", "1"], "-s", savepoint)
    _flink(stack, "cancel", third)  # no savepoint: the next run resumes from the group's offsets
    fourth = phase(4, ["--parallelism", "1"])
    try:
        out = read_topic(bootstrap, t_out, timeout_s=60, quiet_s=5)
        ids = Counter(json.loads(m.value())["id"] for m in out)
    finally:
        _flink(stack, "cancel", fourth)
    assert set(ids) == {r.id for r in reviews}
    assert [i for i, n in ids.items() if n > 1] == []
    assert read_topic(bootstrap, f"{t_out}.dlq", timeout_s=5) == []
