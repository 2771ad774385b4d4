"""Configuration of the SQL / Table API inference functions, from Flink job parameters.

:class:`TableInferenceConfig` is read in the functions' ``open()`` from the
global job parameters (``pipeline.global-job-parameters``) through the
``FunctionContext``; the ``*_PARAM`` constants are their names. ``none`` (or
empty) turns an optional knob off, and every validation error names the
parameter.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from pyflink_aisp.errors import ConfigError
from pyflink_aisp.inference._queue import BatchingConfig
from pyflink_aisp.inference._swap import ModelSwapConfig

__all__ = [
    "BATCH_LENGTH_BUCKETS_PARAM",
    "BATCH_MAX_IDLE_PARAM",
    "BATCH_MAX_SIZE_PARAM",
    "BATCH_MAX_TOKENS_PARAM",
    "BATCH_MAX_WAIT_PARAM",
    "INTRA_OP_THREADS_PARAM",
    "LATENCY_SLO_PARAM",
    "MODEL_DIR_ENV",
    "MODEL_DIR_PARAM",
    "MODEL_POINTER_PARAM",
    "MODEL_POLL_INTERVAL_PARAM",
    "STATS_DIR_PARAM",
    "TABLE_BATCHING",
    "JobParameters",
    "TableInferenceConfig",
]

#: Built model asset directory (``aisp model build`` output); else :data:`MODEL_DIR_ENV`, else the cache.
MODEL_DIR_PARAM = "aisp.model.dir"
#: Hot swap: the model pointer JSON file to poll (unset: never swap); see ``aisp model publish``.
MODEL_POINTER_PARAM = "aisp.model.pointer"
#: Hot swap: seconds between two reads of the pointer.
MODEL_POLL_INTERVAL_PARAM = "aisp.model.poll-interval-s"
#: Most records per model call.
BATCH_MAX_SIZE_PARAM = "aisp.batch.max-size"
#: Longest a record waits for companions while the model is idle, in ms.
BATCH_MAX_WAIT_PARAM = "aisp.batch.max-wait-ms"
#: Padded-token budget per model call (rows x longest row); ``none`` for no budget.
BATCH_MAX_TOKENS_PARAM = "aisp.batch.max-tokens"
#: Comma-separated ascending token-length bucket bounds, e.g. ``16,32,64``.
BATCH_LENGTH_BUCKETS_PARAM = "aisp.batch.length-buckets"
#: A batch also leaves when no record arrived for this long, in ms; ``none`` to turn it off.
BATCH_MAX_IDLE_PARAM = "aisp.batch.max-idle-ms"
#: p99 latency target in ms for the SLO controller; ``none`` for fixed knobs.
LATENCY_SLO_PARAM = "aisp.latency-slo-ms"
#: ONNX Runtime intra-op threads; ``0`` for ORT's default (one per physical core).
INTRA_OP_THREADS_PARAM = "aisp.onnx.intra-op-threads"
#: Directory where each worker writes its batcher statistics as JSON (unset: none).
STATS_DIR_PARAM = "aisp.stats.dir"
#: Environment variable naming the model asset directory (when the job parameter is unset).
MODEL_DIR_ENV = "AISP_MODEL_DIR"

#: Default batching of the SQL functions: 64 records, 5 ms, released after 2 ms without input
#: (PyFlink ends each bundle by waiting for every row in flight; as the DataStream job's default).
TABLE_BATCHING = BatchingConfig(max_batch_size=64, max_wait_ms=5.0, max_idle_ms=2.0)

#: ``get_job_parameter(key, default)`` of a Flink ``FunctionContext``.
JobParameters = Callable[[str, str], str]

_NONE_WORDS = ("", "none", "null")
#: Config field → job parameter, to name the parameter in validation errors.
_FIELD_PARAMS = {
    "max_batch_size": BATCH_MAX_SIZE_PARAM,
    "max_wait_ms": BATCH_MAX_WAIT_PARAM,
    "max_idle_ms": BATCH_MAX_IDLE_PARAM,
    "max_batch_tokens": BATCH_MAX_TOKENS_PARAM,
    "length_buckets": BATCH_LENGTH_BUCKETS_PARAM,
    "latency_slo_ms": LATENCY_SLO_PARAM,
    "intra_op_threads": INTRA_OP_THREADS_PARAM,
    "poll_interval_s": MODEL_POLL_INTERVAL_PARAM,
}


@dataclass(frozen=True, kw_only=True)
class TableInferenceConfig:
    """What the SQL functions load and how they batch.

    Attributes:
        model_dir: Built model assets (``minilm-sentiment-*`` directory); None:
            ``$AISP_MODEL_DIR``, else the cached build (built on first use).
        batching: Batch size, wait, idle release, token budget, length buckets
            and p99 target (default :data:`TABLE_BATCHING`).
        intra_op_threads: ONNX Runtime intra-op threads (≥ 1), None: ORT's default.
        swap: Where to look for new model versions (hot swap between batches;
            every row carries the version that scored it); None: never swap.
        stats_dir: Where each worker writes ``aisp-stats-<pid>.json`` with its
            batcher counts (``batches``, ``records``, ``max_batch_size``,
            ``sizes``) every 0.1 s while they change and on close; None: not written.

    Job parameters (all optional; :meth:`from_job_parameters`):
    ``aisp.model.dir``, ``aisp.batch.max-size``, ``aisp.batch.max-wait-ms``,
    ``aisp.batch.max-idle-ms``, ``aisp.batch.max-tokens``, ``aisp.batch.length-buckets``,
    ``aisp.latency-slo-ms``, ``aisp.onnx.intra-op-threads``, ``aisp.model.pointer``,
    ``aisp.model.poll-interval-s``, ``aisp.stats.dir``.

    Raises:
        ConfigError: ``intra_op_threads`` < 1.
    """

    model_dir: Path | None = None
    batching: BatchingConfig = TABLE_BATCHING
    intra_op_threads: int | None = None
    swap: ModelSwapConfig | None = None
    stats_dir: Path | None = None

    def __post_init__(self) -> None:
        if self.intra_op_threads is not None and self.intra_op_threads < 1:
            raise ConfigError(f"intra_op_threads must be >= 1 or None, got {self.intra_op_threads}")

    @classmethod
    def from_job_parameters(
        cls, get: JobParameters, *, base: TableInferenceConfig | None = None
    ) -> TableInferenceConfig:
        """``base`` (default: the defaults) overridden by the job parameters that are set.

        Args:
            get: ``FunctionContext.get_job_parameter`` (``(key, default) -> str``).
            base: Values for the parameters that are not set.

        Raises:
            ConfigError: A parameter is not a number of the right kind or is out of
                range (the message names the parameter).
        """
        base = base or cls()
        b = base.batching
        try:
            batching = replace(
                b,
                max_batch_size=_number(get, BATCH_MAX_SIZE_PARAM, b.max_batch_size, int),
                max_wait_ms=_number(get, BATCH_MAX_WAIT_PARAM, b.max_wait_ms, float),
                max_idle_ms=_optional(get, BATCH_MAX_IDLE_PARAM, b.max_idle_ms, float),
                max_batch_tokens=_optional(get, BATCH_MAX_TOKENS_PARAM, b.max_batch_tokens, int),
                length_buckets=_buckets(get, b.length_buckets),
                latency_slo_ms=_optional(get, LATENCY_SLO_PARAM, b.latency_slo_ms, float),
            )
            threads = _number(get, INTRA_OP_THREADS_PARAM, base.intra_op_threads or 0, int)
            return cls(
                model_dir=_path(get, MODEL_DIR_PARAM, base.model_dir),
                batching=batching,
                intra_op_threads=None if threads == 0 else threads,
                swap=_swap(get, base.swap),
                stats_dir=_path(get, STATS_DIR_PARAM, base.stats_dir),
            )
        except ConfigError as exc:
            named = [param for name, param in _FIELD_PARAMS.items() if name in str(exc)]
            if not named:  # the message names the parameter already
                raise
            raise ConfigError(f"job parameter {named[0]}: {exc}") from exc

    def job_parameters(self) -> dict[str, str]:
        """This config as job parameters (the inverse of :meth:`from_job_parameters`)."""
        b = self.batching
        params = {
            BATCH_MAX_SIZE_PARAM: str(b.max_batch_size),
            BATCH_MAX_WAIT_PARAM: repr(float(b.max_wait_ms)),
            BATCH_MAX_IDLE_PARAM: "none" if b.max_idle_ms is None else repr(float(b.max_idle_ms)),
            BATCH_MAX_TOKENS_PARAM: "none" if b.max_batch_tokens is None else str(b.max_batch_tokens),
            BATCH_LENGTH_BUCKETS_PARAM: ",".join(str(x) for x in b.length_buckets) or "none",
            LATENCY_SLO_PARAM: "none" if b.latency_slo_ms is None else repr(float(b.latency_slo_ms)),
            INTRA_OP_THREADS_PARAM: str(self.intra_op_threads or 0),
        }
        if self.model_dir is not None:
            params[MODEL_DIR_PARAM] = str(self.model_dir)
        if self.swap is not None:
            params[MODEL_POINTER_PARAM] = str(self.swap.pointer_path)
            params[MODEL_POLL_INTERVAL_PARAM] = repr(float(self.swap.poll_interval_s))
        if self.stats_dir is not None:
            params[STATS_DIR_PARAM] = str(self.stats_dir)
        return params

    def model_assets(self) -> Any:
        """The :class:`~pyflink_aisp.models.ModelAssets` to load: ``model_dir``, else
        ``$AISP_MODEL_DIR``, else the cached build (built on first use, ~30 s).

        Raises:
            ModelError: The directory has no valid manifest or the build failed.
            ChecksumError: A file differs from its manifest.
        """
        from pyflink_aisp.models import ensure_model_assets, load_model_assets

        directory = self.model_dir or (
            Path(os.environ[MODEL_DIR_ENV]) if os.environ.get(MODEL_DIR_ENV) else None
        )
        return load_model_assets(directory) if directory is not None else ensure_model_assets()


def _raw(get: JobParameters, key: str) -> str | None:
    value = get(key, "")
    return None if value is None or not value.strip() else value.strip()


def _number(get: JobParameters, key: str, default: Any, kind: type) -> Any:
    value = _raw(get, key)
    if value is None:
        return default
    try:
        return kind(value)
    except ValueError as exc:
        what = "an integer" if kind is int else "a number"
        raise ConfigError(f"{key} must be {what}, got {value!r}") from exc


def _optional(get: JobParameters, key: str, default: Any, kind: type) -> Any:
    value = _raw(get, key)
    if value is not None and value.lower() in _NONE_WORDS:
        return None
    return _number(get, key, default, kind)


def _buckets(get: JobParameters, default: tuple[int, ...]) -> tuple[int, ...]:
    value = _raw(get, BATCH_LENGTH_BUCKETS_PARAM)
    if value is None:
        return default
    if value.lower() in _NONE_WORDS:
        return ()
    # ';' as well as ',': in the legacy 'k:v,k:v' form of the job parameters ',' separates entries.
    parts = [p.strip() for p in value.replace(";", ",").split(",") if p.strip()]
    try:
        return tuple(int(p) for p in parts)
    except ValueError as exc:
        raise ConfigError(f"{BATCH_LENGTH_BUCKETS_PARAM} must list integers, got {value!r}") from exc


def _path(get: JobParameters, key: str, default: Path | None) -> Path | None:
    value = _raw(get, key)
    return default if value is None else Path(value)


def _swap(get: JobParameters, default: ModelSwapConfig | None) -> ModelSwapConfig | None:
    pointer = _path(get, MODEL_POINTER_PARAM, None)
    interval = _raw(get, MODEL_POLL_INTERVAL_PARAM)
    if pointer is None and interval is None:
        return default
    if pointer is None:
        if default is None:
            raise ConfigError(f"{MODEL_POLL_INTERVAL_PARAM} is set but {MODEL_POINTER_PARAM} is not")
        pointer = default.pointer_path
    poll_s = _number(get, MODEL_POLL_INTERVAL_PARAM, default.poll_interval_s if default else 2.0, float)
    return ModelSwapConfig(pointer_path=pointer, poll_interval_s=poll_s)
