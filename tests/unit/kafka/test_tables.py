import pytest

from pyflink_aisp.errors import ConfigError
from pyflink_aisp.kafka import DeliveryGuarantee, KafkaSinkTable, KafkaSourceTable, StartupMode


def test_source_ddl_reads_raw_bytes_with_metadata_and_read_committed():
    ddl = KafkaSourceTable(name="src", topic="in.t", bootstrap_servers="h:1", group_id="g").ddl()
    assert "`offset` BIGINT METADATA VIRTUAL" in ddl
    assert "'properties.isolation.level' = 'read_committed'" in ddl
    assert "'format' = 'raw'" in ddl
    assert "scan.bounded.mode" not in ddl
    assert "'scan.startup.mode' = 'group-offsets'" in ddl
    assert "'properties.auto.offset.reset' = 'earliest'" in ddl


def test_a_source_with_the_key_adds_it_as_the_last_raw_column():
    ddl = KafkaSourceTable(name="src", topic="t", bootstrap_servers="h:1", group_id="g", with_key=True).ddl()
    assert "`offset` BIGINT METADATA VIRTUAL,\n  `key` BYTES\n)" in ddl
    for option in ("'key.format' = 'raw'", "'key.fields' = 'key'", "'value.format' = 'raw'",
                   "'value.fields-include' = 'EXCEPT_KEY'"):
        assert option in ddl
    assert "'format' = 'raw'" not in ddl


def test_earliest_startup_needs_no_reset_policy():
    ddl = KafkaSourceTable(name="s", topic="t", bootstrap_servers="h:1", group_id="g",
                           startup_mode=StartupMode.EARLIEST).ddl()
    assert "'scan.startup.mode' = 'earliest-offset'" in ddl
    assert "auto.offset.reset" not in ddl


def test_bounded_source_stops_at_latest_offsets():
    ddl = KafkaSourceTable(name="s", topic="t", bootstrap_servers="h:1", group_id="g", bounded=True).ddl()
    assert "'scan.bounded.mode' = 'latest-offset'" in ddl


def test_sink_defaults_to_exactly_once_with_prefix_and_timeout():
    ddl = KafkaSinkTable(name="o", topic="out", bootstrap_servers="h:1", transactional_id_prefix="p").ddl()
    assert "'sink.delivery-guarantee' = 'exactly-once'" in ddl
    assert "'sink.transactional-id-prefix' = 'p'" in ddl
    assert "'properties.transaction.timeout.ms' = '600000'" in ddl
    assert "linger.ms" not in ddl  # the client's default unless asked


def test_sink_linger_is_passed_to_the_producer():
    ddl = KafkaSinkTable(name="o", topic="out", bootstrap_servers="h:1", transactional_id_prefix="p",
                         linger_ms=0).ddl()
    assert "'properties.linger.ms' = '0'" in ddl


def test_option_values_are_quoted():
    ddl = KafkaSourceTable(name="s", topic="t", bootstrap_servers="h:1", group_id="it's").ddl()
    assert "'it''s'" in ddl


@pytest.mark.parametrize(
    "kwargs",
    [
        {"name": "bad name"},
        {"topic": "bad topic!"},
        {"bootstrap_servers": ""},
        {"transactional_id_prefix": ""},
        {"transaction_timeout_ms": 2**31},
        {"linger_ms": -1},  # over a Java int (the brokers bound it further, checked at start)
    ],
)
def test_sink_rejects_bad_config(kwargs):
    base = {"name": "o", "topic": "out", "bootstrap_servers": "h:1", "transactional_id_prefix": "p"}
    with pytest.raises(ConfigError):
        KafkaSinkTable(**{**base, **kwargs})


def test_at_least_once_needs_no_prefix():
    t = KafkaSinkTable(name="o", topic="out", bootstrap_servers="h:1", transactional_id_prefix="",
                       delivery_guarantee=DeliveryGuarantee.AT_LEAST_ONCE)
    assert "transactional-id-prefix" not in t.ddl()


def test_the_sink_record_limit_is_the_smallest_producer_or_topic_limit_less_overhead(monkeypatch):
    from pyflink_aisp.kafka import _limits

    seen = []

    def topic_limits(servers, topics, timeout_s=30.0):
        seen.append(list(topics))
        return {"out": 2_000_000, "out.dlq": 500_000}

    monkeypatch.setattr(_limits, "topic_max_message_bytes", topic_limits)
    assert _limits.sink_record_limit("b:9092", ["out", "out.dlq"]) == 500_000 - 1024
    assert _limits.sink_record_limit("b:9092", ["out", "out"], max_request_size=100_000) == 100_000 - 1024
    assert seen[-1] == ["out"]  # each topic described once
    monkeypatch.setattr(_limits, "topic_max_message_bytes", lambda *a, **k: {"out": 60_000_000})
    # the producer's buffer.memory (32 MiB) caps a larger max.request.size
    assert _limits.sink_record_limit("b:9092", ["out"], max_request_size=60_000_000) == 33_554_432 - 1024
