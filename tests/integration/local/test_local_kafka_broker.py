"""A real KRaft broker started by LocalStack in a temp state dir on free ports.

The tests run in file order on one module-scoped stack: up, use, up again, down.
"""

import shutil
import uuid

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient

from pyflink_aisp.local import LocalStack, broker_answers, port_is_free
from pyflink_aisp.local._procs import is_alive

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def stack(tmp_path_factory, stack_config):
    stack = LocalStack(stack_config(tmp_path_factory.mktemp("local"), with_flink=False))
    yield stack
    stack.down()


@pytest.fixture(scope="module")
def first_up(stack):
    return stack.up()


def test_up_answers_metadata(stack, first_up):
    assert first_up.kafka.running and first_up.kafka.ready
    assert not first_up.flink.running
    assert first_up.bootstrap_servers == f"127.0.0.1:{stack.config.kafka_port}"
    metadata = AdminClient({"bootstrap.servers": first_up.bootstrap_servers}).list_topics(timeout=10)
    assert [(b.host, b.port) for b in metadata.brokers.values()] == [("127.0.0.1", stack.config.kafka_port)]
    assert broker_answers(first_up.bootstrap_servers)


def test_produce_consume_on_auto_created_topic(first_up):
    topic = f"local-{uuid.uuid4().hex[:8]}"
    producer = Producer({"bootstrap.servers": first_up.bootstrap_servers, "enable.idempotence": True})
    for i in range(5):
        producer.produce(topic, value=f"v{i}".encode())
    assert producer.flush(30) == 0
    consumer = Consumer(
        {
            "bootstrap.servers": first_up.bootstrap_servers,
            "group.id": topic,
            "auto.offset.reset": "earliest",
        }
    )
    consumer.subscribe([topic])
    values = []
    try:
        for _ in range(60):
            msg = consumer.poll(1.0)
            if msg is not None and msg.error() is None:
                values.append(msg.value())
            if len(values) == 5:
                break
        consumer.commit(asynchronous=False)  # group coordinator works with RF=1 offsets topic
    finally:
        consumer.close()
    assert values == [f"v{i}".encode() for i in range(5)]


def test_broker_logs_through_log4j2(stack, first_up):
    logs = stack.state_dir / "kafka" / "logs"
    assert "Kafka Server started" in (logs / "server.log").read_text()
    assert "NOP" not in (logs / "stdout.log").read_text()  # SLF4J found its Log4j 2 provider


def test_second_up_is_a_no_op(stack, first_up):
    again = stack.up()
    assert again.kafka.pids == first_up.kafka.pids
    assert again.kafka.ready


def test_status_line(stack, first_up):
    (pid,) = first_up.kafka.pids
    assert stack.status().lines()[0] == f"kafka: running pid {pid} bootstrap {first_up.bootstrap_servers}"


def test_down_kills_and_frees_ports_then_up_again(stack, first_up):
    (pid,) = first_up.kafka.pids
    status = stack.down()
    assert not status.kafka.running
    assert not is_alive(pid)
    assert port_is_free(stack.config.kafka_port)
    assert port_is_free(stack.config.kafka_controller_port)
    assert stack.down().kafka.pids == ()  # idempotent
    restarted = stack.up()  # storage already formatted: reused
    assert restarted.kafka.ready and restarted.kafka.pids != (pid,)
    stack.down()
    assert port_is_free(stack.config.kafka_port)


def test_state_dir_removed_under_a_running_broker(stack):
    (pid,) = stack.up().kafka.pids
    shutil.rmtree(stack.state_dir)
    assert stack.status().kafka.pids == (pid,)  # found by `kafka.Kafka <its server.properties>`
    restarted = stack.up()  # no pid file: stopped and started afresh (fresh storage)
    (new_pid,) = restarted.kafka.pids
    assert restarted.kafka.ready and new_pid != pid and not is_alive(pid)
    shutil.rmtree(stack.state_dir)
    assert not stack.down().kafka.running
    assert not is_alive(new_pid)
    assert port_is_free(stack.config.kafka_port) and port_is_free(stack.config.kafka_controller_port)
