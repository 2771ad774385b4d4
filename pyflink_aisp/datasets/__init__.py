"""Real data sets used by the jobs, tests and benchmarks.

Public API: :class:`Review`, :func:`load_rotten_tomatoes`,
:func:`split_reviews`, :func:`is_heldout`, :func:`rotten_tomatoes_path` and the
split constants.
"""

from __future__ import annotations

from pyflink_aisp.datasets._rotten_tomatoes import (
    DEFAULT_HELDOUT_FRACTION,
    DEFAULT_SPLIT_SEED,
    ROTTEN_TOMATOES_SHA256,
    Review,
    is_heldout,
    load_rotten_tomatoes,
    rotten_tomatoes_path,
    split_reviews,
)

__all__ = [
    "DEFAULT_HELDOUT_FRACTION",
    "DEFAULT_SPLIT_SEED",
    "ROTTEN_TOMATOES_SHA256",
    "Review",
    "is_heldout",
    "load_rotten_tomatoes",
    "rotten_tomatoes_path",
    "split_reviews",
]
