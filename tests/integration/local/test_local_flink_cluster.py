"""The full local stack: Kafka + Flink standalone cluster, a PyFlink job via `flink run -py`."""

import subprocess
import textwrap

import pytest

from pyflink_aisp.local import LocalStack, flink_overview, port_is_free
from pyflink_aisp.local._procs import is_alive

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


def test_down_stops_both(stack, first_up):
    pids = first_up.flink.pids + first_up.kafka.pids
    status = stack.down()
    assert not status.flink.running and not status.kafka.running
    assert not any(is_alive(pid) for pid in pids)
    assert port_is_free(stack.config.flink_rest_port)
    assert port_is_free(stack.config.kafka_port)
