"""The local standalone cluster and broker, started once for all e2e tests (free ports, temp state)."""

from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from pyflink_aisp.local import LocalStack, LocalStackConfig


@contextmanager
def _running(config: LocalStackConfig) -> Iterator[LocalStack]:
    """A stack up for the ``with`` block, down after it; when ``up`` fails, what it started is
    stopped before the error propagates (it must not run on beside the other tests)."""
    stack = LocalStack(config)
    try:
        stack.up()
    except Exception:
        stack.down()
        raise
    try:
        yield stack
    finally:
        stack.down()


@pytest.fixture(scope="session")
def running_stack():
    """``with running_stack(config) as stack:`` (:func:`_running`) for fixtures of their own stacks."""
    return _running


@pytest.fixture(scope="session")
def stack(tmp_path_factory, stack_config):
    with _running(stack_config(tmp_path_factory.mktemp("e2e"))) as stack:
        yield stack


def _job_outputs(stack: LocalStack, mode: str, args: tuple[str, ...], topics: dict[str, int]):
    """Run ``jobs/review_sentiment.py ARGS --mode MODE`` through ``flink run`` and read ``topics``
    (name -> at least this many records) once it wrote them: a batch run attached (its stdout is
    returned), a streaming run detached and cancelled after the read.

    Returns:
        ``(stdout, {topic: messages})``.
    """
    import re
    import subprocess
    from pathlib import Path

    from pyflink_aisp.kafka import read_topic

    job = Path(__file__).resolve().parents[2] / "jobs" / "review_sentiment.py"
    cmd = stack.flink_run_command(str(job), "--mode", mode, *args)
    if mode == "streaming":
        cmd.insert(cmd.index("run") + 1, "-d")
    proc = subprocess.run(cmd, env=stack.flink_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    found = re.search(r"JobID ([0-9a-f]{32})", proc.stdout) if mode == "streaming" else None
    bootstrap = str(stack.status().bootstrap_servers)
    try:
        read = {t: read_topic(bootstrap, t, min_count=n, timeout_s=180, quiet_s=2) for t, n in topics.items()}
    finally:
        if found is not None:
            subprocess.run([stack.flink_run_command("x")[0], "cancel", found.group(1)], env=stack.flink_env(),
                           capture_output=True, timeout=120)
    return proc.stdout, read


@pytest.fixture(scope="session")
def job_outputs():
    """``job_outputs(stack, mode, args, {topic: min_count})`` (:func:`_job_outputs`)."""
    return _job_outputs
