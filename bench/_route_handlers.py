"""Handlers of ``bench/route_isolation.py``: the lexicon model with a set delay per call.

:class:`DelayedLexiconHandler` is ``jobs/examples/lexicon_handler.py``'s
:class:`LexiconSentimentHandler` whose ``run_inference`` also sleeps
``delay_ms_per_batch + delay_ms_per_record * len(batch)`` ms: a model whose cost is known
exactly, so that a second route's latency can be read against it. The sleep holds the model's
batching thread (as a model call does) but no CPU, so a slowed model does not take cores from
the other route on a small machine: what changes is only time spent waiting.

Both files are shipped to the workers with ``flink run -pyfs bench/_route_handlers.py,
jobs/examples/lexicon_handler.py``; the registry names the class
``_route_handlers:DelayedLexiconHandler``.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

from lexicon_handler import Lexicon, LexiconScore, LexiconSentimentHandler

from pyflink_aisp.errors import ConfigError

__all__ = ["DelayedLexiconHandler"]


class DelayedLexiconHandler(LexiconSentimentHandler):
    """The lexicon scorer, slowed by a fixed delay per model call and per record.

    Args:
        path: The lexicon JSON (``Lexicon.save``).
        sha256: Its sha256 (the model version).
        delay_ms_per_record: Sleep per record of a call, ms.
        delay_ms_per_batch: Sleep per call, ms.

    Raises:
        ConfigError: A negative delay.
    """

    def __init__(
        self, path: Path, sha256: str, *, delay_ms_per_record: float = 0.0, delay_ms_per_batch: float = 0.0
    ) -> None:
        super().__init__(path, sha256)
        if delay_ms_per_record < 0 or delay_ms_per_batch < 0:
            raise ConfigError(
                f"delays must be >= 0 ms, got {delay_ms_per_record} per record and "
                f"{delay_ms_per_batch} per batch"
            )
        self.delay_ms_per_record = float(delay_ms_per_record)
        self.delay_ms_per_batch = float(delay_ms_per_batch)

    def run_inference(self, batch: Sequence[str], model: Lexicon) -> list[LexiconScore]:
        """The lexicon's scores, after sleeping ``delay_ms_per_batch + delay_ms_per_record * n`` ms."""
        time.sleep((self.delay_ms_per_batch + self.delay_ms_per_record * len(batch)) / 1000.0)
        return super().run_inference(batch, model)
