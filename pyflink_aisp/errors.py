"""The error tree of pyflink-aisp.

Every error this package raises on purpose derives from :class:`AispError`, so a
caller can catch one type. Errors carry the context a user needs to act
(topic, partition, offset, model version, path, command) and chain their cause
(``raise ... from exc``)::

    AispError
    ├── ConfigError            invalid configuration value (raised in __post_init__)
    ├── EnvironmentSetupError  missing Java/Maven, taken port, failed download
    │   └── ServiceError       a local service (Kafka broker, Flink cluster) failed
    ├── ModelError             model asset missing, checksum mismatch, load failure
    │   └── ChecksumError      a file's sha256 differs from the expected one
    ├── DataError              a data set is missing or malformed
    ├── DecodeError            one record could not be decoded (goes to the DLQ)
    ├── DeadLetterRateError    most records are dead letters (--max-dead-letter-rate): fail the job
    ├── TokenizeError          one input could not be tokenized
    ├── InferenceError         a record got no prediction (batcher closed, timed out)
    │   ├── InferenceTimeoutError  it waited longer than the operator's timeout
    │   ├── CircuitOpenError       too many records fail inference: fail the job (restart)
    │   └── OperatorNotOpenError   an operator scored a record before its open() (also a RuntimeError)
    ├── OversizedOutputError   a record's output is larger than the sink can write
    ├── KafkaError             producing to / consuming from Kafka failed
    └── AffinityError          GPU affinity: topology, placement, leases, the service
        ├── TopologyError          a topology file or NVML discovery is unusable
        ├── PlacementRefusedError  no GPU / NUMA node can take the request (no over-commit)
        ├── UnknownDeviceError     a request names a GPU / MIG instance the host lacks
        ├── LeaseNotFoundError     no lease of that id (or it expired / was released)
        └── AffinityUnavailableError  the affinity service cannot be reached
"""

from __future__ import annotations

__all__ = [
    "AffinityError",
    "AffinityUnavailableError",
    "AispError",
    "ChecksumError",
    "CircuitOpenError",
    "ConfigError",
    "DataError",
    "DeadLetterRateError",
    "DecodeError",
    "EnvironmentSetupError",
    "InferenceError",
    "InferenceTimeoutError",
    "InvalidModelOutputError",
    "KafkaError",
    "LeaseNotFoundError",
    "ModelError",
    "NoRouteError",
    "OperatorNotOpenError",
    "OversizedOutputError",
    "PlacementRefusedError",
    "ServiceError",
    "TokenizeError",
    "TopologyError",
    "UnknownDeviceError",
]


class AispError(Exception):
    """Root of every error raised on purpose by pyflink-aisp."""


class ConfigError(AispError, ValueError):
    """A configuration value is invalid (raised from ``__post_init__``)."""


class EnvironmentSetupError(AispError):
    """Something the machine must provide is missing (Java, Maven, a free port, a download).

    The message says what to do about it.
    """


class ServiceError(EnvironmentSetupError):
    """A local service (Kafka broker, Flink cluster) failed to start, answer or stop."""


class ModelError(AispError):
    """A model asset is missing, corrupt or cannot be loaded."""


class ChecksumError(ModelError):
    """A file's sha256 differs from the expected one.

    Attributes:
        path: The file checked.
        expected: Expected hex sha256.
        actual: Hex sha256 of the file on disk.
    """

    def __init__(self, path: str, expected: str, actual: str) -> None:
        super().__init__(f"sha256 mismatch for {path}: expected {expected}, got {actual}")
        self.path = path
        self.expected = expected
        self.actual = actual


class DataError(AispError):
    """A data set is missing or malformed."""


class DecodeError(AispError):
    """One record could not be decoded; such records go to the DLQ with ``reason``.

    Attributes:
        reason: Short machine-readable reason (e.g. ``invalid_json``).
        detail: Human-readable detail.
    """

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


class NoRouteError(DecodeError):
    """No rule of a route takes the record and the route has no default (dead-lettered as
    ``no_route``: the record's fault, not a model's)."""


class TokenizeError(AispError):
    """An input could not be tokenized (wrong type, invalid UTF-8)."""


class InferenceError(AispError):
    """A record got no prediction: the batcher closed first or the record timed out."""


class InferenceTimeoutError(InferenceError):
    """A record waited longer than its operator's timeout (dead-lettered as ``inference_timeout``)."""


class RemoteError(InferenceError):
    """A remote model server refused or failed a request (dead-lettered as ``remote_error``).

    Attributes:
        status: The HTTP status of the last answer, or None when none came (connection
            refused or reset, a body that is not the protocol's).
    """

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class RemoteTimeoutError(RemoteError):
    """A remote call got no usable answer within its record's deadline, retries included
    (dead-lettered as ``remote_timeout``)."""


class PromptTooLongError(RemoteError):
    """A record's prompt does not fit: over ``--prompt-max-tokens`` when counted before the
    request, or past the model's context window as the server answered (llama.cpp's
    ``exceed_context_size_error``, OpenAI's ``context_length_exceeded``, vLLM's "maximum context
    length"); dead-lettered as ``prompt_too_long``. The record's fault, not the server's: never
    retried, and not counted by the circuit breaker.

    Attributes:
        status: The server's HTTP status, or None when the prompt was counted before any request.
    """


class InvalidModelOutputError(InferenceError):
    """A model answered, but not in the form its task asked for, e.g. a generation asked for
    JSON of a schema that does not parse or lacks a field (dead-lettered as
    ``invalid_model_output``)."""


class OperatorNotOpenError(InferenceError, RuntimeError):
    """An operator or SQL function scored a record before its ``open()`` ran: a bug in
    the job, not in a record (a ``RuntimeError`` too)."""


class DeadLetterRateError(AispError):
    """The dead-letter share of a window of records passed ``--max-dead-letter-rate``.

    Raised by :class:`~pyflink_aisp.pipeline._watch.DeadLetterWatch` and left to fail the
    job; its message is the watch's line (share, top reason, one record's detail, the
    likely fix).
    """


class CircuitOpenError(InferenceError):
    """The inference failure rate over a window of records reached its threshold.

    Raised by :class:`~pyflink_aisp.inference.FailureRateBreaker` and left to
    fail the job, so that Flink restarts it from the last checkpoint instead of
    dead-lettering the whole stream (a circuit breaker, Nygard, *Release It!*).

    Attributes:
        failure_rate: Failures / records in the window when it opened.
        failures: Failed records in the window.
        records: Records in the window.
        max_failure_rate: The threshold.
        last_failure: ``"Type: message"`` of the last failure (≤ 300 chars, '' if unknown).
    """

    def __init__(
        self,
        message: str,
        *,
        failure_rate: float = 0.0,
        failures: int = 0,
        records: int = 0,
        max_failure_rate: float = 0.0,
        last_failure: str = "",
    ) -> None:
        super().__init__(message)
        self.failure_rate = failure_rate
        self.failures = failures
        self.records = records
        self.max_failure_rate = max_failure_rate
        self.last_failure = last_failure


class KafkaError(AispError):
    """Producing to or consuming from Kafka failed (context in the message)."""


class OversizedOutputError(AispError):
    """A record's output (Kafka key + value) is larger than the sink can write
    (the producer's ``max.request.size`` or the topic's ``max.message.bytes``);
    the record goes to the DLQ with reason ``oversized_output``.

    Attributes:
        size_bytes: UTF-8 bytes of key + value.
        limit_bytes: The most the sink takes for key + value.
    """

    def __init__(self, size_bytes: int, limit_bytes: int) -> None:
        super().__init__(f"output of {size_bytes} bytes (key + value) is over the sink's limit of "
                         f"{limit_bytes} bytes (max.request.size / max.message.bytes less record overhead)")
        self.size_bytes = size_bytes
        self.limit_bytes = limit_bytes


class AffinityError(AispError):
    """GPU affinity (topology, placement, leases, the side service) failed; context in the message."""


class TopologyError(AffinityError, ValueError):
    """A topology file (or NVML discovery) is unusable: the message names the field and the file."""


class PlacementRefusedError(AffinityError):
    """No candidate device can take the request without over-committing it.

    Attributes:
        explanation: Per-candidate reasons (JSON-ready dicts), as the service returns them.
    """

    def __init__(self, message: str, explanation: list[dict[str, object]] | None = None) -> None:
        super().__init__(message)
        self.explanation = explanation or []


class UnknownDeviceError(AffinityError, LookupError):
    """A request names a GPU or MIG instance (uuid or index) that the topology lacks."""


class LeaseNotFoundError(AffinityError, KeyError):
    """No active lease of that id (unknown, released or expired).

    Attributes:
        gone: The lease existed and was released or expired (HTTP 410), not unknown (404).
    """

    def __init__(self, message: str, *, gone: bool = False) -> None:
        super().__init__(message)
        self.gone = gone

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class AffinityUnavailableError(AffinityError):
    """The affinity service did not answer (after the client's retries)."""
