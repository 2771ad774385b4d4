"""Kafka transactions that outlive their job: the brokers' timeout ceiling, listing, aborting.

An exactly-once sink keeps a transaction open from one checkpoint to the next.
When its job is killed, that transaction stays open until the broker aborts it
after ``transaction.timeout.ms``, and until then it holds the last stable offset
of every partition it wrote to: ``read_committed`` readers (the next job, a
backfill, a dashboard) see nothing beyond it. :func:`list_transactions` lists a
job's transactions with Kafka's own tool (``kafka-transactions.sh list``,
KIP-664, ``org.apache.kafka.tools.TransactionsCommand`` from the broker's jars);
:func:`abort_transactions` ends the open ones by fencing: a producer that calls
``initTransactions`` with the same ``transactional.id`` makes the coordinator
abort the open transaction of the previous producer epoch (KIP-98; what Flink's
KafkaSink itself does to lingering transactions when it restarts).
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass

from confluent_kafka import KafkaException, Producer
from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType

from pyflink_aisp.errors import ConfigError, KafkaError

__all__ = ["TransactionInfo", "abort_transactions", "broker_transaction_max_timeout_ms",
           "check_transaction_timeout", "list_transactions"]

#: The broker's default ``transaction.max.timeout.ms`` (Kafka broker configs).
DEFAULT_TRANSACTION_MAX_TIMEOUT_MS = 900_000


def broker_transaction_max_timeout_ms(servers: str, timeout_s: float = 30.0) -> int:
    """The smallest ``transaction.max.timeout.ms`` over the cluster's brokers.

    Raises:
        KafkaError: No broker answered or the configs cannot be read.
    """
    admin = AdminClient({"bootstrap.servers": servers, "log_level": 2})
    try:
        brokers = admin.list_topics(timeout=timeout_s).brokers
        resources = [ConfigResource(ResourceType.BROKER, str(b)) for b in sorted(brokers)]
        values = [int(f.result(timeout=timeout_s)["transaction.max.timeout.ms"].value)
                  for f in admin.describe_configs(resources, request_timeout=timeout_s).values()]
    except (KafkaException, KeyError, TimeoutError, ValueError) as exc:
        raise KafkaError(f"cannot read transaction.max.timeout.ms of the brokers at {servers}: "
                         f"{exc}") from exc
    return min(values) if values else DEFAULT_TRANSACTION_MAX_TIMEOUT_MS


def check_transaction_timeout(servers: str, transaction_timeout_ms: int) -> None:
    """Refuse a job whose sinks' ``transaction.timeout.ms`` the brokers would reject.

    Raises:
        ConfigError: It exceeds the brokers' ``transaction.max.timeout.ms`` (one line, with the fix).
        KafkaError: As :func:`broker_transaction_max_timeout_ms`.
    """
    ceiling = broker_transaction_max_timeout_ms(servers)
    if transaction_timeout_ms > ceiling:
        raise ConfigError(f"--transaction-timeout-ms {transaction_timeout_ms} exceeds the brokers' "
                          f"transaction.max.timeout.ms {ceiling} at {servers}: raise it on the brokers "
                          f"(e.g. to {2 * transaction_timeout_ms}) or lower --transaction-timeout-ms "
                          "(keeping it above checkpoint interval + timeout and a restart)")


@dataclass(frozen=True, kw_only=True)
class TransactionInfo:
    """One row of ``kafka-transactions.sh list``."""

    transactional_id: str
    coordinator: int
    producer_id: int
    state: str


def _kafka_tools_command(servers: str, *args: str, timeout_s: float) -> str:
    from pyflink_aisp.jars import JarKind, ensure_jars, require_tools

    java = require_tools("java")["java"]
    classpath = ":".join(str(j) for j in ensure_jars(JarKind.KAFKA_BROKER))
    cmd = [java, "-cp", classpath, "org.apache.kafka.tools.TransactionsCommand",
           "--bootstrap-server", servers, *args]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired as exc:
        raise KafkaError(f"kafka-transactions {' '.join(args)} did not answer within {timeout_s} s") from exc
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        raise KafkaError(f"kafka-transactions {' '.join(args)} failed: {tail[0]}")
    return proc.stdout


def list_transactions(servers: str, prefix: str, timeout_s: float = 60.0) -> list[TransactionInfo]:
    """The transactions whose ``transactional.id`` starts with ``prefix``, as the
    coordinators know them (``Ongoing``, ``CompleteCommit``, ``CompleteAbort``, ``Empty``, ...).

    Raises:
        ConfigError: An empty prefix (it would match every job's transactions).
        KafkaError: The tool failed or the broker did not answer.
        EnvironmentSetupError: No ``java`` on PATH, or the broker jars cannot be fetched.
    """
    if not prefix:
        raise ConfigError("a transactional id prefix is needed (it would match every job)")
    rows = []
    for line in _kafka_tools_command(servers, "list", timeout_s=timeout_s).splitlines()[1:]:
        parts = line.split()
        if len(parts) >= 4 and parts[0].startswith(prefix):
            rows.append(TransactionInfo(transactional_id=parts[0], coordinator=int(parts[1]),
                                        producer_id=int(parts[2]), state=parts[3]))
    return sorted(rows, key=lambda r: r.transactional_id)


def abort_transactions(servers: str, prefix: str, timeout_s: float = 60.0) -> list[str]:
    """Abort the open (``Ongoing``) transactions of ``prefix`` by fencing their producers.

    Only for a job that no longer runs: a live job's producer would be fenced too and
    the job would fail and restart.

    Returns:
        The transactional ids whose open transaction was aborted.

    Raises:
        ConfigError / KafkaError / EnvironmentSetupError: As :func:`list_transactions`;
            KafkaError also when fencing fails.
    """
    aborted = []
    for info in list_transactions(servers, prefix, timeout_s):
        if info.state != "Ongoing":
            continue
        producer = Producer({"bootstrap.servers": servers, "transactional.id": info.transactional_id,
                             "log_level": 2})
        try:
            producer.init_transactions(timeout_s)  # bumps the epoch: the open transaction is aborted
        except KafkaException as exc:
            raise KafkaError(f"cannot abort the transaction of {info.transactional_id}: {exc}") from exc
        finally:
            producer.flush(0)
        aborted.append(info.transactional_id)
    return aborted
