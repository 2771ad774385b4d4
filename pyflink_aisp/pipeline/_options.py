"""How an option is declared: once, as a field of the options dataclasses.

Every knob of the packaged jobs and SQL functions is one field of
:class:`~pyflink_aisp.pipeline.InferenceOptions` (what a SQL function reads:
batching, model, worker) or :class:`~pyflink_aisp.pipeline.PipelineOptions`
(what only a job has: topics, ranges, sinks, checkpoints), declared with
:func:`opt` (or :func:`required`): its default and the table row's doc, group,
unit, Flink job parameter (``aisp.*``, read by the SQL functions and the job's
operators from ``pipeline.global-job-parameters``), nullability and minimum.
Its type comes from the field's annotation. :func:`options_of` reads the rows
(:class:`Option`) back from a dataclass: from them come the job's ``argparse``
flags, the job parameters a job sets and the SQL functions read
(:func:`read_job_parameters`, :func:`render_job_parameter`), the options page
of the docs (:func:`options_markdown`, checked by a test) and the derived
PyFlink settings.

``none`` as a job parameter, or as the value of a flag whose option is
``nullable``, turns an optional knob off (an empty job parameter counts as
unset). Errors name the flag or parameter.

A *device-aware* option (``opt(..., cuda=(value, why))``: the batch size, the token
budget, the Arrow batch size) has one default on the CPU and another on a CUDA
device. Left unset (None), it takes its device's default as a :class:`Derived` int,
which stays recognisable as "not given": :func:`dataclasses.replace` onto another
device derives it again, and it is not written as a job parameter (the worker
derives it from ``aisp.device``). A value given in code, by a flag or by a job
parameter always wins.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import types
import typing
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyflink_aisp.device import Device
from pyflink_aisp.errors import ConfigError

__all__ = ["Derived", "GpuProvider", "InferenceRuntime", "JvmJit", "Option", "OptionGroup", "Precision",
           "Runner", "RuntimeMode", "device_value", "opt", "options_markdown", "options_of",
           "read_job_parameters", "render_job_parameter", "required"]


class OptionGroup(enum.StrEnum):
    """Where an option applies (the options page groups the table by it)."""

    JOB = "job"            # the packaged job only: topics, mode, checkpoints, operator
    BATCHING = "batching"  # the batcher: job and SQL functions
    MODEL = "model"        # what is loaded and where it runs: job and SQL functions
    WORKER = "worker"      # PyFlink Python-worker settings derived for the job


class RuntimeMode(enum.StrEnum):
    """Flink's runtime mode (``--mode``; ``execution.runtime-mode``)."""

    STREAMING = "streaming"  # unbounded, checkpoints, transactions commit on each
    BATCH = "batch"          # bounded at the range's end, one commit at the end


class RestartStrategy(enum.StrEnum):
    """Flink's restart strategy of a job (``--restart-strategy``; ``restart-strategy.type``)."""

    EXPONENTIAL_DELAY = "exponential-delay"  # the wait doubles while failures repeat
    FAILURE_RATE = "failure-rate"            # a fixed wait, a cap on failures per interval


class RouteOperators(enum.StrEnum):
    """How a rule route's models are laid out in the job graph (``--route-operators``).

    ``PER_RULE``: one Python operator per rule (and the default), each reading every record and
    scoring its own; in STREAMING each is a task (thread) of its own behind a ``rescale``
    exchange, so a slow rule's model holds back only its own records (and the source once its
    channel's buffers are full). ``ONE``: one operator for the whole route (each record crosses
    to Python once; a slow model's call holds the records of the others in its bundle). A
    cascade always runs in one.
    """

    PER_RULE = "per-rule"
    ONE = "one"


class Runner(enum.StrEnum):
    """How the job's inference operator takes records (``--operator``).

    ``ARROW``: a vectorized (pandas) map over the Kafka table: records cross the
    JVM/Python boundary as Arrow record batches, the model sees the batch whole.
    ``ASYNC``: PyFlink's ``AsyncFunction``, one coroutine and future per record,
    batches formed across records in flight (low-rate, latency-first streams).
    ``RECORD``: a general (row-at-a-time) map run in Flink's thread mode
    (``python.execution-mode: thread``, PEMJA) inside the TaskManager's JVM: one model call
    per record, no bundle and no JVM/Python process hop (low-rate streams, latency first).
    """

    ARROW = "arrow"
    ASYNC = "async"
    RECORD = "record"


class JvmJit(enum.StrEnum):
    """HotSpot's just-in-time compilers in the JVM a local run starts (``--jvm-jit``).

    ``TIERED``: HotSpot's default tiered compilation (the levels 0-4 described in HotSpot's
    ``compilationPolicy.hpp``: the interpreter, C1, then C2 for the hottest methods). ``C1``:
    ``-XX:TieredStopAtLevel=1``, C1 only, with no C2 compiler threads (HotSpot's product flag
    ``TieredStopAtLevel``, ``compiler_globals.hpp``).
    """

    TIERED = "tiered"
    C1 = "c1"


class InferenceRuntime(enum.StrEnum):
    """What runs the sentiment model (``--runtime``)."""

    ONNX = "onnx"    # ONNX Runtime: CPU, CUDA or TensorRT execution provider
    TORCH = "torch"  # PyTorch (``pip install -e .[torch]``)


class Precision(enum.StrEnum):
    """Encoder precision of the torch runtime (``--precision``)."""

    FP32 = "fp32"
    FP16 = "fp16"
    BF16 = "bf16"


class GpuProvider(enum.StrEnum):
    """ONNX Runtime execution provider for ``--device cuda:N`` (``--onnx-provider``)."""

    CUDA = "cuda"          # CUDAExecutionProvider
    TENSORRT = "tensorrt"  # TensorrtExecutionProvider, CUDA for the nodes TensorRT does not take


class Derived(int):
    """An int option's value that was not given but derived from the device
    (:func:`device_value`): equal to, and used as, the int; told apart from a given value
    by its type only, so that rebuilding the options for another device derives it again.

    Thread-safety: immutable.
    """

    __slots__ = ()

    def __repr__(self) -> str:
        return f"Derived({int(self)})"

    def __str__(self) -> str:  # what settings and messages show: the number
        return int.__repr__(self)


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"expected a finite number, got {text!r}")
    return value


def _int_tuple(text: str) -> tuple[int, ...]:
    # ';' as well as ',': in the legacy 'k:v,k:v' form of the job parameters ',' separates entries.
    return tuple(int(p) for p in text.replace(";", ",").split(",") if p.strip())


def _bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered not in ("true", "false", "1", "0", "yes", "no"):
        raise ValueError(f"expected true or false, got {text!r}")
    return lowered in ("true", "1", "yes")


def _is_kind(value: Any, kind: type) -> bool:
    """Whether a value given in code is of a number or bool option's kind (an int is a float; a bool
    is neither an int nor a float here, though Python makes it one)."""
    if kind is bool or isinstance(value, bool):
        return kind is bool and isinstance(value, bool)
    return isinstance(value, int) if kind is int else isinstance(value, int | float)


#: How an error names a kind.
_KIND_WORDS: dict[Any, str] = {int: "an integer", float: "a finite number", tuple: "comma-separated integers",
                               bool: "true or false", Device: "cpu, cuda or cuda:N"}
#: Parsers by type (the ``kind`` of an option).
_PARSERS: dict[Any, Callable[[str], Any]] = {
    int: int, float: _finite, str: str, Path: Path, bool: _bool, tuple: _int_tuple, Device: Device.parse,
}


@dataclass(frozen=True, kw_only=True)
class Option:
    """One knob: a row of the options table, read from its field by :func:`options_of`.

    Attributes:
        name: Field of the options dataclass (snake case).
        kind: ``int``, ``float``, ``str``, ``Path``, ``bool``, ``tuple`` (of ints)
            or an ``enum.StrEnum``.
        default: Value when unset (None: off, or derived; see ``doc``); None for a required one.
        doc: One sentence for ``--help`` and the options page.
        group: Where it applies.
        unit: Unit of the value (``ms``, ``s``, ``records``, ``tokens``...), or "".
        job_param: Flink job parameter name, or None (flag only).
        nullable: ``none`` turns it off.
        minimum: Smallest accepted number (inclusive), or None.
        required: The job needs it (no default).
        choices: For an enum: the members accepted, when not all are (empty: all).
        cuda_default: The default on a CUDA device, where ``device_aware`` (``default``
            is then the CPU's).
        cuda_why: Why the CUDA default differs (the options page shows it); "" for an
            option whose default does not depend on the device.
    """

    name: str
    kind: Any
    default: Any
    doc: str
    group: OptionGroup
    unit: str = ""
    job_param: str | None = None
    nullable: bool = False
    minimum: float | None = None
    required: bool = False
    choices: tuple[Any, ...] = ()
    cuda_default: Any = None
    cuda_why: str = ""

    @property
    def device_aware(self) -> bool:
        """Whether the default depends on the device (see the module docstring)."""
        return bool(self.cuda_why)

    def default_for(self, device: Device) -> Any:
        """The default on ``device``: ``cuda_default`` on a CUDA device where device-aware,
        else ``default``."""
        return self.cuda_default if self.device_aware and device.is_gpu else self.default

    @property
    def flag(self) -> str:
        """The command-line flag: ``--`` and the name with dashes."""
        return "--" + self.name.replace("_", "-")

    def parse(self, text: str, *, where: str | None = None) -> Any:
        """A string (flag or job parameter value) → the option's value.

        Raises:
            ConfigError: Not of the option's kind, below its minimum, or ``none``
                for an option that cannot be off; the message names ``where``
                (default: the flag).
        """
        where = where or self.flag
        stripped = text.strip()
        if self.nullable and stripped.lower() in ("", "none", "null"):
            return () if self.kind is tuple else None  # an empty tuple is a tuple option's "off"
        try:
            if isinstance(self.kind, type) and issubclass(self.kind, enum.Enum):
                value: Any = self.kind(stripped.lower())
            else:
                value = _PARSERS[self.kind](stripped)
        except (ValueError, KeyError, ConfigError) as exc:
            raise ConfigError(f"{where} must be {self.expected}, got {text!r}") from exc
        self.check(value, where=where)
        return value

    @property
    def expected(self) -> str:
        """What a value of this kind is, for errors: ``an integer``, ``one of streaming, batch``..."""
        if isinstance(self.kind, enum.EnumMeta):
            members: list[enum.Enum] = list(self.choices or self.kind.__members__.values())
            return "one of " + ", ".join(str(m.value) for m in members)
        return _KIND_WORDS.get(self.kind, f"a {getattr(self.kind, '__name__', self.kind)}")

    def check(self, value: Any, *, where: str | None = None) -> None:
        """Range check of a parsed value.

        Raises:
            ConfigError: not one of ``choices``, not of the option's number or bool kind
                (``True`` or ``2.5`` for an integer, ``"8"`` given in code), below
                ``minimum`` (for tuples: any element), or an integer above
                :data:`JAVA_INT_MAX` (Flink reads these settings as Java ints).
        """
        if value is None:
            return
        if self.choices and value not in self.choices:
            raise ConfigError(f"{where or self.flag} must be {self.expected}, got {str(value)!r}")
        if self.kind in (int, float, bool) and not _is_kind(value, self.kind):
            raise ConfigError(f"{where or self.flag} must be {self.expected}, got {value!r}")
        values = value if isinstance(value, tuple) else (value,)
        if self.minimum is not None and any(v < self.minimum for v in values):
            raise ConfigError(f"{where or self.flag} must be >= {self.minimum:g}, got {value!r}")
        if self.kind in (int, tuple) and any(v > JAVA_INT_MAX for v in values):
            raise ConfigError(f"{where or self.flag} must be <= {JAVA_INT_MAX} (a Java int), got {value!r}")

    def render_default(self) -> str:
        """The default as the options page and ``--help`` show it (``32; cuda: 1024`` where
        device-aware)."""
        if self.required:
            return "required"
        if self.device_aware:
            cuda = render_job_parameter(self, self.cuda_default)
            return f"{render_job_parameter(self, self.default)}; cuda: {cuda}"
        return render_job_parameter(self, self.default)


#: Largest integer option: Flink reads the settings derived from them as Java ints.
JAVA_INT_MAX = 2**31 - 1

#: The field-metadata key of an option's row.
_SPEC = "aisp.option"


def opt(default: Any, group: OptionGroup, doc: str, *, unit: str = "", job_param: str | None = None,
        nullable: bool = False, minimum: float | None = None, choices: tuple[Any, ...] = (),
        cuda: tuple[Any, str] | None = None) -> Any:
    """Declare an option field: ``max_batch_size: int = opt(32, B, "Most records per model call.", ...)``.

    Args:
        default: The value when unset (immutable: a tuple, not a list).
        group: Where it applies.
        doc: One sentence for ``--help`` and the options page.
        unit: Unit of the value (``ms``, ``s``, ``records``, ...), or "".
        job_param: Flink job parameter name, or None (flag only).
        nullable: ``none`` turns it off.
        minimum: Smallest accepted number (inclusive), or None.
        choices: For an enum: the members accepted, when not all are (empty: all).
        cuda: ``(default on a CUDA device, why)``: a device-aware option, whose ``default``
            is the CPU's; the field's own default is then None ("not given", see
            :func:`device_value`).

    Returns:
        A :func:`dataclasses.field` (typed ``Any`` so that the annotation stays the field's type).
    """
    spec = {"group": group, "doc": doc, "unit": unit, "job_param": job_param, "nullable": nullable,
            "minimum": minimum, "required": False, "choices": choices}
    if cuda is None:
        return dataclasses.field(default=default, metadata={_SPEC: spec})
    spec.update(cpu_default=default, cuda_default=cuda[0], cuda_why=cuda[1])
    return dataclasses.field(default=None, metadata={_SPEC: spec})


def required(group: OptionGroup, doc: str) -> Any:
    """Declare a required option field (no default: the dataclass refuses to be built without it)."""
    spec = {"group": group, "doc": doc, "unit": "", "job_param": None, "nullable": False, "minimum": None,
            "required": True}
    return dataclasses.field(metadata={_SPEC: spec})


def _kind(annotation: Any) -> Any:
    """The option kind of a field annotation: ``X | None`` is ``X``; ``tuple[int, ...]`` is ``tuple``."""
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) != 1:
            raise TypeError(f"an option is one type or None, got {annotation!r}")
        annotation = args[0]
    origin = typing.get_origin(annotation)
    if origin is tuple:
        return tuple
    is_enum = isinstance(annotation, type) and issubclass(annotation, enum.Enum)
    if annotation not in _PARSERS and not is_enum:
        raise TypeError(f"no parser for an option of type {annotation!r}")
    return annotation


#: The order of the groups in ``--help`` and on the options page.
_GROUP_ORDER = (OptionGroup.JOB, OptionGroup.BATCHING, OptionGroup.MODEL, OptionGroup.WORKER)


_OPTIONS_OF: dict[type, tuple[Option, ...]] = {}


def options_of(cls: type) -> tuple[Option, ...]:
    """The options of an options dataclass, by group (job, batching, model, worker), each group
    in field order.

    Raises:
        TypeError: A field without :func:`opt` / :func:`required`, or of a type no option takes.
    """
    if cls in _OPTIONS_OF:
        return _OPTIONS_OF[cls]
    hints = typing.get_type_hints(cls)
    rows = []
    for field in dataclasses.fields(cls):
        spec = field.metadata.get(_SPEC)
        if spec is None:
            raise TypeError(f"{cls.__name__}.{field.name} is not declared with opt() or required()")
        spec = dict(spec)
        default = None if field.default is dataclasses.MISSING else field.default
        default = spec.pop("cpu_default", default)
        rows.append(Option(name=field.name, kind=_kind(hints[field.name]), default=default, **spec))
    table = tuple(sorted(rows, key=lambda o: _GROUP_ORDER.index(o.group)))
    _OPTIONS_OF[cls] = table
    return table


def device_value(option: Option, value: Any, device: Device) -> Any:
    """The value of an option on ``device``: ``value`` where it was given, else (None, or
    :class:`Derived` from another device) the device's default, an int as :class:`Derived`.

    Args:
        option: The option (not device-aware: ``value`` is returned as it is).
        value: The field's value.
        device: Where the model runs.
    """
    if not option.device_aware or (value is not None and not isinstance(value, Derived)):
        return value
    chosen = option.default_for(device)
    return Derived(chosen) if isinstance(chosen, int) and not isinstance(chosen, bool) else chosen


def read_job_parameters(options: Iterable[Option], get: Callable[[str, str], str]) -> dict[str, Any]:
    """The job parameters that are set, parsed: field name → value.

    Args:
        options: The options to read (those without a job parameter are skipped).
        get: ``FunctionContext.get_job_parameter`` (``(key, default) -> str``).

    Raises:
        ConfigError: A value does not parse (the message names the parameter).
    """
    values: dict[str, Any] = {}
    for option in options:
        if option.job_param is None:
            continue
        raw = get(option.job_param, "")
        if raw is not None and raw.strip():
            values[option.name] = option.parse(raw, where=f"job parameter {option.job_param}")
    return values


def render_job_parameter(opt: Option, value: Any) -> str:
    """A value as its job parameter string (inverse of :meth:`Option.parse`)."""
    if value is None:
        return "none"
    if isinstance(value, tuple):
        return ",".join(map(str, value)) or "none"
    if isinstance(value, enum.Enum):
        return str(value.value)
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return repr(value)
    return str(value)


def options_markdown(options: Iterable[Option]) -> str:
    """The options table of the docs' options page (a test checks that the page holds exactly this)."""
    lines = ["| flag | job parameter | default | unit | what |", "|---|---|---|---|---|"]
    for opt in options:
        param = f"`{opt.job_param}`" if opt.job_param else ""
        doc = opt.doc + (f" On cuda: {opt.cuda_why}" if opt.device_aware else "")
        lines.append(f"| `{opt.flag}` | {param} | {opt.render_default()} | {opt.unit} | "
                     f"{doc.replace('|', '/')} |")
    return "\n".join(lines)
