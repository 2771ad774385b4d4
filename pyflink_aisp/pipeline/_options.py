"""The options table: every knob of the packaged jobs and SQL functions, declared once.

Each :class:`Option` names its field, command-line flag, Flink job parameter
(``aisp.*``, read by the SQL functions and the job's operators from
``pipeline.global-job-parameters``), type, unit, default and doc. From the
table come the job's ``argparse`` flags (:func:`add_flags`), the job
parameters a job sets and the SQL functions read
(:func:`options_from_job_parameters`, :func:`job_parameters_of`), the README
table (:func:`options_markdown`, checked by a test) and, through
:class:`PipelineOptions`, the derived PyFlink settings
(:func:`pyflink_aisp.pipeline.flink_settings`). :class:`PipelineOptions`
holds the parsed values; a test checks its fields and defaults against the table.

``none`` as a job parameter, or as the value of a flag whose option is
``nullable``, turns an optional knob off (an empty job parameter counts as
unset). Errors name the flag or parameter.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyflink_aisp.affinity import AffinityPolicy
from pyflink_aisp.errors import ConfigError
from pyflink_aisp.inference import BatchCuts
from pyflink_aisp.inference.handlers import Pooling

__all__ = ["OPTIONS", "GpuProvider", "InferenceRuntime", "Option", "OptionGroup", "Precision", "Runner",
           "option", "options_markdown", "parse_value"]


class OptionGroup(enum.StrEnum):
    """Where an option applies (the README groups the table by it)."""

    JOB = "job"            # the packaged job only: topics, mode, checkpoints, operator
    BATCHING = "batching"  # the batcher: job and SQL functions
    MODEL = "model"        # what is loaded and where it runs: job and SQL functions
    WORKER = "worker"      # PyFlink Python-worker settings derived for the job


class Runner(enum.StrEnum):
    """How the job's inference operator takes records (``--operator``).

    ``ARROW``: a vectorized (pandas) map over the Kafka table: records cross the
    JVM/Python boundary as Arrow record batches, the model sees the batch whole.
    ``ASYNC``: PyFlink's ``AsyncFunction``, one coroutine and future per record,
    batches formed across records in flight (low-rate, latency-first streams).
    """

    ARROW = "arrow"
    ASYNC = "async"


class InferenceRuntime(enum.StrEnum):
    """What runs the sentiment model (``--runtime``)."""

    ONNX = "onnx"    # ONNX Runtime: CPU, CUDA or TensorRT execution provider
    TORCH = "torch"  # PyTorch (``pip install -e .[torch]``)


class Precision(enum.StrEnum):
    """Encoder precision of the torch runtime (``--precision``)."""

    FP32 = "fp32"
    FP16 = "fp16"
    BF16 = "bf16"


class GpuProvider(enum.StrEnum):
    """ONNX Runtime execution provider for ``--device cuda:N`` (``--onnx-provider``)."""

    CUDA = "cuda"          # CUDAExecutionProvider
    TENSORRT = "tensorrt"  # TensorrtExecutionProvider, CUDA for the nodes TensorRT does not take


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"expected a finite number, got {text!r}")
    return value


def _int_tuple(text: str) -> tuple[int, ...]:
    # ';' as well as ',': in the legacy 'k:v,k:v' form of the job parameters ',' separates entries.
    return tuple(int(p) for p in text.replace(";", ",").split(",") if p.strip())


def _bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered not in ("true", "false", "1", "0", "yes", "no"):
        raise ValueError(f"expected true or false, got {text!r}")
    return lowered in ("true", "1", "yes")


#: How an error names a kind.
_KIND_WORDS: dict[Any, str] = {int: "an integer", float: "a finite number", tuple: "comma-separated integers",
                               bool: "true or false"}
#: Parsers by type (the ``kind`` of an option).
_PARSERS: dict[Any, Callable[[str], Any]] = {
    int: int, float: _finite, str: str, Path: Path, bool: _bool, tuple: _int_tuple,
}


@dataclass(frozen=True, kw_only=True)
class Option:
    """One knob.

    Attributes:
        name: Field of :class:`PipelineOptions` (snake case).
        kind: ``int``, ``float``, ``str``, ``Path``, ``bool``, ``tuple`` (of ints)
            or an ``enum.StrEnum``.
        default: Value when unset (None: off, or derived; see ``doc``).
        doc: One sentence for ``--help`` and the README.
        group: Where it applies.
        unit: Unit of the value (``ms``, ``s``, ``records``, ``tokens``...), or "".
        job_param: Flink job parameter name, or None (flag only).
        nullable: ``none`` turns it off.
        minimum: Smallest accepted number (inclusive), or None.
        required: The job needs it (no default).
    """

    name: str
    kind: Any
    default: Any
    doc: str
    group: OptionGroup
    unit: str = ""
    job_param: str | None = None
    nullable: bool = False
    minimum: float | None = None
    required: bool = False

    @property
    def flag(self) -> str:
        """The command-line flag: ``--`` and the name with dashes."""
        return "--" + self.name.replace("_", "-")

    def parse(self, text: str, *, where: str | None = None) -> Any:
        """A string (flag or job parameter value) → the option's value.

        Raises:
            ConfigError: Not of the option's kind, below its minimum, or ``none``
                for an option that cannot be off; the message names ``where``
                (default: the flag).
        """
        where = where or self.flag
        stripped = text.strip()
        if self.nullable and stripped.lower() in ("", "none", "null"):
            return () if self.kind is tuple else None  # an empty tuple is a tuple option's "off"
        try:
            if isinstance(self.kind, type) and issubclass(self.kind, enum.Enum):
                value: Any = self.kind(stripped.lower())
            else:
                value = _PARSERS[self.kind](stripped)
        except (ValueError, KeyError) as exc:
            if isinstance(self.kind, enum.EnumMeta):
                members: list[enum.Enum] = list(self.kind.__members__.values())
                choices = "one of " + ", ".join(str(m.value) for m in members)
            else:
                choices = _KIND_WORDS.get(self.kind, f"a {getattr(self.kind, '__name__', self.kind)}")
            raise ConfigError(f"{where} must be {choices}, got {text!r}") from exc
        self.check(value, where=where)
        return value

    def check(self, value: Any, *, where: str | None = None) -> None:
        """Range check of a parsed value.

        Raises:
            ConfigError: below ``minimum`` (for tuples: any element), or an integer
                above :data:`JAVA_INT_MAX` (Flink reads these settings as Java ints).
        """
        if value is None:
            return
        values = value if isinstance(value, tuple) else (value,)
        if self.minimum is not None and any(v < self.minimum for v in values):
            raise ConfigError(f"{where or self.flag} must be >= {self.minimum:g}, got {value!r}")
        if self.kind in (int, tuple) and any(v > JAVA_INT_MAX for v in values):
            raise ConfigError(f"{where or self.flag} must be <= {JAVA_INT_MAX} (a Java int), got {value!r}")

    def render_default(self) -> str:
        """The default as the README and ``--help`` show it."""
        if self.required:
            return "required"
        if self.default is None:
            return "none"
        if isinstance(self.default, tuple):
            return ",".join(map(str, self.default)) or "none"
        if isinstance(self.default, enum.Enum):
            return str(self.default.value)
        return str(self.default).lower() if isinstance(self.default, bool) else str(self.default)


def _o(name: str, kind: Any, default: Any, doc: str, group: OptionGroup, **kw: Any) -> Option:
    return Option(name=name, kind=kind, default=default, doc=doc, group=group, **kw)


#: Largest integer option: Flink reads the settings derived from them as Java ints.
JAVA_INT_MAX = 2**31 - 1

J, B, M, W = OptionGroup.JOB, OptionGroup.BATCHING, OptionGroup.MODEL, OptionGroup.WORKER

#: Every option, in ``--help`` and README order.
OPTIONS: tuple[Option, ...] = (
    _o("input_topic", str, None, "Kafka topic of JSON records {\"id\", \"text\", ...}.", J, required=True),
    _o("output_topic", str, None, "Kafka topic of the scored records (exactly once).", J, required=True),
    _o("dlq_topic", str, None, "Dead-letter topic (default: <output-topic>.dlq).", J),
    _o("bootstrap_servers", str, None,
       "Kafka bootstrap servers (default: $AISP_KAFKA_BOOTSTRAP, else 127.0.0.1:$AISP_KAFKA_PORT).", J),
    _o("job_name", str, None, "Name of the job: the Flink job name, and the consumer group and the sinks' "
       "transactional id prefix unless set (default: aisp-<input-topic>-<output-topic>); a second live job "
       "of that name on the cluster is refused.", J),
    _o("group_id", str, None, "Consumer group (default: the job name).", J),
    _o("transactional_id_prefix", str, None,
       "Kafka transactional id prefix of the sinks, unique per job, stable across restarts "
       "(default: the job name).", J),
    _o("mode", str, "streaming", "Flink runtime mode: streaming (unbounded, checkpoints) or batch "
       "(bounded at the latest offsets at start).", J),
    _o("startup_mode", str, None, "Kafka scan.startup.mode (default: group-offsets in streaming, "
       "earliest-offset in batch).", J),
    _o("range_start", str, None, "Where reading starts: earliest, latest, timestamp:T, offsets:P=O,..., "
       "group:G, checkpoint:JOB (a streaming job's last completed checkpoint) or manifest:PATH (where a "
       "run ended); checked against the topic before the job starts (default: --startup-mode).", J),
    _o("range_end", str, None, "Where reading stops, exclusive, in the same forms (batch default: latest, "
       "the last stable offset at start; streaming default: no end).", J),
    _o("manifest_dir", Path, None, "Write run manifests (JSON) here: at the end of a batch run, and for "
       "each completed checkpoint of a stream while the submitting client runs attached.", J),
    _o("flink_rest_url", str, None, "Flink REST API for checkpoint:JOB bounds and stream manifests "
       "(default: the cluster flink run submits to, else http://127.0.0.1:$AISP_FLINK_REST_PORT).", J),
    _o("checkpoint_interval_ms", int, 5000, "Checkpoint interval (streaming); transactions commit on "
       "each checkpoint.", J, unit="ms", minimum=1),
    _o("checkpoint_timeout_ms", int, 600_000, "A checkpoint not completed within this long is declined "
       "(execution.checkpointing.timeout).", J, unit="ms", minimum=1),
    _o("transaction_timeout_ms", int, 3_600_000, "Kafka transaction.timeout.ms of the exactly-once sinks: at "
       "least 2 x (checkpoint interval + checkpoint timeout) + restart delay and 2 x --timeout-s, so a "
       "transaction outlives a slow checkpoint and a restart; checked against the brokers' "
       "transaction.max.timeout.ms before the job starts.", J, unit="ms", minimum=1000),
    _o("parallelism", int, 1, "Parallelism of the job.", J, minimum=1),
    _o("jars", str, None, "pipeline.jars: ';'-separated file:// URLs of the Flink Kafka connector "
       "(default: $AISP_CONNECTOR_JARS, else the jar cache of `aisp local jars`).", J),
    _o("max_request_size", int, 1_048_576, "Kafka producer max.request.size of the sinks; an output "
       "that would not fit in it or in the topic's max.message.bytes (less 1 KiB of record overhead) "
       "goes to the DLQ as oversized_output (at most buffer.memory, 32 MiB, counts).", J, unit="bytes",
       minimum=33 * 1024),
    _o("restart_attempts", int, 3, "Restart strategy failure-rate: most job failures within "
       "--restart-interval-s before the job stays FAILED (0: no restart).", J, minimum=0),
    _o("restart_interval_s", int, 300, "Restart strategy failure-rate: the window of --restart-attempts.",
       J, unit="s", minimum=1),
    _o("restart_delay_s", int, 10, "Restart strategy: wait before each restart.", J, unit="s", minimum=0),
    _o("with_embedding", bool, False, "Also write the 384-float embedding of each record.", J),
    _o("operator", Runner, Runner.ARROW, "arrow: Arrow batches through a vectorized map (throughput); "
       "async: one coroutine per record (low-rate streams, --ordered).", J),
    _o("ordered", bool, False, "async operator: emit in input order (AsyncDataStream.ordered_wait).", J),
    _o("capacity", int, 256, "async operator: records in flight (>= --max-batch-size; 4x lets the next "
       "batch form while the model runs).", J, unit="records", minimum=1),
    _o("timeout_s", int, 600, "async operator: per-record timeout; a record past it is dead-lettered.",
       J, unit="s", minimum=1),
    _o("max_batch_size", int, 32, "Most records per model call.", B, unit="records",
       job_param="aisp.batch.max-size", minimum=1),
    _o("max_wait_ms", float, 5.0, "Longest a record waits for companions while the model is idle "
       "(async operator).", B, unit="ms", job_param="aisp.batch.max-wait-ms", minimum=0),
    _o("max_idle_ms", float, 2.0, "A batch also leaves when no record arrived for this long "
       "(async operator).", B, unit="ms", job_param="aisp.batch.max-idle-ms", nullable=True, minimum=0),
    _o("max_batch_tokens", int, None, "Padded-token budget per model call (rows x longest row).", B,
       unit="tokens", job_param="aisp.batch.max-tokens", nullable=True, minimum=1),
    _o("batch_cuts", BatchCuts, BatchCuts.COST, "Where a sorted Arrow batch is cut into model batches: "
       "cost: the cuts of least cost fitted online (per call + per padded token); fixed: runs of "
       "--max-batch-size.", B, job_param="aisp.batch.cuts"),
    _o("length_buckets", tuple, (), "Ascending token-length bucket bounds, e.g. 16,32,64: a model batch "
       "holds one bucket.", B, unit="tokens", job_param="aisp.batch.length-buckets", nullable=True,
       minimum=1),
    _o("latency_slo_ms", float, None, "p99 target of the inference operator: shorter bundles (SLO / 30) "
       "and no ORT spin-wait; the async operator's batch size and wait are tuned online within their "
       "maxima.", B, unit="ms", job_param="aisp.latency-slo-ms",
       nullable=True, minimum=0.001),
    _o("max_failure_rate", float, 0.5, "Circuit breaker: fail the job (Flink restarts it from the last "
       "checkpoint) when this share of the last --failure-window inferences failed (none: never; decode "
       "dead letters do not count).", M, job_param="aisp.breaker.max-failure-rate", nullable=True,
       minimum=0.001),
    _o("failure_window", int, 1000, "Circuit breaker: inference outcomes in the window (it trips only "
       "once a tenth of them, at least 1, are in).", M, unit="records", job_param="aisp.breaker.window",
       minimum=1),
    _o("model_dir", Path, None, "Built sentiment model assets (default: $AISP_MODEL_DIR, else the "
       "cached build).", M, job_param="aisp.model.dir", nullable=True),
    _o("runtime", InferenceRuntime, InferenceRuntime.ONNX, "What runs the sentiment model: onnx (ONNX "
       "Runtime) or torch (PyTorch, pip install -e .[torch]).", M, job_param="aisp.runtime"),
    _o("device", str, "cpu", "Where the model runs: cpu, cuda (= cuda:0) or cuda:N; a GPU that is not usable "
       "fails the job at start, never a silent CPU run.", M, job_param="aisp.device"),
    _o("precision", Precision, Precision.FP32, "Encoder precision (--runtime torch): fp32, fp16 or bf16 "
       "(torch.autocast; checked at load against fp32 on a probe set, part of the model version).", M,
       job_param="aisp.precision"),
    _o("onnx_provider", GpuProvider, GpuProvider.CUDA, "ONNX Runtime execution provider on a GPU: cuda or "
       "tensorrt (CUDA takes the nodes TensorRT does not).", M, job_param="aisp.onnx.provider"),
    _o("gpu_affinity", str, None, "URL of the GPU affinity service (`aisp affinity serve`): in open() each "
       "inference subtask leases a GPU or MIG instance (--device cuda; it becomes cuda:0) or, with "
       "--device cpu, a NUMA node's CPUs (no GPU visible), pins its threads to the lease's CPUs, renews "
       "it and releases it in close().", M, job_param="aisp.gpu-affinity", nullable=True),
    _o("gpu_affinity_policy", AffinityPolicy, AffinityPolicy.FAIL, "When the affinity service cannot be "
       "reached: fail (the job fails at start) or local (a deterministic local choice, metric "
       "affinityFallback = 1); never a silent CPU run.", M, job_param="aisp.gpu-affinity.policy"),
    _o("gpu_mem_mib", int, 1024, "GPU memory each subtask's lease reserves (--gpu-affinity; the service "
       "never over-commits a device).", M, unit="MiB", job_param="aisp.gpu-affinity.mem-mib", minimum=0),
    _o("model_pointer", Path, None, "Hot swap: JSON pointer {\"path\", \"sha256\"} polled by every "
       "worker (`aisp model publish`).", M, job_param="aisp.model.pointer", nullable=True),
    _o("model_poll_interval_s", float, 2.0, "Hot swap: seconds between two reads of the pointer.", M,
       unit="s", job_param="aisp.model.poll-interval-s", minimum=0.001),
    _o("intra_op_threads", int, 0, "ONNX Runtime intra-op threads (0: one per physical core).", M,
       job_param="aisp.onnx.intra-op-threads", minimum=0),
    _o("onnx_spin_wait", bool, None, "ONNX Runtime intra-op threads spin between runs (true: fastest "
       "back-to-back batches; false: leaves idle CPU to the JVMs; default: false with --latency-slo-ms, "
       "else ORT's default, true).", M, job_param="aisp.onnx.spin-wait", nullable=True),
    _o("encoder_onnx", Path, None, "A generic ONNX text encoder instead of the sentiment model: the job "
       "writes {\"id\", \"embedding\", \"model_sha256\"}.", M, job_param="aisp.encoder.onnx", nullable=True),
    _o("encoder_tokenizer", Path, None, "tokenizer.json of --encoder-onnx.", M,
       job_param="aisp.encoder.tokenizer", nullable=True),
    _o("encoder_output", str, None, "Graph output of --encoder-onnx to pool (needed when the graph has "
       "several outputs).", M,
       job_param="aisp.encoder.output", nullable=True),
    _o("encoder_pooling", Pooling, Pooling.MEAN, "none (output is per text), mean (attention-mask mean "
       "over tokens) or cls (first token) for --encoder-onnx.", M, job_param="aisp.encoder.pooling"),
    _o("encoder_normalize", bool, False, "L2-normalise the vectors of --encoder-onnx.", M,
       job_param="aisp.encoder.normalize"),
    _o("stats_dir", Path, None, "SQL functions: directory where each worker writes its batch statistics "
       "as JSON.", M,
       job_param="aisp.stats.dir", nullable=True),
    _o("arrow_batch_size", int, 1024, "python.fn-execution.arrow.batch.size: most records per Arrow "
       "batch (arrow operator, pandas SQL function); the batcher cuts model batches from it.", W,
       unit="records", minimum=1),
    _o("bundle_time_ms", int, None, "python.fn-execution.bundle.time: longest a result waits in the "
       "Python worker (default 50, or --latency-slo-ms / 30 within [5, 50]).", W, unit="ms",
       nullable=True, minimum=1),
)

_BY_NAME = {o.name: o for o in OPTIONS}


def option(name: str) -> Option:
    """The option of a field name.

    Raises:
        KeyError: no such option.
    """
    return _BY_NAME[name]


def parse_value(name: str, text: str, *, where: str | None = None) -> Any:
    """``option(name).parse(text)``."""
    return _BY_NAME[name].parse(text, where=where)


def job_param_options() -> Iterable[Option]:
    """The options that are also Flink job parameters."""
    return (o for o in OPTIONS if o.job_param is not None)


def read_job_parameters(get: Callable[[str, str], str]) -> dict[str, Any]:
    """The job parameters that are set, parsed: field name → value.

    Args:
        get: ``FunctionContext.get_job_parameter`` (``(key, default) -> str``).

    Raises:
        ConfigError: A value does not parse (the message names the parameter).
    """
    values: dict[str, Any] = {}
    for opt in job_param_options():
        assert opt.job_param is not None
        raw = get(opt.job_param, "")
        if raw is not None and raw.strip():
            values[opt.name] = opt.parse(raw, where=f"job parameter {opt.job_param}")
    return values


def render_job_parameter(opt: Option, value: Any) -> str:
    """A value as its job parameter string (inverse of :meth:`Option.parse`)."""
    if value is None:
        return "none"
    if isinstance(value, tuple):
        return ",".join(map(str, value)) or "none"
    if isinstance(value, enum.Enum):
        return str(value.value)
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return repr(value)
    return str(value)


def defaults() -> Mapping[str, Any]:
    """Field name → default, for every option."""
    return {o.name: o.default for o in OPTIONS}


def options_markdown() -> str:
    """The README's options table (a test checks that the README holds exactly this)."""
    lines = ["| flag | job parameter | default | unit | what |", "|---|---|---|---|---|"]
    for opt in OPTIONS:
        param = f"`{opt.job_param}`" if opt.job_param else ""
        lines.append(f"| `{opt.flag}` | {param} | {opt.render_default()} | {opt.unit} | "
                     f"{opt.doc.replace('|', '/')} |")
    return "\n".join(lines)
