"""The review sentiment job (:mod:`pyflink_aisp.jobs.review_sentiment`, which ships in the package).

This file lets a source checkout run it as a script: ``python jobs/review_sentiment.py --help`` or
``flink run -py jobs/review_sentiment.py ...``; an installed package runs the same ``main`` with
``python -m pyflink_aisp.jobs.review_sentiment`` or ``flink run -pym pyflink_aisp.jobs.review_sentiment``.
"""

import sys

from pyflink_aisp.jobs.review_sentiment import main

if __name__ == "__main__":
    sys.exit(main())
