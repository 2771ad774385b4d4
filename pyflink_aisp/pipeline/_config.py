"""The options, declared once: :class:`InferenceOptions` and :class:`PipelineOptions`.

Each field is one option (:func:`~pyflink_aisp.pipeline._options.opt`): its
default, doc, unit, Flink job parameter and bounds sit beside it, and the
options table (:data:`OPTIONS`: ``--help``, the job parameters, the docs'
options page) is read from the fields. :class:`InferenceOptions` is what the SQL
functions and the operators read in ``open()`` (batching, model, worker;
:meth:`InferenceOptions.from_job_parameters`); :class:`PipelineOptions` adds what
only a packaged job has (topics, required; ranges, sinks, checkpoints, restarts,
the operator; :meth:`PipelineOptions.from_args`). Both give the batching,
hot-swap, breaker and affinity configs; :mod:`pyflink_aisp.pipeline._settings`
derives the PyFlink settings from them.
"""

from __future__ import annotations

import argparse
import enum
import itertools
import json
import math
import os
import re
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Self

from pyflink_aisp.affinity import AffinityPolicy, AffinitySettings
from pyflink_aisp.alignment import parse_bound
from pyflink_aisp.device import Device, DeviceKind
from pyflink_aisp.errors import ConfigError
from pyflink_aisp.inference import BatchCuts, BatchingConfig, BreakerConfig, ModelSwapConfig
from pyflink_aisp.inference.handlers import MAX_CONCURRENT_RUNS, Pooling
from pyflink_aisp.kafka import FieldMapping, StartupMode, ValueFormat, default_bootstrap_servers
from pyflink_aisp.pipeline._options import (
    Derived,
    GpuProvider,
    InferenceRuntime,
    JvmJit,
    Option,
    OptionGroup,
    Precision,
    RestartStrategy,
    RouteOperators,
    Runner,
    RuntimeMode,
    device_value,
    opt,
    options_of,
    read_job_parameters,
    render_job_parameter,
    required,
)
from pyflink_aisp.pipeline._remote_options import RemoteApi, RemoteOptions
from pyflink_aisp.pipeline._watch import DeadLetterWatchConfig

__all__ = ["INFERENCE_OPTIONS", "MODEL_DIR_ENV", "OPTIONS", "InferenceOptions", "PipelineOptions",
           "add_flags", "default_bundle_time_ms", "option"]

#: Environment variable naming the model asset directory (when no option sets it).
MODEL_DIR_ENV = "AISP_MODEL_DIR"
#: The startup modes a job may ask for (``specific-offsets`` is what a range sets itself).
_STARTUP_CHOICES = (StartupMode.EARLIEST, StartupMode.LATEST, StartupMode.GROUP_OFFSETS)
#: Where a job starts reading without --startup-mode or --range-start.
_DEFAULT_STARTUP = {RuntimeMode.BATCH: StartupMode.EARLIEST, RuntimeMode.STREAMING: StartupMode.GROUP_OFFSETS}

#: ``module:Class`` of --handler (dotted module, dotted attribute).
_HANDLER_PATH = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_][\w.]*")

J, B, M, W = OptionGroup.JOB, OptionGroup.BATCHING, OptionGroup.MODEL, OptionGroup.WORKER


def _coerce(options: Any) -> None:
    """Strings given for enum or device fields (``mode="batch"``, ``device="cuda"``) become their
    values, parsed as the flag would be, and strings for path fields paths; any other type
    there is refused; every value is range-checked.

    Raises:
        ConfigError: A value of another type for an enum, device or path field, or out of range
            (naming the flag).
    """
    for option in options_of(type(options)):
        value = getattr(options, option.name)
        kind = option.kind
        if isinstance(kind, type) and issubclass(kind, enum.Enum | Device | Path) and value is not None:
            if isinstance(value, kind):
                pass
            elif kind is Path and isinstance(value, str | os.PathLike):
                object.__setattr__(options, option.name, Path(value))
            elif isinstance(value, str):
                object.__setattr__(options, option.name, option.parse(value))
            else:
                raise ConfigError(f"{option.flag} must be {option.expected}, got {value!r}")
        option.check(getattr(options, option.name))


@dataclass(frozen=True, kw_only=True)
class InferenceOptions(RemoteOptions):
    """What the inference operators and the SQL functions read: batching, model, worker.

    Raises:
        ConfigError: A value out of range or of the wrong kind (naming the flag),
            ``--encoder-onnx`` without ``--encoder-tokenizer``, a precision or hot
            swap the runtime cannot do, a torch device-path option (``--tf32``, shapes, depth)
            the runtime or device cannot take, or batching knobs that
            :class:`~pyflink_aisp.inference.BatchingConfig` refuses.

    The batch size, token budget and Arrow batch size left unset (None) take the device's
    default (:func:`~pyflink_aisp.pipeline._options.device_value`).
    """

    max_batch_size: int = opt(32, B, 'Most records per model call (a remote model: default '
        '--remote-rows-per-request x --remote-max-concurrency, the requests one call may have in flight).',
        unit='records', job_param='aisp.batch.max-size', minimum=1, cuda=(1024, 'a GPU call costs about '
        '5 ms whatever its size, and bf16 on an H200 scored 48,900 sentences/s in batches of 1,024 '
        'against 8,200 in batches of 256.'))
    max_wait_ms: float = opt(5.0, B, 'Longest a record waits for companions while the model is idle (async '
        'operator).', unit='ms', job_param='aisp.batch.max-wait-ms', minimum=0)
    max_idle_ms: float | None = opt(2.0, B, 'A batch also leaves when no record arrived for this long '
        '(async operator).', unit='ms', job_param='aisp.batch.max-idle-ms', nullable=True, minimum=0)
    max_batch_tokens: int | None = opt(None, B, 'Padded-token budget per model call (rows x longest row; '
        "none: the device's default).", unit='tokens', job_param='aisp.batch.max-tokens', nullable=True,
        minimum=1, cuda=(65536, 'full batches of 1,024 rows up to 64 tokens (the reviews average 27), '
                         'fewer rows of longer texts, so activation memory stays bounded.'))
    batch_cuts: BatchCuts = opt(BatchCuts.COST, B, 'Where a sorted Arrow batch is cut into model batches: '
        'cost: the cuts of least cost fitted online (per call + per padded token); fixed: runs of '
        '--max-batch-size.', job_param='aisp.batch.cuts')
    length_buckets: tuple[int, ...] = opt((), B, 'Ascending token-length bucket bounds, e.g. 16,32,64: a '
        'model batch holds one bucket.',
        unit='tokens', job_param='aisp.batch.length-buckets', nullable=True, minimum=1)
    pipeline_depth: int | None = opt(None, B, 'Model batches launched and not yet collected. --runtime '
        'torch: the next batch is prepared and copied while one computes (none: 2 on cuda, 1 on cpu). The '
        'ONNX sentiment model on the CPU: that many session.run calls compute at once, each on its own '
        'thread, with physical cores / depth intra-op threads each unless --intra-op-threads is given '
        '(none: 1; with --operator record, --parallelism: its subtasks share the model, capped on a '
        "cluster at taskmanager.numberOfTaskSlots, the most of them one TaskManager holds).", unit='batches',
        job_param='aisp.batch.pipeline-depth', nullable=True, minimum=1)
    latency_slo_ms: float | None = opt(None, B, 'p99 target of the inference operator: shorter bundles (SLO '
        "/ 30) and, in a local run, C1 only (--jvm-jit); the async operator's batch size "
        'and wait are tuned online within their maxima.', unit='ms',
        job_param='aisp.latency-slo-ms', nullable=True, minimum=0.001)
    max_failure_rate: float | None = opt(0.5, M, 'Circuit breaker: fail the job (Flink restarts it from the '
        'last checkpoint) when this share of the last --failure-window inferences failed (none: never; '
        'decode dead letters do not count).',
        job_param='aisp.breaker.max-failure-rate', nullable=True, minimum=0.001)
    failure_window: int = opt(1000, M, 'Circuit breaker: inference outcomes in the window (it trips only '
        'once a tenth of them, at least 1, are in).',
        unit='records', job_param='aisp.breaker.window', minimum=1)
    model_dir: Path | None = opt(None, M, 'Built sentiment model assets (default: $AISP_MODEL_DIR, else the '
        'cached build).', job_param='aisp.model.dir', nullable=True)
    runtime: InferenceRuntime = opt(InferenceRuntime.ONNX, M, 'What runs the sentiment model: onnx (ONNX '
        'Runtime) or torch (PyTorch, pip install -e .[torch]).', job_param='aisp.runtime')
    device: Device = opt(Device(DeviceKind.CPU), M, 'Where the model runs: cpu, cuda (= cuda:0) or '
        'cuda:N; a GPU that is not usable fails the job at start, never a silent CPU run.',
        job_param='aisp.device')
    precision: Precision = opt(Precision.FP32, M, 'Encoder precision (--runtime torch): fp32, fp16 or bf16 '
        '(torch.autocast; checked at load against fp32 on a probe set, part of the model version).',
        job_param='aisp.precision')
    onnx_provider: GpuProvider = opt(GpuProvider.CUDA, M, 'ONNX Runtime execution provider on a GPU: cuda '
        'or tensorrt (CUDA takes the nodes TensorRT does not).', job_param='aisp.onnx.provider')
    tf32: bool = opt(False, M, 'fp32 matmuls as TF32 on the GPU (--runtime torch with --device cuda only): '
        'faster on Ampere and later GPUs, scores move slightly, so it is part of the model version.',
        job_param='aisp.torch.tf32')
    pad_to_multiple_of: int | None = opt(None, M, 'Sequence lengths padded up to a multiple of this '
        "(--runtime torch), so the GPU sees few shapes and sets each up once (none: the device's default, "
        '16 on cuda, no padding on cpu).', unit='tokens', job_param='aisp.torch.pad-to-multiple-of',
        nullable=True, minimum=1)
    batch_size_buckets: tuple[int, ...] = opt((), M, 'Ascending batch sizes a model batch is padded up to '
        "(--runtime torch; the padded rows are dropped; none: the device's default, powers of two from 8 to "
        '--max-batch-size on cuda, none on cpu).', unit='records', job_param='aisp.torch.batch-size-buckets',
        nullable=True, minimum=1)
    gpu_affinity: str | None = opt(None, M, 'URL of the GPU affinity service (`aisp affinity serve`): in '
        'open() each inference subtask leases a GPU or MIG instance (--device cuda; it becomes cuda:0) or, '
        "with --device cpu, a NUMA node's CPUs (no GPU visible), pins its threads to the lease's CPUs, "
        'renews it and releases it in close().', job_param='aisp.gpu-affinity', nullable=True)
    gpu_affinity_policy: AffinityPolicy = opt(AffinityPolicy.FAIL, M, 'When the affinity service cannot be '
        'reached: fail (the job fails at start) or local (a deterministic local choice, metric '
        'affinityFallback = 1); never a silent CPU run.', job_param='aisp.gpu-affinity.policy')
    gpu_mem_mib: int = opt(1024, M, "GPU memory each subtask's lease reserves (--gpu-affinity; the service "
        'never over-commits a device).', unit='MiB', job_param='aisp.gpu-affinity.mem-mib', minimum=0)
    model_pointer: Path | None = opt(None, M, 'Hot swap: JSON pointer {"path", "sha256"} polled by every '
        'worker (`aisp model publish`).', job_param='aisp.model.pointer', nullable=True)
    model_poll_interval_s: float = opt(2.0, M, 'Hot swap: seconds between two reads of the pointer.',
        unit='s', job_param='aisp.model.poll-interval-s', minimum=0.001)
    intra_op_threads: int = opt(0, M, 'ONNX Runtime intra-op threads (0: one per physical '
        'core, shared among the concurrent runs of --pipeline-depth).',
        job_param='aisp.onnx.intra-op-threads', minimum=0)
    onnx_spin_wait: bool | None = opt(None, M, 'ONNX Runtime intra-op threads spin between runs (true: '
        "ORT's own default, for cores the model has to itself; false: a thread sleeps when its run ends and "
        "leaves the core to the JVMs beside it; default: false, see decision record 7).",
        job_param='aisp.onnx.spin-wait', nullable=True)
    onnx_profile_dir: Path | None = opt(None, M, "ONNX Runtime's profiler on the ONNX sentiment model: "
        'each worker writes a trace of its first --onnx-profile-runs runs here (Chrome trace JSON: one '
        "event per kernel, with the intra-op thread pool's run and wait times; bench/ort_profile_bench.py "
        'reads them).', job_param='aisp.onnx.profile-dir', nullable=True)
    onnx_profile_runs: int = opt(500, M, 'Runs each worker profiles with --onnx-profile-dir.', unit='runs',
        job_param='aisp.onnx.profile-runs', minimum=1)
    encoder_onnx: Path | None = opt(None, M, 'A generic ONNX text encoder instead of the sentiment model: '
        'the job writes {"id", "embedding", "model_sha256"}.', job_param='aisp.encoder.onnx', nullable=True)
    encoder_tokenizer: Path | None = opt(None, M, 'tokenizer.json of --encoder-onnx.',
        job_param='aisp.encoder.tokenizer', nullable=True)
    encoder_output: str | None = opt(None, M, 'Graph output of --encoder-onnx to pool (needed when the '
        'graph has several outputs).', job_param='aisp.encoder.output', nullable=True)
    encoder_pooling: Pooling = opt(Pooling.MEAN, M, 'none (output is per text), mean (attention-mask mean '
        'over tokens) or cls (first token) for --encoder-onnx.', job_param='aisp.encoder.pooling')
    encoder_normalize: bool = opt(False, M, 'L2-normalise the vectors of --encoder-onnx.',
        job_param='aisp.encoder.normalize')
    classifier: Path | None = opt(None, M, 'A Hugging Face sequence-classification model directory '
        '(config.json with id2label, tokenizer.json, model.onnx) instead of the sentiment model: the job '
        'writes {"id", "label", "score", "model_sha256"} (softmax, or sigmoid per label for a multi-label '
        'config).',
        job_param='aisp.classifier.dir', nullable=True)
    top_k: int = opt(0, M, 'With --classifier: also write top_labels and top_scores, the K most probable '
        'labels (0: only label and score).', job_param='aisp.classifier.top-k', minimum=0)
    predictor: Path | None = opt(None, M, 'A numeric ONNX model (one float input (batch, n_features), e.g. '
        'a scikit-learn model exported by skl2onnx with zipmap=False) instead of the sentiment model, on '
        'the feature vectors of --feature-fields: the job writes one field per graph output.',
        job_param='aisp.predictor.onnx', nullable=True)
    handler: str | None = opt(None, M, "Your own ModelHandler, 'module:Class' (importable on the workers: "
        'ship it with flink run -pyfs or in a package), built with --handler-args; it declares its output '
        'fields (ModelHandler.task).', job_param='aisp.handler', nullable=True)
    handler_args: str | None = opt(None, M, 'Keyword arguments of --handler, a JSON object.',
        job_param='aisp.handler.args', nullable=True)
    stats_dir: Path | None = opt(None, M, 'SQL functions: directory where each worker writes its batch '
        'statistics as JSON.', job_param='aisp.stats.dir', nullable=True)
    arrow_batch_size: int = opt(1024, W, 'python.fn-execution.arrow.batch.size: most records per Arrow '
        'batch (arrow operator, pandas SQL function); the batcher cuts model batches from it.',
        unit='records', minimum=1, cuda=(8192, 'eight model batches of 1,024 per Arrow batch, so the '
                                          'device has the next batch while one computes.'))
    bundle_time_ms: int | None = opt(None, W, 'python.fn-execution.bundle.time: longest a result waits in '
        'the Python worker (default 50, or --latency-slo-ms / 30 within [5, 50]).',
        unit='ms', nullable=True, minimum=1)
    buffer_timeout_ms: int | None = opt(None, W, 'execution.buffer-timeout.interval: longest a record waits '
        "in a network buffer between operators that are not chained (default Flink's 100; not derived "
        'from --latency-slo-ms, see docs/decisions/0007-latency-settings.md).', unit='ms', nullable=True,
        minimum=0)

    def __post_init__(self) -> None:
        _coerce(self)
        for option in options_of(type(self)):  # the device's defaults where not given
            if option.device_aware:
                object.__setattr__(self, option.name, self._device_default(option))
        self.batching()  # validate the batching knobs before any JVM or broker is touched
        for option in options_of(type(self)):  # nan passes every bound: refuse it (a flag cannot be nan)
            value = getattr(self, option.name)
            if option.kind is float and isinstance(value, float) and not math.isfinite(value):
                raise ConfigError(f"{option.flag} must be a finite number, got {value!r}")
        if self.max_failure_rate is not None and self.max_failure_rate > 1:
            raise ConfigError(f"--max-failure-rate must be <= 1 (a share of the window), "
                              f"got {self.max_failure_rate}")
        if (self.encoder_onnx is None) != (self.encoder_tokenizer is None):
            raise ConfigError("--encoder-onnx and --encoder-tokenizer go together")
        if self.encoder_onnx is not None and self.runtime is InferenceRuntime.TORCH:
            raise ConfigError("--encoder-onnx runs on ONNX Runtime: --runtime torch does not apply to it")
        torch = self.runtime is InferenceRuntime.TORCH
        if self.classifier is not None and (self.encoder_onnx is not None or torch):
            raise ConfigError("--classifier runs on ONNX Runtime instead of the sentiment model: "
                              "--encoder-onnx and --runtime torch do not go with it")
        named = (("--encoder-onnx", self.encoder_onnx), ("--classifier", self.classifier),
                 ("--predictor", self.predictor), ("--handler", self.handler),
                 ("--remote-url", self.remote_url))
        chosen = [flag for flag, value in named if value is not None]
        if len(chosen) > 1 or (chosen and torch):
            both = " and ".join(chosen + (["--runtime torch"] if torch else []))
            raise ConfigError(f"{both} each name the model: give one")
        if self.handler is not None and not _HANDLER_PATH.fullmatch(self.handler):
            raise ConfigError(f"--handler must be 'module:Class' (e.g. my_models.handlers:MyHandler), "
                              f"got {self.handler!r}")
        if self.handler_args is not None:
            if self.handler is None:
                raise ConfigError("--handler-args applies to --handler only")
            self.handler_kwargs()
        self._check_remote()
        if self.remote_url is not None and self.model_pointer is not None:
            raise ConfigError("--model-pointer (hot swap) is for in-process models: a remote model is "
                              "swapped on its server")
        if self.top_k and self.classifier is None:
            raise ConfigError("--top-k applies to --classifier only")
        if self.precision is not Precision.FP32 and self.runtime is not InferenceRuntime.TORCH:
            raise ConfigError(f"--precision {self.precision.value} needs --runtime torch (no "
                              "reduced-precision ONNX model is built)")
        self.affinity()  # --gpu-affinity: a URL, and --device cpu or cuda (= cuda:0)
        if self.runtime is InferenceRuntime.TORCH and self.model_pointer is not None:
            raise ConfigError("--model-pointer (hot swap) needs --runtime onnx: the torch handler "
                              "cannot swap")
        self._check_device_path()

    def _device_default(self, option: Option) -> Any:
        """The value of a device-aware option: the given one, else the device's default; for a
        remote model (``--remote-url``) the batch size not given is ``--remote-rows-per-request`` x
        ``--remote-max-concurrency``, so that a model call is as many full requests as may be in
        flight (the handler sends a call's requests at once, under the adaptive limit)."""
        value = device_value(option, getattr(self, option.name), self.device)
        if option.name == "max_batch_size" and isinstance(value, Derived) and self.remote_url is not None:
            return Derived(self.remote_rows_per_request * self.remote_max_concurrency)
        return value

    def _check_device_path(self) -> None:
        """The torch runtime's device-path options (--tf32, shapes, pipeline depth; the depth
        also for the ONNX sentiment model on the CPU: concurrent runs).

        Raises:
            ConfigError: One given without ``--runtime torch`` (the depth: nor for the ONNX
                sentiment model on the CPU), ``--tf32`` off CUDA, or
                batch-size buckets that are not strictly ascending.
        """
        torch = self.runtime is InferenceRuntime.TORCH
        onnx_cpu_sentiment = not torch and not self.device.is_gpu and all(
            value is None for value in (self.handler, self.remote_url, self.predictor, self.encoder_onnx,
                                        self.classifier))
        given = [flag for flag, value in (("--pad-to-multiple-of", self.pad_to_multiple_of),
                                          ("--batch-size-buckets", self.batch_size_buckets or None),
                                          ("--pipeline-depth",
                                           None if onnx_cpu_sentiment else self.pipeline_depth))
                 if value is not None]
        if given and not torch:
            raise ConfigError(f"{' and '.join(given)} apply to --runtime torch (and --pipeline-depth to the "
                              "sentiment model on ONNX Runtime's CPU provider: concurrent runs); the other "
                              "handlers choose their own shapes and depth")
        if self.tf32 and not (torch and self.device.is_gpu):
            raise ConfigError(f"--tf32 needs --runtime torch and --device cuda (TF32 is a matmul mode of "
                              f"CUDA GPUs), got --runtime {self.runtime.value} --device {self.device}")
        buckets = self.batch_size_buckets
        if any(a >= b for a, b in itertools.pairwise(buckets)):
            raise ConfigError(f"--batch-size-buckets must be strictly ascending, got "
                              f"{','.join(map(str, buckets))}")

    # -- derived configs -----------------------------------------------------------------

    def handler_kwargs(self) -> dict[str, Any]:
        """``--handler-args`` as keyword arguments ({} when unset).

        Raises:
            ConfigError: Not a JSON object.
        """
        if self.handler_args is None:
            return {}
        try:
            value = json.loads(self.handler_args)
        except ValueError as exc:
            raise ConfigError(f"--handler-args must be a JSON object: {exc}") from None
        if not isinstance(value, dict):
            raise ConfigError(f"--handler-args must be a JSON object, got {type(value).__name__}")
        return value

    def batching(self) -> BatchingConfig:
        """The batcher's config.

        Raises:
            ConfigError: As :class:`~pyflink_aisp.inference.BatchingConfig`, naming the flag.
        """
        try:
            tokens = self.max_batch_tokens
            return BatchingConfig(
                max_batch_size=int(self.max_batch_size), max_wait_ms=self.max_wait_ms,
                max_batch_tokens=None if tokens is None else int(tokens), length_buckets=self.length_buckets,
                latency_slo_ms=self.latency_slo_ms, max_idle_ms=self.max_idle_ms, batch_cuts=self.batch_cuts)
        except ConfigError as exc:
            named = [o.flag for o in OPTIONS if o.name in str(exc)]
            raise ConfigError(f"{named[0]}: {exc}" if named else str(exc)) from exc

    @property
    def lease_job(self) -> str:
        """The job of the affinity lease key: ``aisp-sql-<host>-<pid>`` of the worker for a SQL
        function (no job name there), so two SQL jobs never share a lease."""
        return f"aisp-sql-{socket.gethostname()}-{os.getpid()}"

    def affinity(self) -> AffinitySettings | None:
        """The workers' affinity settings (None without ``--gpu-affinity``), keyed by :attr:`lease_job`.

        Raises:
            ConfigError: Not an http(s) URL, or ``--device cuda:N`` with N > 0 (the service picks the GPU).
        """
        if self.gpu_affinity is None:
            return None
        return AffinitySettings(url=self.gpu_affinity, job=self.lease_job, device=self.resolved_device,
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
    def concurrent_runs(self) -> int:
        """Concurrent ``session.run`` calls of the ONNX sentiment model on the CPU:
        ``pipeline_depth``, else 1."""
        return self.pipeline_depth or 1

    @property
    def effective_spin_wait(self) -> bool:
        """``onnx_spin_wait``, else off: the model shares its cores with the JVMs (decision record 7)."""
        return bool(self.onnx_spin_wait)

    @property
    def resolved_device(self) -> str:
        """``device`` by its canonical name: ``"cpu"`` or ``"cuda:N"``."""
        return str(self.device)

    @property
    def resolved_model_dir(self) -> Path | None:
        """``model_dir``, else ``$AISP_MODEL_DIR``, else None (the cached build)."""
        env = os.environ.get(MODEL_DIR_ENV)
        return self.model_dir or (Path(env) if env else None)

    # -- job parameters ------------------------------------------------------------------

    @classmethod
    def from_job_parameters(cls, get: Callable[[str, str], str], *, base: Self | None = None) -> Self:
        """``base`` (default: the defaults) overridden by the job parameters that are set.

        Args:
            get: ``FunctionContext.get_job_parameter`` (``(key, default) -> str``).
            base: Values for the parameters that are not set (required for a class with
                required fields, such as :class:`PipelineOptions`).

        Raises:
            ConfigError: A parameter does not parse or is out of range (named).
            TypeError: ``base`` is not an instance of this class (its job options would be lost).
        """
        if base is not None and not isinstance(base, cls):
            raise TypeError(f"{cls.__name__}.from_job_parameters needs a {cls.__name__} base, "
                            f"got a {type(base).__name__}")
        values = read_job_parameters(options_of(cls), get)
        try:
            return replace(base or cls(), **values)
        except ConfigError as exc:
            for option in options_of(cls):
                flag, param = option.flag, option.job_param
                if param and (str(exc).startswith(flag + ":") or str(exc).startswith(flag + " ")):
                    raise ConfigError(f"job parameter {param}: {exc}") from exc
            raise

    def job_parameters(self) -> dict[str, str]:
        """The options that are job parameters, as strings (the inverse of
        :meth:`from_job_parameters`); unset paths are left out, and so are the device's
        defaults that were not given (the reader derives them from ``aisp.device``)."""
        params = {}
        for option in options_of(type(self)):
            value = getattr(self, option.name)
            if option.job_param is None or (value is None and option.kind is Path):
                continue
            if option.device_aware and (value is None or isinstance(value, Derived)):
                continue
            params[option.job_param] = render_job_parameter(option, value)
        return params


@dataclass(frozen=True, kw_only=True)
class PipelineOptions(InferenceOptions):
    """Every option of a packaged job: :class:`InferenceOptions` and the job's own.

    Raises:
        ConfigError: As :class:`InferenceOptions`; also an unknown startup mode, both
            ``--startup-mode`` and ``--range-start``, a bound that does not parse, the same
            topic as two of input, output and dead-letter topic, ``--capacity`` below
            ``--max-batch-size`` for the async operator, or a transaction timeout below
            :attr:`min_transaction_timeout_ms`.
        TypeError: ``input_topic`` or ``output_topic`` missing.
    """

    input_topic: str = required(J, 'Kafka topic of JSON records {"id", "text", ...}.')
    output_topic: str = required(J, 'Kafka topic of the scored records (exactly once).')
    dlq_topic: str | None = opt(None, J, 'Dead-letter topic (default: <output-topic>.dlq).')
    value_format: ValueFormat = opt(ValueFormat.JSON, J, 'How record values are read: json (objects; the '
        'fields below), raw (the whole value is the UTF-8 text, the id its topic/partition/offset) or '
        'avro (the Confluent wire format, schemas from --schema-registry-url; fields by JSON Pointer as '
        'for json).')
    schema_registry_url: str | None = opt(None, J, 'The Confluent-compatible Schema Registry of avro values '
        "(e.g. http://127.0.0.1:8081; Apicurio Registry: http://HOST:PORT/apis/ccompat/v7); "
        'user:password@ in the URL is never logged.', nullable=True)
    text_field: str = opt('/text', J, 'Where the text of each JSON record is: a JSON Pointer (RFC 6901), '
        'e.g. /body or /review/text.')
    text_pair_field: str | None = opt(None, J, 'Where the second text of each JSON record is, for pair '
        'models (cross-encoders, NLI classifiers): a JSON Pointer; the model gets (text, text pair), '
        'tokenized as HF tokenizer(text, text_pair). Needs a --classifier or --encoder-onnx model (or a '
        'handler that accepts pairs) and --operator arrow.', nullable=True)
    id_field: str | None = opt('/id', J, "Where the id of each record is: a JSON Pointer, or 'key' (the "
        "record's Kafka key, UTF-8; any value format); a record without one, and every record with 'none', "
        "is scored under its topic/partition/offset.", nullable=True)
    feature_fields: str | None = opt(None, J, 'The feature vector of each JSON record for --predictor and '
        'a numeric model on a V2 server: one JSON Pointer to an array of numbers (/features), or '
        'comma-separated pointers to numbers (/amount,/age); no text is read then. Without it a V2 '
        "server's model takes the record's text (one BYTES input).", nullable=True)
    models: Path | None = opt(None, J, 'A model registry (YAML: named models, each its task, path and '
        'options; `aisp models list FILE`); with --model, the job runs that model.', nullable=True)
    model: str | None = opt(None, J, 'The model of --models the job runs: its task, path and options '
        'replace the model options given here.', nullable=True)
    route: str | None = opt(None, J, 'The route of --models the job runs instead of one model: a rule '
        'router or a model cascade over its models (docs/routing.md); each model keeps its own options and '
        'batcher. Runs on --operator arrow.', nullable=True)
    route_operators: RouteOperators = opt(RouteOperators.PER_RULE, J, 'A rule route in the job graph: '
        'per-rule: an operator per rule (and the default), each scoring its own records, in STREAMING each '
        "a task of its own (a slow model holds back only its own records); one: one operator for the whole "
        "route (each record crosses to Python once; a slow model's calls delay the others' records).")
    keep_fields: str | None = opt(None, J, "Fields of the input record copied unchanged into each output, "
        "after its id: comma-separated JSON Pointers, each written under its last name (/meta/lang -> "
        "lang; null where a record has none); '*': every top-level field but the text's and the id's.")
    prompt_fields: str | None = opt(None, J, "Fields of each JSON or Avro record that the --prompt-template "
        "names beside its text: comma-separated JSON Pointers, each filling the placeholder of its last name "
        "(/meta/product -> {product}); a string as it is, another value as JSON; a record without one is a "
        "missing_text dead letter. Generation models (openai-chat, openai-completions) only.", nullable=True)
    bootstrap_servers: str | None = opt(None, J, 'Kafka bootstrap servers (default: $AISP_KAFKA_BOOTSTRAP, '
        'else 127.0.0.1:$AISP_KAFKA_PORT).')
    job_name: str | None = opt(None, J, 'Name of the job: the Flink job name, and the consumer group and '
        "the sinks' transactional id prefix unless set (default: aisp-<input-topic>-<output-topic>); a "
        'second live job of that name on the cluster is refused.')
    group_id: str | None = opt(None, J, 'Consumer group (default: the job name).')
    transactional_id_prefix: str | None = opt(None, J, 'Kafka transactional id prefix of the sinks, unique '
        'per job, stable across restarts (default: the job name).')
    mode: RuntimeMode = opt(RuntimeMode.STREAMING, J, 'Flink runtime mode: streaming (unbounded, '
        'checkpoints) or batch (bounded at the latest offsets at start).')
    startup_mode: StartupMode | None = opt(None, J, 'Kafka scan.startup.mode (default: group-offsets in '
        'streaming, earliest-offset in batch).', choices=_STARTUP_CHOICES)
    range_start: str | None = opt(None, J, 'Where reading starts: earliest, latest, timestamp:T, '
        "offsets:P=O,..., group:G, checkpoint:JOB (a streaming job's last completed checkpoint) or "
        'manifest:PATH (where a run ended); checked against the topic before the job starts (default: '
        '--startup-mode).')
    range_end: str | None = opt(None, J, 'Where reading stops, exclusive, in the same forms (batch default: '
        'latest, the last stable offset at start; streaming default: no end).')
    manifest_dir: Path | None = opt(None, J, 'Write run manifests (JSON) here: at the end of a batch run, '
        'and for each completed checkpoint of a stream while the submitting client runs attached.')
    flink_rest_url: str | None = opt(None, J, 'Flink REST API for checkpoint:JOB bounds and stream '
        'manifests (default: the cluster flink run submits to, else '
        'http://127.0.0.1:$AISP_FLINK_REST_PORT).')
    checkpoint_interval_ms: int = opt(5000, J, 'Checkpoint interval (streaming); transactions commit on '
        'each checkpoint.', unit='ms', minimum=1)
    checkpoint_timeout_ms: int = opt(600_000, J, 'A checkpoint not completed within this long is declined '
        '(execution.checkpointing.timeout).', unit='ms', minimum=1)
    transaction_timeout_ms: int = opt(3_600_000, J, 'Kafka transaction.timeout.ms of the exactly-once '
        'sinks: at least 2 x (checkpoint interval + checkpoint timeout) + the longest restart wait and 2 x '
        '--timeout-s, so a transaction outlives a slow checkpoint and a restart; checked against the '
        "brokers' transaction.max.timeout.ms before the job starts.", unit='ms', minimum=1000)
    parallelism: int = opt(1, J, 'Parallelism of the job.', minimum=1)
    jars: str | None = opt(None, J, "pipeline.jars: ';'-separated file:// URLs of the Flink Kafka connector "
        '(default: $AISP_CONNECTOR_JARS, else the jar cache of `aisp local jars`).')
    max_request_size: int = opt(1_048_576, J, 'Kafka producer max.request.size of the sinks; an output that '
        "would not fit in it or in the topic's max.message.bytes (less 1 KiB of record overhead) goes to "
        'the DLQ as oversized_output (at most buffer.memory, 32 MiB, counts).',
        unit='bytes', minimum=33 * 1024)
    sink_linger_ms: int | None = opt(None, J, "The sinks' producer linger.ms: longest a record waits for "
        "companions in the producer (default the client's 5).",
        unit='ms', nullable=True, minimum=0)
    restart_strategy: RestartStrategy = opt(RestartStrategy.EXPONENTIAL_DELAY, J, 'Flink restart strategy: '
        'exponential-delay (the wait starts at --restart-delay-s and doubles on each failure up to '
        '--restart-max-delay-s, so the restarts that find no TaskManager while one is replaced are few) or '
        'failure-rate (a fixed --restart-delay-s wait).')
    restart_attempts: int = opt(10, J, 'Most restarts before the job stays FAILED: before a '
        '--restart-interval-s run without failure resets the count (exponential-delay), or within '
        '--restart-interval-s (failure-rate); 0: no restart.', minimum=0)
    restart_interval_s: int = opt(600, J, 'Restart strategy: a run this long without failure resets the '
        'attempts and the wait (exponential-delay); the window of --restart-attempts (failure-rate).',
        unit='s', minimum=1)
    restart_delay_s: int = opt(5, J, 'Restart strategy: the first wait before a restart '
        '(exponential-delay), or every wait (failure-rate).', unit='s', minimum=0)
    restart_max_delay_s: int = opt(60, J, 'Restart strategy exponential-delay: the longest wait before a '
        'restart (>= --restart-delay-s).', unit='s', minimum=0)
    with_embedding: bool = opt(False, J, 'Also write the 384-float embedding of each record.')
    operator: Runner = opt(Runner.ARROW, J, 'arrow: Arrow batches through a vectorized map (throughput); '
        'async: one coroutine per record (low-rate streams, --ordered); record: one model call per '
        'record in Flink\'s thread mode, inside the TaskManager\'s JVM (no bundle, no hop to a Python '
        'process: latency first at low rates).')
    separate_sinks: bool | None = opt(None, J, "STREAMING: the Kafka sinks run in tasks of their own "
        "behind a rescale exchange instead of chained into the operator's thread, so a checkpoint's "
        "flush and transaction commit do not hold the model's input back (default: on for --operator "
        "record, whose model runs in the task thread, off otherwise); with it on and no "
        "--buffer-timeout-ms, execution.buffer-timeout.interval is 0 (each result is sent on at once).",
        nullable=True)
    jvm_jit: JvmJit | None = opt(None, J, "HotSpot's JIT compilers in the JVM that a local run starts "
        "(PyFlink's gateway, which runs the MiniCluster): tiered (C1, then C2: HotSpot's default) or c1 "
        "(-XX:TieredStopAtLevel=1: no C2 compiler threads competing with the model for the cores in the "
        "job's first minute or two; default: c1 with --latency-slo-ms, else tiered). A job submitted with "
        "flink run runs in the cluster's TaskManagers, whose JVM options are the cluster's "
        "(env.java.opts.taskmanager): giving it there is an error.", nullable=True)
    ordered: bool = opt(False, J, 'async operator: emit in input order (AsyncDataStream.ordered_wait).')
    capacity: int = opt(256, J, 'async operator: records in flight (>= --max-batch-size; 4x lets the next '
        'batch form while the model runs).', unit='records', minimum=1)
    timeout_s: int = opt(600, J, 'async operator: per-record timeout; a record past it is dead-lettered.',
        unit='s', minimum=1)
    max_dead_letter_rate: float | None = opt(None, J, 'Fail the job once more than this share of a window '
        'of 1000 records are dead letters (as soon as the window cannot end below it), with the line that '
        'names the top reason and the likely fix; an attached flink run cancels the job then. Above 0.5 '
        '(or this share, if lower) that line is logged as a warning either way (none: never fail).',
        nullable=True, minimum=0.0)
    latency_trace_dir: Path | None = opt(None, J, 'arrow operator: directory where each Python worker '
        'appends one JSON line per Arrow batch (wall-clock times at entry, after decode, after inference, '
        'at return, and the ids) to split end-to-end latency by stage (bench/latency_bench.py).',
        nullable=True)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.startup_mode is not None and self.range_start is not None:
            raise ConfigError("--range-start and --startup-mode both say where reading starts: give one")
        for flag, bound in (("--range-start", self.range_start), ("--range-end", self.range_end)):
            if bound is not None:
                try:
                    parse_bound(bound)
                except ConfigError as exc:
                    raise ConfigError(f"{flag}: {exc}") from None
        if self.operator is Runner.ASYNC and self.capacity < self.max_batch_size:
            raise ConfigError(f"--capacity ({self.capacity}) must be >= --max-batch-size "
                              f"({self.max_batch_size}): records in flight cap the batch")
        named = {"--input-topic": self.input_topic, "--output-topic": self.output_topic,
                 "--dlq-topic": self.dlq}
        if len(set(named.values())) < 3:
            raise ConfigError("the input, output and dead-letter topics must differ (a job that reads "
                              f"its own output or dead letters loops without end): {named}")
        if self.with_embedding and self.classifier is not None:
            raise ConfigError("--with-embedding is the sentiment model's: a --classifier writes "
                              "its labels only")
        try:
            self.field_mapping()
        except ConfigError as exc:
            raise ConfigError(f"--value-format / --text-field / --text-pair-field / --id-field / "
                              f"--keep-fields / --feature-fields / --prompt-fields / --schema-registry-url: "
                              f"{exc}") from None
        if self.prompt_fields and self.operator is Runner.ASYNC:
            raise ConfigError("--prompt-fields runs on --operator arrow (the default): the async operator "
                              "carries one text per record")
        if self.prompt_fields and self.route is not None:
            raise ConfigError("--prompt-fields is for one generation model (--model or --remote-url), not a "
                              "--route")
        v2 = self.remote_url is not None and self.remote_api is RemoteApi.V2
        if self.predictor is not None and not self.feature_fields:
            raise ConfigError("--predictor reads the feature vectors of --feature-fields: give both")
        if self.feature_fields and not (self.predictor is not None or v2):
            raise ConfigError("--feature-fields is read by --predictor and --remote-url (--remote-api v2) "
                              "only: other models take the record's text")
        if v2 and not self.feature_fields and self.text_pair_field is not None:
            raise ConfigError("--text-pair-field is not for a V2 text model (one BYTES input: one text per "
                              "record)")
        if self.feature_fields and self.operator is Runner.ASYNC:
            raise ConfigError("--feature-fields runs on --operator arrow (the default): the async operator "
                              "carries texts")
        if self.text_pair_field is not None and self.operator is Runner.ASYNC:
            raise ConfigError("--text-pair-field runs on --operator arrow (the default): the async operator "
                              "carries one text per record")
        if (self.models is None) != (self.model is None and self.route is None) or (
                self.model is not None and self.route is not None):
            raise ConfigError("--models FILE goes with one of --model NAME (the job runs one named model) "
                              "or --route NAME (it runs a route over several)")
        if self.route is not None and self.operator is not Runner.ARROW:
            raise ConfigError("--route runs on --operator arrow (the default)")
        if self.max_dead_letter_rate is not None and self.max_dead_letter_rate >= 1:
            raise ConfigError(f"--max-dead-letter-rate must be < 1 (a share that can be passed), "
                              f"got {self.max_dead_letter_rate}")
        if self.restart_attempts > 2**31 - 1:
            raise ConfigError(f"--restart-attempts must be <= {2**31 - 1} (a Java int), "
                              f"got {self.restart_attempts}")
        if self.restart_strategy is RestartStrategy.EXPONENTIAL_DELAY and self.restart_attempts > 0:
            if self.restart_delay_s < 1:
                raise ConfigError("--restart-delay-s must be >= 1 for --restart-strategy exponential-delay "
                                  "(its first wait, which it doubles)")
            if self.restart_max_delay_s < self.restart_delay_s:
                raise ConfigError(f"--restart-max-delay-s ({self.restart_max_delay_s}) must be >= "
                                  f"--restart-delay-s ({self.restart_delay_s})")
        floor = self.min_transaction_timeout_ms
        if self.transaction_timeout_ms < floor:
            raise ConfigError(f"--transaction-timeout-ms {self.transaction_timeout_ms} is below {floor}: 2 x "
                              "(--checkpoint-interval-ms + --checkpoint-timeout-ms) + the longest restart "
                              "wait, and 2 x --timeout-s; a transaction that times out before its checkpoint "
                              "commits is lost")

    @property
    def concurrent_runs(self) -> int:
        """``pipeline_depth``; else, with ``--operator record``, ``parallelism`` (at most
        :data:`~pyflink_aisp.inference.handlers.MAX_CONCURRENT_RUNS`): in Flink's thread mode
        the subtasks of one TaskManager share one interpreter and its model, so each subtask's
        call runs beside the others' instead of queueing behind them; else 1."""
        if self.pipeline_depth is None and self.operator is Runner.RECORD:
            return min(self.parallelism, MAX_CONCURRENT_RUNS)
        return super().concurrent_runs

    def _device_default(self, option: Option) -> Any:
        """As :class:`InferenceOptions`; on a GPU or for a remote model the async operator's
        derived batch size is capped at ``--capacity`` (records in flight cap its batch)."""
        value = super()._device_default(option)
        capped = option.name == "max_batch_size" and self.operator is Runner.ASYNC and (
            self.device.is_gpu or self.remote_url is not None)
        if capped and isinstance(value, Derived):
            return Derived(min(value, self.capacity))
        return value

    def field_mapping(self) -> FieldMapping:
        """Where the text and id are, and the kept fields (:class:`~pyflink_aisp.kafka.FieldMapping`).

        Raises:
            ConfigError: A pointer is not one, or kept names clash.
        """
        keep = tuple(p.strip() for p in (self.keep_fields or "").split(",") if p.strip())
        features = tuple(p.strip() for p in (self.feature_fields or "").split(",") if p.strip())
        prompt = tuple(p.strip() for p in (self.prompt_fields or "").split(",") if p.strip())
        return FieldMapping(text=self.text_field, id=self.id_field, keep=keep, value_format=self.value_format,
                            features=features, schema_registry_url=self.schema_registry_url,
                            text_pair=self.text_pair_field, prompt_fields=prompt)

    def dead_letter_watch(self) -> DeadLetterWatchConfig:
        """The dead-letter watch of the job's operator: it warns above a share of 0.5 (or
        ``max_dead_letter_rate`` if lower) and fails the job above ``max_dead_letter_rate``."""
        limit = self.max_dead_letter_rate
        warn = DeadLetterWatchConfig().warn_share
        return DeadLetterWatchConfig(warn_share=warn if limit is None else min(warn, limit), max_share=limit)

    @property
    def lease_job(self) -> str:
        """The job of the affinity lease key: the job's name."""
        return self.name

    @property
    def bounded(self) -> bool:
        """Whether the job runs in BATCH mode (its source is bounded)."""
        return self.mode is RuntimeMode.BATCH

    @property
    def effective_separate_sinks(self) -> bool:
        """``separate_sinks``, else on for the record operator; never in BATCH (no checkpoints)."""
        if self.bounded:
            return False
        return self.operator is Runner.RECORD if self.separate_sinks is None else self.separate_sinks

    @property
    def effective_jvm_jit(self) -> JvmJit:
        """``jvm_jit``, else C1 only with a latency target (``--latency-slo-ms``), else tiered."""
        if self.jvm_jit is not None:
            return self.jvm_jit
        return JvmJit.TIERED if self.latency_slo_ms is None else JvmJit.C1

    @property
    def effective_startup_mode(self) -> StartupMode:
        """``startup_mode``, else earliest in batch and the group's offsets in streaming."""
        return self.startup_mode or _DEFAULT_STARTUP[self.mode]

    @property
    def servers(self) -> str:
        """The Kafka bootstrap servers: ``bootstrap_servers``, else
        :func:`~pyflink_aisp.kafka.default_bootstrap_servers`."""
        return default_bootstrap_servers(self.bootstrap_servers)

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
        return max(checkpoint_span + 1000 * self.longest_restart_delay_s, 2 * 1000 * self.timeout_s)

    @property
    def longest_restart_delay_s(self) -> int:
        """The longest wait before a restart: ``restart_max_delay_s`` (exponential-delay), else
        ``restart_delay_s``."""
        if self.restart_strategy is RestartStrategy.EXPONENTIAL_DELAY:
            return max(self.restart_delay_s, self.restart_max_delay_s)
        return self.restart_delay_s

    @property
    def transactional_prefix(self) -> str:
        """The sinks' transactional id prefix (the job name unless set); each sink adds
        ``-scores`` / ``-dlq``."""
        return self.transactional_id_prefix or self.name

    @classmethod
    def from_args(
        cls, argv: Sequence[str] | None = None, *, description: str = "",
        model_options: Callable[[Path, str], dict[str, Any]] | None = None,
    ) -> PipelineOptions:
        """The command line → options (``--help`` from the table; exits 2 on a bad flag).

        Args:
            argv: The arguments (default ``sys.argv[1:]``).
            description: Of ``--help``.
            model_options: ``(registry file, model name) -> option values`` for ``--models`` /
                ``--model`` (:func:`pyflink_aisp.pipeline.options_from_args` passes the registry's);
                None: those flags are refused.
        """
        parser = argparse.ArgumentParser(description=description)
        add_flags(parser)
        namespace = parser.parse_args(argv)
        try:
            values = {o.name: getattr(namespace, o.name) for o in OPTIONS}
            if values["models"] is not None and values["model"] is not None and values["route"] is None:
                if model_options is None:
                    raise ConfigError("--models is read by pyflink_aisp.pipeline.options_from_args, "
                                      "not by PipelineOptions.from_args")
                values.update(model_options(values["models"], values["model"]))
            return cls(**values)
        except ConfigError as exc:
            parser.error(str(exc))
            raise  # parser.error exits


def default_bundle_time_ms(latency_slo_ms: float | None) -> int:
    """``python.fn-execution.bundle.time`` for a latency target.

    Outputs leave the Python worker when its bundle ends, and each bundle end
    drains every record in flight: 50 ms for throughput without a target, else
    SLO / 30 within [5, 50] ms, as measured in decision record 1
    (``docs/decisions/0001-bundle-time-and-size.md``).

    Args:
        latency_slo_ms: The p99 target in ms, or None.

    Returns:
        The bundle time in ms, an int in [5, 50].
    """
    return 50 if latency_slo_ms is None else max(5, min(50, int(latency_slo_ms / 30)))


#: Every option of a packaged job, in ``--help`` and options-page order.
OPTIONS: tuple[Option, ...] = options_of(PipelineOptions)
#: The options a SQL function reads.
INFERENCE_OPTIONS: tuple[Option, ...] = options_of(InferenceOptions)
_BY_NAME = {o.name: o for o in OPTIONS}


def option(name: str) -> Option:
    """The option of a field name.

    Raises:
        KeyError: no such option.
    """
    return _BY_NAME[name]


def _flag_type(row: Option) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        try:
            return row.parse(text)
        except ConfigError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from exc

    parse.__name__ = row.name  # argparse names the type in its error
    return parse


def add_flags(parser: argparse.ArgumentParser) -> None:
    """Add one flag per option to ``parser`` (bools become ``store_true`` switches, except
    a nullable bool, which takes ``true``, ``false`` or ``none``)."""
    for row in OPTIONS:
        help_text = f"{row.doc} [{row.unit + ', ' if row.unit else ''}default {row.render_default()}]"
        if row.kind is bool and not row.nullable:
            parser.add_argument(row.flag, action="store_true", help=help_text)
        else:  # a device-aware option left out stays None: the device's default
            default = None if row.device_aware else row.default
            parser.add_argument(row.flag, type=_flag_type(row), default=default,
                                required=row.required, help=help_text.replace("%", "%%"))
