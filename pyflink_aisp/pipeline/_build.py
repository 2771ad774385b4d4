"""``build_pipeline``: Kafka source → decode + inference → split → exactly-once Kafka sinks.

The job graph of every packaged inference job, built from
:class:`~pyflink_aisp.pipeline.PipelineOptions`:

* source: a Kafka table of raw values with ``topic``/``partition``/``offset``
  metadata (:class:`~pyflink_aisp.kafka.KafkaSourceTable`), bounded at the
  latest offsets in BATCH mode;
* decode + inference, one Python operator, for any
  :class:`~pyflink_aisp.inference.ModelHandler` that declares its
  :meth:`~pyflink_aisp.inference.ModelHandler.task` (the output fields each
  record's JSON carries between ``id`` and ``model_sha256``): ``--operator arrow`` (default) is
  ``Table.map`` with :class:`~pyflink_aisp.pipeline._arrow_op.ArrowInferenceFunction`
  (Arrow batches end to end); ``--operator async`` is PyFlink's
  ``AsyncDataStream`` with
  :class:`~pyflink_aisp.pipeline._async_op.BatchedInferenceFunction`
  (one coroutine per record; ``--ordered`` keeps input order); ``--operator record`` is
  ``Table.map`` with :class:`~pyflink_aisp.pipeline._record_op.RecordInferenceFunction`, a
  row-at-a-time function in Flink's thread mode
  (:func:`~pyflink_aisp.pipeline._settings.thread_mode_settings`);
* split in the JVM on the ``dead`` column, one ``INSERT`` per sink (each its
  own transactional id prefix): outputs to ``output_topic``, dead letters to
  the DLQ topic, both exactly once.
"""

from __future__ import annotations

import sys
from functools import partial
from typing import Any

from pyflink.common import Configuration, Row, Time, Types
from pyflink.datastream import (
    AsyncDataStream,
    CheckpointingMode,
    RuntimeExecutionMode,
    StreamExecutionEnvironment,
)
from pyflink.table import DataTypes, StatementSet, StreamTableEnvironment, Table, TableResult
from pyflink.table.expressions import col, lit, map_

from pyflink_aisp.errors import ConfigError, DecodeError, KafkaError
from pyflink_aisp.inference import ModelHandler
from pyflink_aisp.inference.routing import RuleNode
from pyflink_aisp.inference.tasks import Task, check_kept_names, check_task, render_prediction
from pyflink_aisp.jars import connector_jars
from pyflink_aisp.kafka import (
    DEFAULT_MAPPING,
    JOB_HEADER,
    SOURCE_HEADER,
    FieldMapping,
    KafkaSinkTable,
    KafkaSourceTable,
    StartupMode,
    check_transaction_timeout,
    create_topics,
    decode_record,
    list_topics,
    sink_record_limit,
)
from pyflink_aisp.outcome import MIN_RECORD_BYTES, DeadLettered, render_dead_letter
from pyflink_aisp.pipeline._arrow_op import ArrowInferenceFunction, arrow_inference_udf
from pyflink_aisp.pipeline._async_op import BatchedInferenceFunction
from pyflink_aisp.pipeline._config import PipelineOptions
from pyflink_aisp.pipeline._handlers import handler_for
from pyflink_aisp.pipeline._identity import check_no_live_job
from pyflink_aisp.pipeline._options import RouteOperators, Runner
from pyflink_aisp.pipeline._plan import InputPlan, plan_input
from pyflink_aisp.pipeline._preflight import (
    check_connector_jars,
    check_device,
    check_model_paths,
    check_python,
)
from pyflink_aisp.pipeline._record_op import RecordInferenceFunction, record_inference_udf
from pyflink_aisp.pipeline._routed_op import RoutedInferenceFunction, route_branches, routed_inference_udf
from pyflink_aisp.pipeline._routes import RoutePlan, route_plan
from pyflink_aisp.pipeline._settings import (
    cluster_pipeline_depth,
    flink_settings,
    start_gateway,
    thread_mode_settings,
)
from pyflink_aisp.pipeline._shell import WorkerSpec

__all__ = ["SCORED_TYPE", "build_pipeline", "make_environment", "pipeline_statements"]


#: Output of the async inference step: Kafka key and value, and whether it is a dead letter.
#: ``source``: the input record, ``topic/partition/offset`` (written as the :data:`SOURCE_HEADER`).
SCORED_TYPE = Types.ROW_NAMED(["key", "value", "dead", "source"],
                              [Types.STRING(), Types.STRING(), Types.BOOLEAN(), Types.STRING()])


def make_environment(options: PipelineOptions) -> StreamTableEnvironment:
    """A table environment in the options' runtime mode, with the connector jar and
    the derived Python-worker settings (:func:`~pyflink_aisp.pipeline.flink_settings`).

    The connector is appended with ``add_jars`` (not by setting ``pipeline.jars``),
    so the jars that ``flink run -py`` puts there (flink-python) stay. A local run starts
    PyFlink's gateway JVM here, with ``--jvm-jit``'s flags
    (:func:`~pyflink_aisp.pipeline._settings.start_gateway`).

    Raises:
        ConfigError: ``--jvm-jit`` given to a job in a JVM already started (``flink run``).
        ConfigError: No connector jar (see :func:`~pyflink_aisp.pipeline.connector_jars`),
            or a pre-flight check failed (:mod:`pyflink_aisp.pipeline._preflight`: jar, model
            path, device, Python executable), in one line.
    """
    check_model_paths(options)
    check_device(options)  # before the jars: a GPU that is not there is named whatever the jar cache holds
    jars = connector_jars(options.jars)
    check_connector_jars(jars)
    start_gateway(options)  # a local run's JVM starts with --jvm-jit's flags
    conf = Configuration()
    for key, value in flink_settings(options).items():
        conf.set_string(key, value)
    env = StreamExecutionEnvironment.get_execution_environment(conf)
    env.add_jars(*jars)
    # `flink run -pyexec` (or the cluster's python.executable) names the workers' Python; else this one
    config = _env_config(env)
    python = config.get("python.executable") or sys.executable
    env.set_python_executable(check_python(python, config.get("python.archives")))
    env.set_parallelism(options.parallelism)
    if options.bounded:
        env.set_runtime_mode(RuntimeExecutionMode.BATCH)
    else:
        env.set_runtime_mode(RuntimeExecutionMode.STREAMING)
        env.enable_checkpointing(options.checkpoint_interval_ms, CheckpointingMode.EXACTLY_ONCE)
    check_no_live_job(options.name, _env_config(env))
    t_env = StreamTableEnvironment.create(env)
    # Also on the table config: the Table API's Python operators (the Arrow map) read it there.
    for key, value in flink_settings(options).items():
        t_env.get_config().set(key, value)
    if options.operator is Runner.RECORD:
        for key, value in thread_mode_settings(python, config).items():
            t_env.get_config().set(key, value)
    t_env.get_config().set("pipeline.name", options.name)
    return t_env


def _env_config(env: StreamExecutionEnvironment) -> dict[str, str]:
    """The environment's effective configuration (``flink run`` options, config.yaml, ours)."""
    from pyflink.java_gateway import get_gateway

    util = get_gateway().jvm.org.apache.flink.python.util.PythonConfigUtil
    config = util.getEnvironmentConfig(env._j_stream_execution_environment).toMap()
    return {str(k): str(config.get(k)) for k in config.keySet()}


def build_pipeline(
    t_env: StreamTableEnvironment,
    options: PipelineOptions,
    handler: ModelHandler[Any, Any, Any] | None = None,
    *,
    plan: InputPlan | None = None,
) -> TableResult:
    """Declare the Kafka tables, build the job graph and submit it
    (:func:`pipeline_statements`, then ``execute()``).

    Args:
        t_env: From :func:`make_environment` (or any table environment set up alike).
        options: Topics, mode, operator, batching, model.
        handler: Replaces the handler the options name: any
            :class:`~pyflink_aisp.inference.ModelHandler` whose ``task()`` declares
            its output fields (a user's own handler; pickled into the job graph).
        plan: Where the source starts and stops (default: :func:`plan_input` of
            ``options`` now); pass the one a manifest will record.

    Returns:
        The submitted job's ``TableResult`` (``.wait()`` for a bounded run;
        ``.get_job_client().cancel()`` to stop a streaming one).

    Raises:
        ConfigError: A handler without a task, or a range bound that does not fit the topic
            (:func:`~pyflink_aisp.alignment.resolve_range`).
        KafkaError: The broker is unreachable or the input topic does not exist.
        ModelError: The model assets cannot be found or built.
    """
    return pipeline_statements(t_env, options, handler, plan=plan).execute()


def pipeline_statements(
    t_env: StreamTableEnvironment,
    options: PipelineOptions,
    handler: ModelHandler[Any, Any, Any] | None = None,
    *,
    plan: InputPlan | None = None,
) -> StatementSet:
    """The job graph of :func:`build_pipeline`, not submitted: one ``INSERT`` per sink in a
    ``StatementSet`` (``explain()`` shows the plan). Creates the output and DLQ topics.

    Args and Raises: as :func:`build_pipeline`. The record operator's derived ``--pipeline-depth``
    is capped at a cluster TaskManager's slots
    (:func:`~pyflink_aisp.pipeline._settings.cluster_pipeline_depth`).
    """
    options = cluster_pipeline_depth(options, t_env.get_config().get)
    servers = options.servers
    routes = route_plan(options.models, options.route) if options.models and options.route else None
    if routes is None:
        handler = handler or handler_for(options)
        task = check_task(handler.task(with_embedding=options.with_embedding))  # before any topic is made
    elif handler is not None:
        raise ConfigError("--route runs the registry's models: pass no handler")
    if options.input_topic not in list_topics(servers):
        raise KafkaError(f"input topic {options.input_topic} does not exist on {servers}")
    for info in create_topics(servers, [options.output_topic, options.dlq]):
        verb = "created" if info.created else "using"
        print(f"{verb} topic {info.name} ({info.partitions} partitions, replication factor "
              f"{info.replication_factor})", file=sys.stderr, flush=True)
    limit = sink_record_limit(servers, [options.output_topic, options.dlq],
                              max_request_size=options.max_request_size)
    if limit < MIN_RECORD_BYTES:
        raise ConfigError(f"the sinks can write records of at most {limit} bytes (key + value; "
                          f"max.message.bytes of {options.output_topic} / {options.dlq} and "
                          "--max-request-size, less 1 KiB), "
                          f"below the {MIN_RECORD_BYTES} a dead letter may need: raise the topics' "
                          f"max.message.bytes to at least {MIN_RECORD_BYTES + 1024}")
    check_transaction_timeout(servers, options.transaction_timeout_ms)
    plan = plan or plan_input(options)
    if routes is None:
        assert handler is not None  # set above
        scored = _scored_table(t_env, options, servers, handler, task, limit, plan)
    else:
        scored = _routed_table(t_env, options, servers, routes, limit, plan)
    if options.effective_separate_sinks:
        scored = _own_sink_tasks(t_env, scored)
    prefix = options.transactional_prefix
    statements = t_env.create_statement_set()
    for name, topic, kind, dead in (("scores_out", options.output_topic, "scores", False),
                                    ("dlq_out", options.dlq, "dlq", True)):
        sink = KafkaSinkTable(name=name, topic=topic, bootstrap_servers=servers,
                              transactional_id_prefix=f"{prefix}-{kind}",
                              max_request_size=options.max_request_size, with_headers=True,
                              transaction_timeout_ms=options.transaction_timeout_ms,
                              linger_ms=options.sink_linger_ms)
        t_env.execute_sql(sink.ddl())
        lineage = map_(lit(SOURCE_HEADER), col("source").cast(DataTypes.BYTES()),
                       lit(JOB_HEADER), lit(options.name).cast(DataTypes.BYTES()))
        rows = scored.where(col("dead") == lit(dead)).select(col("key"), col("value"), lineage)
        statements.add_insert(name, rows)
    return statements


def _raw_table(t_env: StreamTableEnvironment, options: PipelineOptions, servers: str,
               plan: InputPlan) -> Table:
    """The Kafka source table ``records_in`` of raw values with their coordinates."""
    startup = options.effective_startup_mode
    if plan.starts is not None:
        startup = StartupMode.SPECIFIC_OFFSETS
    source = KafkaSourceTable(name="records_in", topic=options.input_topic, bootstrap_servers=servers,
                              group_id=options.group, bounded=options.bounded, startup_mode=startup,
                              start_offsets=plan.starts, stop_offsets=plan.span.ends if plan.span else None,
                              with_key=options.field_mapping().id_from_key)
    t_env.execute_sql(source.ddl())
    return t_env.from_path("records_in")


def _routed_table(t_env: StreamTableEnvironment, options: PipelineOptions, servers: str,
                  routes: RoutePlan, max_record_bytes: int, plan: InputPlan) -> Table:
    """Source → decode + route + inference (:class:`RoutedInferenceFunction`): ``(key, value,
    dead, source)``. A rule route with ``--route-operators per-rule``: one operator per rule (and
    the default) over the same source, each its own task in STREAMING (:func:`_branch_feeds`),
    their outputs united; else one operator. Each model's
    worker spec from its registry options; a lease (``--affinity-url``) for the first model only."""
    specs = {}
    for i, (name, model) in enumerate(routes.models.items()):
        o = model.options
        specs[name] = WorkerSpec.of(model.handler(), batching=o.batching(), swap=o.swap(),
                                    breaker=o.breaker(), affinity=options.affinity() if i == 0 else None)
    raw = _raw_table(t_env, options, servers, plan)
    per_rule = isinstance(routes.node, RuleNode) and options.route_operators is RouteOperators.PER_RULE
    branches = route_branches(routes.node) if isinstance(routes.node, RuleNode) and per_rule else [None]
    feeds = _branch_feeds(t_env, raw, len(branches), streaming=not options.bounded)
    scored: Table | None = None
    for branch, feed in zip(branches, feeds, strict=True):
        node = routes.node if branch is None else branch.target
        function = RoutedInferenceFunction(node, {m: specs[m] for m in node.models}, routes.tasks,
                                           fields=routes.fields, mapping=options.field_mapping(),
                                           max_record_bytes=max_record_bytes,
                                           dead_letters=options.dead_letter_watch(), branch=branch)
        table = feed.map(routed_inference_udf(function)).alias("key", "value", "dead", "source")
        scored = table if scored is None else scored.union_all(table)
    assert scored is not None
    return scored


def _own_sink_tasks(t_env: StreamTableEnvironment, scored: Table) -> Table:
    """``scored`` behind a ``rescale`` exchange (equal parallelism: subtask i to subtask i), which
    Flink does not chain across: the sinks that read it run in tasks (threads) of their own, so
    their flush and transaction commit at a checkpoint do not stall the operator's thread (the
    record operator runs its model there)."""
    return t_env.from_data_stream(t_env.to_data_stream(scored).rescale())


def _branch_feeds(t_env: StreamTableEnvironment, raw: Table, count: int, *, streaming: bool) -> list[Table]:
    """The input of each of ``count`` route operators. In STREAMING with more than one, each
    reads ``raw`` through a ``rescale`` exchange (equal parallelism: subtask i to subtask i, in
    order), which Flink does not chain across: each route operator is a task (thread) of its
    own, so a slow model's bundle does not hold the thread of the others (chained, they would
    share the source's thread). In BATCH, or with one operator, ``raw`` itself (chained)."""
    if count == 1 or not streaming:
        return [raw] * count
    stream = t_env.to_data_stream(raw)
    return [t_env.from_data_stream(stream.rescale()) for _ in range(count)]


def _scored_table(
    t_env: StreamTableEnvironment, options: PipelineOptions, servers: str,
    handler: ModelHandler[Any, Any, Any], task: Task, max_record_bytes: int, plan: InputPlan,
) -> Table:
    """Source → decode + inference: a table ``(key, value, dead, source)``."""
    raw = _raw_table(t_env, options, servers, plan)
    if options.operator is not Runner.ASYNC:
        kind = ArrowInferenceFunction if options.operator is Runner.ARROW else RecordInferenceFunction
        function = kind(handler, batching=options.batching(), swap=options.swap(),
                        with_embedding=options.with_embedding, max_record_bytes=max_record_bytes,
                        breaker=options.breaker(), affinity=options.affinity(),
                        dead_letters=options.dead_letter_watch(), mapping=options.field_mapping(),
                        latency_trace=options.latency_trace_dir)
        wrap = arrow_inference_udf if options.operator is Runner.ARROW else record_inference_udf
        return raw.map(wrap(function)).alias("key", "value", "dead", "source")
    mapping = options.field_mapping()
    check_kept_names(mapping.kept_names, task)
    scorer = BatchedInferenceFunction(
        handler, batching=options.batching(), prepare=partial(decode_row, mapping=mapping), extract=_text,
        emit=_async_output(task, max_record_bytes),
        dead_letter=_async_dead_letter(max_record_bytes, mapping), swap=options.swap(),
        breaker=options.breaker(), affinity=options.affinity(), dead_letters=options.dead_letter_watch())
    wait = AsyncDataStream.ordered_wait if options.ordered else AsyncDataStream.unordered_wait
    stream = wait(t_env.to_data_stream(raw), scorer, Time.seconds(options.timeout_s), options.capacity,
                  SCORED_TYPE).name("decode+tokenize+infer")
    return t_env.from_data_stream(stream)


class UndecodableRecord(DecodeError):
    """Raised by :func:`decode_row`; ``letter`` is the record's dead letter."""

    def __init__(self, letter: DeadLettered) -> None:
        super().__init__(str(letter.reason), letter.detail)
        self.letter = letter


def decode_row(value: Row, mapping: FieldMapping = DEFAULT_MAPPING) -> Row:
    """Decode a raw Kafka row ``(value BYTES, topic, partition, offset)`` into a row
    ``(id, text, topic, partition, offset, kept)`` (``kept``: the mapping's kept values).

    Raises:
        UndecodableRecord: The record is not a review; its ``letter`` says why.
    """
    result = decode_record(value[0], value[1], value[2], value[3], mapping,
                           value[4] if mapping.id_from_key else None)
    if isinstance(result, DeadLettered):
        raise UndecodableRecord(result)
    return Row(id=result.id, text=result.text, topic=value[1], partition=value[2], offset=value[3],
               kept=result.kept)


def _source(topic: Any, partition: Any, offset: Any) -> str:
    return f"{topic}/{partition}/{offset}"


def _text(record: Row) -> str:
    return str(record[1])


def _async_output(task: Task, max_record_bytes: int) -> Any:
    def emit(record: Row, prediction: Any, version: str) -> Row:
        kept = dict(record[5]) if record[5] else None
        value = render_prediction(task, record[0], prediction, version, max_record_bytes=max_record_bytes,
                                  kept=kept)
        return Row(key=record[0], value=value, dead=False, source=_source(record[2], record[3], record[4]))

    return emit


def _async_dead_letter(max_record_bytes: int, mapping: FieldMapping) -> Any:
    def dead_letter(raw: Row, error: BaseException) -> Row:
        """A DLQ row for a raw Kafka row ``(value, topic, partition, offset)``: its decode
        dead letter, or the dead letter of its failed, timed-out or oversized inference."""
        source = _source(raw[1], raw[2], raw[3])
        if isinstance(error, UndecodableRecord):
            key, value = render_dead_letter(error.letter, max_record_bytes)
            return Row(key=key, value=value, dead=True, source=source)
        record = decode_row(raw, mapping)  # it decoded before, or inference would not have run
        letter = DeadLettered.of_error(error, id=record[0], topic=record[2], partition=record[3],
                                       offset=record[4], value=None if raw[0] is None else bytes(raw[0]))
        key, value = render_dead_letter(letter, max_record_bytes)
        return Row(key=key, value=value, dead=True, source=source)

    return dead_letter
