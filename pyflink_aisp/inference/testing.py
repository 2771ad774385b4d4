"""A contract test for :class:`~pyflink_aisp.inference.ModelHandler` implementations.

Run :func:`check_model_handler` on your handler with a few real examples before
putting it into a job: it checks, in this order, what the operators rely on::

    picklable       cloudpickle round trip (PyFlink ships functions with cloudpickle);
                    every later check runs on the copy, as a worker would
    model_version   a non-empty str
    device          a non-empty str ("cpu", "cuda:0", ...)
    load_model      returns without error
    pipeline_depth  an int >= 1
    device_uuid     None or a non-empty str
    example_tokens  an int >= 1 per example (bool refused)
    batch_byte_size an int >= 0
    output_count    run_inference returns exactly one output per input (len())
    input_unchanged run_inference leaves its input batch as it was
    order           the batch's output i equals the output of example i alone
    shuffle         a shuffled batch gives the same outputs, shuffled alike
    pipelined       the batch prepared once (prepare_batch) and run as model batches of
                    rows in reverse order, up to pipeline_depth launched (launch_prepared)
                    before the oldest is collected (collect_prepared): the same outputs
    empty_batch     an empty batch returns an empty sequence
    release_model   returns without error

Outputs compare recursively: numbers (Python, numpy scalars and arrays) within
``atol`` (NaN equals NaN; shapes must match); tuples, lists and dicts element
by element; anything else with ``==``. A failed check raises
:class:`HandlerContractError` naming the check, the example and the values.

Typical use in a test::

    from pyflink_aisp.inference.testing import check_model_handler

    def test_my_handler_contract():
        report = check_model_handler(MyHandler(path), ["good film", "dull", "meh"])
        assert report.examples == 3
"""

from __future__ import annotations

import math
import random
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from numbers import Number
from typing import Any

import numpy as np

from pyflink_aisp.errors import ConfigError
from pyflink_aisp.inference._handler import ModelHandler

__all__ = ["ContractReport", "HandlerContractError", "check_model_handler"]

_CHECKS = (
    "picklable",
    "model_version",
    "device",
    "load_model",
    "pipeline_depth",
    "device_uuid",
    "example_tokens",
    "batch_byte_size",
    "output_count",
    "input_unchanged",
    "order",
    "shuffle",
    "pipelined",
    "empty_batch",
    "release_model",
)


class HandlerContractError(AssertionError):
    """A handler broke the ModelHandler contract.

    An ``AssertionError`` so that pytest shows it as a test failure.

    Attributes:
        check: Which check failed (one of the names in the module docstring).
        reason: What was wrong, with the values involved.
    """

    def __init__(self, check: str, reason: str) -> None:
        super().__init__(f"[{check}] {reason}")
        self.check = check
        self.reason = reason


@dataclass(frozen=True, kw_only=True)
class ContractReport:
    """What :func:`check_model_handler` saw when every check passed.

    Attributes:
        examples: Examples checked.
        model_version: ``handler.model_version()``.
        device: ``handler.device()``.
        example_tokens: ``handler.example_tokens`` of each example, in order.
        max_abs_diff: Largest numeric difference between a batched output and the
            same example's output alone or in the shuffled batch (0.0 when no
            output is numeric).
        checks: Names of the checks run, in order.
    """

    examples: int
    model_version: str
    device: str
    example_tokens: tuple[int, ...]
    max_abs_diff: float
    checks: tuple[str, ...] = _CHECKS


def check_model_handler(
    handler: ModelHandler[Any, Any, Any],
    examples: Sequence[Any],
    *,
    atol: float = 1e-5,
    seed: int = 0,
) -> ContractReport:
    """Check that ``handler`` keeps the ModelHandler contract on ``examples``.

    Runs the model ``len(examples) + 3`` times (the batch, each example alone,
    a shuffled batch, an empty batch), and once more through the batch path
    (``prepare_batch``, ``launch_prepared``/``collect_prepared``). Pick examples whose outputs differ from
    each other, so that an order mistake shows.

    Args:
        handler: The handler under test (not changed: the checks use a copy).
        examples: At least two real inputs.
        atol: Absolute tolerance for numeric outputs (batching may pad inputs,
            which moves float results in the last bits).
        seed: Seed of the shuffle.

    Returns:
        A :class:`ContractReport`.

    Raises:
        HandlerContractError: A check failed (``check`` says which).
        ConfigError: Fewer than two examples or a negative ``atol``.
    """
    if len(examples) < 2:
        raise ConfigError(f"check_model_handler needs at least 2 examples, got {len(examples)}")
    if not atol >= 0:
        raise ConfigError(f"atol must be >= 0, got {atol}")
    copy = _pickled_copy(handler)
    version = _non_empty_str(copy.model_version, "model_version")
    device = _non_empty_str(copy.device, "device")
    model = _call("load_model", copy.load_model)
    depth = _pipeline_depth(copy, model)
    uuid = _call("device_uuid", lambda: copy.device_uuid(model))
    if uuid is not None and (not isinstance(uuid, str) or not uuid):
        raise HandlerContractError("device_uuid", f"device_uuid() must return None or a non-empty str, "
                                   f"got {uuid!r}")
    tokens = tuple(_example_tokens(copy, model, x, i) for i, x in enumerate(examples))
    _batch_byte_size(copy, examples)
    batch = _outputs(copy, model, list(examples), "output_count", "the batch")
    diff = _check_alone(copy, model, examples, batch, atol)
    diff = max(diff, _check_shuffled(copy, model, examples, batch, atol, seed))
    diff = max(diff, _check_pipelined(copy, model, examples, batch, depth, atol))
    if len(_outputs(copy, model, [], "empty_batch", "an empty batch")) != 0:
        raise HandlerContractError("empty_batch", "an empty batch returned outputs")
    _call("release_model", lambda: copy.release_model(model))
    return ContractReport(
        examples=len(examples), model_version=version, device=device, example_tokens=tokens, max_abs_diff=diff
    )


def _pickled_copy(handler: ModelHandler[Any, Any, Any]) -> ModelHandler[Any, Any, Any]:
    """The handler after a cloudpickle round trip (what a Flink worker receives)."""
    import cloudpickle  # a dependency of apache-flink

    try:
        copy = cloudpickle.loads(cloudpickle.dumps(handler))
    except Exception as exc:  # pickling raises PicklingError, TypeError, AttributeError, ...
        raise HandlerContractError(
            "picklable", f"{type(handler).__name__} cannot be pickled: {type(exc).__name__}: {exc}"
        ) from exc
    if not isinstance(copy, ModelHandler):
        raise HandlerContractError("picklable", f"unpickled to {type(copy).__name__}, not a ModelHandler")
    return copy


def _call(check: str, fn: Any) -> Any:
    try:
        return fn()
    except Exception as exc:  # any failure of user code is the finding
        raise HandlerContractError(check, f"raised {type(exc).__name__}: {exc}") from exc


def _non_empty_str(method: Any, check: str) -> str:
    value = _call(check, method)
    if not isinstance(value, str) or not value:
        raise HandlerContractError(check, f"{check}() must return a non-empty str, got {value!r}")
    return value


def _example_tokens(handler: ModelHandler[Any, Any, Any], model: Any, example: Any, index: int) -> int:
    value = _call("example_tokens", lambda: handler.example_tokens(example, model))
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
        raise HandlerContractError(
            "example_tokens", f"example {index} ({_short(example)}): expected an int >= 1, got {value!r}"
        )
    return int(value)


def _batch_byte_size(handler: ModelHandler[Any, Any, Any], examples: Sequence[Any]) -> None:
    value = _call("batch_byte_size", lambda: handler.batch_byte_size(list(examples)))
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 0:
        raise HandlerContractError("batch_byte_size", f"expected an int >= 0, got {value!r}")


def _outputs(
    handler: ModelHandler[Any, Any, Any], model: Any, batch: list[Any], check: str, what: str
) -> Sequence[Any]:
    """``run_inference`` on a copy of ``batch``, checked for count and for input changes."""
    given = list(batch)
    outputs = _call(check, lambda: handler.run_inference(given, model))
    try:
        count = len(outputs)
    except TypeError as exc:
        raise HandlerContractError(check, f"{what}: returned {type(outputs).__name__} without len()") from exc
    if count != len(batch):
        raise HandlerContractError(check, f"{what}: {count} outputs for {len(batch)} inputs")
    if len(given) != len(batch) or any(a is not b for a, b in zip(given, batch, strict=True)):
        raise HandlerContractError("input_unchanged", f"{what}: run_inference changed its input list")
    return list(outputs)


def _check_alone(
    handler: ModelHandler[Any, Any, Any],
    model: Any,
    examples: Sequence[Any],
    batch: Sequence[Any],
    atol: float,
) -> float:
    worst = 0.0
    for i, example in enumerate(examples):
        (alone,) = _outputs(handler, model, [example], "output_count", f"example {i} alone")
        diff, reason = _compare(batch[i], alone, atol)
        if reason is not None:
            raise HandlerContractError(
                "order",
                f"output {i} of the batch differs from example {i} ({_short(example)}) run alone: {reason}",
            )
        worst = max(worst, diff)
    return worst


def _check_shuffled(
    handler: ModelHandler[Any, Any, Any],
    model: Any,
    examples: Sequence[Any],
    batch: Sequence[Any],
    atol: float,
    seed: int,
) -> float:
    order = list(range(len(examples)))
    random.Random(seed).shuffle(order)
    if order == sorted(order):
        order.reverse()  # never the identity: n >= 2
    shuffled = _outputs(handler, model, [examples[j] for j in order], "output_count", "the shuffled batch")
    worst = 0.0
    for position, j in enumerate(order):
        diff, reason = _compare(batch[j], shuffled[position], atol)
        if reason is not None:
            raise HandlerContractError(
                "shuffle", f"example {j} at position {position} of a shuffled batch: {reason}"
            )
        worst = max(worst, diff)
    return worst


def _pipeline_depth(handler: ModelHandler[Any, Any, Any], model: Any) -> int:
    value = _call("pipeline_depth", lambda: handler.pipeline_depth(model))
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise HandlerContractError("pipeline_depth",
                                   f"pipeline_depth() must return an int >= 1, got {value!r}")
    return value


def _check_pipelined(
    handler: ModelHandler[Any, Any, Any],
    model: Any,
    examples: Sequence[Any],
    batch: Sequence[Any],
    depth: int,
    atol: float,
) -> float:
    """The batch path as the batcher drives it: rows in reverse order, cut into ``max(2, depth)``
    model batches (at most one per example), up to ``depth`` launched before the oldest is
    collected; each output compared with the batch's."""
    prepared = _call("pipelined", lambda: handler.prepare_batch(list(examples), model))
    if len(prepared) != len(examples):
        raise HandlerContractError("pipelined", f"prepare_batch returned {len(prepared)} rows for "
                                   f"{len(examples)} examples")
    order = np.arange(len(examples), dtype=np.intp)[::-1]
    parts = [np.ascontiguousarray(p) for p in np.array_split(order, min(len(order), max(2, depth)))]
    in_flight: deque[tuple[np.ndarray[Any, Any], Any]] = deque()
    worst = 0.0
    for rows in parts:
        if len(in_flight) == depth:  # full: collect the oldest first, as the batcher does
            worst = max(worst, _collect_checked(handler, model, in_flight.popleft(), batch, atol))
        handle = _call("pipelined", lambda r=rows: handler.launch_prepared(prepared, r, model))
        in_flight.append((rows, handle))
    while in_flight:
        worst = max(worst, _collect_checked(handler, model, in_flight.popleft(), batch, atol))
    return worst


def _collect_checked(handler: ModelHandler[Any, Any, Any], model: Any,
                     launched: tuple[np.ndarray[Any, Any], Any], batch: Sequence[Any], atol: float) -> float:
    rows, handle = launched
    outputs = list(_call("pipelined", lambda: handler.collect_prepared(handle, model)))
    if len(outputs) != len(rows):
        raise HandlerContractError("pipelined", f"collect_prepared returned {len(outputs)} outputs for "
                                   f"{len(rows)} rows")
    worst = 0.0
    for row, output in zip(rows.tolist(), outputs, strict=True):
        diff, reason = _compare(batch[row], output, atol)
        if reason is not None:
            raise HandlerContractError("pipelined", f"example {row} through launch_prepared/collect_prepared"
                                       f" (rows {rows.tolist()}) differs from the batch's output: {reason}")
        worst = max(worst, diff)
    return worst


def _is_numeric(value: Any) -> bool:
    if isinstance(value, bool | np.bool_):
        return False
    if isinstance(value, np.ndarray):
        return value.dtype.kind in "iufc"
    return isinstance(value, Number | np.number)


def _compare(expected: Any, actual: Any, atol: float) -> tuple[float, str | None]:
    """``(max abs difference, reason or None)`` between two outputs."""
    if _is_numeric(expected) and _is_numeric(actual):
        a, b = np.asarray(expected), np.asarray(actual)
        if a.shape != b.shape:
            return 0.0, f"shape {a.shape} vs {b.shape}"
        if a.size == 0:
            return 0.0, None
        nan_a, nan_b = np.isnan(a), np.isnan(b)
        if (nan_a != nan_b).any():
            return math.inf, "NaN in one output only"
        same = (a == b) | nan_a  # equal infinities are equal; inf - inf would be NaN
        diff = float(np.max(np.where(same, 0.0, np.abs(a - b))))
        return diff, None if diff <= atol else f"max abs difference {diff:.3g} > atol {atol:.3g}"
    if isinstance(expected, Mapping) and isinstance(actual, Mapping):
        if set(expected) != set(actual):
            return 0.0, f"keys {sorted(map(str, expected))} vs {sorted(map(str, actual))}"
        return _compare_items([(expected[k], actual[k], f"[{k!r}]") for k in expected], atol)
    if isinstance(expected, tuple | list) and isinstance(actual, tuple | list):
        if len(expected) != len(actual):
            return 0.0, f"length {len(expected)} vs {len(actual)}"
        return _compare_items(
            [(x, y, f"[{i}]") for i, (x, y) in enumerate(zip(expected, actual, strict=True))], atol
        )
    if isinstance(expected, np.ndarray) or isinstance(actual, np.ndarray):  # bool, str, object arrays
        equal_arrays = np.shape(expected) == np.shape(actual) and bool(np.array_equal(expected, actual))
        return 0.0, None if equal_arrays else f"{_short(expected)} != {_short(actual)}"
    try:
        equal = bool(expected == actual)
    except Exception as exc:  # == of arbitrary user objects
        return 0.0, f"cannot compare {type(expected).__name__} with ==: {exc}"
    return 0.0, None if equal else f"{_short(expected)} != {_short(actual)}"


def _compare_items(items: list[tuple[Any, Any, str]], atol: float) -> tuple[float, str | None]:
    worst = 0.0
    for expected, actual, where in items:
        diff, reason = _compare(expected, actual, atol)
        if reason is not None:
            return diff, f"{where}: {reason}"
        worst = max(worst, diff)
    return worst, None


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
