"""The call log on a real Kafka broker: the topic is created compacted, entries written and flushed by
one worker are read back by the next (a restart), other models' entries are skipped, and the newest
entry of a key wins."""

from __future__ import annotations

from confluent_kafka.admin import AdminClient, ConfigResource

from pyflink_aisp.inference.handlers.remote import CallLog, CallLogConfig, call_key


def test_entries_survive_the_worker_and_the_topic_is_compacted(kafka_bootstrap):
    config = CallLogConfig(topic="calls-it", bootstrap_servers=kafka_bootstrap)
    first = CallLog(config, scope="openai:smollm2").open()
    keys = [call_key("openai:smollm2", {"prompt": str(i)}) for i in range(50)]
    first.put((k, {"kind": "started", "at": 1.0}) for k in keys)
    first.put((k, {"kind": "ok", "at": 2.0, "result": {"completion": f"answer {i}"}})
              for i, k in enumerate(keys))
    other = CallLog(config, scope="openai:other").open()
    other.put([(call_key("openai:other", {"prompt": "0"}), {"kind": "ok", "at": 2.0, "result": {}})])
    first.flush()
    other.flush()
    first.close()
    other.close()
    second = CallLog(config, scope="openai:smollm2").open()
    try:
        assert second.size == 50, "the other model's entry is not kept"
        assert [second.get(k)["result"]["completion"] for k in keys] == [f"answer {i}" for i in range(50)]
    finally:
        second.close()
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    (described,) = admin.describe_configs([ConfigResource("topic", "calls-it")]).values()
    settings = described.result()
    assert settings["cleanup.policy"].value == "compact,delete"
    assert settings["retention.ms"].value == str(7 * 24 * 3600 * 1000)
