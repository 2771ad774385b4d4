"""Review sentiment: Kafka → decode (DLQ) → tokenize + batched ONNX Runtime → Kafka.

Reads JSON reviews ``{"id", "text", "label"}`` from ``--input-topic``, scores
each text with all-MiniLM-L6-v2 plus a logistic sentiment head (one ONNX
Runtime session per Python worker, loaded in ``open()``), and writes
``{"id", "label", "score", "model_sha256"}`` (``"embedding"``: 384 floats with
``--with-embedding``) to ``--output-topic``, exactly once. Records that are not
UTF-8 JSON objects with a string ``text`` go to ``--dlq-topic`` with the reason,
topic, partition, offset and raw bytes.

Run it locally (MiniCluster)::

    python jobs/review_sentiment.py --input-topic reviews --output-topic scores --mode batch

or on a cluster::

    flink run -pyexec $(which python) -py jobs/review_sentiment.py --input-topic ...

``--mode streaming`` (default) reads without end, with checkpoints every
``--checkpoint-interval-ms`` and transactions committed on each checkpoint; it
starts from the consumer group's committed offsets (earliest for a new group).
Stop it with ``flink stop`` (a savepoint: open transactions commit) and resume
with ``flink run -s <savepoint>``; a cancelled job leaves its open transaction
to time out (``transaction.timeout.ms``, 10 min), holding read_committed
consumers back until then. ``--mode batch`` reads from the earliest offset (or
``--startup-mode``) to the latest offsets at start, so the run ends.
The job creates its output and DLQ topics if they do not exist.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyflink.common import Configuration, Row, Time, Types
from pyflink.datastream import (
    AsyncDataStream,
    CheckpointingMode,
    RuntimeExecutionMode,
    StreamExecutionEnvironment,
)
from pyflink.table import StreamTableEnvironment, TableResult
from pyflink.table.expressions import col, lit

from pyflink_aisp.errors import AispError, ConfigError, InferenceError, KafkaError
from pyflink_aisp.inference import (
    BatchedInferenceFunction,
    BatchingConfig,
    ModelHandler,
    ModelSwapConfig,
    SentimentHandler,
)
from pyflink_aisp.kafka import (
    KafkaSinkTable,
    KafkaSourceTable,
    StartupMode,
    create_topics,
    default_bootstrap_servers,
    list_topics,
)
from pyflink_aisp.kafka.flink import UndecodableRecord, decode_row


@dataclass(frozen=True, kw_only=True)
class JobConfig:
    """Options of the review sentiment job (see ``--help``)."""

    bootstrap_servers: str
    input_topic: str
    output_topic: str
    dlq_topic: str
    group_id: str
    mode: str
    startup_mode: StartupMode
    model_dir: Path | None
    with_embedding: bool
    checkpoint_interval_ms: int
    parallelism: int
    max_batch_size: int
    max_wait_ms: float
    max_batch_tokens: int | None
    length_buckets: tuple[int, ...]
    latency_slo_ms: float | None
    max_idle_ms: float | None
    model_pointer: Path | None
    ordered: bool
    capacity: int
    timeout_s: int
    intra_op_threads: int
    bundle_time_ms: int
    transactional_id_prefix: str
    jars: str | None

    def batching(self) -> BatchingConfig:
        """The inference operator's batching (raises ConfigError for bad flags)."""
        return _batching_of(self)

    def __post_init__(self) -> None:
        for name in ("capacity", "timeout_s", "bundle_time_ms", "checkpoint_interval_ms", "parallelism"):
            if getattr(self, name) < 1:
                raise ConfigError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        if self.latency_slo_ms is not None and not self.latency_slo_ms > 0:
            raise ConfigError(f"--latency-slo-ms must be > 0, got {self.latency_slo_ms}")
        self.batching()  # validate the batching flags before any JVM or broker is touched
        if self.capacity < self.max_batch_size:
            raise ConfigError(f"--capacity ({self.capacity}) must be >= --max-batch-size "
                              f"({self.max_batch_size}): records in flight cap the batch")
        if self.intra_op_threads < 0:
            raise ConfigError(f"--intra-op-threads must be >= 0, got {self.intra_op_threads}")


def _batching_of(cfg: JobConfig) -> BatchingConfig:
    return BatchingConfig(max_batch_size=cfg.max_batch_size, max_wait_ms=cfg.max_wait_ms,
                          max_batch_tokens=cfg.max_batch_tokens, length_buckets=cfg.length_buckets,
                          latency_slo_ms=cfg.latency_slo_ms, max_idle_ms=cfg.max_idle_ms)


def _finite(text: str) -> float:
    """A float flag: finite numbers only (``nan``/``inf`` would hang or crash later)."""
    try:
        value = float(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from exc
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value


def _int_list(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(b) for b in text.split(",") if b.strip())
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from exc


_DEFAULT_STARTUP = {"batch": "earliest-offset", "streaming": "group-offsets"}


def _default_bundle_time_ms(latency_slo_ms: float | None) -> int:
    """Outputs leave the Python worker when its bundle ends, and each bundle end drains
    every record in flight. Measured here (2 cores, 124 records/s offered, p50 / p99
    Kafka-in to Kafka-out): 50 ms bundles 223 / 457 ms, 20 ms 135 / 357, 10 ms 94 / 287,
    5 ms 82 / 254; the most records/s fell only from ~370 to ~330 at 5-10 ms. So: 50 ms
    for throughput without a target, else SLO / 15 within [5, 50] ms."""
    return 50 if latency_slo_ms is None else max(5, min(50, int(latency_slo_ms / 15)))


def parse_args(argv: list[str] | None = None) -> JobConfig:
    """Command line → :class:`JobConfig`."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--bootstrap-servers", default=None,
                   help="default: $AISP_KAFKA_BOOTSTRAP, else 127.0.0.1:$AISP_KAFKA_PORT (9092)")
    p.add_argument("--input-topic", required=True)
    p.add_argument("--output-topic", required=True)
    p.add_argument("--dlq-topic", default=None, help="default: <output-topic>.dlq")
    p.add_argument("--group-id", default=None, help="default: aisp-<input-topic>")
    p.add_argument("--mode", choices=["streaming", "batch"], default="streaming")
    p.add_argument("--startup-mode", choices=[m.value for m in StartupMode], default=None,
                   help="default: group-offsets in streaming, earliest-offset in batch")
    p.add_argument("--model-dir", type=Path, default=None,
                   help="built model assets (default: build or reuse the cached ones)")
    p.add_argument("--with-embedding", action="store_true")
    p.add_argument("--checkpoint-interval-ms", type=int, default=5000)
    p.add_argument("--parallelism", type=int, default=1)
    # 512 / 50 ms / 2048: the model sorts a batch by length into sub-batches of 64, so a larger
    # batch pads less; on 2 cores the demo ran 1.35x faster than with 64 / 10 ms / 256.
    p.add_argument("--max-batch-size", type=int, default=512)
    p.add_argument("--max-wait-ms", type=_finite, default=50.0)
    p.add_argument("--max-batch-tokens", type=int, default=None,
                   help="padded-token budget per model call (rows x longest row); default: none")
    p.add_argument("--length-buckets", type=_int_list, default=(),
                   help="comma-separated token-length bucket bounds, e.g. 16,32,64; default: one bucket")
    p.add_argument("--latency-slo-ms", type=_finite, default=None,
                   help="p99 target of the inference operator (queue + compute), in ms: batch size "
                        "and wait are then tuned online within --max-batch-size / --max-wait-ms; "
                        "default: fixed knobs")
    p.add_argument("--max-idle-ms", type=_finite, default=2.0,
                   help="a batch also leaves when no record arrived for this long (PyFlink waits for "
                        "all records in flight at each bundle end); a negative value turns it off")
    p.add_argument("--model-pointer", type=Path, default=None,
                   help='hot swap: a JSON file {"path", "sha256"} (written by `aisp model publish`) '
                        "polled every 2 s; a new version is swapped in between batches")
    p.add_argument("--ordered", action="store_true",
                   help="emit in input order (AsyncDataStream.ordered_wait); default unordered")
    p.add_argument("--capacity", type=int, default=2048,
                   help="async operator: records in flight; 4x --max-batch-size lets the next "
                        "batch form while the model runs")
    p.add_argument("--timeout-s", type=int, default=600, help="async operator: per-record timeout")
    p.add_argument("--intra-op-threads", type=int, default=0, help="ONNX Runtime threads (0: cores)")
    p.add_argument("--bundle-time-ms", type=int, default=None,
                   help="python.fn-execution.bundle.time: longest a result waits in the Python worker "
                        "(default 50, or --latency-slo-ms / 15 within [5, 50])")
    p.add_argument("--transactional-id-prefix", default=None,
                   help="Kafka transactional ids of the sinks; unique per job, stable across its "
                        "restarts (default: the group id)")
    p.add_argument("--jars", default=None, help="pipeline.jars (default: the cached Kafka connector)")
    a = p.parse_args(argv)
    group_id = a.group_id or f"aisp-{a.input_topic}"
    return JobConfig(
        bootstrap_servers=a.bootstrap_servers or default_bootstrap_servers(), input_topic=a.input_topic,
        output_topic=a.output_topic, dlq_topic=a.dlq_topic or f"{a.output_topic}.dlq",
        group_id=group_id, mode=a.mode,
        startup_mode=StartupMode(a.startup_mode or _DEFAULT_STARTUP[a.mode]),
        model_dir=a.model_dir,
        with_embedding=a.with_embedding, checkpoint_interval_ms=a.checkpoint_interval_ms,
        parallelism=a.parallelism, max_batch_size=a.max_batch_size, max_wait_ms=a.max_wait_ms,
        max_batch_tokens=a.max_batch_tokens,
        length_buckets=a.length_buckets, latency_slo_ms=a.latency_slo_ms,
        max_idle_ms=a.max_idle_ms if a.max_idle_ms >= 0 else None,
        model_pointer=a.model_pointer, ordered=a.ordered,
        capacity=a.capacity, timeout_s=a.timeout_s, intra_op_threads=a.intra_op_threads,
        bundle_time_ms=(a.bundle_time_ms if a.bundle_time_ms is not None
                        else _default_bundle_time_ms(a.latency_slo_ms)),
        transactional_id_prefix=a.transactional_id_prefix or group_id,
        jars=a.jars,
    )


def make_environment(cfg: JobConfig) -> StreamTableEnvironment:
    """A table environment in the job's runtime mode, with the Kafka connector jar.

    The connector is appended with ``add_jars`` (not by setting ``pipeline.jars``),
    so the jars that ``flink run -py`` puts there (flink-python) stay.
    """
    from pyflink_aisp.local import flink_connector_jars

    conf = Configuration()
    conf.set_string("python.fn-execution.bundle.time", str(cfg.bundle_time_ms))
    env = StreamExecutionEnvironment.get_execution_environment(conf)
    env.add_jars(*(cfg.jars.split(";") if cfg.jars else [p.as_uri() for p in flink_connector_jars()]))
    env.set_python_executable(sys.executable)
    env.set_parallelism(cfg.parallelism)
    if cfg.mode == "batch":
        env.set_runtime_mode(RuntimeExecutionMode.BATCH)
    else:
        env.set_runtime_mode(RuntimeExecutionMode.STREAMING)
        env.enable_checkpointing(cfg.checkpoint_interval_ms, CheckpointingMode.EXACTLY_ONCE)
    return StreamTableEnvironment.create(env)


def _to_output(with_embedding: bool) -> Any:
    def emit(record: Row, prediction: Any, version: str) -> Row:
        score, embedding = prediction
        out: dict[str, Any] = {
            "id": record[0],
            "label": "fresh" if score >= 0.5 else "rotten",
            "score": float(score),
            "model_sha256": version,
        }
        if with_embedding:
            out["embedding"] = [float(x) for x in embedding]
        return Row(key=record[0], value=json.dumps(out), dead=False)

    return emit


def _dead_letter(raw: Row, error: BaseException) -> Row:
    """A DLQ row for a raw Kafka row ``(value, topic, partition, offset)``: a record that
    did not decode (its decode dead letter), or whose inference failed (isolated by
    bisection) or timed out."""
    if isinstance(error, UndecodableRecord):
        letter = error.letter
        return Row(key=letter.source.default_id(), value=letter.to_json(), dead=True)
    record = decode_row(raw)  # it decoded before, or inference would not have run
    timed_out = isinstance(error, InferenceError) and str(error).startswith("inference_timeout")
    doc = {"reason": "inference_timeout" if timed_out else "inference_error",
           "detail": f"{type(error).__name__}: {error}"[:1000],
           "id": record[0], "topic": record[2], "partition": record[3], "offset": record[4]}
    return Row(key=record[0], value=json.dumps(doc), dead=True)


#: Output of the inference step: Kafka key and value, and whether it is a dead letter.
SCORED_TYPE = Types.ROW_NAMED(["key", "value", "dead"], [Types.STRING(), Types.STRING(), Types.BOOLEAN()])


def _text(record: Row) -> str:
    return str(record[1])


def build_and_run(
    t_env: StreamTableEnvironment, cfg: JobConfig, handler: ModelHandler[Any, Any, Any] | None = None
) -> TableResult:
    """Declare the Kafka tables, build the pipeline and submit it.

    ``handler`` replaces the sentiment model handler (tests inject failing ones).

    Returns:
        The submitted job's ``TableResult`` (``.wait()`` for a bounded run;
        ``.get_job_client().cancel()`` to stop a streaming one).
    """
    from pyflink_aisp.models import ensure_model_assets, load_model_assets

    assets = load_model_assets(cfg.model_dir) if cfg.model_dir else ensure_model_assets()
    source = KafkaSourceTable(name="reviews_in", topic=cfg.input_topic,
                              bootstrap_servers=cfg.bootstrap_servers, group_id=cfg.group_id,
                              bounded=cfg.mode == "batch", startup_mode=cfg.startup_mode)
    sinks = [KafkaSinkTable(name=name, topic=topic, bootstrap_servers=cfg.bootstrap_servers,
                            transactional_id_prefix=f"{cfg.transactional_id_prefix}-{kind}")
             for name, topic, kind in (("scores_out", cfg.output_topic, "scores"),
                                       ("dlq_out", cfg.dlq_topic, "dlq"))]
    if cfg.input_topic not in list_topics(cfg.bootstrap_servers):
        raise KafkaError(f"input topic {cfg.input_topic} does not exist on {cfg.bootstrap_servers}")
    create_topics(cfg.bootstrap_servers, [cfg.output_topic, cfg.dlq_topic])
    for table in (source, *sinks):
        t_env.execute_sql(table.ddl())
    raw = t_env.to_data_stream(t_env.from_path("reviews_in"))
    # Decode inside the async operator: one Python operator, one JVM<->Python hop per record.
    scorer = BatchedInferenceFunction(
        handler or SentimentHandler(assets, intra_op_num_threads=cfg.intra_op_threads or None),
        batching=cfg.batching(),
        prepare=decode_row, extract=_text, emit=_to_output(cfg.with_embedding), dead_letter=_dead_letter,
        swap=ModelSwapConfig(pointer_path=cfg.model_pointer.resolve()) if cfg.model_pointer else None,
    )
    wait = AsyncDataStream.ordered_wait if cfg.ordered else AsyncDataStream.unordered_wait
    scored = wait(raw, scorer, Time.seconds(cfg.timeout_s), cfg.capacity, SCORED_TYPE)
    scored = scored.name("decode+tokenize+infer")
    # Split in the JVM (no extra Python step); one insert per sink: one transactional id prefix each.
    scored_t = t_env.from_data_stream(scored)
    dead = scored_t.where(col("dead")).select(col("key"), col("value"))
    statements = t_env.create_statement_set()
    good = scored_t.where(col("dead") == lit(False)).select(col("key"), col("value"))
    statements.add_insert("scores_out", good)
    statements.add_insert("dlq_out", dead)
    return statements.execute()


def main(argv: list[str] | None = None) -> int:
    """Run the job; returns the exit status (1 on a pyflink-aisp error, printed in one line)."""
    try:
        cfg = parse_args(argv)
        start = time.perf_counter()
        t_env = make_environment(cfg)
        result = build_and_run(t_env, cfg)
    except AispError as exc:
        print(f"review_sentiment: error: {exc}", file=sys.stderr)
        return 1
    client = result.get_job_client()
    job_id = client.get_job_id() if client is not None else "?"
    print(f"review_sentiment: job {job_id} submitted ({cfg.mode}); output {cfg.output_topic}, "
          f"dead letters {cfg.dlq_topic}", flush=True)
    if t_env.get_config().get("execution.attached", "true") == "false":
        return 0  # `flink run -d`: the job runs on; stop it with `flink stop`
    result.wait()
    print(f"review_sentiment: job {job_id} finished in {time.perf_counter() - start:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
