"""The full local stack: Kafka + Flink standalone cluster, a PyFlink job via `flink run -py`.

The tests run in file order on one module-scoped stack: up, jobs, a killed TaskManager, down.
"""

import json
import os
import signal
import subprocess
import textwrap
import urllib.request

import pytest

from pyflink_aisp.local import LocalStack, flink_overview, port_is_free
from pyflink_aisp.local._procs import is_alive, wait_until

pytestmark = pytest.mark.integration

JOB = textwrap.dedent(
    """
    import sys
    from pyflink.common import Types
    from pyflink.datastream import StreamExecutionEnvironment

    env = StreamExecutionEnvironment.get_execution_environment()
    squares = env.from_collection(list(range(10)), type_info=Types.INT()).map(
        lambda x: x * x, output_type=Types.INT()
    )  # a Python UDF: runs in a Python worker the TaskManager starts from python.executable
    with squares.execute_and_collect() as results:
        total = sum(results)
    print(f"SUM={total} EXE={sys.executable}")
    """
)

# Unbounded and Java-only (datagen -> blackhole): no Python worker. Checkpointing on, so the
# default restart strategy (exponential delay) restarts it on a new TaskManager.
STREAMING_JOB = textwrap.dedent(
    """
    from pyflink.table import EnvironmentSettings, TableEnvironment

    t_env = TableEnvironment.create(EnvironmentSettings.in_streaming_mode())
    t_env.get_config().set("execution.checkpointing.interval", "2 s")
    t_env.execute_sql("CREATE TABLE src (x BIGINT) WITH ('connector' = 'datagen', 'rows-per-second' = '5')")
    t_env.execute_sql("CREATE TABLE snk (x BIGINT) WITH ('connector' = 'blackhole')")
    t_env.execute_sql("INSERT INTO snk SELECT x FROM src")
    """
)


def _jobs(rest_url):
    with urllib.request.urlopen(f"{rest_url}/jobs/overview", timeout=5) as resp:
        return {job["jid"]: job["state"] for job in json.load(resp)["jobs"]}


@pytest.fixture(scope="module")
def stack(tmp_path_factory, stack_config):
    stack = LocalStack(stack_config(tmp_path_factory.mktemp("local")))
    yield stack
    stack.down()


@pytest.fixture(scope="module")
def first_up(stack):
    return stack.up()


def test_overview_shows_a_taskmanager(stack, first_up):
    assert first_up.kafka.ready and first_up.flink.ready
    assert len(first_up.flink.pids) == 2
    assert first_up.rest_url == f"http://localhost:{stack.config.flink_rest_port}"
    overview = flink_overview(first_up.rest_url)
    assert overview is not None
    assert overview["taskmanagers"] == 1 and overview["slots-total"] == 4
    assert overview["flink-version"].startswith("2.3")


def test_second_up_is_a_no_op(stack, first_up):
    assert stack.up().flink.pids == first_up.flink.pids


def test_flink_run_python_job(stack, first_up, tmp_path):
    job = tmp_path / "squares.py"
    job.write_text(JOB)
    cmd = stack.flink_run_command(job)
    assert cmd[1:4] == ["run", "-m", f"localhost:{stack.config.flink_rest_port}"]
    proc = subprocess.run(cmd, env=stack.flink_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "SUM=285" in proc.stdout
    overview = flink_overview(first_up.rest_url)
    assert overview is not None and overview["jobs-finished"] >= 1


def test_up_after_taskmanager_died_keeps_the_jobmanager_and_its_job(stack, first_up, tmp_path):
    url = first_up.rest_url
    job = tmp_path / "endless.py"
    job.write_text(STREAMING_JOB)
    cmd = stack.flink_run_command(job)
    cmd.insert(2, "--detached")
    proc = subprocess.run(cmd, env=stack.flink_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert wait_until(lambda: "RUNNING" in _jobs(url).values(), 60, 0.5), _jobs(url)
    (jid,) = [j for j, state in _jobs(url).items() if state == "RUNNING"]

    jm, tm = stack.status().flink.pids
    os.kill(tm, signal.SIGKILL)
    assert wait_until(lambda: not is_alive(tm), 10, 0.1)
    assert stack.status().flink.pids == (jm,)

    status = stack.up()
    assert status.flink.ready
    new_jm, new_tm = status.flink.pids
    assert new_jm == jm and new_tm != tm and is_alive(new_tm)
    assert jid in _jobs(url)  # the JobManager kept the job
    # the dead TaskManager stays listed until its heartbeat fails; then the job runs on the new one
    assert wait_until(lambda: (flink_overview(url) or {}).get("taskmanagers") == 1, 120, 1.0)
    assert wait_until(lambda: _jobs(url).get(jid) == "RUNNING", 120, 1.0), _jobs(url)


def test_down_stops_both(stack, first_up):
    pids = stack.status().flink.pids + first_up.kafka.pids
    status = stack.down()
    assert not status.flink.running and not status.kafka.running
    assert not any(is_alive(pid) for pid in pids)
    assert port_is_free(stack.config.flink_rest_port)
    assert port_is_free(stack.config.kafka_port)
