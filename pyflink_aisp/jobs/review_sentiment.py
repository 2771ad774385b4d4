"""Review sentiment: Kafka → decode (DLQ) → tokenize + batched inference → Kafka, exactly once.

Reads JSON reviews ``{"id", "text", "label"}`` from ``--input-topic``, scores
each text with all-MiniLM-L6-v2 plus a logistic sentiment head (one ONNX
Runtime session per Python worker) and writes ``{"id", "label", "score",
"model_sha256"}`` (``"embedding"``: 384 floats with ``--with-embedding``) to
``--output-topic``; records that do not decode or score go to ``--dlq-topic``
with the reason. Every output and dead letter carries the Kafka header
``aisp.source`` = ``topic/partition/offset`` of its input record. With
``--encoder-onnx`` / ``--encoder-tokenizer`` it runs any ONNX text encoder
instead and writes ``{"id", "embedding", "model_sha256"}``. The graph is
:func:`pyflink_aisp.pipeline.flink.build_pipeline`, run by
:func:`pyflink_aisp.pipeline.flink.run_job`; every flag is a row of the
options table (``--help``, docs/options.md).

It ships inside the package, so no source checkout is needed to run it. Locally
(MiniCluster)::

    python -m pyflink_aisp.jobs.review_sentiment --input-topic reviews --output-topic scores --mode batch

or on a cluster (``jobs/review_sentiment.py`` in the source tree runs the same ``main``)::

    flink run -pyexec $(which python) -pyclientexec $(which python) \
        -pym pyflink_aisp.jobs.review_sentiment --input-topic ...

``--mode streaming`` (default) reads without end, checkpoints every
``--checkpoint-interval-ms`` and commits its Kafka transactions on each
checkpoint; it starts from the consumer group's committed offsets (earliest
for a new group) or ``--range-start``. Stop it with ``flink stop`` (a
savepoint: open transactions commit) and resume with ``flink run -s
<savepoint>``. ``--mode batch`` reads the range ``--range-start`` (default
earliest) to ``--range-end`` (default: the last stable offset at start), so
the run ends. ``--manifest-dir`` writes run manifests. The job creates its
output and DLQ topics.
"""

from __future__ import annotations

import sys

from pyflink_aisp.pipeline import options_from_args

__all__ = ["MODULE", "main"]

#: The module name ``flink run -pym`` takes.
MODULE = "pyflink_aisp.jobs.review_sentiment"


def main(argv: list[str] | None = None) -> int:
    """Run the job; returns the exit status (1 on a pyflink-aisp error, printed in one line)."""
    options = options_from_args(argv, description=__doc__.split("\n\n")[0])
    from pyflink_aisp.pipeline.flink import run_job  # imports PyFlink: after --help and flag errors

    return run_job(options, prog="review_sentiment")


if __name__ == "__main__":
    sys.exit(main())
