"""Your own handler in the packaged job: Kafka → the lexicon handler → Kafka, exactly once.

The graph is :func:`pyflink_aisp.pipeline.flink.build_pipeline` (run by
:func:`~pyflink_aisp.pipeline.flink.run_job`) with a
:class:`lexicon_handler.LexiconSentimentHandler` object instead of the handler
the options name: it reads JSON reviews ``{"id", "text"}`` from
``--input-topic`` and writes the fields the handler's task declares,
``{"id", "label", "score", "known_words", "model_sha256"}``, to
``--output-topic``; bad records go to the DLQ topic with their reason. Every
other flag is a row of the options table (``--help``).

``--lexicon PATH`` is the lexicon file; when it does not exist it is trained
first on the project's train split of the Rotten Tomatoes reviews (0.1 s).
The path must be readable on every TaskManager (on the local standalone
cluster: this host). ``lexicon_handler.py`` beside this script travels to the
Python workers by value (cloudpickle), so no ``-pyfs`` is needed::

    aisp local flink run -py jobs/examples/lexicon_job.py --lexicon /tmp/lexicon.json \\
        --input-topic reviews --output-topic lexicon-scores --mode batch
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from pyflink_aisp.inference import ModelHandler


def _handler(path: Path) -> ModelHandler[Any, Any, Any]:
    """The handler of the lexicon at ``path`` (trained there first when missing)."""
    import cloudpickle

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import lexicon_handler

    from pyflink_aisp.checksums import sha256_file
    from pyflink_aisp.datasets import load_rotten_tomatoes, split_reviews

    cloudpickle.register_pickle_by_value(lexicon_handler)  # the workers need not import it
    if not path.exists():
        train, _ = split_reviews(load_rotten_tomatoes())
        path.parent.mkdir(parents=True, exist_ok=True)
        lexicon_handler.train_lexicon(train).save(path)
    handler: ModelHandler[Any, Any, Any] = lexicon_handler.LexiconSentimentHandler(path, sha256_file(path))
    return handler


def main(argv: list[str] | None = None) -> int:
    """Run the job; returns the exit status (1 on a pyflink-aisp error, printed in one line)."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--lexicon", type=Path, required=True, help="the lexicon file (trained when missing)")
    own, rest = parser.parse_known_args(argv)
    from pyflink_aisp.pipeline import options_from_args

    options = options_from_args(rest, description=__doc__.split("\n\n")[0])
    from pyflink_aisp.pipeline.flink import run_job

    return run_job(options, _handler(own.lexicon.resolve()), prog="lexicon_job")


if __name__ == "__main__":
    sys.exit(main())
