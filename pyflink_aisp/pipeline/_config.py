"""Parsed options (:class:`PipelineOptions`) and the PyFlink settings derived from them.

:class:`PipelineOptions` has one field per row of
:data:`~pyflink_aisp.pipeline._options.OPTIONS`, with the table's defaults (a
test checks both). It is built from the job's command line
(:meth:`PipelineOptions.from_args`) or from Flink job parameters
(:meth:`PipelineOptions.from_job_parameters`, in the SQL functions' and the
operators' ``open()``), and gives the batching, hot-swap and model configs.
:func:`flink_settings` derives the PyFlink settings that make its batches and
latency target reachable.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from pyflink_aisp.affinity import AffinityPolicy, AffinitySettings
from pyflink_aisp.alignment import parse_bound
from pyflink_aisp.errors import ConfigError
from pyflink_aisp.inference import BatchCuts, BatchingConfig, BreakerConfig, ModelSwapConfig
from pyflink_aisp.inference.handlers import Pooling, parse_torch_device
from pyflink_aisp.pipeline._options import (
    OPTIONS,
    GpuProvider,
    InferenceRuntime,
    Option,
    Precision,
    Runner,
    job_param_options,
    read_job_parameters,
    render_job_parameter,
)

__all__ = ["MODEL_DIR_ENV", "PipelineOptions", "default_bundle_time_ms", "flink_settings",
           "format_job_parameters"]

#: Environment variable naming the model asset directory (when no option sets it).
MODEL_DIR_ENV = "AISP_MODEL_DIR"
_MODES = ("streaming", "batch")
_STARTUP_MODES = ("earliest-offset", "latest-offset", "group-offsets")
#: PyFlink's default ``python.fn-execution.bundle.size`` (1000 in 2.3.0).
_FLINK_DEFAULT_BUNDLE_SIZE = 1000
#: Arrow batches per bundle (see :func:`flink_settings`): a bundle end makes the Python worker wait
#: for the JVM, so a bundle of several batches lets the next one arrive during compute.
BUNDLE_ARROW_BATCHES = 4
#: Per-row timeout of PyFlink's async scalar operator: a stalled model fails the job only after it.
_ASYNC_TIMEOUT_MS = 600_000


@dataclass(frozen=True, kw_only=True)
class PipelineOptions:
    """Every option of the packaged jobs and SQL functions (see ``OPTIONS`` for docs and units).

    Raises:
        ConfigError: A value out of range, an unknown mode, the same topic as two of
            input, output and dead-letter topic, ``--capacity`` below
            ``--max-batch-size`` for the async operator, ``--encoder-onnx``
            without ``--encoder-tokenizer``, or batching knobs that
            :class:`~pyflink_aisp.inference.BatchingConfig` refuses.
    """

    input_topic: str | None = None
    output_topic: str | None = None
    dlq_topic: str | None = None
    bootstrap_servers: str | None = None
    job_name: str | None = None
    group_id: str | None = None
    transactional_id_prefix: str | None = None
    mode: str = "streaming"
    startup_mode: str | None = None
    range_start: str | None = None
    range_end: str | None = None
    manifest_dir: Path | None = None
    flink_rest_url: str | None = None
    checkpoint_interval_ms: int = 5000
    checkpoint_timeout_ms: int = 600_000
    transaction_timeout_ms: int = 3_600_000
    parallelism: int = 1
    jars: str | None = None
    max_request_size: int = 1_048_576
    restart_attempts: int = 3
    restart_interval_s: int = 300
    restart_delay_s: int = 10
    with_embedding: bool = False
    operator: Runner = Runner.ARROW
    ordered: bool = False
    capacity: int = 256
    timeout_s: int = 600
    max_batch_size: int = 32
    max_wait_ms: float = 5.0
    max_idle_ms: float | None = 2.0
    max_batch_tokens: int | None = None
    batch_cuts: BatchCuts = BatchCuts.COST
    length_buckets: tuple[int, ...] = ()
    latency_slo_ms: float | None = None
    max_failure_rate: float | None = 0.5
    failure_window: int = 1000
    model_dir: Path | None = None
    runtime: InferenceRuntime = InferenceRuntime.ONNX
    device: str = "cpu"
    precision: Precision = Precision.FP32
    onnx_provider: GpuProvider = GpuProvider.CUDA
    gpu_affinity: str | None = None
    gpu_affinity_policy: AffinityPolicy = AffinityPolicy.FAIL
    gpu_mem_mib: int = 1024
    model_pointer: Path | None = None
    model_poll_interval_s: float = 2.0
    intra_op_threads: int = 0
    onnx_spin_wait: bool | None = None
    encoder_onnx: Path | None = None
    encoder_tokenizer: Path | None = None
    encoder_output: str | None = None
    encoder_pooling: Pooling = Pooling.MEAN
    encoder_normalize: bool = False
    stats_dir: Path | None = None
    arrow_batch_size: int = 1024
    bundle_time_ms: int | None = None

    def __post_init__(self) -> None:
        for opt in OPTIONS:
            opt.check(getattr(self, opt.name))
        if self.mode not in _MODES:
            raise ConfigError(f"--mode must be one of {list(_MODES)}, got {self.mode!r}")
        if self.startup_mode is not None and self.startup_mode not in _STARTUP_MODES:
            raise ConfigError(f"--startup-mode must be one of {list(_STARTUP_MODES)}, "
                              f"got {self.startup_mode!r}")
        if self.startup_mode is not None and self.range_start is not None:
            raise ConfigError("--range-start and --startup-mode both say where reading starts: give one")
        for flag, bound in (("--range-start", self.range_start), ("--range-end", self.range_end)):
            if bound is not None:
                try:
                    parse_bound(bound)
                except ConfigError as exc:
                    raise ConfigError(f"{flag}: {exc}") from None
        self.batching()  # validate the batching knobs before any JVM or broker is touched
        if self.operator is Runner.ASYNC and self.capacity < self.max_batch_size:
            raise ConfigError(f"--capacity ({self.capacity}) must be >= --max-batch-size "
                              f"({self.max_batch_size}): records in flight cap the batch")
        if self.input_topic and self.output_topic:
            named = {"--input-topic": self.input_topic, "--output-topic": self.output_topic,
                     "--dlq-topic": self.dlq}
            if len(set(named.values())) < 3:
                raise ConfigError("the input, output and dead-letter topics must differ (a job that reads "
                                  f"its own output or dead letters loops without end): {named}")
        floor = self.min_transaction_timeout_ms
        if self.transaction_timeout_ms < floor:
            raise ConfigError(f"--transaction-timeout-ms {self.transaction_timeout_ms} is below {floor}: 2 x "
                              "(--checkpoint-interval-ms + --checkpoint-timeout-ms) + --restart-delay-s, and "
                              "2 x --timeout-s; a transaction that times out before its checkpoint commits "
                              "is lost")
        if self.max_failure_rate is not None and self.max_failure_rate > 1:
            raise ConfigError(f"--max-failure-rate must be <= 1 (a share of the window), "
                              f"got {self.max_failure_rate}")
        if (self.encoder_onnx is None) != (self.encoder_tokenizer is None):
            raise ConfigError("--encoder-onnx and --encoder-tokenizer go together")
        try:
            parse_torch_device(self.device)
        except ConfigError as exc:
            raise ConfigError(f"--device must be cpu, cuda or cuda:N, got {self.device!r}") from exc
        if self.encoder_onnx is not None and self.runtime is InferenceRuntime.TORCH:
            raise ConfigError("--encoder-onnx runs on ONNX Runtime: --runtime torch does not apply to it")
        if self.precision is not Precision.FP32 and self.runtime is not InferenceRuntime.TORCH:
            raise ConfigError(f"--precision {self.precision.value} needs --runtime torch (no "
                              "reduced-precision ONNX model is built)")
        self.affinity()  # --gpu-affinity: a URL, and --device cpu or cuda (= cuda:0)
        if self.runtime is InferenceRuntime.TORCH and self.model_pointer is not None:
            raise ConfigError("--model-pointer (hot swap) needs --runtime onnx: the torch handler "
                              "cannot swap")

    # -- derived configs -----------------------------------------------------------------

    def batching(self) -> BatchingConfig:
        """The batcher's config.

        Raises:
            ConfigError: As :class:`~pyflink_aisp.inference.BatchingConfig`, naming the flag.
        """
        try:
            return BatchingConfig(
                max_batch_size=self.max_batch_size, max_wait_ms=self.max_wait_ms,
                max_batch_tokens=self.max_batch_tokens, length_buckets=self.length_buckets,
                latency_slo_ms=self.latency_slo_ms, max_idle_ms=self.max_idle_ms, batch_cuts=self.batch_cuts)
        except ConfigError as exc:
            named = [o.flag for o in OPTIONS if o.name in str(exc)]
            raise ConfigError(f"{named[0]}: {exc}" if named else str(exc)) from exc

    def affinity(self) -> AffinitySettings | None:
        """The workers' affinity settings (None without ``--gpu-affinity``). The lease key's
        job is the job name; without topics (SQL functions) and without ``--job-name`` it is
        ``aisp-sql-<host>-<pid>`` of the worker, so two SQL jobs never share a lease.

        Raises:
            ConfigError: Not an http(s) URL, or ``--device cuda:N`` with N > 0 (the service picks the GPU).
        """
        if self.gpu_affinity is None:
            return None
        import socket

        job = self.job_name or (self.name if self.input_topic
                                else f"aisp-sql-{socket.gethostname()}-{os.getpid()}")
        return AffinitySettings(url=self.gpu_affinity, job=job, device=self.resolved_device,
                                mem_bytes=self.gpu_mem_mib * 2**20, policy=self.gpu_affinity_policy)

    def breaker(self) -> BreakerConfig | None:
        """The circuit breaker's config (None with ``--max-failure-rate none``): it
        judges the window once a tenth of ``failure_window`` outcomes (at least 1) are in."""
        if self.max_failure_rate is None:
            return None
        return BreakerConfig(max_failure_rate=self.max_failure_rate, window_records=self.failure_window,
                             min_records=max(1, self.failure_window // 10))

    def swap(self) -> ModelSwapConfig | None:
        """Hot-swap config (None without ``--model-pointer``); the path is made absolute."""
        if self.model_pointer is None:
            return None
        return ModelSwapConfig(pointer_path=self.model_pointer.resolve(),
                               poll_interval_s=self.model_poll_interval_s)

    @property
    def effective_bundle_time_ms(self) -> int:
        """``bundle_time_ms``, else :func:`default_bundle_time_ms` of the SLO."""
        return self.bundle_time_ms or default_bundle_time_ms(self.latency_slo_ms)

    @property
    def effective_spin_wait(self) -> bool | None:
        """``onnx_spin_wait``, else off with a latency target, else None (ORT's default)."""
        if self.onnx_spin_wait is not None:
            return self.onnx_spin_wait
        return False if self.latency_slo_ms is not None else None

    @property
    def resolved_device(self) -> str:
        """``device`` normalised: ``"cpu"`` or ``"cuda:N"``."""
        return parse_torch_device(self.device)

    @property
    def dlq(self) -> str:
        """The dead-letter topic (``<output-topic>.dlq`` unless set)."""
        return self.dlq_topic or f"{self.output_topic}.dlq"

    @property
    def name(self) -> str:
        """The job's name (``aisp-<input-topic>-<output-topic>`` unless set): two jobs that
        read one topic into different outputs get different names, groups and
        transactional ids."""
        return self.job_name or f"aisp-{self.input_topic}-{self.output_topic}"

    @property
    def group(self) -> str:
        """The consumer group (the job name unless set)."""
        return self.group_id or self.name

    @property
    def min_transaction_timeout_ms(self) -> int:
        """Smallest accepted ``transaction_timeout_ms``: a sink's transaction stays open from
        one checkpoint until the next completes and its commit lands, and across a
        restart; twice the longest such span (Flink Kafka connector docs, "Kafka
        Producers and Fault Tolerance": the transaction timeout must exceed the maximum
        checkpoint duration plus the maximum restart duration)."""
        checkpoint_span = 2 * (self.checkpoint_interval_ms + self.checkpoint_timeout_ms)
        return max(checkpoint_span + 1000 * self.restart_delay_s, 2 * 1000 * self.timeout_s)

    @property
    def transactional_prefix(self) -> str:
        """The sinks' transactional id prefix (the job name unless set); each sink adds
        ``-scores`` / ``-dlq``."""
        return self.transactional_id_prefix or self.name

    @property
    def resolved_model_dir(self) -> Path | None:
        """``model_dir``, else ``$AISP_MODEL_DIR``, else None (the cached build)."""
        env = os.environ.get(MODEL_DIR_ENV)
        return self.model_dir or (Path(env) if env else None)

    # -- sources -------------------------------------------------------------------------

    @classmethod
    def from_args(cls, argv: Sequence[str] | None = None, *, description: str = "") -> PipelineOptions:
        """The command line → options (``--help`` from the table; exits 2 on a bad flag)."""
        parser = argparse.ArgumentParser(description=description)
        add_flags(parser)
        namespace = parser.parse_args(argv)
        try:
            return cls(**{o.name: getattr(namespace, o.name) for o in OPTIONS})
        except ConfigError as exc:
            parser.error(str(exc))
            raise  # parser.error exits

    @classmethod
    def from_job_parameters(
        cls, get: Callable[[str, str], str], *, base: PipelineOptions | None = None
    ) -> PipelineOptions:
        """``base`` (default: the defaults) overridden by the job parameters that are set.

        Args:
            get: ``FunctionContext.get_job_parameter`` (``(key, default) -> str``).
            base: Values for the parameters that are not set.

        Raises:
            ConfigError: A parameter does not parse or is out of range (named).
        """
        values = read_job_parameters(get)
        try:
            return replace(base or cls(), **values)
        except ConfigError as exc:
            names = {o.flag: o.job_param for o in job_param_options()}
            for flag, param in names.items():
                if str(exc).startswith(flag + ":") or str(exc).startswith(flag + " "):
                    raise ConfigError(f"job parameter {param}: {exc}") from exc
            raise

    def job_parameters(self) -> dict[str, str]:
        """The options that are job parameters, as strings (the inverse of
        :meth:`from_job_parameters`); unset paths are left out."""
        params = {}
        for opt in job_param_options():
            value = getattr(self, opt.name)
            if value is None and opt.kind is Path:
                continue
            assert opt.job_param is not None
            params[opt.job_param] = render_job_parameter(opt, value)
        return params


def _flag_type(opt: Option) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        try:
            return opt.parse(text)
        except ConfigError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from exc

    parse.__name__ = opt.name  # argparse names the type in its error
    return parse


def add_flags(parser: argparse.ArgumentParser) -> None:
    """Add one flag per option to ``parser`` (bools become ``store_true`` switches, except
    a nullable bool, which takes ``true``, ``false`` or ``none``)."""
    for opt in OPTIONS:
        help_text = f"{opt.doc} [{opt.unit + ', ' if opt.unit else ''}default {opt.render_default()}]"
        if opt.kind is bool and not opt.nullable:
            parser.add_argument(opt.flag, action="store_true", help=help_text)
        else:
            parser.add_argument(opt.flag, type=_flag_type(opt), default=opt.default,
                                required=opt.required, help=help_text.replace("%", "%%"))


def default_bundle_time_ms(latency_slo_ms: float | None) -> int:
    """``python.fn-execution.bundle.time`` for a latency target.

    Outputs leave the Python worker when its bundle ends, and each bundle end
    drains every record in flight. Measured on the async operator (2 cores, 124
    records/s offered, p50 / p99 Kafka-in to Kafka-out): 50 ms bundles 223 / 457
    ms, 20 ms 135 / 357, 10 ms 94 / 287, 5 ms 82 / 254; the most records/s fell
    only from ~370 to ~330 at 5-10 ms. On the Arrow operator (the default), 175
    records/s offered (30 % of its most) with ``--latency-slo-ms 150``, p99 in
    interleaved runs: 20 ms bundles 201 ms, 10 ms 164 / 163, 5 ms 146 / 127 /
    121, 2 ms 135; at 60 % load 5 and 10 ms alike (p99 1,262 / 1,203 ms);
    a 12,808-record backlog 0.92x / 0.95x the plain loop at 5 / 10 ms. So: 50 ms
    for throughput without a target, else SLO / 30 within [5, 50] ms.

    Args:
        latency_slo_ms: The p99 target in ms, or None.

    Returns:
        The bundle time in ms, an int in [5, 50].
    """
    return 50 if latency_slo_ms is None else max(5, min(50, int(latency_slo_ms / 30)))


def flink_settings(options: PipelineOptions) -> dict[str, str]:
    """PyFlink settings that let the operators form their batches within the latency target.

    * ``python.fn-execution.bundle.time`` = :attr:`PipelineOptions.effective_bundle_time_ms`
      (results leave the Python worker when a bundle ends);
    * ``python.fn-execution.arrow.batch.size`` = ``arrow_batch_size``: one
      pandas call per Arrow batch; the batcher cuts it into model batches of
      ``max_batch_size`` sorted by length, so a larger Arrow batch pads less;
    * ``python.fn-execution.bundle.size`` = max(1000, :data:`BUNDLE_ARROW_BATCHES` x
      ``arrow_batch_size``, 8 x ``max_batch_size``): PyFlink caps the Arrow batch at
      the bundle size, and at each bundle end the JVM waits for every result in
      flight before it sends more, so the Python worker idles until the next batch
      arrives. Measured with a backlog (12,808 reviews, Arrow batches of 1,024, 2
      cores): a bundle of one batch left the worker idle 100-230 ms after every
      batch (busy 90-91 % of the run), of 4 batches only once per 4 (busy 93-95 %;
      about 5 ms between the batches within a bundle), of 8 batches 94-96 %. Four:
      each checkpoint barrier also waits for the bundle in flight (~7 s of compute
      here), and without a backlog bundles end on ``bundle.time`` first;
    * ``table.exec.async-scalar.max-concurrent-operations`` = 2 x
      ``max_batch_size``: rows in flight cap the SQL async function's batch (its
      default of 10 capped it at 10 here); twice lets the next batch fill
      during compute; ``timeout`` 10 min (a slow model backpressures instead of
      failing the job); ``retry-strategy`` ``NO_RETRY`` (the function never raises
      for a row);
    * ``execution.checkpointing.timeout`` = ``checkpoint_timeout_ms``;
    * ``restart-strategy.type`` ``failure-rate``: at most ``restart_attempts``
      restarts within ``restart_interval_s``, ``restart_delay_s`` apart, then the
      job stays FAILED (Flink's default with checkpoints restarts without end,
      so a record that fails the job every time would be replayed forever);
      ``none`` for ``restart_attempts`` = 0.

    Returns:
        Flink configuration key → value (``t_env.get_config().set`` or SQL ``SET``).
    """
    size = options.max_batch_size
    return {**_restart_settings(options),
        "execution.checkpointing.timeout": f"{options.checkpoint_timeout_ms} ms",
        "python.fn-execution.bundle.time": str(options.effective_bundle_time_ms),
        "python.fn-execution.bundle.size": str(min(2**31 - 1, max(
            _FLINK_DEFAULT_BUNDLE_SIZE, BUNDLE_ARROW_BATCHES * options.arrow_batch_size, 8 * size))),
        "python.fn-execution.arrow.batch.size": str(options.arrow_batch_size),
        "table.exec.async-scalar.max-concurrent-operations": str(min(2**31 - 1, 2 * size)),
        "table.exec.async-scalar.timeout": f"{_ASYNC_TIMEOUT_MS} ms",
        "table.exec.async-scalar.retry-strategy": "NO_RETRY",
    }


def _restart_settings(options: PipelineOptions) -> dict[str, str]:
    """The failure-rate restart strategy of :func:`flink_settings` (Flink docs,
    "Task Failure Recovery": ``restart-strategy.failure-rate.*``)."""
    if options.restart_attempts == 0:
        return {"restart-strategy.type": "none"}
    return {
        "restart-strategy.type": "failure-rate",
        "restart-strategy.failure-rate.max-failures-per-interval": str(options.restart_attempts),
        "restart-strategy.failure-rate.failure-rate-interval": f"{options.restart_interval_s} s",
        "restart-strategy.failure-rate.delay": f"{options.restart_delay_s} s",
    }


def format_job_parameters(params: Mapping[str, str]) -> str:
    """``params`` as a ``pipeline.global-job-parameters`` value: a JSON object,
    which Flink 2.x parses as a YAML flow map (any path, ``,``, ``:`` or quote
    survives; the legacy ``k:v,k:v`` form splits them)."""
    return json.dumps(dict(params))


