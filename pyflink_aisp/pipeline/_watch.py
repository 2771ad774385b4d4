"""The dead-letter watch: one loud line when a job dead-letters most of what it reads.

A job that reads a topic of another shape (``{"review_id", "body"}`` where it expects
``{"id", "text"}``) dead-letters every record and otherwise finishes "fine"; the circuit
breaker judges inference failures only (a bad record is data, not a broken model).
:class:`DeadLetterWatch` counts every outcome of one operator in tumbling windows of
:attr:`DeadLetterWatchConfig.window` records and, once the window holds
:attr:`DeadLetterWatchConfig.min_records`, compares its dead-letter share with:

* ``warn_share``: above it the watch logs one WARNING line (logger
  ``pyflink_aisp.dead_letters``, in the TaskManager log) naming the share, the top
  reason, one record's detail and the likely fix, and raises its ``deadLetterAlarm``
  gauge; one line when it starts, one when a window ends at or below the share again;
* ``max_share`` (``--max-dead-letter-rate``, off by default): once the window holds more
  dead letters than ``max_share`` x ``window`` (so its share is above ``max_share`` whatever
  the rest of it brings; a burst early in a window does not decide it) the job fails with
  :class:`~pyflink_aisp.errors.DeadLetterRateError` carrying the same line.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from pyflink_aisp.errors import ConfigError, DeadLetterRateError
from pyflink_aisp.outcome import DeadLettered, Reason

__all__ = ["DeadLetterWatch", "DeadLetterWatchConfig", "likely_fix"]

LOG = logging.getLogger("pyflink_aisp.dead_letters")

_NOT_JSON = ("the records are not UTF-8 JSON objects: check --input-topic and the producer's value "
             "serializer")
#: Reason → the likely fix named in the watch's line.
_FIXES: dict[Reason, str] = {
    Reason.NULL_VALUE: "the topic holds tombstones (null values): is --input-topic a compacted changelog?",
    Reason.INVALID_UTF8: _NOT_JSON,
    Reason.INVALID_JSON: _NOT_JSON,
    Reason.NOT_AN_OBJECT: _NOT_JSON,
    Reason.DUPLICATE_KEY: "the producer writes JSON objects with a repeated name: fix the producer",
    Reason.MISSING_TEXT: "the job reads the text at --text-field (default /text) of each JSON object: "
                         "point --text-field (and --id-field) at your records' fields, e.g. --text-field "
                         "/body, or check --input-topic",
    Reason.TEXT_NOT_STRING: "the field 'text' must be a JSON string",
    Reason.MISSING_FEATURE: "the records lack a field of --feature-fields: point it at your records' "
                            "numeric fields, e.g. --feature-fields /features or /amount,/age",
    Reason.INVALID_AVRO: "the values are not Avro in the Confluent wire format (magic byte 0, schema id): "
                         "check the producer's serializer, or --value-format",
    Reason.UNKNOWN_SCHEMA: "the Schema Registry does not serve the records' schema ids: check "
                           "--schema-registry-url (Apicurio: .../apis/ccompat/v7)",
    Reason.BAD_FEATURE: "each field of --feature-fields must be a JSON number (or one array of numbers)",
    Reason.INVALID_UNICODE: "the texts hold lone UTF-16 surrogate escapes (\\ud800): fix the producer",
    Reason.BAD_ID: "'id' must be a non-empty string or an integer (absent or null: the record's "
                   "topic/partition/offset)",
    Reason.DECODE_ERROR: "an unforeseen decoder error: report it with a record from the dead-letter topic",
    Reason.NO_ROUTE: "no rule of --route takes these records: give the route a default, or a rule for them",
    Reason.INFERENCE_ERROR: "the model fails on these records: see the dead letters' detail",
    Reason.INFERENCE_TIMEOUT: "the model is slower than --timeout-s: raise it or scale out",
    Reason.REMOTE_ERROR: "the model server refuses or fails these requests: see the status in the dead "
                         "letters' detail",
    Reason.REMOTE_TIMEOUT: "the model server does not answer within --remote-deadline-s: raise it, or "
                           "lower --remote-max-concurrency",
    Reason.PROMPT_TOO_LONG: "the prompts do not fit the model's context: --prompt-overflow truncate cuts "
                            "the text to --prompt-max-tokens, or shorten --prompt-template",
    Reason.INVALID_MODEL_OUTPUT: "the model's answers do not fit --json-schema: make the prompt ask for it, "
                                 "or use a server that enforces the schema (response_format)",
    Reason.OVERSIZED_OUTPUT: "outputs exceed the sink's record limit: raise --max-request-size and the "
                             "output topic's max.message.bytes",
}


def likely_fix(reason: Reason) -> str:
    """The fix the watch's line names for ``reason`` (a sentence, no final period)."""
    return _FIXES.get(reason, "see the dead letters' detail")


@dataclass(frozen=True, kw_only=True)
class DeadLetterWatchConfig:
    """When the watch speaks.

    Attributes:
        warn_share: Dead-letter share of a window above which it warns, in [0, 1).
        max_share: Share above which the job fails (None: never), in [0, 1).
        window: Records per tumbling window (>= ``min_records``).
        min_records: Records a window must hold before its share is judged for the warning (>= 1).

    Raises:
        ConfigError: A share outside [0, 1) or a count out of range.
    """

    warn_share: float = 0.5
    max_share: float | None = None
    window: int = 1000
    min_records: int = 100

    def __post_init__(self) -> None:
        for name, share in (("warn_share", self.warn_share), ("max_share", self.max_share)):
            if share is not None and not 0.0 <= share < 1.0:
                raise ConfigError(f"{name} must be within [0, 1), got {share}")
        if not 1 <= self.min_records <= self.window:
            raise ConfigError(f"need 1 <= min_records <= window, got {self.min_records}, {self.window}")


class DeadLetterWatch:
    """Counts one operator's outcomes per window and speaks when most are dead letters.

    Attributes:
        alarm: Whether the share is above ``warn_share`` now (the ``deadLetterAlarm`` gauge).
        last_share: The dead-letter share of the last judged window, in [0, 1].
        message: The last warning line ("" before the first).

    Thread-safety: :meth:`record` may run on several threads (the async operator's timeouts
    fire on timer threads); a lock guards the counts.
    """

    def __init__(self, config: DeadLetterWatchConfig | None = None) -> None:
        self.config = config or DeadLetterWatchConfig()
        self.alarm = False
        self.last_share = 0.0
        self.message = ""
        self._records = 0
        self._reasons: Counter[Reason] = Counter()
        self._example: dict[Reason, str] = {}
        self._lock = threading.Lock()

    def record(self, total: int, letters: Iterable[DeadLettered]) -> None:
        """Count ``total`` outcomes, ``letters`` the dead letters among them.

        Raises:
            DeadLetterRateError: ``max_share`` is set and the window holds more than
                ``max_share`` x ``window`` dead letters.
        """
        with self._lock:
            self._record(total, letters)

    def _record(self, total: int, letters: Iterable[DeadLettered]) -> None:
        for letter in letters:
            self._reasons[letter.reason] += 1
            self._example.setdefault(letter.reason, letter.detail)
        self._records += total
        dead = sum(self._reasons.values())
        limit = self.config.max_share
        if limit is not None and dead > limit * self.config.window:
            self.alarm, self.message = True, self._line(dead)
            raise DeadLetterRateError(f"{self.message} (above --max-dead-letter-rate {limit:g} of "
                                      f"{self.config.window} records)")
        if self._records < self.config.min_records:
            return
        share = dead / self._records
        self.last_share = share
        if share > self.config.warn_share:
            line = self._line(dead)
            if not self.alarm:
                LOG.warning(line)
            self.alarm, self.message = True, line
        if self._records >= self.config.window:
            if self.alarm and share <= self.config.warn_share:
                LOG.warning("dead letters back to %.0f %% of the last %d records", 100 * share, self._records)
                self.alarm = False
            self._records, self._reasons, self._example = 0, Counter(), {}

    def _line(self, dead: int) -> str:
        reason, count = self._reasons.most_common(1)[0]
        others = ", ".join(f"{r.value} {n}" for r, n in self._reasons.most_common()[1:4])
        detail = " ".join(self._example[reason].split())[:200]  # one line, whatever the error's text
        return (f"{100 * dead / self._records:.0f} % of the last {self._records} records were dead-lettered, "
                f"{count} as {reason.value} ({detail}){'; also ' + others if others else ''}: "
                f"{likely_fix(reason)}")
