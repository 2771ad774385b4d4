"""``aisp demo``: the main job on the real reviews, end to end, on the local stack.

Starts the embedded stack (Kafka broker + Flink standalone cluster) unless it
already runs, builds or reuses the model, ingests all 12,808 labelled reviews
into a fresh topic, runs ``jobs/review_sentiment.py`` in BATCH mode (``flink
run`` on the cluster, or a local MiniCluster with ``--runner local``), reads the
committed output and DLQ, and prints counts, throughput, held-out accuracy and
the throughput of a plain ONNX Runtime loop over the same texts for
comparison. Stops what it started.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from pyflink_aisp.errors import AispError
from pyflink_aisp.jobs.review_sentiment import MODULE as JOB_MODULE
from pyflink_aisp.local import LocalStack

__all__ = ["DemoResult", "run_demo"]

_TOPIC_PREFIX = "aisp-demo-"


@dataclass(frozen=True, kw_only=True)
class DemoResult:
    """What the demo measured."""

    ingested: int
    processed: int
    dlq: int
    job_seconds: float
    output_span_seconds: float
    heldout_accuracy: float
    heldout_scored: int
    baseline_records_per_s: float

    @property
    def records_per_s(self) -> float:
        """Processed records per second of job wall time (submission to end, start-up included)."""
        return self.processed / self.job_seconds if self.job_seconds > 0 else 0.0

    @property
    def steady_records_per_s(self) -> float:
        """Processed records per second between the first and the last output record
        (Kafka CreateTime, ms resolution): the rate once the job runs."""
        return self.processed / self.output_span_seconds if self.output_span_seconds > 0 else 0.0


def _fresh_topics(bootstrap: str) -> tuple[str, str, str]:
    from pyflink_aisp.kafka import create_topics, delete_topics, list_topics

    old = [t for t in list_topics(bootstrap) if t.startswith(_TOPIC_PREFIX)]
    delete_topics(bootstrap, old)
    run = time.strftime("%Y%m%d-%H%M%S")
    topics = (f"{_TOPIC_PREFIX}{run}-reviews", f"{_TOPIC_PREFIX}{run}-scores",
              f"{_TOPIC_PREFIX}{run}-dlq")
    create_topics(bootstrap, topics)
    return topics


def _run_job(
    stack: LocalStack, runner: str, bootstrap: str, topics: tuple[str, str, str], model_dir: Path
) -> float:
    args = ["--bootstrap-servers", bootstrap, "--input-topic", topics[0], "--output-topic", topics[1],
            "--dlq-topic", topics[2], "--mode", "batch", "--model-dir", str(model_dir)]
    if runner == "cluster":
        cmd, env = stack.flink_run_command(JOB_MODULE, *args, module=True), stack.flink_env()
    else:
        cmd, env = [sys.executable, "-m", JOB_MODULE, *args], None
    start = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-40:])
        raise AispError(f"the job failed (exit {proc.returncode}):\n{tail}")
    return elapsed


def _baseline(assets: object, texts: list[str]) -> float:
    from pyflink_aisp.inference.handlers import OnnxSentimentModel
    from pyflink_aisp.pipeline import InferenceOptions

    # Batches of the job's own most (32): on the whole corpus faster than the model's default of 64
    # (bench/inference_bench.py: 690 against 592 records/s in one run).
    model = OnnxSentimentModel(assets, batch_size=InferenceOptions().max_batch_size)  # type: ignore[arg-type]
    start = time.perf_counter()
    model.predict(texts)
    return len(texts) / (time.perf_counter() - start)


@dataclass(frozen=True, kw_only=True)
class _Outputs:
    processed: int
    dlq: int
    accuracy: float
    heldout: int
    span_s: float


def _score(bootstrap: str, topics: tuple[str, str, str], truth: dict[str, int]) -> _Outputs:
    from pyflink_aisp.datasets import is_heldout
    from pyflink_aisp.kafka import read_topic

    out = read_topic(bootstrap, topics[1], min_count=len(truth), timeout_s=120)
    dlq = read_topic(bootstrap, topics[2], timeout_s=10)
    predicted = {}
    for msg in out:
        doc = json.loads(msg.value() or b"{}")
        predicted[doc["id"]] = 1 if doc["label"] == "fresh" else 0
    held = [rid for rid in predicted if rid in truth and is_heldout(rid)]
    correct = sum(predicted[rid] == truth[rid] for rid in held)
    stamps = [m.timestamp()[1] for m in out]
    span_s = (max(stamps) - min(stamps)) / 1000.0 if stamps else 0.0
    return _Outputs(processed=len(predicted), dlq=len(dlq), accuracy=correct / max(len(held), 1),
                    heldout=len(held), span_s=span_s)


def run_demo(*, runner: str = "cluster", keep_stack: bool = False) -> DemoResult:
    """Run the demo and print its report (see the module docstring).

    Raises:
        AispError: a step failed (the message says which and how to fix it).
    """
    from pyflink_aisp.datasets import load_rotten_tomatoes
    from pyflink_aisp.jars import flink_connector_jars
    from pyflink_aisp.kafka import ingest_records
    from pyflink_aisp.local import LocalStackConfig
    from pyflink_aisp.models import ensure_model_assets

    stack = LocalStack(LocalStackConfig(with_flink=runner == "cluster"))
    before = stack.status()
    was_running = before.kafka.running and (runner == "local" or before.flink.running)
    status = stack.up()
    try:
        flink_connector_jars()
        assets = ensure_model_assets()
        print(f"model      {assets.sha256[:12]}  held-out accuracy at build {assets.heldout_accuracy:.4f}")
        reviews = load_rotten_tomatoes()
        bootstrap = str(status.bootstrap_servers)
        topics = _fresh_topics(bootstrap)
        label = {1: "fresh", 0: "rotten"}
        ingest = ingest_records(bootstrap, topics[0], ({"id": r.id, "text": r.text, "label": label[r.label]}
                                                       for r in reviews), total=len(reviews))
        print(f"ingested   {ingest.delivered} (failed {ingest.failed}) into {topics[0]}")
        job_s = _run_job(stack, runner, bootstrap, topics, assets.directory)
        outputs = _score(bootstrap, topics, {r.id: r.label for r in reviews})
        base = _baseline(assets, [r.text for r in reviews])
    finally:
        if not keep_stack and not was_running:
            stack.down()
    result = DemoResult(ingested=ingest.delivered, processed=outputs.processed, dlq=outputs.dlq,
                        job_seconds=job_s, output_span_seconds=outputs.span_s,
                        heldout_accuracy=outputs.accuracy, heldout_scored=outputs.heldout,
                        baseline_records_per_s=base)
    _report(result, runner)
    return result


def _report(r: DemoResult, runner: str) -> None:
    print(f"processed  {r.processed}")
    print(f"dlq        {r.dlq}")
    print(f"accuracy   {r.heldout_accuracy:.4f} on the held-out split ({r.heldout_scored} reviews)")
    print(f"throughput {r.steady_records_per_s:.0f} records/s steady state (first to last output, "
          f"{r.output_span_seconds:.1f} s); {r.records_per_s:.0f} records/s over the job's wall time "
          f"({r.job_seconds:.1f} s, job start-up included; runner {runner})")
    print(f"baseline   {r.baseline_records_per_s:.0f} records/s (plain ONNX Runtime loop, same texts)")
