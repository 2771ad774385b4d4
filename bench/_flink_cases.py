"""Cases (b) and (c) of the inference benchmark: the model in plain PyFlink Python UDFs.

Both run as Table API jobs on a MiniCluster in this process, BATCH runtime
mode, parallelism 1, over ``from_elements`` (the same texts as the plain
loop) into a ``blackhole`` sink, with PyFlink's default Python-worker settings
(process mode; bundle size, bundle time and Arrow batch size untouched and
reported). The UDFs live in ``_flink_udfs.py``, shipped to the worker.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["UdfResult", "python_worker_defaults", "run_udf_cases"]

_UDFS = Path(__file__).resolve().parent / "_flink_udfs.py"


@dataclass(frozen=True, kw_only=True)
class UdfResult:
    """One UDF case.

    Attributes:
        rows: Rows the UDF scored.
        compute_s: First call's start to last call's end, seconds (steady state).
        job_s: The job's wall time, submission to end (start-up included), seconds.
        batch_sizes: Rows per UDF call -> number of calls.
    """

    rows: int
    compute_s: float
    job_s: float
    batch_sizes: dict[int, int] = field(default_factory=dict)

    @property
    def records_per_s(self) -> float:
        """Rows per second of steady state (start-up and model load excluded)."""
        return self.rows / self.compute_s if self.compute_s > 0 else 0.0


def _environment() -> Any:
    from pyflink.table import EnvironmentSettings, TableEnvironment

    t_env = TableEnvironment.create(EnvironmentSettings.in_batch_mode())
    config = t_env.get_config()
    config.set("python.executable", sys.executable)
    config.set("python.client.executable", sys.executable)
    config.set("parallelism.default", "1")
    t_env.add_python_file(str(_UDFS))
    return t_env


def python_worker_defaults() -> dict[str, str]:
    """PyFlink's default bundle size, bundle time (ms) and Arrow batch size, read from the JVM."""
    from pyflink.java_gateway import get_gateway

    options = get_gateway().jvm.org.apache.flink.python.PythonOptions
    return {
        "python.fn-execution.bundle.size": str(options.MAX_BUNDLE_SIZE.defaultValue()),
        "python.fn-execution.bundle.time": str(options.MAX_BUNDLE_TIME_MILLS.defaultValue()),
        "python.fn-execution.arrow.batch.size": str(options.MAX_ARROW_BATCH_SIZE.defaultValue()),
    }


def _run_one(t_env: Any, texts: list[str], function: Any, func_type: str, timing: Path) -> UdfResult:
    from pyflink.table import DataTypes
    from pyflink.table.expressions import col
    from pyflink.table.udf import udf

    score = udf(function, result_type=DataTypes.FLOAT(), func_type=func_type)
    source = t_env.from_elements([(t,) for t in texts],
                                 DataTypes.ROW([DataTypes.FIELD("text", DataTypes.STRING())]))
    sink = f"sink_{func_type}"
    t_env.execute_sql(f"CREATE TEMPORARY TABLE {sink} (score FLOAT) WITH ('connector' = 'blackhole')")
    start = time.perf_counter()
    source.select(score(col("text"))).execute_insert(sink).wait()
    job_s = time.perf_counter() - start
    if not timing.exists():
        raise RuntimeError(f"the {func_type} UDF wrote no timing record (close() not called?)")
    record = json.loads(timing.read_text())
    return UdfResult(rows=record["rows"], compute_s=record["last_end_s"] - record["first_start_s"],
                     job_s=job_s, batch_sizes={int(k): v for k, v in record["batch_sizes"].items()})


def run_udf_cases(
    texts: list[str], model_dir: Path, *, intra_op_threads: int, batch_size: int, cases: set[str]
) -> dict[str, UdfResult]:
    """Run the per-record UDF (``"b"``) and the pandas UDF (``"c"``) that ``cases`` names.

    Args:
        texts: Review texts, one row each.
        model_dir: Built model assets.
        intra_op_threads: ONNX Runtime intra-op threads in the worker.
        batch_size: ``OnnxSentimentModel.batch_size`` for the pandas UDF's ``predict``.
        cases: Subset of ``{"b", "c"}``.

    Returns:
        Case letter -> result.
    """
    import _flink_udfs

    t_env = _environment()
    out: dict[str, UdfResult] = {}
    with tempfile.TemporaryDirectory(prefix="aisp-bench-udf-") as tmp:
        for case, cls, func_type, size in (("b", _flink_udfs.PerRecordScore, "general", 1),
                                           ("c", _flink_udfs.PandasScore, "pandas", batch_size)):
            if case not in cases:
                continue
            timing = Path(tmp) / f"{case}.json"
            print(f"[{case}] PyFlink {func_type} UDF over {len(texts):,} texts ...", flush=True)
            function = cls(str(model_dir), intra_op_threads, size, str(timing))
            out[case] = _run_one(t_env, texts, function, func_type, timing)
            print(f"[{case}] {out[case].records_per_s:,.0f} records/s "
                  f"(job {out[case].job_s:.1f} s)", flush=True)
    return out
