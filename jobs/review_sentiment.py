"""Review sentiment: Kafka → decode (DLQ) → tokenize + batched inference → Kafka, exactly once.

Reads JSON reviews ``{"id", "text", "label"}`` from ``--input-topic``, scores
each text with all-MiniLM-L6-v2 plus a logistic sentiment head (one ONNX
Runtime session per Python worker) and writes ``{"id", "label", "score",
"model_sha256"}`` (``"embedding"``: 384 floats with ``--with-embedding``) to
``--output-topic``; records that do not decode or score go to ``--dlq-topic``
with the reason. With ``--encoder-onnx`` / ``--encoder-tokenizer`` it runs any
ONNX text encoder instead and writes ``{"id", "embedding", "model_sha256"}``.
The graph is :func:`pyflink_aisp.pipeline.flink.build_pipeline`; every flag is
a row of the options table (``--help``, README "Options").

Run it locally (MiniCluster)::

    python jobs/review_sentiment.py --input-topic reviews --output-topic scores --mode batch

or on a cluster::

    flink run -pyexec $(which python) -py jobs/review_sentiment.py --input-topic ...

``--mode streaming`` (default) reads without end, checkpoints every
``--checkpoint-interval-ms`` and commits its Kafka transactions on each
checkpoint; it starts from the consumer group's committed offsets (earliest
for a new group). Stop it with ``flink stop`` (a savepoint: open transactions
commit) and resume with ``flink run -s <savepoint>``. ``--mode batch`` reads
from the earliest offset (or ``--startup-mode``) to the latest offsets at
start, so the run ends. The job creates its output and DLQ topics.
"""

from __future__ import annotations

import sys
import time

from pyflink_aisp.errors import AispError
from pyflink_aisp.pipeline import PipelineOptions


def main(argv: list[str] | None = None) -> int:
    """Run the job; returns the exit status (1 on a pyflink-aisp error, printed in one line)."""
    options = PipelineOptions.from_args(argv, description=__doc__.split("\n\n")[0])
    from pyflink_aisp.pipeline.flink import build_pipeline, make_environment

    start = time.perf_counter()
    try:
        t_env = make_environment(options)
        result = build_pipeline(t_env, options)
    except AispError as exc:
        print(f"review_sentiment: error: {exc}", file=sys.stderr)
        return 1
    client = result.get_job_client()
    job_id = client.get_job_id() if client is not None else "?"
    print(f"review_sentiment: job {job_id} submitted ({options.mode}, {options.operator.value} operator); "
          f"output {options.output_topic}, dead letters {options.dlq}", flush=True)
    if t_env.get_config().get("execution.attached", "true") == "false":
        return 0  # `flink run -d`: the job runs on; stop it with `flink stop`
    result.wait()
    print(f"review_sentiment: job {job_id} finished in {time.perf_counter() - start:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
